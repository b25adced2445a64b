"""durable create requests, backend health and backend events

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22 16:45:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("backends", schema=None) as batch_op:
        batch_op.add_column(sa.Column("health", sa.String(length=8), nullable=True))
        batch_op.add_column(sa.Column("health_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("health_detail", sa.Text(), nullable=True))

    op.create_table(
        "backend_events",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("backend_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["backend_id"],
            ["backends.id"],
            name=op.f("fk_backend_events_backend_id_backends"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_backend_events")),
    )
    op.create_index("ix_backend_events_backend_id_at", "backend_events", ["backend_id", "at"], unique=False)

    op.create_table(
        "requests",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("want_backend", sa.String(length=64), nullable=True),
        sa.Column("backend_id", sa.Integer(), nullable=True),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("claimed_by", sa.String(length=64), nullable=True),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["backend_id"], ["backends.id"], name=op.f("fk_requests_backend_id_backends"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_requests")),
    )
    op.create_index("ix_requests_status_created_at", "requests", ["status", "created_at"], unique=False)
    op.create_index("ix_requests_backend_id_job_id", "requests", ["backend_id", "job_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_requests_backend_id_job_id", table_name="requests")
    op.drop_index("ix_requests_status_created_at", table_name="requests")
    op.drop_table("requests")
    op.drop_index("ix_backend_events_backend_id_at", table_name="backend_events")
    op.drop_table("backend_events")
    with op.batch_alter_table("backends", schema=None) as batch_op:
        batch_op.drop_column("health_detail")
        batch_op.drop_column("health_at")
        batch_op.drop_column("health")
