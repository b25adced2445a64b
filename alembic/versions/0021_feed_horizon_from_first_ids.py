"""the change feed's horizon from each writer's first id: readers no longer wait for writers (PostgreSQL)

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-30 17:30:00.000000

Until 0021 a reader of the change feed (0015's ``synnefo_ganeti_feed_horizon()``) learned the
sequence's last value ``L`` and which transactions were writing change rows, and then polled
``pg_locks`` (1, 2, 5, 10, 20 ms apart) until every one of them had ended: only then was every id
up to ``L`` final. In a burst some writer is always running, so a read took about three looks at
``pg_locks`` (933 in a two-dispatcher ``benchmarks/burst.py`` of 2,000 requests, 0.3 ms of the
server's CPU each), and waited for them (issue 31).

From 0021 each writer says where its ids begin, so a reader need not wait for it:

- ``synnefo_ganeti_change_id()`` (BEFORE INSERT on ``changes``) still takes the feed writers' lock
  (shared) before the id, and then, at the transaction's first change row only, also locks that
  id itself: ``pg_advisory_xact_lock_shared(id)`` (the one-``bigint`` form: ``objsubid`` 1 in
  ``pg_locks``, the id's two halves in ``classid`` and ``objid``). The transaction-local setting
  ``synnefo_ganeti.first_change`` remembers that it did. A savepoint rolled back takes the lock,
  the setting and its ids back together, and the next change row locks its own id again.
  Every id a transaction takes after its first is higher, so the running writers' lowest first
  id bounds every id still uncommitted.
- ``synnefo_ganeti_feed_safe_id()`` returns ``safe_id``: the sequence's last value, read first,
  or one below the lowest first id of the writers running (read after it, in one look at
  ``pg_locks``), whichever is lower; and ``waiting``: the writers that hold the feed lock and no id
  lock yet. Such a writer is between its ``nextval`` and its id's lock (one trigger call), and may
  hold an id up to ``safe_id``: the reader looks again after a millisecond. Otherwise every id up
  to ``safe_id`` is final (committed and visible to any later snapshot, or rolled back for good).

0015's horizon function stays: a dispatcher of the previous version still reads it, and it is
still right (the feed lock is taken as before).

The first id's lock is in the one-``bigint`` advisory key space of the store's database, which
no other lock of the store uses (they are all the two-integer form). Software that took an
exclusive one-``bigint`` advisory lock in the same database would make the writer of that change
id wait for it: the store's database is its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: the feed writers' lock key ("sgfd"; 0015, synnefo_ganeti.store.changes._horizon.FEED_LOCK_KEY)
_FEED_LOCK_KEY = 1936156260
#: the transaction-local setting that says the transaction's first change id is locked
_FIRST = "synnefo_ganeti.first_change"


def _change_id(nextval: str, *, first_locked: bool) -> str:
    first = (
        f"""    -- the transaction's first id, locked as itself: readers deliver nothing from it on
    -- while this transaction runs (synnefo_ganeti_feed_safe_id); its later ids are higher
    IF coalesce(current_setting('{_FIRST}', true), '') = '' THEN
        PERFORM pg_advisory_xact_lock_shared(NEW.id);
        PERFORM set_config('{_FIRST}', NEW.id::text, true);
    END IF;
"""
        if first_locked
        else ""
    )
    return f"""
CREATE OR REPLACE FUNCTION synnefo_ganeti_change_id() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- the lock first, the id after: a reader that sees this transaction's lock gone knows
    -- every id it took is final (see synnefo_ganeti_feed_horizon)
    PERFORM pg_advisory_xact_lock_shared(hashtext(current_database()), {_FEED_LOCK_KEY});
    NEW.id := {nextval};
{first}    RETURN NEW;
END
$$
"""


def _safe_id(sequence: str) -> str:
    return f"""
CREATE OR REPLACE FUNCTION synnefo_ganeti_feed_safe_id(OUT safe_id bigint, OUT waiting text[])
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    last_id bigint;
    lowest_first bigint;
BEGIN
    -- the sequence first, the locks after (two statements, in this order): an id up to last_id
    -- was taken by a transaction that held the feed lock before this look at the locks
    SELECT CASE WHEN is_called THEN last_value ELSE 0 END INTO last_id FROM {sequence};
    WITH held AS (  -- (one look at pg_locks: a CTE read twice is read once)
        SELECT l.virtualtransaction, l.classid, l.objid, l.objsubid
        FROM pg_locks l
        WHERE l.locktype = 'advisory'
          AND l.granted
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
    ), writers AS (
        SELECT h.virtualtransaction FROM held h
        WHERE h.objsubid = 2
          AND h.classid::bigint = (hashtext(current_database())::bigint & 4294967295)
          AND h.objid::bigint = {_FEED_LOCK_KEY}
    ), firsts AS (
        SELECT h.virtualtransaction, min((h.classid::bigint << 32) | h.objid::bigint) AS first_id
        FROM held h JOIN writers w USING (virtualtransaction)
        WHERE h.objsubid = 1
        GROUP BY h.virtualtransaction
    )
    SELECT min(f.first_id),
           coalesce(array_agg(w.virtualtransaction) FILTER (WHERE f.first_id IS NULL), ARRAY[]::text[])
    INTO lowest_first, waiting
    FROM writers w LEFT JOIN firsts f USING (virtualtransaction);
    safe_id := least(last_id, lowest_first - 1);  -- (least ignores a NULL: no writer)
END
$$
"""


def _quoted(identifier: str) -> str:
    return "'" + identifier.replace("'", "''") + "'"


def _sequence() -> str:
    # (schema-qualified and quoted as PostgreSQL needs it: 'public.changes_id_seq'; as 0019)
    return str(op.get_bind().execute(sa.text("SELECT pg_get_serial_sequence('changes', 'id')")).scalar_one())


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    sequence = _sequence()
    op.execute(_change_id(f"nextval({_quoted(sequence)}::regclass)", first_locked=True))
    op.execute(_safe_id(sequence))


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP FUNCTION IF EXISTS synnefo_ganeti_feed_safe_id()")
    op.execute(_change_id(f"nextval({_quoted(_sequence())}::regclass)", first_locked=False))
