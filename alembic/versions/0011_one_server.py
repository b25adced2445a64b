"""one server from request to delete: an instance's request, a delete waiting to follow

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28 12:45:00.000000

- ``instances.request_id``: the durable request that made the instance (``StoredInstance.request_id``),
  None for instances made by ``create_instance`` or adopted; filled from ``requests.instance_uuid``.
- ``instances.delete_requested_at``: a delete asked while the instance's create or another action
  ran; the delete follows as soon as it ends (``ControlPlane.delete_instance`` never waits).
- ``ix_instances_delete_requested`` (partial): the rows with a delete waiting.
- ``ix_requests_instance_uuid``: a request by its instance's id (given at once when the request is
  written: ``Request.instance_id``), which every look of an instance by id may need.
- ``requests.instance_uuid`` of the requests still open without one gets a new id (each open
  request has its instance's id from now on).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("instances", sa.Column("request_id", sa.String(length=36), nullable=True))
    op.add_column("instances", sa.Column("delete_requested_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_requests_instance_uuid", "requests", ["instance_uuid"])
    # the few rows with a delete waiting, read by every follower pass (a scan of every instance
    # several times a second otherwise)
    op.create_index(
        "ix_instances_delete_requested",
        "instances",
        ["delete_requested_at"],
        postgresql_where=sa.text("delete_requested_at IS NOT NULL"),
        sqlite_where=sa.text("delete_requested_at IS NOT NULL"),
    )
    bind = op.get_bind()
    bind.execute(
        sa.text(
            "UPDATE instances SET request_id = "
            "(SELECT requests.id FROM requests WHERE requests.instance_uuid = instances.uuid) "
            "WHERE EXISTS (SELECT 1 FROM requests WHERE requests.instance_uuid = instances.uuid)"
        )
    )
    open_ids = [
        row[0]
        for row in bind.execute(
            sa.text(
                "SELECT id FROM requests WHERE instance_uuid IS NULL AND status IN ('pending', 'submitted')"
            )
        )
    ]
    for request_id in open_ids:
        bind.execute(
            sa.text("UPDATE requests SET instance_uuid = :u WHERE id = :i"),
            {"u": str(uuid.uuid4()), "i": request_id},
        )


def downgrade() -> None:
    op.drop_index("ix_instances_delete_requested", table_name="instances")
    op.drop_index("ix_requests_instance_uuid", table_name="requests")
    # (no batch copy on SQLite: it would drop the change feed's triggers and partial indexes;
    # SQLite 3.35+ drops a column with no index or constraint in place)
    op.execute("ALTER TABLE instances DROP COLUMN delete_requested_at")
    op.execute("ALTER TABLE instances DROP COLUMN request_id")
