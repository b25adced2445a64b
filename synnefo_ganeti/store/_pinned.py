"""A pinned read: several reads that see one snapshot of the database, taken up front.

The reconciler's pass needs its database snapshot taken before it asks any backend, and
reads each backend's rows while the backends answer (benchmarks/reconcile.py: the
answers take a second, the rows of 100,000 instances most of one). ``async with
store.pinned_read() as read:`` takes the snapshot on entering (the transaction's first
statement: SQLite's deferred ``BEGIN`` takes its read mark there, PostgreSQL's
``REPEATABLE READ`` its snapshot); each ``await read.call(fn)`` then runs ``fn(connection)``
in that transaction, one at a time. Nothing is written through it; leaving rolls back.

A SQLite file is read from a thread of the read's own, on a connection of its own: a long
read there takes no turns of the event loop, which a pass of 50 backends keeps busy (its
first backend's rows came 0.65 s late through the async engine's thread hops). PostgreSQL
reads on a connection of the async engine.

An in-memory SQLite database has one connection, which the writer needs too: no snapshot
is held there (``pinned`` is False) and each call is an ordinary read, so a caller that
needs the order (read first, then ask) waits for its read.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from sqlalchemy import select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection

from synnefo_ganeti.store.backends._backends import backends_t
from synnefo_ganeti.store.db._engine import Database

__all__ = ["PinnedRead", "pinned_read"]

T = TypeVar("T")

_PIN = select(backends_t.c.id).limit(1)  # any read of a table: SQLite's read mark is taken at the first


class PinnedRead:
    """Reads of one snapshot (see the module). ``pinned`` False: ordinary reads, no snapshot held."""

    def __init__(
        self,
        db: Database,
        *,
        conn: AsyncConnection | None = None,
        sync: tuple[Connection, ThreadPoolExecutor] | None = None,
    ) -> None:
        self._db = db
        self._conn = conn
        self._sync = sync
        self._lock = asyncio.Lock()  # one statement at a time on the one connection
        self.pinned = conn is not None or sync is not None

    def __repr__(self) -> str:
        return f"<PinnedRead {self._db.display_url} pinned={self.pinned}>"

    async def call(self, fn: Callable[[Connection], T]) -> T:
        """``fn(connection)`` in the pinned transaction; database trouble is a :class:`StoreError`.

        On a SQLite file ``fn`` runs in the read's thread (it may hand results to the event
        loop with ``loop.call_soon_threadsafe`` as it goes); else on the event loop."""
        if self._sync is not None:
            conn, executor = self._sync
            try:
                return await asyncio.get_running_loop().run_in_executor(executor, fn, conn)
            except (DBAPIError, OSError) as exc:
                raise self._db.error("cannot read from", exc) from None
        if self._conn is None:
            return await self._db.call_read(fn)
        async with self._lock:
            try:
                return await self._conn.run_sync(fn)
            except (DBAPIError, OSError) as exc:
                raise self._db.error("cannot read from", exc) from None


@contextlib.asynccontextmanager
async def pinned_read(db: Database) -> AsyncIterator[PinnedRead]:
    """Take the snapshot, yield its reads, roll back (see the module)."""
    if db.dialect == "sqlite":
        if db.in_memory:
            yield PinnedRead(db)
        else:
            async with _sqlite_file(db) as read:
                yield read
        return
    stack = contextlib.AsyncExitStack()
    for attempt in (1, 2):
        try:
            conn = await stack.enter_async_context(db.engine.connect())
            conn = await conn.execution_options(isolation_level="REPEATABLE READ")
            await conn.execute(_PIN)
            break
        except DBAPIError as exc:
            await stack.aclose()
            if attempt == 1 and exc.connection_invalidated:  # a pooled connection the server dropped
                continue
            raise db.error("cannot read from", exc) from None
        except OSError as exc:
            await stack.aclose()
            raise db.error("cannot read from", exc) from None
    async with stack:
        yield PinnedRead(db, conn=conn)


def _pin(engine: Engine) -> Connection:
    conn = engine.connect()
    try:
        conn.execute(_PIN)  # (the "begin" event's BEGIN first)
    except BaseException:
        conn.close()
        raise
    return conn


@contextlib.asynccontextmanager
async def _sqlite_file(db: Database) -> AsyncIterator[PinnedRead]:
    loop = asyncio.get_running_loop()
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-pinned-read")
    try:
        engine = db.make_sync_reader()
        try:
            try:
                conn = await loop.run_in_executor(executor, _pin, engine)
            except (SQLAlchemyError, OSError) as exc:
                raise db.error("cannot read from", exc) from None
            try:
                yield PinnedRead(db, sync=(conn, executor))
            finally:
                # queued behind any call still running in the thread (a cancelled caller's)
                await asyncio.shield(loop.run_in_executor(executor, conn.close))
        finally:
            await asyncio.shield(loop.run_in_executor(executor, engine.dispose))
    finally:
        executor.shutdown(wait=False)  # (what is queued still runs)
