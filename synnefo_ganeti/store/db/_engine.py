"""The database engine: URLs to engines, SQLite's WAL switch and write lock, PostgreSQL's advisory
locks of the writers, the schema check on open, and :func:`upgrade_database`.

:class:`Database` owns the async engine (readers, PostgreSQL writes) and, for a SQLite
file, the writer's synchronous engine and its one thread. Everything else in the store
reaches the database through it: :meth:`Database.read` for reads (database trouble
becomes a :class:`StoreError`), :meth:`Database.run_transaction` for the writer's
write transactions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import orjson
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool

from synnefo_ganeti.errors import StoreError
from synnefo_ganeti.store.db import _migrate
from synnefo_ganeti.store.db._batch import Batched, Outcome, grouped
from synnefo_ganeti.store.db._types import connection_class
from synnefo_ganeti.store.db._urls import display_url, normalize_url

__all__ = ["NOTIFY_CHANNEL", "Database", "reason", "upgrade_database"]

log = logging.getLogger("synnefo_ganeti.store")

T = TypeVar("T")

NOTIFY_CHANNEL = "synnefo_ganeti_events"
# the writers' advisory lock: "sgwr" after the database's own name hashed (advisory locks are the
# whole server's: the name keeps stores of different databases on one server out of each other's way)
_WRITE_LOCK_KEY = int.from_bytes(b"sgwr", "big")
_WRITE_LOCK = text("SELECT pg_advisory_xact_lock(hashtext(current_database()), :key)")
_WRITE_LOCK_SHARED = text("SELECT pg_advisory_xact_lock_shared(hashtext(current_database()), :key)")

_JSON_OPTIONS: dict[str, Any] = {
    "json_serializer": lambda value: orjson.dumps(value).decode(),
    "json_deserializer": orjson.loads,
}


def reason(exc: BaseException) -> str:
    """A one-line reason from a database error, without the SQL or its parameters."""
    original = getattr(exc, "orig", None) or exc
    message = str(original).strip().splitlines()[0] if str(original).strip() else ""
    return f"{type(original).__name__}: {message[:200]}" if message else type(original).__name__


def is_deadlock(exc: BaseException) -> bool:
    """PostgreSQL ended the transaction to break a cycle of lock waits (SQLSTATE 40P01): nothing
    of it was written, and running it again goes through (``store/db/_locks.py``)."""
    original = getattr(exc, "orig", None)
    for candidate in (original, getattr(original, "__cause__", None)):
        if getattr(candidate, "sqlstate", None) == "40P01":
            return True
    return False


#: how long closing waits for connects cut off midway (twice: a connect, then its close)
_ABANDONED_WAIT = 5.0


class Database:
    """The engines of one database URL, and what the store needs to know about its dialect."""

    def __init__(self, url: str | URL, *, create: bool = True, busy_timeout: float = 30.0) -> None:
        self.url = normalize_url(url)
        self.display_url = display_url(self.url)
        self.dialect = "sqlite" if self.url.drivername.startswith("sqlite") else "postgresql"
        self.create = create
        self.busy_timeout = busy_timeout
        self.async_engine: AsyncEngine | None = None
        #: SQLite files: the writer's own synchronous engine, used from its one thread
        self.sync_engine: Engine | None = None
        self.sync_executor: ThreadPoolExecutor | None = None
        #: connects whose caller was cancelled meanwhile, and the closes of what they made
        self._abandoned: set[asyncio.Future[Any]] = set()
        #: SQLite: every driver connection the async engine opened (closed by :meth:`close`)
        self._drivers: weakref.WeakSet[Any] = weakref.WeakSet()

    @property
    def engine(self) -> AsyncEngine:
        if self.async_engine is None:
            raise RuntimeError("the store is not open: use 'async with Store(url) as store'")
        return self.async_engine

    @property
    def in_memory(self) -> bool:
        return self.url.database in (None, "", ":memory:")

    # -- engines -----------------------------------------------------------------------------------

    def make_engine(self) -> AsyncEngine:
        if self.dialect == "sqlite":
            engine = create_async_engine(
                self.url,
                connect_args={"timeout": self.busy_timeout},
                poolclass=StaticPool if self.in_memory else None,
                **_JSON_OPTIONS,
            )
            self._sqlite_events(engine.sync_engine)
            event.listen(engine.sync_engine, "connect", self._opened)
            return engine
        types = connection_class()  # asyncpg asks about built-in types once per process (._types)
        return create_async_engine(
            self.url,
            pool_size=5,
            max_overflow=5,
            # no ping at each checkout (a round trip per read and per write): a connection the
            # server dropped is found by using it, and the read or write is tried again (above)
            connect_args={"timeout": self.busy_timeout, "command_timeout": 300, "connection_class": types},
            **_JSON_OPTIONS,
        )

    def _make_sync_writer(self) -> None:
        """A SQLite file gets a synchronous engine for the writer (see :meth:`run_transaction`);
        an in-memory database has one connection, the async engine's."""
        if self.dialect != "sqlite" or self.in_memory:
            return
        self.sync_engine = self._sync_engine()
        self.sync_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-writer")

    def make_sync_reader(self) -> Engine:
        """A SQLite file: a synchronous engine of one connection for reads from a thread of
        their own (a pinned read, :mod:`._pinned`); its owner disposes of it."""
        assert self.dialect == "sqlite" and not self.in_memory
        return self._sync_engine()

    def _sync_engine(self) -> Engine:
        """A synchronous engine of one connection on the SQLite file, used from one thread."""
        engine = create_engine(
            self.url.set(drivername="sqlite+pysqlite"),
            connect_args={"timeout": self.busy_timeout, "check_same_thread": False},
            pool_size=1,
            max_overflow=0,
            **_JSON_OPTIONS,
        )
        self._sqlite_events(engine)
        return engine

    def _sqlite_events(self, engine: Engine) -> None:
        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            # Transactions are ours to begin (below), not the sqlite3 module's.
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
            cursor.execute("PRAGMA journal_mode=WAL")  # a no-op: open() converted the file already
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _on_begin(connection: Any) -> None:
            # The writer takes the write lock up front, so that what it reads stays true
            # until it commits; readers take none.
            immediate = connection.get_execution_options().get("sqlite_immediate", False)
            connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    # -- opening and closing -----------------------------------------------------------------------

    async def open(self) -> None:
        if self.dialect == "sqlite":
            self.check_sqlite_folder()
            if not self.in_memory:
                await asyncio.to_thread(
                    _sqlite_to_wal, str(self.url.database), self.busy_timeout, self.display_url
                )
        engine = self.async_engine = self.make_engine()
        try:
            await self._check_schema()
        except BaseException:
            await engine.dispose()
            if self.async_engine is engine:
                self.async_engine = None
            raise
        self._make_sync_writer()

    async def close(self) -> None:
        if self._abandoned:  # cut-off connects finish and are closed before the engine goes
            await asyncio.wait(set(self._abandoned), timeout=_ABANDONED_WAIT)
            if self._abandoned:  # (their connection, once made, is closed all the same)
                await asyncio.wait(set(self._abandoned), timeout=_ABANDONED_WAIT)
        if self.sync_engine is not None and self.sync_executor is not None:
            # after the transaction the thread may still be in (its writer task was cancelled)
            await asyncio.get_running_loop().run_in_executor(self.sync_executor, self.sync_engine.dispose)
            self.sync_executor.shutdown()
            self.sync_engine = self.sync_executor = None
        if self.async_engine is not None:
            await self.async_engine.dispose()
            self.async_engine = None
        # dispose() closes the pooled connections only: one a cancelled task still held (cut
        # off mid-read as a daemon stopped) would be left to the garbage collector; the store
        # closes every connection it opened (aiosqlite's close is a no-op on a closed one)
        for driver in list(self._drivers):
            with contextlib.suppress(Exception):
                await driver.close()
        self._drivers.clear()

    def _opened(self, dbapi_connection: Any, _record: Any) -> None:
        driver = getattr(dbapi_connection, "driver_connection", None)
        if driver is not None:
            self._drivers.add(driver)

    def check_sqlite_folder(self) -> None:
        if self.in_memory:
            return
        parent = os.path.dirname(os.path.abspath(os.path.expanduser(self.url.database or "")))
        if not os.path.isdir(parent):
            raise StoreError(
                f"cannot open database {self.display_url}: folder {parent} does not exist",
                url=self.display_url,
            )

    async def _check_schema(self) -> None:
        try:
            current = await _migrate.current_revision(self.engine)
        except (SQLAlchemyError, OSError) as exc:
            raise self.error("cannot open", exc) from None
        head = _migrate.head_revision()
        if current == head:
            return
        if current is None and self.create:
            log.info("creating the schema in %s", self.display_url)
            try:
                await _migrate.upgrade(self.engine)
            except (SQLAlchemyError, OSError) as exc:
                # another process may have created it at the same moment (SQLite: "table ... already
                # exists"): what counts is that the schema is there now
                with contextlib.suppress(SQLAlchemyError, OSError):
                    if await _migrate.current_revision(self.engine) == head:
                        return
                raise self.error("cannot create the schema in", exc) from None
            return
        if current is None:
            raise StoreError(
                f"database {self.display_url} has no synnefo-ganeti tables; run "
                f"'synnefo-ganeti db upgrade --db URL' first",
                url=self.display_url,
            )
        raise StoreError(
            f"database {self.display_url} is at schema revision {current}, this version of "
            f"synnefo-ganeti needs {head}; run 'synnefo-ganeti db upgrade --db URL'"
            " (or install the version that made it)",
            url=self.display_url,
        )

    # -- errors --------------------------------------------------------------------------------------

    def error(self, what: str, exc: BaseException) -> StoreError:
        return StoreError(f"{what} database {self.display_url}: {reason(exc)}", url=self.display_url)

    def is_locked(self, exc: BaseException) -> bool:
        """A SQLite "database is locked" (or busy) error: another process holds the write lock."""
        if self.dialect != "sqlite":
            return False
        message = str(getattr(exc, "orig", None) or exc).lower()
        return "database is locked" in message or "database is busy" in message

    def locked_error(self, waited: float) -> StoreError:
        path = os.path.abspath(self.url.database or "")
        return StoreError(
            f"database file {path} is locked by another process: waited {waited:.1f} s "
            f"(busy_timeout {self.busy_timeout:g} s) for the write lock, nothing written; "
            f"find the process holding it (fuser {path}), or raise busy_timeout",
            url=self.display_url,
        )

    # -- transactions ------------------------------------------------------------------------------

    async def begin_write(
        self, conn: AsyncConnection, *, exclusive: bool = True, shared: bool = False
    ) -> AsyncConnection:
        """Begin a write transaction: SQLite ``BEGIN IMMEDIATE``; PostgreSQL the writers' lock,
        exclusive (``exclusive``: the default, for writes that read and then decide), shared
        (``shared``: writes that exclude only the exclusive ones and lock by key what they touch,
        ``store/db/_locks.py``: the job-version batches, their backends' jobs and each job;
        placements, an earlier life's jobs they drop; submit records, their jobs), or none (``exclusive=False``:
        request claims, which rely on row locks; new requests, which lock their names and ids).

        The change feed needs no lock of the writers (migration 0015, ``changes/_horizon.py``)."""
        if self.dialect == "sqlite":
            conn = await conn.execution_options(sqlite_immediate=True)
        await conn.begin()
        if self.dialect == "postgresql" and (exclusive or shared):
            await conn.execute(_WRITE_LOCK_SHARED if shared else _WRITE_LOCK, {"key": _WRITE_LOCK_KEY})
        return conn

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[AsyncConnection]:
        """A connection of the async engine for the context, closed after it.

        Unlike ``engine.connect()``, a caller cancelled while the pool opens a new SQLite
        connection (SQLAlchemy's on-connect steps awaiting aiosqlite's thread) leaves nothing
        open: the connect goes on, shielded, and what it made is closed (:meth:`close` waits a
        moment for that). Cut off midway, it left a driver connection that no one owned or
        closed (found as ``ResourceWarning: unclosed database`` when a dispatcher stopped while
        its first reads were connecting). SQLite only: PostgreSQL's connects are cut off as they
        come (a read under a timeout shorter than a connect would otherwise open connection
        after connection in the background).
        """
        if self.dialect != "sqlite":
            async with self.engine.connect() as conn:
                yield conn
            return
        connecting = asyncio.ensure_future(self.engine.connect().start())
        try:
            conn = await asyncio.shield(connecting)
        except asyncio.CancelledError:
            self._abandoned.add(connecting)
            connecting.add_done_callback(self._close_abandoned)
            raise
        try:
            yield conn
        finally:
            await asyncio.shield(conn.close())

    def _close_abandoned(self, connecting: asyncio.Future[Any]) -> None:
        self._abandoned.discard(connecting)
        if connecting.cancelled() or connecting.exception() is not None:
            return
        closing = asyncio.ensure_future(connecting.result().close())
        self._abandoned.add(closing)
        closing.add_done_callback(self._abandoned.discard)
        closing.add_done_callback(_quiet)

    async def run_transaction(
        self, fn: Callable[[Connection], T], *, exclusive: bool = True, shared: bool = False
    ) -> T:
        """Run ``fn`` in one write transaction: in the writer's thread (SQLite file) or via run_sync."""
        if self.sync_engine is not None:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self.sync_executor, self._transaction_in_thread, fn)
        # (a pooled connection the server dropped fails here: the writer retries the call)
        async with self.connect() as conn:
            conn = await self.begin_write(conn, exclusive=exclusive, shared=shared)
            result = await conn.run_sync(fn)
            await conn.commit()
        return result

    async def run_group(
        self,
        calls: Sequence[tuple[Callable[[Connection], Any], Batched | None]],
        *,
        exclusive: bool = True,
        shared: bool = False,
        savepoints: bool = False,
    ) -> list[Outcome]:
        """Several callers' writes in one write transaction, one commit for all: each in a
        savepoint, or a step of a set-based batch (:mod:`._batch`, which says when a step has
        a savepoint of its own); per call ``(True, result)`` or ``(False, exception)``.
        Database trouble other than an integrity error ends the transaction (raised, nothing
        written)."""
        return await self.run_transaction(
            grouped(calls, savepoints=savepoints), exclusive=exclusive, shared=shared
        )

    def _transaction_in_thread(self, fn: Callable[[Connection], T]) -> T:
        assert self.sync_engine is not None
        with self.sync_engine.connect() as conn:
            conn.execution_options(sqlite_immediate=True)
            conn.begin()
            result = fn(conn)
            conn.commit()
        return result

    @contextlib.asynccontextmanager
    async def listen(
        self,
        channel: str,
        on_notify: Callable[..., None],
        *,
        on_lost: Callable[..., None] | None = None,
    ) -> AsyncIterator[None]:
        """PostgreSQL: LISTEN on ``channel`` on a connection of its own while the context is
        open (``on_notify(connection, pid, channel, payload)``; ``on_lost`` when the database
        drops that connection)."""
        async with self.connect() as conn:
            raw = await conn.get_raw_connection()
            driver = raw.driver_connection
            assert driver is not None
            lost = False

            def dropped(*args: Any) -> None:
                nonlocal lost
                lost = True
                if on_lost is not None:
                    on_lost(*args)

            driver.add_termination_listener(dropped)
            try:
                await driver.add_listener(channel, on_notify)
                yield
            finally:
                with contextlib.suppress(Exception):
                    await driver.remove_listener(channel, on_notify)
                with contextlib.suppress(Exception):
                    driver.remove_termination_listener(dropped)
                if lost or driver.is_closed():
                    # never back to the pool: the next checkout would get a closed connection
                    with contextlib.suppress(Exception):
                        await conn.invalidate()

    async def read(self, fn: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """``fn`` on a connection of the async engine; database trouble is a :class:`StoreError`.

        PostgreSQL: the read runs without a transaction (``AUTOCOMMIT``): at READ COMMITTED each
        statement sees its own snapshot either way, and BEGIN and ROLLBACK were two round trips
        per read. A pooled connection the server dropped (a restart) is found by using it, not
        by a ping at every checkout: the read is tried once more on a fresh one."""
        for attempt in (1, 2):
            try:
                async with self.connect() as conn:
                    if self.dialect == "postgresql":
                        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
                    return await fn(conn)
            except DBAPIError as exc:
                if attempt == 1 and exc.connection_invalidated:
                    continue
                raise self.error("cannot read from", exc) from None
            except OSError as exc:
                raise self.error("cannot read from", exc) from None
        raise AssertionError("unreachable")

    async def call_read(self, fn: Callable[[Connection], T]) -> T:
        """Run a synchronous read ``fn(connection)`` on a connection of the async engine."""

        async def run(conn: AsyncConnection) -> T:
            return await conn.run_sync(fn)

        return await self.read(run)


def _quiet(task: asyncio.Future[Any]) -> None:
    """Mark a background close's failure as seen (a connection that fails to close is gone)."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("closing an abandoned connection: %s", task.exception())


async def upgrade_database(url: str | URL) -> tuple[str, str | None, str | None]:
    """Create or upgrade the schema of ``url``; returns (display URL, revision before, after)."""
    database = Database(url, create=False)
    if database.dialect == "sqlite":
        database.check_sqlite_folder()
    engine = database.make_engine()
    try:
        before = await _migrate.current_revision(engine)
        await _migrate.upgrade(engine)
        after = await _migrate.current_revision(engine)
    except (SQLAlchemyError, OSError) as exc:
        raise database.error("cannot upgrade", exc) from None
    finally:
        await engine.dispose()
    return database.display_url, before, after


_wal_lock = threading.Lock()


def _sqlite_to_wal(path: str, busy_timeout: float, display: str) -> None:
    """Put a SQLite file in WAL mode before any of the store's connections use it.

    Switching a file to WAL needs it to itself: connections that each switched it as they
    opened (several stores, or a dispatcher and a CLI command, on a fresh file) could hold
    each other off until the busy timeout. Here the switch is made once, on a connection
    of its own, one at a time in this process, and tried again while another process has
    the file locked; a file in WAL mode already costs one pragma.
    """
    deadline = time.monotonic() + busy_timeout
    with _wal_lock:
        while True:
            try:
                connection = sqlite3.connect(path, timeout=busy_timeout)
                try:
                    mode = connection.execute("PRAGMA journal_mode=WAL").fetchone()
                finally:
                    connection.close()
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise StoreError(f"cannot open database {display}: {exc}", url=display) from None
                time.sleep(0.05)
                continue
            if mode and str(mode[0]).lower() != "wal":
                log.warning("database %s stays in journal mode %s (WAL not possible here)", display, mode[0])
            return
