"""incidents and their repairs; rolling maintenance runs

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-28 20:05:00.000000

- ``incidents``: what the dispatcher found wrong (a node down, an instance stopped or in error
  while it should run, a migration that left it stopped) and the repair it sent, if policy allows
  (issue 30 item 2).
- ``maintenance_runs``: a rolling maintenance of a backend, its plan and where it is, so that a run
  killed resumes where it was; at most one running per backend (a partial unique index) (issue 30
  item 3).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_RUNNING = sa.text("status = 'running'")


def upgrade() -> None:
    op.create_table(
        "incidents",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("backend", sa.String(length=64), nullable=False),
        sa.Column("node", sa.String(length=255), nullable=True),
        sa.Column("instance", sa.String(length=255), nullable=True),
        sa.Column("opened_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("action", sa.String(length=32), nullable=True),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("outcome", sa.String(length=32), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_incidents")),
    )
    op.create_index("ix_incidents_backend_closed_at", "incidents", ["backend", "closed_at"])
    op.create_index("ix_incidents_opened_at", "incidents", ["opened_at"])
    op.create_table(
        "maintenance_runs",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("backend", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("command", sa.Text(), nullable=False),
        sa.Column("plan", sa.JSON(), nullable=False),
        sa.Column("position", sa.JSON(), nullable=False),
        sa.Column("started_by", sa.String(length=255), nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_maintenance_runs")),
    )
    op.create_index(
        "ix_maintenance_runs_one_running",
        "maintenance_runs",
        ["backend"],
        unique=True,
        postgresql_where=_RUNNING,
        sqlite_where=_RUNNING,
    )


def downgrade() -> None:
    op.drop_index("ix_maintenance_runs_one_running", table_name="maintenance_runs")
    op.drop_table("maintenance_runs")
    op.drop_index("ix_incidents_opened_at", table_name="incidents")
    op.drop_index("ix_incidents_backend_closed_at", table_name="incidents")
    op.drop_table("incidents")
