"""networks: the networks this control plane made, and their state on each backend

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26 21:10:00.000000

``networks`` holds what ``ControlPlane.create_network`` was asked (subnet, gateway, MAC
prefix, mode, link, node groups); ``network_backends`` one row per backend the network
is on: its state (pending, active, error, deleting), the groups it is connected to and
should be, the link resolved there and the last job (see ``store/networks/_networks.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "networks",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("uuid", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("subnet", sa.String(length=64), nullable=False),
        sa.Column("gateway", sa.String(length=64), nullable=True),
        sa.Column("mac_prefix", sa.String(length=17), nullable=True),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("link", sa.String(length=64), nullable=True),
        sa.Column("groups", sa.JSON(), nullable=True),
        sa.Column("tags", sa.JSON(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_networks")),
        sa.UniqueConstraint("uuid", name=op.f("uq_networks_uuid")),
        sa.UniqueConstraint("name", name=op.f("uq_networks_name")),
    )
    op.create_table(
        "network_backends",
        sa.Column("network_id", _ID, nullable=False),
        sa.Column("backend_id", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("groups", sa.JSON(), nullable=True),
        sa.Column("want_groups", sa.JSON(), nullable=True),
        sa.Column("link", sa.String(length=64), nullable=True),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["network_id"],
            ["networks.id"],
            name=op.f("fk_network_backends_network_id_networks"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["backend_id"],
            ["backends.id"],
            name=op.f("fk_network_backends_backend_id_backends"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("network_id", "backend_id", name=op.f("pk_network_backends")),
    )


def downgrade() -> None:
    op.drop_table("network_backends")
    op.drop_table("networks")
