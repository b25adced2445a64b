"""instance_jobs: a partial index of the jobs whose end is not applied yet

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26 22:45:00.000000

Every process that follows recorded jobs (the dispatcher's follower of jobs recorded by other
processes, ``store/instances/_recorded.py``; a backend's unapplied jobs at start) asks for the rows with
``applied_at IS NULL``. Those are the few jobs in flight, while the table keeps every job ever
recorded: without an index each look read the whole table (on SQLite, every poll). The index
holds only the unapplied rows, so it stays as small as the work in flight.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_WHERE = sa.text("applied_at IS NULL")


def upgrade() -> None:
    op.create_index(
        "ix_instance_jobs_unapplied",
        "instance_jobs",
        ["backend_id", "job_id"],
        postgresql_where=_WHERE,
        sqlite_where=_WHERE,
    )


def downgrade() -> None:
    op.drop_index("ix_instance_jobs_unapplied", table_name="instance_jobs")
