"""names compared case-insensitively; why a request waits

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28 13:00:00.000000

- ``ix_instances_name_lower``: the instances by ``lower(name)``, which every name check asks
  (names are unique whatever their case: ``Web.example.org`` and ``web.example.org`` are one;
  the name is kept as given, as Ganeti keeps it).
- ``requests.waiting_reason``: why the dispatcher cannot place a pending request now
  (``Request.waiting_reason``; None once placed).
- The change feed carries it: ``changes.waiting_reason`` (a request's, after the change), and
  the request triggers written again so that a change of ``waiting_reason`` alone is a change
  row (downgrade writes 0010's back).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: the writers' advisory lock key ("sgwr"; synnefo_ganeti.store.db._engine._WRITE_LOCK_KEY)
_WRITE_LOCK_KEY = 1936160626
_CHANNEL = "synnefo_ganeti_changes"
_SQLITE_NOW = "(julianday('now') - 2440587.5) * 86400.0"
_NAME_INDEX = "ix_instances_name_lower"
_REQUEST_TRIGGERS = ("changes_requests_insert", "changes_requests_update")


def _sqlite_triggers(waiting: bool) -> list[str]:
    """The request triggers of the change feed on SQLite: 0005's, or (``waiting``) 0012's."""
    columns = "kind, key, status, task, error, at" + (", waiting_reason" if waiting else "")
    values = f"'request', NEW.id, NEW.status, NULL, NEW.error, {_SQLITE_NOW}" + (
        ", NEW.waiting_reason" if waiting else ""
    )
    insert = f"INSERT INTO changes ({columns}) VALUES ({values});"
    of = "status, error" + (", waiting_reason" if waiting else "")
    when = "OLD.status IS NOT NEW.status OR OLD.error IS NOT NEW.error"
    if waiting:
        when += " OR OLD.waiting_reason IS NOT NEW.waiting_reason"
    return [
        f"CREATE TRIGGER changes_requests_insert AFTER INSERT ON requests BEGIN {insert} END",
        f"CREATE TRIGGER changes_requests_update AFTER UPDATE OF {of} ON requests WHEN {when} "
        f"BEGIN {insert} END",
    ]


def _pg_function(waiting: bool) -> str:
    """The change feed's trigger function on PostgreSQL: 0010's, or (``waiting``) 0012's."""
    columns = "kind, key, status, task, error, at" + (", waiting_reason" if waiting else "")
    extra = ", NEW.waiting_reason" if waiting else ""
    return f"""
CREATE OR REPLACE FUNCTION synnefo_ganeti_change() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    change_id bigint;
BEGIN
    -- commit order = id order: every writer holds this lock already (re-entrant)
    PERFORM pg_advisory_xact_lock(hashtext(current_database()), {_WRITE_LOCK_KEY});
    IF TG_TABLE_NAME = 'requests' THEN
        INSERT INTO changes ({columns})
        VALUES ('request', NEW.id, NEW.status, NULL, NEW.error, extract(epoch FROM clock_timestamp()){extra})
        RETURNING id INTO change_id;
    ELSE
        INSERT INTO changes (kind, key, status, task, error, at, node_state)
        VALUES ('instance', NEW.uuid, NEW.status, NEW.task, NEW.last_error ->> 'message',
                extract(epoch FROM clock_timestamp()), NEW.node_state)
        RETURNING id INTO change_id;
    END IF;
    PERFORM pg_notify('{_CHANNEL}', change_id::text);
    RETURN NULL;
END
$$
"""


def _pg_update_trigger(waiting: bool) -> str:
    of = "status, error" + (", waiting_reason" if waiting else "")
    when = "OLD.status IS DISTINCT FROM NEW.status OR OLD.error IS DISTINCT FROM NEW.error"
    if waiting:
        when += " OR OLD.waiting_reason IS DISTINCT FROM NEW.waiting_reason"
    return (
        f"CREATE TRIGGER changes_requests_update AFTER UPDATE OF {of} ON requests FOR EACH ROW "
        f"WHEN ({when}) EXECUTE FUNCTION synnefo_ganeti_change()"
    )


def _feed_triggers(waiting: bool) -> None:
    """Write the request triggers of the change feed (0010's, or with ``waiting_reason``)."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS changes_requests_update ON requests")
        op.execute(_pg_function(waiting))
        op.execute(_pg_update_trigger(waiting))
        return
    for trigger in _REQUEST_TRIGGERS:
        op.execute(f"DROP TRIGGER IF EXISTS {trigger}")
    for statement in _sqlite_triggers(waiting):
        op.execute(statement)


def upgrade() -> None:
    # (no batch copy on SQLite: it would drop the change feed's triggers and partial indexes)
    op.add_column("requests", sa.Column("waiting_reason", sa.Text(), nullable=True))
    op.add_column("changes", sa.Column("waiting_reason", sa.Text(), nullable=True))
    _feed_triggers(waiting=True)
    op.create_index(_NAME_INDEX, "instances", [sa.text("lower(name)")])


def downgrade() -> None:
    op.drop_index(_NAME_INDEX, table_name="instances")
    postgresql = op.get_bind().dialect.name == "postgresql"
    # no trigger may name a column dropped: 0010's are written back before the columns go
    if postgresql:
        op.execute("DROP TRIGGER IF EXISTS changes_requests_update ON requests")
        op.execute(_pg_function(False))
        op.execute(_pg_update_trigger(False))
    else:
        for trigger in _REQUEST_TRIGGERS:
            op.execute(f"DROP TRIGGER IF EXISTS {trigger}")
    # SQLite 3.35+ drops a column with no index or constraint in place (no copy of the table)
    op.execute("ALTER TABLE changes DROP COLUMN waiting_reason")
    op.execute("ALTER TABLE requests DROP COLUMN waiting_reason")
    if not postgresql:
        for statement in _sqlite_triggers(False):
            op.execute(statement)
