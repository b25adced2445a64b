"""node failures: an instance's node state, a request's failed attempts, the nodes of a backend

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28 09:45:00.000000

- ``instances.node_state`` / ``node_state_since``: None while the instance's primary node is up,
  "down" (Ganeti's ``ERROR_nodedown``) or "offline" (``ERROR_nodeoffline``), and since when.
- ``requests.attempt_errors``: every failed attempt of a request, kept when it is placed again.
- ``backend_nodes``: each backend's nodes as the dispatcher last read them (up, down, offline;
  since when; the first sign), for placement in other processes, ``backends show`` and the console.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("instances") as batch:
        batch.add_column(sa.Column("node_state", sa.String(16), nullable=True))
        batch.add_column(sa.Column("node_state_since", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("attempt_errors", sa.JSON(), nullable=True))
    op.create_table(
        "backend_nodes",
        sa.Column(
            "backend_id", sa.Integer(), sa.ForeignKey("backends.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("backend_nodes")
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("attempt_errors")
    with op.batch_alter_table("instances") as batch:
        batch.drop_column("node_state_since")
        batch.drop_column("node_state")
