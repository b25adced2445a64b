"""Recorded jobs whose end is not applied yet: the query that finds them, and the signal
that a job was just recorded.

Every job recorded against an instance (an ``instance_jobs`` row, written by any process:
a cloud API, the CLI, a dispatcher) must be followed to its end. On a backend whose queue
directory the dispatcher watches, the watcher sees every job anyway; on the others the
dispatcher follows them through RAPI, so it must learn of each one quickly:

* PostgreSQL: the recording transaction sends ``NOTIFY synnefo_ganeti_jobs, '<backend>'``
  (:func:`notify_job_recorded`, inside the writer's transaction: delivered at commit, never
  for a transaction rolled back); :func:`listen_jobs` LISTENs on a connection of its own,
  which only listens (it never writes);
* SQLite has no notification across processes: the dispatcher polls
  :func:`unapplied_jobs` every ``poll_interval``.

Either way the query is the truth, the signal only says when to run it: a notification
lost (the listening connection dropped by a database restart) delays a job until the next
safety poll, it never loses it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import Table, select, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection

from synnefo_ganeti.store.backends._rows import Backend
from synnefo_ganeti.store.db._engine import Database
from synnefo_ganeti.store.instances._rows import InstanceJob

__all__ = ["JOBS_CHANNEL", "JobSignal", "listen_jobs", "notify_job_recorded", "unapplied_jobs"]

#: the PostgreSQL channel a recorded job is announced on (the payload: the backend's name)
JOBS_CHANNEL = "synnefo_ganeti_jobs"

_NOTIFY = text("SELECT pg_notify(:channel, :backend)")

_jobs_t = cast(Table, InstanceJob.__table__)
_backends_t = cast(Table, Backend.__table__)


def notify_job_recorded(conn: Connection, backend: str) -> None:
    """Announce, at commit, that a job of ``backend`` was recorded (PostgreSQL; else nothing)."""
    if conn.dialect.name == "postgresql":
        conn.execute(_NOTIFY, {"channel": JOBS_CHANNEL, "backend": backend})


async def unapplied_jobs(db: Database, backends: Iterable[str] | None = None) -> dict[str, list[int]]:
    """Backend name -> the ids of its recorded jobs whose end is not applied (oldest first);
    only ``backends`` when given (backends without such jobs are left out)."""
    names = None if backends is None else sorted(set(backends))
    if names == []:
        return {}

    async def run(conn: AsyncConnection) -> dict[str, list[int]]:
        query = (
            select(_backends_t.c.name, _jobs_t.c.job_id)
            .join(_backends_t, _backends_t.c.id == _jobs_t.c.backend_id)
            .where(_jobs_t.c.applied_at.is_(None))
            .order_by(_jobs_t.c.backend_id, _jobs_t.c.job_id)
        )
        if names is not None:
            query = query.where(_backends_t.c.name.in_(names))
        found: dict[str, list[int]] = {}
        for row in await conn.execute(query):
            found.setdefault(row.name, []).append(int(row.job_id))
        return found

    return await db.read(run)


@dataclass(slots=True)
class JobSignal:
    """Set when a job was recorded (by any process), with the backends named since the last
    :meth:`clear`; :attr:`alive` turns False when the listening connection is lost."""

    event: asyncio.Event = field(default_factory=asyncio.Event)
    backends: set[str] = field(default_factory=set)
    alive: bool = True

    def clear(self) -> set[str]:
        """The backends announced so far; forgets them and clears :attr:`event`."""
        self.event.clear()
        backends, self.backends = self.backends, set()
        return backends


@contextlib.asynccontextmanager
async def listen_jobs(db: Database) -> AsyncIterator[JobSignal | None]:
    """PostgreSQL: a :class:`JobSignal` set by every job recorded while inside; SQLite: None
    (poll instead). Raises what connecting raises (the caller polls meanwhile)."""
    if db.dialect != "postgresql":
        yield None
        return
    signal = JobSignal()

    def on_notify(*args: Any) -> None:  # (connection, pid, channel, payload)
        if len(args) >= 4 and isinstance(args[3], str):
            signal.backends.add(args[3])
        signal.event.set()

    def on_lost(*_args: Any) -> None:
        signal.alive = False
        signal.event.set()

    async with db.listen(JOBS_CHANNEL, on_notify, on_lost=on_lost):
        yield signal
