"""node failures: an instance's node state, a request's failed attempts, the nodes of a backend

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28 09:45:00.000000

- ``instances.node_state`` / ``node_state_since``: None while the instance's primary node is up,
  "down" (Ganeti's ``ERROR_nodedown``) or "offline" (``ERROR_nodeoffline``), and since when.
- ``requests.attempt_errors``: every failed attempt of a request, kept when it is placed again.
- ``backend_nodes``: each backend's nodes as the dispatcher last read them (up, down, offline;
  since when; the first sign), for placement in other processes, ``backends show`` and the console.
- The change feed carries ``node_state``: ``changes.node_state`` (an instance's, after the
  change), and the instance triggers of 0005 written again so that a change of ``node_state``
  alone is a change row (downgrade writes 0005's back); ``ix_instances_node_state`` (partial:
  the rows whose node is not up, read apart by each reconcile pass).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: the writers' advisory lock key ("sgwr"; synnefo_ganeti.store.db._engine._WRITE_LOCK_KEY)
_WRITE_LOCK_KEY = 1936160626
_CHANNEL = "synnefo_ganeti_changes"
_SQLITE_NOW = "(julianday('now') - 2440587.5) * 86400.0"
_INSTANCE_TRIGGERS = ("changes_instances_insert", "changes_instances_update")
#: the few rows whose node is not up, which each reconcile pass reads (reconcile/_fetch.py)
_NODE_STATE_INDEX = "ix_instances_node_state"
_MARKED = "node_state IS NOT NULL"
#: 0005's request triggers on SQLite (written again after a downgrade copied their tables)
_SQLITE_REQUEST = (
    "INSERT INTO changes (kind, key, status, task, error, at) "
    f"VALUES ('request', NEW.id, NEW.status, NULL, NEW.error, {_SQLITE_NOW});"
)
_SQLITE_REQUEST_TRIGGERS = {
    "changes_requests_insert": f"CREATE TRIGGER changes_requests_insert AFTER INSERT ON requests "
    f"BEGIN {_SQLITE_REQUEST} END",
    "changes_requests_update": "CREATE TRIGGER changes_requests_update AFTER UPDATE OF status, error "
    "ON requests WHEN OLD.status IS NOT NEW.status OR OLD.error IS NOT NEW.error "
    f"BEGIN {_SQLITE_REQUEST} END",
}


def _sqlite_triggers(node_state: bool) -> list[str]:
    """The instance triggers of the change feed on SQLite: 0005's, or (``node_state``) 0010's."""
    columns = "kind, key, status, task, error, at" + (", node_state" if node_state else "")
    values = (
        "'instance', NEW.uuid, NEW.status, NEW.task, json_extract(NEW.last_error, '$.message'), "
        + _SQLITE_NOW
        + (", NEW.node_state" if node_state else "")
    )
    insert = f"INSERT INTO changes ({columns}) VALUES ({values});"
    of = "status, task, last_error" + (", node_state" if node_state else "")
    when = "OLD.status IS NOT NEW.status OR OLD.task IS NOT NEW.task OR OLD.last_error IS NOT NEW.last_error"
    if node_state:
        when += " OR OLD.node_state IS NOT NEW.node_state"
    return [
        f"CREATE TRIGGER changes_instances_insert AFTER INSERT ON instances BEGIN {insert} END",
        f"CREATE TRIGGER changes_instances_update AFTER UPDATE OF {of} ON instances WHEN {when} "
        f"BEGIN {insert} END",
    ]


def _pg_function(node_state: bool) -> str:
    """The change feed's trigger function on PostgreSQL: 0005's, or (``node_state``) 0010's."""
    columns = "kind, key, status, task, error, at" + (", node_state" if node_state else "")
    extra = ", NEW.node_state" if node_state else ""
    return f"""
CREATE OR REPLACE FUNCTION synnefo_ganeti_change() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    change_id bigint;
BEGIN
    -- commit order = id order: every writer holds this lock already (re-entrant)
    PERFORM pg_advisory_xact_lock(hashtext(current_database()), {_WRITE_LOCK_KEY});
    IF TG_TABLE_NAME = 'requests' THEN
        INSERT INTO changes (kind, key, status, task, error, at)
        VALUES ('request', NEW.id, NEW.status, NULL, NEW.error, extract(epoch FROM clock_timestamp()))
        RETURNING id INTO change_id;
    ELSE
        INSERT INTO changes ({columns})
        VALUES ('instance', NEW.uuid, NEW.status, NEW.task, NEW.last_error ->> 'message',
                extract(epoch FROM clock_timestamp()){extra})
        RETURNING id INTO change_id;
    END IF;
    PERFORM pg_notify('{_CHANNEL}', change_id::text);
    RETURN NULL;
END
$$
"""


def _pg_update_trigger(node_state: bool) -> str:
    of = "status, task, last_error" + (", node_state" if node_state else "")
    when = (
        "OLD.status IS DISTINCT FROM NEW.status OR OLD.task IS DISTINCT FROM NEW.task "
        "OR OLD.last_error::text IS DISTINCT FROM NEW.last_error::text"
    )
    if node_state:
        when += " OR OLD.node_state IS DISTINCT FROM NEW.node_state"
    return (
        f"CREATE TRIGGER changes_instances_update AFTER UPDATE OF {of} ON instances FOR EACH ROW "
        f"WHEN ({when}) EXECUTE FUNCTION synnefo_ganeti_change()"
    )


def _feed_triggers(node_state: bool) -> None:
    """Write the instance triggers of the change feed (0005's, or with ``node_state``)."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS changes_instances_update ON instances")
        op.execute(_pg_function(node_state))
        op.execute(_pg_update_trigger(node_state))
        return
    for trigger in _INSTANCE_TRIGGERS:
        op.execute(f"DROP TRIGGER IF EXISTS {trigger}")
    for statement in _sqlite_triggers(node_state):
        op.execute(statement)


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
    with op.batch_alter_table("changes") as batch:
        batch.add_column(sa.Column("node_state", sa.String(16), nullable=True))
    _feed_triggers(node_state=True)
    # (after the batch: SQLite's copy of a table would not keep the index's WHERE)
    op.create_index(
        _NODE_STATE_INDEX,
        "instances",
        ["backend_id"],
        postgresql_where=sa.text(_MARKED),
        sqlite_where=sa.text(_MARKED),
    )


def downgrade() -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    op.drop_index(_NODE_STATE_INDEX, table_name="instances")
    # no trigger may name a column dropped (PostgreSQL), nor a table SQLite copies to drop one
    # of its columns (its copy would lose them): 0005's are written again at the end
    dropped = _INSTANCE_TRIGGERS if postgresql else (*_INSTANCE_TRIGGERS, *_SQLITE_REQUEST_TRIGGERS)
    for trigger in dropped:
        op.execute(f"DROP TRIGGER IF EXISTS {trigger}" + (" ON instances" if postgresql else ""))
    with op.batch_alter_table("changes") as batch:
        batch.drop_column("node_state")
    op.drop_table("backend_nodes")
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("attempt_errors")
    with op.batch_alter_table("instances") as batch:
        batch.drop_column("node_state_since")
        batch.drop_column("node_state")
    if postgresql:
        op.execute(
            "CREATE TRIGGER changes_instances_insert AFTER INSERT ON instances "
            "FOR EACH ROW EXECUTE FUNCTION synnefo_ganeti_change()"
        )
    else:
        for statement in _SQLITE_REQUEST_TRIGGERS.values():
            op.execute(statement)
    _feed_triggers(node_state=False)
