"""Stored job events: reading them in id order, and following them as they are stored.

A follower (:meth:`Events.follow`) is woken at once by this process's writer; on
PostgreSQL, LISTEN/NOTIFY wakes it for every writer's commit; on SQLite, other
processes' commits are seen within ``poll_interval``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

from sqlalchemy import Row, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from synnefo_ganeti.jobs import EventKind, JobStatus
from synnefo_ganeti.store.backends._backends import Backends
from synnefo_ganeti.store.db._engine import NOTIFY_CHANNEL, Database
from synnefo_ganeti.store.db._writer import Writer
from synnefo_ganeti.store.jobs._jobs import events_t
from synnefo_ganeti.store.jobs._models import StoredEvent

__all__ = ["Events", "EventsSignal"]


class EventsSignal:
    """Set when job events were stored by any process (PostgreSQL's ``NOTIFY``); ``alive`` is
    False once the database dropped the listening connection (listen again)."""

    __slots__ = ("alive", "event")

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.alive = True

    def __repr__(self) -> str:
        return f"<EventsSignal set={self.event.is_set()} alive={self.alive}>"


class Events:
    """The events repository."""

    def __init__(self, db: Database, backends: Backends, writer: Writer, *, poll_interval: float) -> None:
        self.db = db
        self.backends = backends
        self.writer = writer
        self.poll_interval = poll_interval

    async def list_events(
        self,
        *,
        since: int | datetime = 0,
        backend: str | None = None,
        job_id: int | None = None,
        limit: int | None = 1000,
    ) -> list[StoredEvent]:
        backends = self.backends

        async def run(conn: AsyncConnection) -> list[StoredEvent]:
            # backend names from the cache; read again only for a name or an id it lacks
            # (follow() calls this on every wake-up)
            names = backends.names
            query = select(events_t).order_by(events_t.c.id)
            if isinstance(since, datetime):
                query = query.where(events_t.c.stored_at >= since)
            else:
                query = query.where(events_t.c.id > since)
            if backend is not None:
                if backend not in backends.ids:
                    names = await backends.read_names(conn)
                backend_id = backends.ids.get(backend)
                if backend_id is None:
                    return []
                query = query.where(events_t.c.backend_id == backend_id)
            if job_id is not None:
                query = query.where(events_t.c.job_id == job_id)
            if limit is not None:
                query = query.limit(limit)
            rows = (await conn.execute(query)).all()
            if any(row.backend_id not in names for row in rows):
                names = await backends.read_names(conn)
            return [_stored_event(row, names) for row in rows]

        return await self.db.read(run)

    async def follow(
        self,
        since: int | datetime = 0,
        *,
        backend: str | None = None,
        job_id: int | None = None,
        follow: bool = True,
    ) -> AsyncIterator[StoredEvent]:
        cursor: int | datetime = since
        async with contextlib.AsyncExitStack() as stack:
            notified: asyncio.Event | None = None
            if follow and self.db.dialect == "postgresql":
                notified = await stack.enter_async_context(self._listen())
            while True:
                wakeup = self.writer.wakeup
                if notified is not None:
                    notified.clear()
                batch = await self.list_events(since=cursor, backend=backend, job_id=job_id, limit=1000)
                for stored in batch:
                    yield stored
                if batch:
                    cursor = batch[-1].id
                    continue
                if isinstance(cursor, datetime):
                    cursor = await self._last_event_id_before(cursor)
                if not follow:
                    return
                waiters = [asyncio.ensure_future(wakeup.wait())]
                if notified is not None:
                    waiters.append(asyncio.ensure_future(notified.wait()))
                timeout = 30.0 if notified is not None else self.poll_interval
                try:
                    await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for waiter in waiters:
                        waiter.cancel()

    async def _last_event_id_before(self, when: datetime) -> int:
        async def run(conn: AsyncConnection) -> int:
            value = (
                await conn.execute(select(func.max(events_t.c.id)).where(events_t.c.stored_at < when))
            ).scalar()
            return int(value or 0)

        return await self.db.read(run)

    @contextlib.asynccontextmanager
    async def signal(self) -> AsyncIterator[EventsSignal | None]:
        """PostgreSQL: an :class:`EventsSignal` set by every commit that stores job events, of
        any process, while inside; SQLite: None (poll instead)."""
        if self.db.dialect != "postgresql":
            yield None
            return
        signal = EventsSignal()

        def on_notify(*_args: object) -> None:
            signal.event.set()

        def on_lost(*_args: object) -> None:
            signal.alive = False
            signal.event.set()

        async with self.db.listen(NOTIFY_CHANNEL, on_notify, on_lost=on_lost):
            yield signal

    @contextlib.asynccontextmanager
    async def _listen(self) -> AsyncIterator[asyncio.Event]:
        notified = asyncio.Event()

        def on_notify(*_args: object) -> None:
            notified.set()

        async with self.db.listen(NOTIFY_CHANNEL, on_notify):
            yield notified


def _stored_event(row: Row[Any], names: dict[int, str]) -> StoredEvent:
    return StoredEvent(
        id=row.id,
        backend=names.get(row.backend_id, str(row.backend_id)),
        job_id=row.job_id,
        seq=row.seq,
        kind=EventKind(row.kind),
        status=JobStatus(row.status),
        op_index=row.op_index,
        op_id=row.op_id,
        instance=row.instance,
        log_serial=row.log_serial,
        log_message=row.log_message,
        event_time=row.event_time,
        stored_at=row.stored_at,
    )
