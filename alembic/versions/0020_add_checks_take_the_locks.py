"""the new requests' checks take their locks in the same statement (PostgreSQL)

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-30 03:45:00.000000

A batch of new requests locked its ids and names (``lock_keys``: one statement) and then read its
checks (``synnefo_ganeti_add_checks``, migration 0018: a second statement): two round trips of
every API transaction, each a statement's work in the API's process too (issue 31).

- ``synnefo_ganeti_add_checks_locking(ids, names, keys)`` takes the advisory lock of each of
  ``keys`` first, as ``lock_keys`` does (one statement, in the array's order: the caller sorts
  them), then returns what ``synnefo_ganeti_add_checks(ids, names)`` returns, read in a statement
  of its own. The function is VOLATILE: each statement in it takes a new snapshot (READ
  COMMITTED), so the checks see what a transaction that held one of these locks committed before
  it let the lock go, as the second statement did before.

0018's function stays (this one calls it: its kept generic plan is the one read).
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FUNCTION = """
CREATE OR REPLACE FUNCTION synnefo_ganeti_add_checks_locking(ids text[], names text[], keys text[])
RETURNS TABLE (c_kind text, c_id varchar, c_name varchar, c_status varchar, c_params json)
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    -- the locks first (synnefo_ganeti.store.db._locks.lock_keys: the same statement), the checks
    -- after, in a statement of their own: a new snapshot, taken once the locks are held
    PERFORM count(pg_advisory_xact_lock(hashtext(current_database()), hashtext(k)))
    FROM unnest(keys) WITH ORDINALITY AS t(k, i);
    RETURN QUERY SELECT * FROM synnefo_ganeti_add_checks(ids, names);
END
$$
"""


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(_FUNCTION)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP FUNCTION IF EXISTS synnefo_ganeti_add_checks_locking(text[], text[], text[])")
