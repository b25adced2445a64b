"""the change feed without the writers' global lock (PostgreSQL)

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-28 23:00:00.000000

Until 0014 every transaction that wrote a change row took one exclusive advisory lock, so that
change ids committed in id order: every writer of the API and of every dispatcher waited for
each other (issue 31). From 0015 (PostgreSQL only; SQLite's writes are serial anyway):

- ``synnefo_ganeti_change()`` (the triggers on ``requests`` and ``instances``) no longer takes
  that lock, and NOTIFYs with an empty payload: PostgreSQL delivers the identical notifications
  of one transaction once, so a transaction that writes ten changes wakes each listener once, not
  ten times (nothing read the id in the payload: readers read the table).
- ``changes_in_order`` (BEFORE INSERT on ``changes``, every insert whatever its path: the
  triggers, an incident's row) takes the *feed writers'* advisory lock in shared mode (writers
  never wait for each other: shared locks do not conflict), and only then gives the row its id
  from ``changes_id_seq``. So every id the sequence has handed out belongs to a transaction
  that held that lock before it took the id.
- ``synnefo_ganeti_feed_horizon()`` returns the sequence's last value, then (read after it)
  the transactions holding that lock now. Once none of those is still running, every id up to
  that value is final: committed, and visible to any later snapshot, or rolled back for good.
  The feed's readers deliver no id above that ("the horizon"), so that no reader ever moves
  past an id that commits later (``store/changes/_horizon.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: the writers' global lock key of 0005-0014 ("sgwr")
_WRITE_LOCK_KEY = 1936160626
#: the feed writers' lock key ("sgfd"; synnefo_ganeti.store.changes._horizon.FEED_LOCK_KEY),
#: taken shared by each transaction that writes a change row
_FEED_LOCK_KEY = 1936156260
_CHANNEL = "synnefo_ganeti_changes"


def _change_function(locked: bool) -> str:
    """The change triggers' function: 0012's (``locked``), or 0015's (no global lock)."""
    lock = (
        "    -- commit order = id order: every writer holds this lock already (re-entrant)\n"
        f"    PERFORM pg_advisory_xact_lock(hashtext(current_database()), {_WRITE_LOCK_KEY});\n"
        if locked
        else ""
    )
    # 0015: one NOTIFY a transaction, not one a change: PostgreSQL delivers identical
    # notifications of one transaction once (the readers never used the id; they read the table)
    notify = "change_id::text" if locked else "''"
    return f"""
CREATE OR REPLACE FUNCTION synnefo_ganeti_change() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    change_id bigint;
BEGIN
{lock}    IF TG_TABLE_NAME = 'requests' THEN
        INSERT INTO changes (kind, key, status, task, error, at, waiting_reason)
        VALUES ('request', NEW.id, NEW.status, NULL, NEW.error, extract(epoch FROM clock_timestamp()),
                NEW.waiting_reason)
        RETURNING id INTO change_id;
    ELSE
        INSERT INTO changes (kind, key, status, task, error, at, node_state)
        VALUES ('instance', NEW.uuid, NEW.status, NEW.task, NEW.last_error ->> 'message',
                extract(epoch FROM clock_timestamp()), NEW.node_state)
        RETURNING id INTO change_id;
    END IF;
    PERFORM pg_notify('{_CHANNEL}', {notify});
    RETURN NULL;
END
$$
"""


_IN_ORDER = f"""
CREATE OR REPLACE FUNCTION synnefo_ganeti_change_id() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- the lock first, the id after: a reader that sees this transaction's lock gone knows
    -- every id it took is final (see synnefo_ganeti_feed_horizon)
    PERFORM pg_advisory_xact_lock_shared(hashtext(current_database()), {_FEED_LOCK_KEY});
    NEW.id := nextval(pg_get_serial_sequence('changes', 'id'));
    RETURN NEW;
END
$$
"""

_HORIZON = f"""
CREATE OR REPLACE FUNCTION synnefo_ganeti_feed_horizon(OUT last_id bigint, OUT writers text[])
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- the sequence first, the lock holders after (two statements, in this order): an id up to
    -- last_id was taken by a transaction that held the lock before this read of the holders
    EXECUTE 'SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM '
        || pg_get_serial_sequence('changes', 'id') INTO last_id;
    SELECT coalesce(array_agg(l.virtualtransaction), ARRAY[]::text[]) INTO writers
    FROM pg_locks l
    WHERE l.locktype = 'advisory'
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid::bigint = (hashtext(current_database())::bigint & 4294967295)
      AND l.objid::bigint = {_FEED_LOCK_KEY}
      AND l.objsubid = 2
      AND l.granted;
END
$$
"""


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(_change_function(locked=False))
    op.execute(_IN_ORDER)
    op.execute(
        "CREATE TRIGGER changes_in_order BEFORE INSERT ON changes FOR EACH ROW "
        "EXECUTE FUNCTION synnefo_ganeti_change_id()"
    )
    op.execute(_HORIZON)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP FUNCTION IF EXISTS synnefo_ganeti_feed_horizon()")
    op.execute("DROP TRIGGER IF EXISTS changes_in_order ON changes")
    op.execute("DROP FUNCTION IF EXISTS synnefo_ganeti_change_id()")
    op.execute(_change_function(locked=True))
