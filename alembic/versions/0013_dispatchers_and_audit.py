"""what a separate console reads of the dispatchers; the operators' audit log

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-28 20:20:00.000000

- ``dispatchers``: each dispatcher's own report of itself, written every few seconds (alive,
  root tasks, claims and queue per backend), so that a ``web`` process of its own, or the CLI,
  sees it (issue 30 item 5).
- ``backends.reconciled_at``, ``reconciled_by``, ``reconcile_report``: the last reconcile pass
  over each backend and its report, for the same readers.
- ``audit_log``: every operator action (who, how, what, on what, which job, how it ended).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "dispatchers",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("interval", sa.Double(), nullable=False),
        sa.Column("healthy", sa.Boolean(), nullable=False),
        sa.Column("stopped_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("state", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dispatchers")),
    )
    op.create_table(
        "audit_log",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(length=255), nullable=False),
        sa.Column("via", sa.String(length=16), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("backend", sa.String(length=64), nullable=True),
        sa.Column("target", sa.String(length=255), nullable=True),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    op.create_index("ix_audit_log_at", "audit_log", ["at"])
    op.add_column("backends", sa.Column("reconciled_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("backends", sa.Column("reconciled_by", sa.String(length=64), nullable=True))
    op.add_column("backends", sa.Column("reconcile_report", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("backends") as batch:
        batch.drop_column("reconcile_report")
        batch.drop_column("reconciled_by")
        batch.drop_column("reconciled_at")
    op.drop_index("ix_audit_log_at", table_name="audit_log")
    op.drop_table("audit_log")
    op.drop_table("dispatchers")
