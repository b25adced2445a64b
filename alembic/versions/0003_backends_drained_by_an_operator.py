"""backends drained by an operator

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 16:04:01.160361
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:

    with op.batch_alter_table("backends", schema=None) as batch_op:
        batch_op.add_column(sa.Column("drained", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch_op.add_column(sa.Column("drained_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:

    with op.batch_alter_table("backends", schema=None) as batch_op:
        batch_op.drop_column("drained_at")
        batch_op.drop_column("drained")
