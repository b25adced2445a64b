"""Keyed transaction locks on PostgreSQL: what replaces the writers' one global lock where a write
needs to exclude only the writes of the same thing (a name, a request id, a backend's jobs).

:func:`lock_keys` takes ``pg_advisory_xact_lock`` on ``(database, hashtext(key))`` for
each key, in one statement and in sorted order (two transactions that lock overlapping sets
cannot deadlock on them), held until the transaction ends. Re-entrant within a transaction.
Two keys whose hashes collide only wait for each other: a lock, never a wrong answer. SQLite
needs none (its writes are serial); :func:`lock_keys` does nothing there.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Connection, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import Text

__all__ = ["lock_keys"]

_LOCK = text(
    "SELECT count(pg_advisory_xact_lock(hashtext(current_database()), hashtext(k))) "
    "FROM unnest(CAST(:keys AS text[])) WITH ORDINALITY AS t(k, i)"
).bindparams(bindparam("keys", type_=ARRAY(Text)))


def lock_keys(conn: Connection, keys: Iterable[str]) -> None:
    """Lock each of ``keys`` (``namespace:key``: ``name:web1.example.org``, ``request:ID``,
    ``jobs:BACKEND-ID``) until the transaction ends (PostgreSQL)."""
    if conn.dialect.name != "postgresql":
        return
    wanted = sorted(set(keys))
    if wanted:
        conn.execute(_LOCK, {"keys": wanted})
