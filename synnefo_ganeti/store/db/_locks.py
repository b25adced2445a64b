"""Keyed transaction locks on PostgreSQL: what replaces the writers' one global lock where a write
needs to exclude only the writes of the same thing (a name, a request id, a backend's jobs).

:func:`lock_keys` takes ``pg_advisory_xact_lock`` on ``(database, hashtext(key))`` for
each key, in one statement and in sorted order (two transactions that lock overlapping sets
cannot deadlock on them), held until the transaction ends. Re-entrant within a transaction.
Two keys whose hashes collide only wait for each other: a lock, never a wrong answer. SQLite
needs none (its writes are serial); :func:`lock_keys` does nothing there.

Who locks what (the writers' lock: ``store/db/_engine.py`` ``begin_write``):

* a new request, no writers' lock: ``request:ID`` and ``name:NAME`` (its checks, migration 0020);
* a placement, the writers' lock shared: ``name:NAME`` where names are checked
  (``unique_names``) off its fast path, and ``jobs:BACKEND`` when it drops the unapplied jobs of
  a row it takes over or of the name's previous life (a request placed is its name's one open
  holder, which the API's checks keep so; the unique index of live rows does the rest);
* a submit record, shared: ``job:BACKEND:JOB``, before it reads whether the job's end is stored;
* a batch of job versions, shared: ``jobs:BACKEND`` and ``job:BACKEND:JOB`` of each of its jobs,
  in one statement, before it reads the jobs stored and the recorded jobs it applies ends to;
* every other write (those that read and then decide: an instance's action, a request's end or
  cancel, the reconciler's repairs), the writers' lock exclusive: it waits for all the above.

A transaction that takes keys in two statements (a writer's group of calls: a submit record,
then a placement that drops old jobs) can meet another in a cycle only on one job or backend;
PostgreSQL then ends one of them (``deadlock detected``), and the writer runs its calls again.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Connection, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import Text

__all__ = ["job_key", "jobs_key", "lock_keys"]

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


def job_key(backend_id: int, job_id: int) -> str:
    """The key of one job of a backend: its submit record and the batch that stores its end
    lock it, so the second of them sees what the first wrote (a job's end is applied once)."""
    return f"job:{backend_id}:{job_id}"


def jobs_key(backend_id: int) -> str:
    """The key of a backend's jobs as a whole: two batches of its job versions one at a time,
    and a placement that drops the unapplied jobs of a row against them."""
    return f"jobs:{backend_id}"
