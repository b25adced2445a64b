"""instance state and the jobs submitted for instances

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 15:01:14.835816
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:

    op.create_table(
        "instance_jobs",
        sa.Column("backend_id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("instance_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("start", sa.Boolean(), nullable=True),
        sa.Column("params", sa.JSON(), nullable=True),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("applied_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("result", sa.String(length=16), nullable=True),
        sa.ForeignKeyConstraint(
            ["backend_id"],
            ["backends.id"],
            name=op.f("fk_instance_jobs_backend_id_backends"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["instance_id"],
            ["instances.id"],
            name=op.f("fk_instance_jobs_instance_id_instances"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("backend_id", "job_id", name=op.f("pk_instance_jobs")),
    )
    with op.batch_alter_table("instance_jobs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_instance_jobs_instance_id"), ["instance_id"], unique=False)

    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.add_column(sa.Column("owned", sa.Boolean(), nullable=False, server_default=sa.true()))
        batch_op.add_column(sa.Column("os", sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column("disk_template", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("beparams", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("nics", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("disks", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("tags", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("create_job_id", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("state_time", sa.Double(), nullable=True))


def downgrade() -> None:

    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.drop_column("state_time")
        batch_op.drop_column("create_job_id")
        batch_op.drop_column("tags")
        batch_op.drop_column("disks")
        batch_op.drop_column("nics")
        batch_op.drop_column("beparams")
        batch_op.drop_column("disk_template")
        batch_op.drop_column("os")
        batch_op.drop_column("owned")

    with op.batch_alter_table("instance_jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_instance_jobs_instance_id"))

    op.drop_table("instance_jobs")
