"""instance_jobs: a partial index of the renames in progress

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27 01:30:00.000000

A rename in progress holds the name it renames to (``store/requests/_names.py``): every name check (a
request written, an instance created, another rename) looks for unapplied ``rename`` jobs that
take it. During a burst of creates the unapplied jobs are the creates in flight, thousands of
them; this index holds only the renames not applied yet, so the look reads next to nothing.
The query spells the condition as the index does (a literal, not a bound value), so that
SQLite's planner sees the index applies.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_WHERE = sa.text("applied_at IS NULL AND action = 'rename'")


def upgrade() -> None:
    op.create_index(
        "ix_instance_jobs_renaming",
        "instance_jobs",
        ["backend_id", "job_id"],
        postgresql_where=_WHERE,
        sqlite_where=_WHERE,
    )


def downgrade() -> None:
    op.drop_index("ix_instance_jobs_renaming", table_name="instance_jobs")
