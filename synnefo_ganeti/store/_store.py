"""The store: one database (SQLite or PostgreSQL), one batching writer task, and the readers.

Writes go through :meth:`Store.put` into a bounded queue; one writer task takes what
is there (up to ``batch_size`` versions), and applies it in one transaction:

* it reads what the database holds of those jobs (inside the transaction, so two
  processes writing the same database serialise: SQLite ``BEGIN IMMEDIATE``,
  PostgreSQL a transaction-scoped advisory lock, which also makes event ids commit
  in order so that a reader following ids never skips one);
* for each version in the order it was read, it keeps it only if it supersedes the
  stored one (:meth:`synnefo_ganeti.jobs.JobSummary.supersedes`: not the same, not
  older, never over a final state), and stores the events between the two;
* the job rows and the events go in with a few bulk statements, then one commit.

A database that goes away (restart, network) makes the writer retry with backoff,
holding what it has; :meth:`Store.put` blocks when the queue is full, which slows
the watcher down rather than losing anything. A SQLite file that another process
keeps locked is the same for job versions (held, written once the lock goes), but a
caller of :meth:`Store.call` (every facade write) waits only ``busy_timeout`` and
then gets a :class:`StoreError` saying the file is locked by another process; its
write is then never made.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Self, TypeVar, cast

import orjson
from sqlalchemy import (
    Row,
    Table,
    and_,
    bindparam,
    create_engine,
    delete,
    event,
    exists,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool
from sqlalchemy.sql.expression import Executable

from synnefo_ganeti import metrics
from synnefo_ganeti.errors import StoreError
from synnefo_ganeti.jobs import EventKind, JobFile, JobStatus, JobSummary, job_events
from synnefo_ganeti.store import _migrate, _requests
from synnefo_ganeti.store._instances import (
    InstanceAction,
    InstanceStatus,
    StoredInstance,
    apply_final_jobs,
    instance_jobs_t,
    instances_t,
    stored_final_job,
)
from synnefo_ganeti.store._requests import Request, RequestStatus
from synnefo_ganeti.store._schema import Backend, Job, JobEventRow
from synnefo_ganeti.store._urls import display_url, normalize_url

__all__ = [
    "CommitInfo",
    "JobVersion",
    "PruneResult",
    "Store",
    "StoredEvent",
    "StoredJob",
    "StoredOp",
    "WriterStats",
]

log = logging.getLogger("synnefo_ganeti.store")

T = TypeVar("T")

NOTIFY_CHANNEL = "synnefo_ganeti_events"
# pg_advisory_xact_lock key of the writers: "sg-write" as an int64
# (the database's own name hashed, "sgwr"): advisory locks are the whole server's, so the
# database's name keeps stores of different databases on one server out of each other's way
_WRITE_LOCK_KEY = int.from_bytes(b"sgwr", "big")

_JSON_OPTIONS: dict[str, Any] = {
    "json_serializer": lambda value: orjson.dumps(value).decode(),
    "json_deserializer": orjson.loads,
}

jobs_t = cast(Table, Job.__table__)
events_t = cast(Table, JobEventRow.__table__)
backends_t = cast(Table, Backend.__table__)


def _dt(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


@dataclass(frozen=True, slots=True)
class StoredOp:
    index: int
    op_id: str
    status: JobStatus
    instance: str | None
    start_time: datetime | None
    exec_time: datetime | None
    end_time: datetime | None
    error: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "op_id": self.op_id,
            "status": self.status.value,
            "instance": self.instance,
            "start_time": _iso(self.start_time),
            "exec_time": _iso(self.exec_time),
            "end_time": _iso(self.end_time),
            "error": self.error,
        }


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


@dataclass(frozen=True, slots=True)
class StoredJob:
    """A job as the database holds it: its last applied version."""

    backend: str
    job_id: int
    status: JobStatus
    instance: str | None
    ops: tuple[StoredOp, ...]
    received_at: datetime | None
    started_at: datetime | None
    ended_at: datetime | None
    archived: bool
    revision: int
    event_count: int
    first_seen_at: datetime
    updated_at: datetime

    @property
    def is_final(self) -> bool:
        return self.status.is_final

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "job_id": self.job_id,
            "status": self.status.value,
            "instance": self.instance,
            "ops": [op.to_json() for op in self.ops],
            "received_at": _iso(self.received_at),
            "started_at": _iso(self.started_at),
            "ended_at": _iso(self.ended_at),
            "archived": self.archived,
            "revision": self.revision,
            "event_count": self.event_count,
            "first_seen_at": _iso(self.first_seen_at),
            "updated_at": _iso(self.updated_at),
        }


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One stored job event, as a Synnefo-style consumer reads it."""

    id: int
    backend: str
    job_id: int
    seq: int
    kind: EventKind
    status: JobStatus
    op_index: int | None
    op_id: str | None
    instance: str | None
    log_serial: int | None
    log_message: str | None
    event_time: datetime | None
    stored_at: datetime

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "backend": self.backend,
            "job_id": self.job_id,
            "seq": self.seq,
            "kind": self.kind.value,
            "status": self.status.value,
            "op_index": self.op_index,
            "op_id": self.op_id,
            "instance": self.instance,
            "log_serial": self.log_serial,
            "log_message": self.log_message,
            "event_time": _iso(self.event_time),
            "stored_at": _iso(self.stored_at),
        }


@dataclass(slots=True)
class JobVersion:
    """One version of a job file as the watcher read it, on its way to the writer."""

    backend: str
    job: JobFile
    archived: bool = False
    #: time.time() when it was read (the writer reports the lag from it)
    read_at: float = field(default_factory=time.time)


@dataclass(frozen=True, slots=True)
class CommitInfo:
    """What one writer transaction did; given to :attr:`Store.on_commit` listeners."""

    versions: int
    applied: tuple[tuple[str, JobSummary], ...]
    skipped: int
    events: int
    committed_at: float
    oldest_read_at: float


@dataclass(slots=True)
class WriterStats:
    versions: int = 0
    applied: int = 0
    skipped: int = 0
    older: int = 0
    events: int = 0
    batches: int = 0
    retries: int = 0


@dataclass(frozen=True, slots=True)
class PruneResult:
    events: int
    jobs: int


@dataclass(slots=True)
class _Call:
    """A write of the facade's or the reconciler's, run by the writer in a transaction of its own."""

    fn: Callable[[Connection], Any]
    future: asyncio.Future[Any]
    #: PostgreSQL: take the writers' advisory lock (False for request claims, which rely on row locks)
    exclusive: bool = True
    queued_at: float = field(default_factory=time.monotonic)
    #: the writer took it up; or its caller gave up waiting first (the writer then skips it)
    started: bool = False
    abandoned: bool = False


_Pending = JobVersion | _Call | None


class Store:
    """``async with Store(url) as store:`` the job store of one database.

    ``create``: a database without our tables is migrated to the latest revision
    on open (a database at an older revision is refused with the command that
    upgrades it). Everything written goes through one writer task per Store.
    """

    def __init__(
        self,
        url: str | URL,
        *,
        create: bool = True,
        busy_timeout: float = 30.0,
        batch_size: int = 1000,
        queue_size: int = 20_000,
        poll_interval: float = 0.5,
    ) -> None:
        self.url = normalize_url(url)
        self.display_url = display_url(self.url)
        self.dialect = "sqlite" if self.url.drivername.startswith("sqlite") else "postgresql"
        self.create = create
        self.busy_timeout = busy_timeout
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self.stats = WriterStats()
        #: called after each commit of the writer (in the writer task; keep them quick)
        self.on_commit: list[Callable[[CommitInfo], None]] = []
        self._queue_size = queue_size
        self._engine: AsyncEngine | None = None
        #: SQLite files: the writer's own synchronous engine, used from its one thread
        self._sync_engine: Engine | None = None
        self._sync_executor: ThreadPoolExecutor | None = None
        self._queue: asyncio.Queue[_Pending] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._backend_ids: dict[str, int] = {}
        self._backend_names: dict[int, str] = {}
        self._wakeup = asyncio.Event()
        self._closed = False
        #: SQLite: since when (monotonic) the writer's transactions fail with "database is locked"
        self._locked_since: float | None = None

    def __repr__(self) -> str:
        return f"<Store {self.display_url}>"

    # -- lifecycle -----------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def engine(self) -> AsyncEngine:
        if self._engine is None:
            raise RuntimeError("the store is not open: use 'async with Store(url) as store'")
        return self._engine

    def _make_engine(self) -> AsyncEngine:
        if self.dialect == "sqlite":
            memory = self.url.database in (None, "", ":memory:")
            engine = create_async_engine(
                self.url,
                connect_args={"timeout": self.busy_timeout},
                poolclass=StaticPool if memory else None,
                **_JSON_OPTIONS,
            )
            self._sqlite_events(engine.sync_engine)
            return engine
        return create_async_engine(
            self.url,
            pool_size=5,
            max_overflow=5,
            pool_pre_ping=True,
            connect_args={"timeout": self.busy_timeout, "command_timeout": 300},
            **_JSON_OPTIONS,
        )

    def _make_sync_writer(self) -> None:
        """A SQLite file gets a synchronous engine for the writer (see :meth:`_write_in_thread`);
        an in-memory database has one connection, the async engine's."""
        if self.dialect != "sqlite" or self.url.database in (None, "", ":memory:"):
            return
        engine = create_engine(
            self.url.set(drivername="sqlite+pysqlite"),
            connect_args={"timeout": self.busy_timeout, "check_same_thread": False},
            pool_size=1,
            max_overflow=0,
            **_JSON_OPTIONS,
        )
        self._sqlite_events(engine)
        self._sync_engine = engine
        self._sync_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-writer")

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

    async def open(self) -> None:
        if self._engine is not None:
            return
        if self.dialect == "sqlite":
            self._check_sqlite_folder()
            database = self.url.database
            if database not in (None, "", ":memory:"):
                await asyncio.to_thread(_sqlite_to_wal, str(database), self.busy_timeout, self.display_url)
        engine = self._engine = self._make_engine()
        try:
            await self._check_schema()
        except BaseException:
            await engine.dispose()
            if self._engine is engine:
                self._engine = None
            raise
        self._make_sync_writer()
        self._queue = asyncio.Queue(self._queue_size)
        self._writer = asyncio.create_task(self._write_loop(), name=f"store-writer {self.display_url}")

    def _check_sqlite_folder(self) -> None:
        if self.url.database in (None, "", ":memory:"):
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
            raise self._error("cannot open", exc) from None
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
                raise self._error("cannot create the schema in", exc) from None
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

    def _error(self, what: str, exc: BaseException) -> StoreError:
        return StoreError(f"{what} database {self.display_url}: {_reason(exc)}", url=self.display_url)

    async def close(self, *, flush_timeout: float = 30.0) -> None:
        """Store what is queued (waiting up to ``flush_timeout`` for the database), then close."""
        if self._engine is None or self._closed:
            return
        self._closed = True
        if self._writer is not None and self._queue is not None:
            left = self._queue.qsize()
            try:
                await asyncio.wait_for(self._stop_writer(), flush_timeout)
            except TimeoutError:
                log.error(
                    "database %s: %d job versions not stored when closing (the watcher reads them "
                    "again from the queue directory on its next start)",
                    self.display_url,
                    left,
                )
                self._writer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._writer
        if self._sync_engine is not None and self._sync_executor is not None:
            # after the transaction the thread may still be in (its writer task was cancelled)
            await asyncio.get_running_loop().run_in_executor(self._sync_executor, self._sync_engine.dispose)
            self._sync_executor.shutdown()
            self._sync_engine = self._sync_executor = None
        await self._engine.dispose()
        self._engine = None

    async def _stop_writer(self) -> None:
        assert self._queue is not None and self._writer is not None
        await self._queue.put(None)
        await asyncio.shield(self._writer)

    # -- writing ---------------------------------------------------------------------------------

    async def put(self, version: JobVersion) -> None:
        """Queue one version for the writer; waits while the queue is full."""
        if self._queue is None or self._closed:
            raise RuntimeError("the store is not open")
        if self._writer is not None and self._writer.done():
            self._writer.result()  # the writer died: say why
        await self._queue.put(version)

    async def record(self, backend: str, job: JobFile, *, archived: bool = False) -> None:
        """Store one version and wait until it is committed (a convenience for one-off writes)."""
        await self.put(JobVersion(backend, job, archived))
        await self.flush()

    async def flush(self) -> None:
        """Wait until everything queued so far is committed."""
        if self._queue is not None:
            await self._queue.join()

    @property
    def pending(self) -> int:
        return 0 if self._queue is None else self._queue.qsize()

    async def _write_loop(self) -> None:
        assert self._queue is not None
        queue = self._queue
        stopping = False
        while not stopping:
            items: list[JobVersion | _Call] = []
            first = await queue.get()
            taken = 1
            if first is None:
                stopping = True
            else:
                items.append(first)
            while len(items) < self.batch_size and not stopping:
                try:
                    item = queue.get_nowait()
                except asyncio.QueueEmpty:
                    break
                taken += 1
                if item is None:
                    stopping = True
                else:
                    items.append(item)
            try:
                # versions in one transaction; a call between them in one of its own, in order
                batch: list[JobVersion] = []
                for item in items:
                    if isinstance(item, _Call):
                        if batch:
                            await self._write_with_retry(batch)
                            batch = []
                        await self._call_with_retry(item)
                    else:
                        batch.append(item)
                if batch:
                    await self._write_with_retry(batch)
            finally:
                for _ in range(taken):
                    queue.task_done()

    async def _call_with_retry(self, call: _Call) -> None:
        if call.abandoned:
            return  # its caller was told the database is locked: it must not happen later
        call.started = True
        delay = 0.05
        for attempt in range(60):
            try:
                result = await self._run_transaction(call.fn, exclusive=call.exclusive)
            except IntegrityError as exc:
                if not call.future.done():
                    call.future.set_exception(self._error("conflict writing to", exc))
                return
            except (DBAPIError, OSError, TimeoutError, ConnectionError) as exc:
                self.stats.retries += 1
                metrics.STORE_WRITE_RETRIES.inc()
                if self._note_locked(exc):
                    waited = time.monotonic() - call.queued_at
                    if waited >= self.busy_timeout:
                        self._locked_since = None  # the writer moves on: the next transaction will tell
                        if not call.future.done():
                            call.future.set_exception(self._locked_error(waited))
                        return
                if attempt == 0:
                    log.warning("database %s unavailable (%s); retrying", self.display_url, _reason(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            except Exception as exc:
                if not call.future.done():
                    call.future.set_exception(exc)
                return
            self._locked_since = None
            if not call.future.done():
                call.future.set_result(result)
            self._wake()
            return
        if not call.future.done():
            call.future.set_exception(
                StoreError(
                    f"database {self.display_url} stayed unavailable; nothing written", url=self.display_url
                )
            )

    async def _run_transaction(self, fn: Callable[[Connection], T], *, exclusive: bool = True) -> T:
        """Run ``fn`` in one write transaction: in the writer's thread (SQLite file) or via run_sync."""
        if self._sync_engine is not None:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._sync_executor, self._transaction_in_thread, fn)
        async with self.engine.connect() as conn:
            conn = await self._begin_write(conn, exclusive=exclusive)
            result = await conn.run_sync(fn)
            await conn.commit()
        return result

    def _transaction_in_thread(self, fn: Callable[[Connection], T]) -> T:
        assert self._sync_engine is not None
        with self._sync_engine.connect() as conn:
            conn.execution_options(sqlite_immediate=True)
            conn.begin()
            result = fn(conn)
            conn.commit()
        return result

    async def call(self, fn: Callable[[Connection], T], *, exclusive: bool = True) -> T:
        """Run ``fn(connection)`` in a write transaction of the writer task; its result.

        ``exclusive=False`` (PostgreSQL): without the writers' advisory lock, for
        transactions that serialise on row locks of their own (request claims)."""
        if self._queue is None or self._closed:
            raise RuntimeError("the store is not open")
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        call = _Call(fn, future, exclusive)
        await self._queue.put(call)
        if self.dialect != "sqlite":
            return await future
        # SQLite: the writer may be stuck behind another process's lock with versions it holds
        # (it retries those for ever); a caller waits busy_timeout, then hears why.
        try:
            while not future.done():
                await asyncio.wait([future], timeout=min(0.1, self.busy_timeout))
                waited = time.monotonic() - call.queued_at
                locked = self._locked_since is not None
                if locked and waited >= self.busy_timeout and not future.done() and not call.started:
                    call.abandoned = True
                    future.cancel()
                    raise self._locked_error(waited)
        except asyncio.CancelledError:
            future.cancel()
            raise
        return future.result()

    def _is_locked(self, exc: BaseException) -> bool:
        """A SQLite "database is locked" (or busy) error: another process holds the write lock."""
        if self.dialect != "sqlite":
            return False
        message = str(getattr(exc, "orig", None) or exc).lower()
        return "database is locked" in message or "database is busy" in message

    def _note_locked(self, exc: BaseException) -> bool:
        """The writer's: :meth:`_is_locked`, and since when its transactions fail so."""
        locked = self._is_locked(exc)
        if locked and self._locked_since is None:
            self._locked_since = time.monotonic()
        return locked

    def _locked_error(self, waited: float) -> StoreError:
        path = os.path.abspath(self.url.database or "")
        return StoreError(
            f"database file {path} is locked by another process: waited {waited:.1f} s "
            f"(busy_timeout {self.busy_timeout:g} s) for the write lock, nothing written; "
            f"find the process holding it (fuser {path}), or raise busy_timeout",
            url=self.display_url,
        )

    async def _write_with_retry(self, batch: list[JobVersion]) -> None:
        delay = 0.05
        down_since: float | None = None
        conflicts = 0
        while True:
            try:
                await self._write(batch)
            except IntegrityError as exc:
                # Another process stored the same job between our read and our write;
                # reading again inside a new transaction settles it.
                conflicts += 1
                self.stats.retries += 1
                metrics.STORE_WRITE_RETRIES.inc()
                if conflicts > 5:
                    raise self._error("repeated conflicts writing to", exc) from None
                continue
            except (DBAPIError, OSError, TimeoutError, ConnectionError) as exc:
                self.stats.retries += 1
                metrics.STORE_WRITE_RETRIES.inc()
                locked = self._note_locked(exc)
                if down_since is None:
                    down_since = time.monotonic()
                    log.warning(
                        "database %s unavailable (%s%s); holding %d job versions and retrying",
                        self.display_url,
                        _reason(exc),
                        ", locked by another process" if locked else "",
                        len(batch) + self.pending,
                    )
                # a lock: its holder may end at any moment, and each attempt waits busy_timeout
                await asyncio.sleep(min(delay, 0.5) if locked else delay)
                delay = min(delay * 2, 5.0)
                continue
            self._locked_since = None
            if down_since is not None:
                log.warning(
                    "database %s is back after %.1f s; writing resumed",
                    self.display_url,
                    time.monotonic() - down_since,
                )
            return

    async def _ensure_backends(self, names: Iterable[str]) -> None:
        missing = sorted({name for name in names if name not in self._backend_ids})
        if not missing:
            return
        async with self.engine.connect() as conn:
            # a write transaction from the start: on SQLite a read one that then writes fails at
            # once ("database is locked", no busy wait) if another writer committed in between
            conn = await self._begin_write(conn)
            rows = await conn.execute(
                select(backends_t.c.id, backends_t.c.name).where(backends_t.c.name.in_(missing))
            )
            found = {row.name: row.id for row in rows}
            now = datetime.now(UTC)
            for name in missing:
                if name not in found:
                    statement: Executable
                    if self.dialect == "postgresql":
                        statement = pg_insert(backends_t).on_conflict_do_nothing(index_elements=["name"])
                    else:
                        statement = sqlite_insert(backends_t).on_conflict_do_nothing(index_elements=["name"])
                    await conn.execute(statement, {"name": name, "created_at": now})
            rows = await conn.execute(
                select(backends_t.c.id, backends_t.c.name).where(backends_t.c.name.in_(missing))
            )
            for row in rows:
                self._backend_ids[row.name] = row.id
                self._backend_names[row.id] = row.name
            await conn.commit()

    async def ensure_backend(self, name: str) -> int:
        """The id of backend ``name``, creating its row if needed."""
        try:
            await self._ensure_backends([name])
        except DBAPIError as exc:
            if self._is_locked(exc):  # a SQLite file another process keeps locked: say so
                raise self._locked_error(self.busy_timeout) from None
            raise
        return self._backend_ids[name]

    async def _begin_write(self, conn: AsyncConnection, *, exclusive: bool = True) -> AsyncConnection:
        if self.dialect == "sqlite":
            conn = await conn.execution_options(sqlite_immediate=True)
        await conn.begin()
        if self.dialect == "postgresql" and exclusive:
            await conn.execute(_WRITE_LOCK, {"key": _WRITE_LOCK_KEY})
        return conn

    async def _write(self, batch: list[JobVersion]) -> None:
        await self._ensure_backends(version.backend for version in batch)
        done = await self._run_transaction(functools.partial(self._apply, batch=batch))
        self._committed(batch, *done)

    def _apply(
        self, conn: Connection, *, batch: list[JobVersion]
    ) -> tuple[list[tuple[str, JobSummary]], int, int, int]:
        """Inside the writer's transaction: what the database holds of the batch's jobs, then
        the versions that supersede it and their events. Returns (applied, skipped, older, events)."""
        grouped: dict[int, dict[int, list[JobVersion]]] = {}
        for version in batch:
            per_job = grouped.setdefault(self._backend_ids[version.backend], {})
            per_job.setdefault(version.job.job_id, []).append(version)

        now = datetime.now(UTC)
        inserts: list[dict[str, Any]] = []
        updates: list[dict[str, Any]] = []
        archive_only: list[dict[str, Any]] = []
        event_rows: list[dict[str, Any]] = []
        applied: list[tuple[str, JobSummary]] = []
        finals: list[tuple[int, int, JobSummary]] = []
        skipped = older = 0
        for backend_id, jobs in grouped.items():
            backend = self._backend_names[backend_id]
            stored: dict[int, Any] = {}
            ids = list(jobs)
            for start in range(0, len(ids), 500):
                rows = conn.execute(
                    _STORED_JOBS, {"b_backend_id": backend_id, "b_ids": ids[start : start + 500]}
                )
                stored.update((row.job_id, row) for row in rows)
            for job_id, versions in jobs.items():
                row = stored.get(job_id)
                summary = JobSummary.from_json(row.summary) if row is not None else None
                count = row.event_count if row is not None else 0
                was_archived = bool(row.archived) if row is not None else False
                archived = was_archived
                last: JobFile | None = None
                revisions = 0
                for version in versions:
                    archived = archived or version.archived
                    current = JobSummary.of(version.job)
                    if not current.supersedes(summary):
                        skipped += 1
                        if summary is not None and current != summary:
                            older += 1
                            log.debug("job %s/%s: an older version arrived late, ignored", backend, job_id)
                        continue
                    for change in job_events(summary, version.job):
                        count += 1
                        event_rows.append(
                            {
                                "backend_id": backend_id,
                                "job_id": job_id,
                                "seq": count,
                                "kind": change.kind.value,
                                "status": change.status.value,
                                "op_index": change.op_index,
                                "op_id": change.op_id,
                                "instance": change.instance,
                                "log_serial": change.log_serial,
                                "log_message": change.log_message,
                                "event_time": _dt(change.event_time),
                                "stored_at": now,
                            }
                        )
                    summary = current
                    last = version.job
                    revisions += 1
                    applied.append((backend, current))
                if last is not None and summary is not None:
                    if summary.status.is_final:
                        finals.append((backend_id, job_id, summary))
                    values = _job_values(summary, archived=archived, now=now)
                    values["event_count"] = count
                    if row is None:
                        values.update(
                            backend_id=backend_id, job_id=job_id, revision=revisions, first_seen_at=now
                        )
                        inserts.append(values)
                    else:
                        values.update(
                            b_backend_id=backend_id, b_job_id=job_id, revision=row.revision + revisions
                        )
                        updates.append(values)
                elif archived and not was_archived and row is not None:
                    archive_only.append({"b_backend_id": backend_id, "b_job_id": job_id, "archived": True})
        if inserts:
            conn.execute(_INSERT_JOB, inserts)
        if updates:
            conn.execute(_UPDATE_JOB, updates)
        if archive_only:
            conn.execute(_ARCHIVE_JOB, archive_only)
        if event_rows:
            conn.execute(_INSERT_EVENTS, event_rows)
            if self.dialect == "postgresql":
                conn.execute(_NOTIFY, {"channel": NOTIFY_CHANNEL})
        if finals:
            # the instances these jobs were submitted for follow their end
            apply_final_jobs(conn, finals, now)
        return applied, skipped, older, len(event_rows)

    def _committed(
        self,
        batch: list[JobVersion],
        applied: list[tuple[str, JobSummary]],
        skipped: int,
        older: int,
        events: int,
    ) -> None:
        stats = self.stats
        stats.versions += len(batch)
        stats.applied += len(applied)
        stats.skipped += skipped
        stats.older += older
        stats.events += events
        stats.batches += 1
        metrics.STORE_VERSIONS.labels("applied").inc(len(applied))
        metrics.STORE_VERSIONS.labels("skipped").inc(skipped)
        metrics.STORE_EVENTS.inc(events)
        metrics.STORE_PENDING.set(self.pending)
        committed_at = time.time()
        for version in batch:
            metrics.WATCH_LAG.observe(committed_at - version.read_at)
        if events:
            self._wake()
        if self.on_commit:
            info = CommitInfo(
                versions=len(batch),
                applied=tuple(applied),
                skipped=skipped,
                events=events,
                committed_at=committed_at,
                oldest_read_at=min(version.read_at for version in batch),
            )
            for listener in self.on_commit:
                listener(info)

    async def wait_for_change(self, timeout: float) -> bool:
        """Wait until this store's writer commits something, or ``timeout`` seconds; True if it did.

        Only this process's commits wake it: code waiting on another process's writes
        polls with it (the timeout is the poll interval)."""
        wakeup = self._wakeup
        try:
            async with asyncio.timeout(timeout):
                await wakeup.wait()
        except TimeoutError:
            return False
        return True

    def _wake(self) -> None:
        wakeup, self._wakeup = self._wakeup, asyncio.Event()
        wakeup.set()

    # -- reading ---------------------------------------------------------------------------------

    async def _names(self, conn: AsyncConnection) -> dict[int, str]:
        rows = await conn.execute(select(backends_t.c.id, backends_t.c.name))
        for row in rows:
            self._backend_names[row.id] = row.name
            self._backend_ids[row.name] = row.id
        return self._backend_names

    async def _read(self, fn: Callable[[AsyncConnection], Any]) -> Any:
        try:
            async with self.engine.connect() as conn:
                return await fn(conn)
        except (DBAPIError, OSError) as exc:
            raise self._error("cannot read from", exc) from None

    async def backends(self) -> list[str]:
        async def run(conn: AsyncConnection) -> list[str]:
            return sorted((await self._names(conn)).values())

        result: list[str] = await self._read(run)
        return result

    async def get_job(self, backend: str, job_id: int) -> StoredJob | None:
        """The stored job, or None if the database has never seen it."""
        jobs = await self.list_jobs(backend=backend, job_id=job_id)
        return jobs[0] if jobs else None

    async def list_jobs(
        self,
        *,
        backend: str | None = None,
        job_id: int | None = None,
        status: Iterable[JobStatus | str] | None = None,
        instance: str | None = None,
        limit: int | None = None,
    ) -> list[StoredJob]:
        """Stored jobs ordered by backend name and job id; every one unless filters or ``limit`` say."""

        async def run(conn: AsyncConnection) -> list[StoredJob]:
            query = (
                select(jobs_t, backends_t.c.name.label("backend"))
                .join(backends_t, backends_t.c.id == jobs_t.c.backend_id)
                .order_by(backends_t.c.name, jobs_t.c.job_id)
            )
            if backend is not None:
                query = query.where(backends_t.c.name == backend)
            if job_id is not None:
                query = query.where(jobs_t.c.job_id == job_id)
            if status is not None:
                query = query.where(jobs_t.c.status.in_([JobStatus(s).value for s in status]))
            if instance is not None:
                query = query.where(jobs_t.c.instance == instance)
            if limit is not None:
                query = query.limit(limit)
            return [_stored_job(row) for row in await conn.execute(query)]

        result: list[StoredJob] = await self._read(run)
        return result

    async def archived_final_job_ids(self, backend: str) -> set[int]:
        """Ids of this backend's jobs stored as final and seen in the archive (a rescan skips them)."""

        async def run(conn: AsyncConnection) -> set[int]:
            final = [status.value for status in JobStatus if status.is_final]
            query = (
                select(jobs_t.c.job_id)
                .join(backends_t, backends_t.c.id == jobs_t.c.backend_id)
                .where(backends_t.c.name == backend, jobs_t.c.archived, jobs_t.c.status.in_(final))
            )
            return {row.job_id for row in await conn.execute(query)}

        result: set[int] = await self._read(run)
        return result

    async def count_jobs(self, *, backend: str | None = None) -> int:
        async def run(conn: AsyncConnection) -> int:
            query = select(func.count()).select_from(jobs_t)
            if backend is not None:
                query = query.join(backends_t, backends_t.c.id == jobs_t.c.backend_id).where(
                    backends_t.c.name == backend
                )
            return int((await conn.execute(query)).scalar_one())

        result: int = await self._read(run)
        return result

    async def list_events(
        self,
        *,
        since: int | datetime = 0,
        backend: str | None = None,
        job_id: int | None = None,
        limit: int | None = 1000,
    ) -> list[StoredEvent]:
        """Stored events after event id ``since`` (or stored at/after a datetime), in id order."""

        async def run(conn: AsyncConnection) -> list[StoredEvent]:
            # backend names from the cache; read again only for a name or an id it lacks
            # (events() calls this on every wake-up)
            names = self._backend_names
            query = select(events_t).order_by(events_t.c.id)
            if isinstance(since, datetime):
                query = query.where(events_t.c.stored_at >= since)
            else:
                query = query.where(events_t.c.id > since)
            if backend is not None:
                if backend not in self._backend_ids:
                    names = await self._names(conn)
                backend_id = self._backend_ids.get(backend)
                if backend_id is None:
                    return []
                query = query.where(events_t.c.backend_id == backend_id)
            if job_id is not None:
                query = query.where(events_t.c.job_id == job_id)
            if limit is not None:
                query = query.limit(limit)
            rows = (await conn.execute(query)).all()
            if any(row.backend_id not in names for row in rows):
                names = await self._names(conn)
            return [_stored_event(row, names) for row in rows]

        result: list[StoredEvent] = await self._read(run)
        return result

    async def events(
        self,
        since: int | datetime = 0,
        *,
        backend: str | None = None,
        job_id: int | None = None,
        follow: bool = True,
    ) -> AsyncIterator[StoredEvent]:
        """Every stored event after ``since``, in the order stored; with ``follow``, forever.

        ``since`` is an event id (the ``id`` of the last event the caller has) or a
        datetime. Waiting for new events: this process's writer wakes the iterator
        at once; on PostgreSQL, LISTEN/NOTIFY wakes it for every writer's commit; on
        SQLite, other processes' commits are seen within ``poll_interval``.
        """
        cursor: int | datetime = since
        async with contextlib.AsyncExitStack() as stack:
            notified: asyncio.Event | None = None
            if follow and self.dialect == "postgresql":
                notified = await stack.enter_async_context(self._listen())
            while True:
                wakeup = self._wakeup
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

        result: int = await self._read(run)
        return result

    @contextlib.asynccontextmanager
    async def _listen(self) -> AsyncIterator[asyncio.Event]:
        notified = asyncio.Event()

        def on_notify(*_args: object) -> None:
            notified.set()

        async with self.engine.connect() as conn:
            raw = await conn.get_raw_connection()
            driver = raw.driver_connection
            assert driver is not None
            await driver.add_listener(NOTIFY_CHANNEL, on_notify)
            try:
                yield notified
            finally:
                with contextlib.suppress(Exception):
                    await driver.remove_listener(NOTIFY_CHANNEL, on_notify)

    # -- backends --------------------------------------------------------------------------------

    async def set_backend_drained(self, name: str, drained: bool) -> bool:
        """Drain (no new instances) or undrain a backend; True when that changed its state."""
        backend_id = await self.ensure_backend(name)

        def run(conn: Connection) -> bool:
            row = conn.execute(select(backends_t.c.drained).where(backends_t.c.id == backend_id)).one()
            if bool(row.drained) == drained:
                return False
            conn.execute(
                update(backends_t)
                .where(backends_t.c.id == backend_id)
                .values(drained=drained, drained_at=datetime.now(UTC) if drained else None)
            )
            return True

        return await self.call(run)

    async def drained_backends(self) -> set[str]:
        """The backends an operator drained in the database."""

        async def run(conn: AsyncConnection) -> set[str]:
            rows = await conn.execute(select(backends_t.c.name).where(backends_t.c.drained))
            return {row.name for row in rows}

        result: set[str] = await self._read(run)
        return result

    # -- instances -------------------------------------------------------------------------------

    async def add_instance(
        self,
        backend: str,
        name: str,
        *,
        status: InstanceStatus = InstanceStatus.BUILD,
        owned: bool = True,
        os: str | None = None,
        disk_template: str | None = None,
        beparams: dict[str, Any] | None = None,
        nics: list[dict[str, Any]] | None = None,
        disks: list[dict[str, Any]] | None = None,
        tags: list[str] | None = None,
    ) -> StoredInstance:
        """Write an instance row (BUILD by default). A name whose instance was DESTROYED or
        ended in ERROR starts a new life; any other existing row is a :class:`StoreError`."""
        backend_id = await self.ensure_backend(backend)
        values = {
            "status": InstanceStatus(status).value,
            "owned": owned,
            "os": os,
            "disk_template": disk_template,
            "beparams": beparams,
            "nics": nics,
            "disks": disks,
            "tags": tags,
        }
        return await self.call(lambda conn: _add_instance(conn, backend_id, backend, name, values))

    async def record_instance_job(
        self,
        backend: str,
        name: str,
        job_id: int,
        action: InstanceAction | str,
        *,
        start: bool | None = None,
        params: dict[str, Any] | None = None,
    ) -> StoredInstance:
        """Record that ``job_id`` was submitted for instance ``name``; if the database already
        holds the job's end (the watcher was faster), it is applied now."""
        backend_id = await self.ensure_backend(backend)
        action = InstanceAction(action)

        return await self.call(
            lambda conn: _record_instance_job(conn, backend_id, backend, name, job_id, action, start, params)
        )

    async def update_instance(self, backend: str, name: str, **values: Any) -> StoredInstance:
        """Set columns of one instance (the reconciler's DB-side fixes)."""
        allowed = {
            "status",
            "owned",
            "os",
            "disk_template",
            "beparams",
            "nics",
            "disks",
            "tags",
            "state_time",
        }
        unknown = set(values) - allowed
        if unknown:
            raise ValueError(f"not instance fields: {', '.join(sorted(unknown))}")
        if "status" in values:
            values["status"] = InstanceStatus(values["status"]).value
        backend_id = await self.ensure_backend(backend)

        def run(conn: Connection) -> StoredInstance:
            instance = _instance(conn, backend_id, backend, name)
            conn.execute(
                update(instances_t)
                .where(instances_t.c.id == instance.id)
                .values(**values, updated_at=datetime.now(UTC))
            )
            new_status = values.get("status")
            if instance.status is InstanceStatus.BUILD and new_status and instance.create_job_id is not None:
                _requests.settle_by_instance(conn, backend_id, instance.create_job_id, new_status)
            return _instance(conn, backend_id, backend, name)

        return await self.call(run)

    async def get_instance(self, backend: str, name: str) -> StoredInstance | None:
        found = await self.list_instances(backend=backend, name=name)
        return found[0] if found else None

    async def list_instances(
        self,
        *,
        backend: str | None = None,
        name: str | None = None,
        status: Iterable[InstanceStatus | str] | None = None,
    ) -> list[StoredInstance]:
        """Instances ordered by backend and name."""

        async def run(conn: AsyncConnection) -> list[StoredInstance]:
            query = (
                select(instances_t, backends_t.c.name.label("backend"))
                .join(backends_t, backends_t.c.id == instances_t.c.backend_id)
                .order_by(backends_t.c.name, instances_t.c.name)
            )
            if backend is not None:
                query = query.where(backends_t.c.name == backend)
            if name is not None:
                query = query.where(instances_t.c.name == name)
            if status is not None:
                query = query.where(instances_t.c.status.in_([InstanceStatus(s).value for s in status]))
            return [StoredInstance.from_row(row, row.backend) for row in await conn.execute(query)]

        result: list[StoredInstance] = await self._read(run)
        return result

    async def instance_jobs(self, backend: str, name: str) -> list[dict[str, Any]]:
        """The jobs recorded for an instance: job_id, action, recorded_at, applied_at, result."""

        async def run(conn: AsyncConnection) -> list[dict[str, Any]]:
            query = (
                select(instance_jobs_t)
                .join(instances_t, instances_t.c.id == instance_jobs_t.c.instance_id)
                .join(backends_t, backends_t.c.id == instances_t.c.backend_id)
                .where(backends_t.c.name == backend, instances_t.c.name == name)
                .order_by(instance_jobs_t.c.job_id)
            )
            return [dict(row._mapping) for row in await conn.execute(query)]

        result: list[dict[str, Any]] = await self._read(run)
        return result

    async def unapplied_jobs(self, backend: str) -> list[int]:
        """Jobs recorded against instances of ``backend`` whose end is not applied yet (oldest first)."""
        backend_id = await self._backend_id(backend)
        if backend_id is None:
            return []

        async def run(conn: AsyncConnection) -> list[int]:
            rows = await conn.execute(
                select(instance_jobs_t.c.job_id)
                .where(instance_jobs_t.c.backend_id == backend_id, instance_jobs_t.c.applied_at.is_(None))
                .order_by(instance_jobs_t.c.job_id)
            )
            return [int(row.job_id) for row in rows]

        result: list[int] = await self._read(run)
        return result

    # -- durable requests ------------------------------------------------------------------------

    async def add_request(
        self,
        spec: dict[str, Any],
        *,
        name: str,
        backend: str | None = None,
        request_id: str | None = None,
    ) -> tuple[Request, bool]:
        """Write a pending create request; (request, True) or, for an id already there, (it, False)."""
        rid = request_id or _requests.new_request_id()
        return await self.call(
            lambda conn: _requests.add(conn, request_id=rid, name=name, spec=spec, want_backend=backend)
        )

    async def get_request(self, request_id: str) -> Request | None:
        return await self.call_read(lambda conn: _requests.get(conn, request_id))

    async def list_requests(
        self,
        *,
        status: Iterable[RequestStatus | str] | None = None,
        backend: str | None = None,
        limit: int | None = None,
        newest_first: bool = True,
    ) -> list[Request]:
        statuses = [RequestStatus(s) for s in status] if status is not None else None
        backend_id = None
        if backend is not None:
            backend_id = await self._backend_id(backend)
            if backend_id is None:
                return []
        return await self.call_read(
            lambda conn: _requests.list_requests(
                conn, statuses=statuses, backend_id=backend_id, limit=limit, newest_first=newest_first
            )
        )

    async def request_counts(
        self, *, status: Iterable[RequestStatus | str] | None = None
    ) -> dict[tuple[str | None, str], int]:
        """(backend or None, status) -> number of requests; ``status`` counts only those (an
        index serves it: cheap to poll for the open ones while the final ones pile up)."""
        statuses = [RequestStatus(s) for s in status] if status is not None else None
        return await self.call_read(lambda conn: _requests.counts(conn, statuses))

    async def claim_requests(self, dispatcher: str, limit: int = 100) -> list[Request]:
        """Take up to ``limit`` pending requests nobody holds (PostgreSQL: SKIP LOCKED)."""
        skip_locked = self.dialect == "postgresql"
        return await self.call(
            lambda conn: _requests.claim(conn, dispatcher, limit, skip_locked=skip_locked), exclusive=False
        )

    async def request_claimants(self, *, exclude: str) -> set[str]:
        return await self.call_read(lambda conn: _requests.claimants(conn, exclude))

    async def take_over_requests(self, old: str, new: str) -> list[Request]:
        """Move a dead dispatcher's pending requests to ``new``."""
        return await self.call(lambda conn: _requests.take_over(conn, old, new), exclusive=False)

    async def release_requests(self, dispatcher: str) -> int:
        """Give back the requests ``dispatcher`` holds and has not placed."""
        return await self.call(lambda conn: _requests.release(conn, dispatcher), exclusive=False)

    async def place_request(
        self, request_id: str, dispatcher: str, backend: str, instance: dict[str, Any]
    ) -> Request:
        """Before sending the create: the backend chosen, an attempt counted, the instance row
        (BUILD, ``instance`` = its add_instance fields) added, in one transaction."""
        backend_id = await self.ensure_backend(backend)

        def run(conn: Connection) -> Request:
            placed_before = _requests.must_get(conn, request_id).backend == backend
            request = _requests.place(conn, request_id, dispatcher, backend_id)
            existing = conn.execute(
                select(instances_t.c.status, instances_t.c.create_job_id).where(
                    instances_t.c.backend_id == backend_id, instances_t.c.name == request.instance
                )
            ).first()
            # a retry of this request's own earlier attempt finds its BUILD row: keep it; a BUILD
            # row of anyone else's (another request, a create of the facade's) is refused
            if (
                not placed_before
                or existing is None
                or existing.status != InstanceStatus.BUILD
                or existing.create_job_id is not None
            ):
                values = {"status": InstanceStatus.BUILD.value, "owned": True, **instance}
                _add_instance(conn, backend_id, backend, request.instance, values)
            return request

        return await self.call(run)

    async def unplace_request(self, request_id: str, dispatcher: str, *, error: str | None = None) -> Request:
        """Ganeti certainly got nothing: forget the backend and the BUILD row (placed anew later)."""
        return await self.call(lambda conn: _requests.unplace(conn, request_id, dispatcher, error=error))

    async def submitted_request(self, request_id: str, job_id: int, *, start: bool | None = None) -> Request:
        """The create was accepted as ``job_id``: the request is submitted and the job recorded
        against its instance (a job end stored already settles both at once)."""

        def run(conn: Connection) -> Request:
            request = _requests.must_get(conn, request_id)
            if request.backend is None:
                raise StoreError(f"request {request_id} has no backend: place it before recording its job")
            backend_id = (
                self._backend_ids.get(request.backend)
                or conn.execute(
                    select(backends_t.c.id).where(backends_t.c.name == request.backend)
                ).scalar_one()
            )
            _requests.mark_submitted(conn, request_id, job_id)
            _record_instance_job(
                conn,
                backend_id,
                request.backend,
                request.instance,
                job_id,
                InstanceAction.CREATE,
                start,
                None,
            )
            return _requests.must_get(conn, request_id)

        return await self.call(run)

    async def finish_request(
        self,
        request_id: str,
        status: RequestStatus | str,
        *,
        error: str | None = None,
        dispatcher: str | None = None,
        instance_status: InstanceStatus | None = None,
    ) -> Request:
        """End a request that never became a job (no capacity, refused by Ganeti, canceled);
        its instance row, if placed, takes ``instance_status`` (ERROR for a refused create)."""
        final = RequestStatus(status)

        def run(conn: Connection) -> Request:
            request = _requests.must_get(conn, request_id)
            # a final request's name may have started a new life on its backend: leave that alone
            if request.backend is not None and instance_status is not None and not request.is_final:
                backend_id = conn.execute(
                    select(backends_t.c.id).where(backends_t.c.name == request.backend)
                ).scalar_one()
                conn.execute(
                    update(instances_t)
                    .where(
                        instances_t.c.backend_id == backend_id,
                        instances_t.c.name == request.instance,
                        instances_t.c.status == InstanceStatus.BUILD.value,
                        instances_t.c.create_job_id.is_(None),
                    )
                    .values(status=instance_status.value, updated_at=datetime.now(UTC))
                )
            return _requests.finish(conn, request_id, final, error=error, dispatcher=dispatcher)

        return await self.call(run)

    async def destroy_unbuilt(
        self, backend: str, name: str, job_id: int, result: JobStatus, *, error: str | None = None
    ) -> StoredInstance:
        """The create ``job_id`` of BUILD instance ``name`` ended ``result`` (canceled by a delete,
        or failed): the instance never exists. In one transaction it becomes DESTROYED, the
        create's end counts as applied (stored later, it moves nothing) and its request ends
        (canceled, or failed with ``error``)."""
        if result is JobStatus.SUCCESS or not result.is_final:
            raise ValueError(f"only a create that ended without success leaves nothing built, not {result}")
        backend_id = await self.ensure_backend(backend)
        if result is JobStatus.CANCELED:
            status, why = RequestStatus.CANCELED, f"job {job_id} was canceled"
        else:
            status, why = RequestStatus.FAILED, error or f"job {job_id} ended in {result.value}"

        def run(conn: Connection) -> StoredInstance:
            instance = _instance(conn, backend_id, backend, name)
            now = datetime.now(UTC)
            conn.execute(
                update(instances_t)
                .where(instances_t.c.id == instance.id)
                .values(status=InstanceStatus.DESTROYED.value, updated_at=now)
            )
            conn.execute(
                update(instance_jobs_t)
                .where(
                    instance_jobs_t.c.backend_id == backend_id,
                    instance_jobs_t.c.job_id == job_id,
                    instance_jobs_t.c.applied_at.is_(None),
                )
                .values(applied_at=now, result=result.value)
            )
            _requests.settle_job(conn, backend_id, job_id, status, why)
            return _instance(conn, backend_id, backend, name)

        return await self.call(run)

    async def cancel_request(self, request_id: str) -> tuple[Request, bool]:
        """Cancel in the database what can be (see :func:`_requests.request_cancel`)."""
        return await self.call(lambda conn: _requests.request_cancel(conn, request_id))

    # -- backend health and events --------------------------------------------------------------

    async def set_backend_health(
        self, name: str, up: bool, *, detail: str | None = None, event: str | None = None
    ) -> None:
        """Record a backend's health (shown by ``backends list``); ``event`` also stores a backend event."""
        backend_id = await self.ensure_backend(name)
        await self.call(lambda conn: _requests.set_health(conn, backend_id, up, detail, event=event))

    async def add_backend_event(self, name: str, kind: str, message: str) -> None:
        backend_id = await self.ensure_backend(name)
        await self.call(lambda conn: _requests.add_backend_event(conn, backend_id, kind, message))

    async def backend_states(self) -> dict[str, dict[str, Any]]:
        """Per backend in the database: drained, drained_at, health, health_at, health_detail."""

        async def run(conn: AsyncConnection) -> dict[str, dict[str, Any]]:
            rows = await conn.execute(
                select(
                    backends_t.c.name,
                    backends_t.c.drained,
                    backends_t.c.drained_at,
                    backends_t.c.health,
                    backends_t.c.health_at,
                    backends_t.c.health_detail,
                )
            )
            return {row.name: {k: v for k, v in row._mapping.items() if k != "name"} for row in rows}

        result: dict[str, dict[str, Any]] = await self._read(run)
        return result

    async def backend_events(self, *, backend: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """The newest backend events first: backend, kind, message, at."""

        async def run(conn: AsyncConnection) -> list[dict[str, Any]]:
            query = (
                select(
                    backends_t.c.name.label("backend"),
                    _requests.backend_events_t.c.kind,
                    _requests.backend_events_t.c.message,
                    _requests.backend_events_t.c.at,
                )
                .join(backends_t, backends_t.c.id == _requests.backend_events_t.c.backend_id)
                .order_by(_requests.backend_events_t.c.id.desc())
                .limit(limit)
            )
            if backend is not None:
                query = query.where(backends_t.c.name == backend)
            return [dict(row._mapping) for row in await conn.execute(query)]

        result: list[dict[str, Any]] = await self._read(run)
        return result

    async def _backend_id(self, name: str) -> int | None:
        if name in self._backend_ids:
            return self._backend_ids[name]

        async def run(conn: AsyncConnection) -> dict[int, str]:
            return await self._names(conn)

        await self._read(run)
        return self._backend_ids.get(name)

    async def call_read(self, fn: Callable[[Connection], T]) -> T:
        """Run a synchronous read ``fn(connection)`` on a connection of the async engine."""

        async def run(conn: AsyncConnection) -> T:
            return await conn.run_sync(fn)

        result: T = await self._read(run)
        return result

    # -- retention -------------------------------------------------------------------------------

    async def prune(self, older_than: timedelta) -> PruneResult:
        """Delete jobs that ended more than ``older_than`` ago (with their events), and the
        events of other ended jobs stored before then. Unfinished jobs and their events stay."""
        if older_than < timedelta(0):
            raise ValueError("older_than must not be negative")
        cutoff = datetime.now(UTC) - older_than
        final = [status.value for status in JobStatus if status.is_final]
        try:
            async with self.engine.connect() as conn:
                conn = await self._begin_write(conn)
                ended = and_(
                    jobs_t.c.status.in_(final), jobs_t.c.ended_at < cutoff, jobs_t.c.updated_at < cutoff
                )
                old_jobs = select(jobs_t.c.backend_id, jobs_t.c.job_id).where(ended)
                job_count = len((await conn.execute(old_jobs)).all())
                events_of_old = (
                    await conn.execute(
                        delete(events_t).where(
                            exists()
                            .where(jobs_t.c.backend_id == events_t.c.backend_id)
                            .where(jobs_t.c.job_id == events_t.c.job_id)
                            .where(
                                jobs_t.c.status.in_(final),
                                events_t.c.stored_at < cutoff,
                            )
                        )
                    )
                ).rowcount
                await conn.execute(delete(jobs_t).where(ended))
                await conn.commit()
        except (DBAPIError, OSError) as exc:
            raise self._error("cannot prune", exc) from None
        return PruneResult(events=int(events_of_old or 0), jobs=job_count)


# The writer's statements, built once: built per transaction, their construction and
# cache keys cost as much as running them.
_STORED_JOBS = select(
    jobs_t.c.job_id, jobs_t.c.summary, jobs_t.c.revision, jobs_t.c.event_count, jobs_t.c.archived
).where(
    jobs_t.c.backend_id == bindparam("b_backend_id"),
    jobs_t.c.job_id.in_(bindparam("b_ids", expanding=True)),
)
_INSERT_JOB = insert(jobs_t)
_INSERT_EVENTS = insert(events_t)
_WRITE_LOCK = text("SELECT pg_advisory_xact_lock(hashtext(current_database()), :key)")
_NOTIFY = text("SELECT pg_notify(:channel, '')")

_UPDATE_JOB = (
    update(jobs_t)
    .where(jobs_t.c.backend_id == bindparam("b_backend_id"), jobs_t.c.job_id == bindparam("b_job_id"))
    .values(
        status=bindparam("status"),
        instance=bindparam("instance"),
        ops=bindparam("ops"),
        summary=bindparam("summary"),
        received_at=bindparam("received_at"),
        started_at=bindparam("started_at"),
        ended_at=bindparam("ended_at"),
        archived=bindparam("archived"),
        revision=bindparam("revision"),
        event_count=bindparam("event_count"),
        updated_at=bindparam("updated_at"),
    )
)

_ARCHIVE_JOB = (
    update(jobs_t)
    .where(jobs_t.c.backend_id == bindparam("b_backend_id"), jobs_t.c.job_id == bindparam("b_job_id"))
    .values(archived=bindparam("archived"))
)


def _job_values(summary: JobSummary, *, archived: bool, now: datetime) -> dict[str, Any]:
    return {
        "status": summary.status.value,
        "instance": summary.instance,
        "ops": [
            {
                "index": op.index,
                "op_id": op.op_id,
                "status": op.status.value,
                "instance": op.instance,
                "start_time": op.start_time,
                "exec_time": op.exec_time,
                "end_time": op.end_time,
                "error": op.error,
            }
            for op in summary.ops
        ],
        "summary": summary.to_json(),
        "received_at": _dt(summary.received_time),
        "started_at": _dt(summary.start_time),
        "ended_at": _dt(summary.end_time),
        "archived": archived,
        "updated_at": now,
    }


def _stored_job(row: Row[Any]) -> StoredJob:
    return StoredJob(
        backend=row.backend,
        job_id=row.job_id,
        status=JobStatus(row.status),
        instance=row.instance,
        ops=tuple(
            StoredOp(
                index=op["index"],
                op_id=op["op_id"],
                status=JobStatus(op["status"]),
                instance=op.get("instance"),
                start_time=_dt(op.get("start_time")),
                exec_time=_dt(op.get("exec_time")),
                end_time=_dt(op.get("end_time")),
                error=op.get("error"),
            )
            for op in row.ops
        ),
        received_at=row.received_at,
        started_at=row.started_at,
        ended_at=row.ended_at,
        archived=bool(row.archived),
        revision=row.revision,
        event_count=row.event_count,
        first_seen_at=row.first_seen_at,
        updated_at=row.updated_at,
    )


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


def _reason(exc: BaseException) -> str:
    """A one-line reason from a database error, without the SQL or its parameters."""
    original = getattr(exc, "orig", None) or exc
    message = str(original).strip().splitlines()[0] if str(original).strip() else ""
    return f"{type(original).__name__}: {message[:200]}" if message else type(original).__name__


async def upgrade_database(url: str | URL) -> tuple[str, str | None, str | None]:
    """Create or upgrade the schema of ``url``; returns (display URL, revision before, after)."""
    store = Store(url, create=False)
    if store.dialect == "sqlite":
        store._check_sqlite_folder()
    engine = store._make_engine()
    try:
        before = await _migrate.current_revision(engine)
        await _migrate.upgrade(engine)
        after = await _migrate.current_revision(engine)
    except (SQLAlchemyError, OSError) as exc:
        raise store._error("cannot upgrade", exc) from None
    finally:
        await engine.dispose()
    return store.display_url, before, after


def _instance(conn: Connection, backend_id: int, backend: str, name: str) -> StoredInstance:
    row = conn.execute(
        select(instances_t).where(instances_t.c.backend_id == backend_id, instances_t.c.name == name)
    ).first()
    if row is None:
        raise StoreError(f"instance {name} of backend {backend} is not in the database")
    return StoredInstance.from_row(row, backend)


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


def _add_instance(
    conn: Connection, backend_id: int, backend: str, name: str, values: dict[str, Any]
) -> StoredInstance:
    now = datetime.now(UTC)
    values = {**values, "create_job_id": None, "state_time": None, "updated_at": now}
    where = (instances_t.c.backend_id == backend_id, instances_t.c.name == name)
    row = conn.execute(select(instances_t.c.id, instances_t.c.status).where(*where)).first()
    if row is None:
        conn.execute(insert(instances_t).values(backend_id=backend_id, name=name, created_at=now, **values))
    elif row.status in (InstanceStatus.DESTROYED, InstanceStatus.ERROR):
        # jobs of the name's previous life must not move the new one
        conn.execute(
            delete(instance_jobs_t).where(
                instance_jobs_t.c.instance_id == row.id, instance_jobs_t.c.applied_at.is_(None)
            )
        )
        conn.execute(update(instances_t).where(instances_t.c.id == row.id).values(**values))
    else:
        raise StoreError(
            f"instance {name} of backend {backend} is already in the database ({row.status}); "
            "delete it first or pick another name"
        )
    return _instance(conn, backend_id, backend, name)


def _record_instance_job(
    conn: Connection,
    backend_id: int,
    backend: str,
    name: str,
    job_id: int,
    action: InstanceAction,
    start: bool | None,
    params: dict[str, Any] | None,
) -> StoredInstance:
    now = datetime.now(UTC)
    instance = _instance(conn, backend_id, backend, name)
    exists_already = conn.execute(
        select(instance_jobs_t.c.job_id).where(
            instance_jobs_t.c.backend_id == backend_id, instance_jobs_t.c.job_id == job_id
        )
    ).first()
    if exists_already is None:
        conn.execute(
            insert(instance_jobs_t).values(
                backend_id=backend_id,
                job_id=job_id,
                instance_id=instance.id,
                action=action.value,
                start=start,
                params=params,
                recorded_at=now,
            )
        )
    if action is InstanceAction.CREATE:
        conn.execute(
            update(instances_t)
            .where(instances_t.c.id == instance.id)
            .values(create_job_id=job_id, updated_at=now)
        )
    summary = stored_final_job(conn, backend_id, job_id)
    if summary is not None:
        apply_final_jobs(conn, [(backend_id, job_id, summary)], now)
    return _instance(conn, backend_id, backend, name)
