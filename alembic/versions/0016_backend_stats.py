"""each backend's latest node stats, read by one dispatcher for all

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-28 23:30:00.000000

- ``backend_stats``: the whole node stats of a backend (its nodes with their figures, ``/2/info``,
  the OS list, the networks) as the holder of its follow lease last read them, and when that read
  began. The other dispatchers take them from here instead of asking Ganeti (issue 31 item 2).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "backend_stats",
        sa.Column("backend_id", sa.Integer(), nullable=False),
        sa.Column("stats", sa.JSON(), nullable=False),
        sa.Column("read_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["backend_id"],
            ["backends.id"],
            name=op.f("fk_backend_stats_backend_id_backends"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("backend_id", name=op.f("pk_backend_stats")),
    )


def downgrade() -> None:
    op.drop_table("backend_stats")
