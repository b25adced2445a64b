"""The store's one writer task: the bounded queue, batching, and riding out database trouble.

:meth:`Writer.put` queues job versions; :meth:`Writer.call` queues a write of the
facade's (a function of a connection) and waits for its result. The task takes what
is queued (up to ``batch_size`` items): versions go in one transaction (the jobs
repository's ``write_batch``), a call in one of its own, in the order queued.

A database that goes away makes the writer retry with backoff (:class:`Backoff`),
holding what it has. A SQLite file that another process keeps locked is the same for
job versions, but a caller of :meth:`Writer.call` waits only ``busy_timeout`` and then
gets a :class:`StoreError` saying the file is locked; its write is then never made.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, IntegrityError

from synnefo_ganeti import metrics
from synnefo_ganeti._backoff import Backoff
from synnefo_ganeti.errors import ConflictError, StoreError
from synnefo_ganeti.jobs import JobSummary
from synnefo_ganeti.store.db._batch import Batched, _BatchFailed
from synnefo_ganeti.store.db._commits import BatchResult, CommitInfo, WriterStats
from synnefo_ganeti.store.db._engine import Database, is_deadlock, reason

if TYPE_CHECKING:  # the writer queues job-file versions; the jobs concern defines them
    from synnefo_ganeti.store.jobs._models import JobVersion

__all__ = ["Writer"]

log = logging.getLogger("synnefo_ganeti.store")

T = TypeVar("T")

_TRANSIENT = (DBAPIError, OSError, TimeoutError, ConnectionError)
#: attempts of one call while the database is unavailable (about 5 minutes with the backoff)
_CALL_ATTEMPTS = 60
#: the writer's wait for more calls before a hot call's transaction, while callers come together
#: (group commit: fewer, larger transactions when a burst keeps the database busy; issue 31)
LINGER = 0.003
#: the last group of calls had at least this many: callers are coming together
LINGER_SIBLINGS = 2
#: waits of :data:`LINGER` at most before one transaction, each after one that brought more
#: calls: while several dispatchers share a burst, each one's callers come half as often, and
#: a group of half the size costs a transaction's round trips all the same (issue 31; 4 until
#: 2026-12-01: 10 cut two dispatchers' CPU by about 3 %, their latency unchanged)
LINGER_STEPS = 10
#: the last batch of job versions had at least this many: a burst's, worth a wait for more
#: (the follow lease's holder of several dispatchers, its writer less busy, wrote a burst's
#: versions in twice the transactions one dispatcher did)
LINGER_VERSIONS = 16
_pause = asyncio.sleep  # (tests hold the linger open)


@dataclass(slots=True)
class _Call:
    """A write of the facade's or the reconciler's, run by the writer in a transaction of its own."""

    fn: Callable[[Connection], Any]
    future: asyncio.Future[Any]
    #: PostgreSQL: take the writers' advisory lock (False for request claims, which rely on row locks)
    exclusive: bool = True
    #: PostgreSQL: take it shared instead (placements, submit records: they lock the jobs they
    #: touch by key, ``store/db/_locks.py``, and exclude only the writes that read and then decide)
    shared: bool = False
    queued_at: float = field(default_factory=time.monotonic)
    #: the writer took it up; or its caller gave up waiting first (the writer then skips it)
    started: bool = False
    abandoned: bool = False
    #: calls of one kind queued together run as one set-based step (``fn`` alone otherwise)
    batch: Batched | None = None


_Pending: TypeAlias = "JobVersion | _Call | None"


class Writer:
    """The queue and the task that empties it; one per open store."""

    def __init__(
        self,
        db: Database,
        write_batch: Callable[[list[JobVersion]], Awaitable[BatchResult]],
        *,
        batch_size: int,
        queue_size: int,
    ) -> None:
        self.db = db
        self.batch_size = batch_size
        self.stats = WriterStats()
        #: called after each commit of the writer (in the writer task; keep them quick)
        self.on_commit: list[Callable[[CommitInfo], None]] = []
        self._write_batch = write_batch
        self._queue_size = queue_size
        self._queue: asyncio.Queue[_Pending] | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.wakeup = asyncio.Event()
        #: how long a hot call waits for others before its transaction, while callers come
        #: together (:meth:`_should_linger`); 0: never
        self.linger = LINGER
        self._last_group = 0
        self._last_versions = 0
        #: SQLite: since when (monotonic) the writer's transactions fail with "database is locked"
        self._locked_since: float | None = None

    # -- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> None:
        self._queue = asyncio.Queue(self._queue_size)
        self._task = asyncio.create_task(self._loop(), name=f"store-writer {self.db.display_url}")

    async def stop(self, flush_timeout: float) -> None:
        """Write what is queued (waiting up to ``flush_timeout``), then end the task."""
        self._closed = True
        if self._task is None or self._queue is None:
            return
        left = self._queue.qsize()
        try:
            await asyncio.wait_for(self._stop(), flush_timeout)
        except TimeoutError:
            log.error(
                "database %s: %d job versions not stored when closing (the watcher reads them "
                "again from the queue directory on its next start)",
                self.db.display_url,
                left,
            )
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _stop(self) -> None:
        assert self._queue is not None and self._task is not None
        await self._queue.put(None)
        await asyncio.shield(self._task)

    def _open_queue(self) -> asyncio.Queue[_Pending]:
        if self._queue is None or self._closed:
            raise RuntimeError("the store is not open")
        return self._queue

    # -- queueing ------------------------------------------------------------------------------------

    async def put(self, version: JobVersion) -> None:
        """Queue one version; waits while the queue is full."""
        queue = self._open_queue()
        if self._task is not None and self._task.done():
            self._task.result()  # the writer died: say why
        await queue.put(version)

    async def flush(self) -> None:
        """Wait until everything queued so far is committed."""
        if self._queue is not None:
            await self._queue.join()

    @property
    def pending(self) -> int:
        return 0 if self._queue is None else self._queue.qsize()

    async def call(
        self,
        fn: Callable[[Connection], T],
        *,
        exclusive: bool = True,
        shared: bool = False,
        batch: Batched | None = None,
    ) -> T:
        """Run ``fn(connection)`` in a write transaction of the writer task; its result.

        ``exclusive``/``shared``: the writers' advisory lock (PostgreSQL) exclusive (the
        default), shared (``shared=True``: a write that locks what it touches by key), or none
        (``exclusive=False``). ``batch``: the same write as a step of a set-based function, which
        the writer runs once for all the calls of that kind it finds queued together (``fn`` for
        those it leaves)."""
        queue = self._open_queue()
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        call = _Call(fn, future, exclusive and not shared, shared, batch=batch)
        await queue.put(call)
        if self.db.dialect != "sqlite":
            return await future
        # SQLite: the writer may be stuck behind another process's lock with versions it holds
        # (it retries those for ever); a caller waits busy_timeout, then hears why.
        busy_timeout = self.db.busy_timeout
        try:
            while not future.done():
                await asyncio.wait([future], timeout=min(0.1, busy_timeout))
                waited = time.monotonic() - call.queued_at
                locked = self._locked_since is not None
                if locked and waited >= busy_timeout and not future.done() and not call.started:
                    call.abandoned = True
                    future.cancel()
                    raise self.db.locked_error(waited)
        except asyncio.CancelledError:
            future.cancel()
            raise
        return future.result()

    # -- waking readers ------------------------------------------------------------------------------

    def wake(self) -> None:
        wakeup, self.wakeup = self.wakeup, asyncio.Event()
        wakeup.set()

    async def wait_for_change(self, timeout: float) -> bool:
        wakeup = self.wakeup
        try:
            async with asyncio.timeout(timeout):
                await wakeup.wait()
        except TimeoutError:
            return False
        return True

    # -- the task ------------------------------------------------------------------------------------

    async def _loop(self) -> None:
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
            lingers, before = 0, 0
            while len(items) < self.batch_size and not stopping:
                try:
                    item = queue.get_nowait()
                except asyncio.QueueEmpty:
                    if lingers >= LINGER_STEPS or (lingers and len(items) == before):
                        break  # waited enough, or the last wait brought nobody
                    if not self._should_linger(first):
                        break
                    # callers at once (the last group had several): a moment for more of them,
                    # as PostgreSQL's commit_delay with commit_siblings (see LINGER), and
                    # another while they keep coming
                    lingers, before = lingers + 1, len(items)
                    self.stats.lingers += 1
                    await _pause(self.linger)
                    continue
                taken += 1
                if item is None:
                    stopping = True
                else:
                    items.append(item)
            try:
                # the calls taken, in one transaction (each call in a savepoint, or a step of a
                # set-based batch; with the writers' lock if one of them needs it, which the
                # others do not mind), then the versions in one: one commit for many callers.
                # Each caller has one call queued at a time, and the versions' order among
                # themselves is kept; a version and a call may commit in either order (a job
                # recorded after its end was stored is settled at once). (The versions keep a
                # transaction of their own: in the calls' one, every caller would wait for them.)
                calls = [item for item in items if isinstance(item, _Call)]
                if calls:
                    await self._calls(calls)
                batch = [item for item in items if not isinstance(item, _Call)]
                if batch:
                    self._last_versions = len(batch)
                    await self._write_with_retry(batch)
            finally:
                for _ in range(taken):
                    queue.task_done()

    def _should_linger(self, first: _Pending) -> bool:
        """Wait :attr:`linger` for more calls before a call's transaction: only a call that has
        a set-based step (the hot writes: requests added, placed, submitted), and only while
        callers come together (the last group of calls had :data:`LINGER_SIBLINGS` or more). A
        caller alone (an API writing one request at a time) never waits. Job versions likewise,
        while they come in numbers (the last batch had :data:`LINGER_VERSIONS` or more: a burst)."""
        if self.linger <= 0 or first is None:
            return False
        if isinstance(first, _Call):
            return first.batch is not None and self._last_group >= LINGER_SIBLINGS
        return self._last_versions >= LINGER_VERSIONS

    def _retried(self, exc: BaseException) -> bool:
        """Count a retry; whether ``exc`` is SQLite's "locked", noting since when it is."""
        self.stats.retries += 1
        metrics.STORE_WRITE_RETRIES.inc()
        locked = self.db.is_locked(exc)
        if locked and self._locked_since is None:
            self._locked_since = time.monotonic()
        return locked

    def _deadlock(self, exc: BaseException) -> None:
        """PostgreSQL ended one of the writer's transactions to break a cycle of lock waits with
        another's (two keys taken in two orders: ``store/db/_locks.py``): run again, at once."""
        self.stats.retries += 1
        metrics.STORE_WRITE_RETRIES.inc()
        log.info("database %s: %s; writing it again", self.db.display_url, reason(exc))

    async def _calls(self, calls: list[_Call]) -> None:
        """Several callers' writes in one transaction (a savepoint each: one that fails is
        rolled back alone); on database trouble, each call on its own with the usual retries."""
        calls = [call for call in calls if not call.abandoned]
        self._last_group = len(calls)
        if not calls or (len(calls) == 1 and calls[0].batch is None):
            for call in calls:
                await self._call_with_retry(call)
            return
        # (a call alone with a batch step runs it too: the step is the short path, a new request
        # checked and written in four round trips where its own function takes eight)
        for call in calls:
            call.started = True
        group = [(call.fn, call.batch) for call in calls]
        # the strongest lock one of them needs: exclusive, else shared, else none
        exclusive = any(call.exclusive for call in calls)
        shared = not exclusive and any(call.shared for call in calls)
        try:
            try:
                outcomes = await self.db.run_group(group, exclusive=exclusive, shared=shared)
            except _BatchFailed:
                # a batch step failed (a race its checks did not see): all again, each step in
                # a savepoint of its own, where a failed one is rolled back alone (see ._batch)
                outcomes = await self.db.run_group(group, exclusive=exclusive, shared=shared, savepoints=True)
        except (*_TRANSIENT, _BatchFailed):
            for call in calls:  # (the retries count and say what went wrong)
                await self._call_with_retry(call)
            return
        except Exception as exc:
            for call in calls:
                if not call.future.done():
                    call.future.set_exception(exc)
            return
        self._locked_since = None
        self.stats.grouped += len(calls)
        self.stats.groups += 1
        for call, (ok, value) in zip(calls, outcomes, strict=True):
            if call.future.done():
                continue
            if ok:
                call.future.set_result(value)
            elif isinstance(value, IntegrityError):
                call.future.set_exception(self._conflict(value))
            else:
                call.future.set_exception(value)
        self.wake()

    def _conflict(self, exc: IntegrityError) -> ConflictError:
        return ConflictError(
            f"conflict writing to database {self.db.display_url}: {reason(exc)}; "
            "another write got there first: read again and retry",
            url=self.db.display_url,
        )

    async def _call_with_retry(self, call: _Call) -> None:
        if call.abandoned:
            return  # its caller was told the database is locked: it must not happen later
        call.started = True
        backoff = Backoff(initial=0.05, maximum=5.0)
        for attempt in range(_CALL_ATTEMPTS):
            try:
                result = await self.db.run_transaction(call.fn, exclusive=call.exclusive, shared=call.shared)
            except IntegrityError as exc:
                if not call.future.done():
                    call.future.set_exception(self._conflict(exc))
                return
            except _TRANSIENT as exc:
                if is_deadlock(exc):  # (another transaction's keys: at once, as the batch's below)
                    self._deadlock(exc)
                    continue
                if self._retried(exc):
                    waited = time.monotonic() - call.queued_at
                    if waited >= self.db.busy_timeout:
                        self._locked_since = None  # the writer moves on: the next transaction will tell
                        if not call.future.done():
                            call.future.set_exception(self.db.locked_error(waited))
                        return
                if attempt == 0:
                    log.warning("database %s unavailable (%s); retrying", self.db.display_url, reason(exc))
                await asyncio.sleep(backoff.next())
                continue
            except Exception as exc:
                if not call.future.done():
                    call.future.set_exception(exc)
                return
            self._locked_since = None
            if not call.future.done():
                call.future.set_result(result)
            self.wake()
            return
        if not call.future.done():
            call.future.set_exception(
                StoreError(
                    f"database {self.db.display_url} stayed unavailable; nothing written",
                    url=self.db.display_url,
                )
            )

    async def _write_with_retry(self, batch: list[JobVersion]) -> None:
        backoff = Backoff(initial=0.05, maximum=5.0)
        down_since: float | None = None
        conflicts = 0
        while True:
            try:
                done = await self._write_batch(batch)
            except IntegrityError as exc:
                # Another process stored the same job between our read and our write;
                # reading again inside a new transaction settles it.
                conflicts += 1
                self.stats.retries += 1
                metrics.STORE_WRITE_RETRIES.inc()
                if conflicts > 5:
                    raise self.db.error("repeated conflicts writing to", exc) from None
                continue
            except _TRANSIENT as exc:
                if is_deadlock(exc):
                    self._deadlock(exc)
                    continue
                locked = self._retried(exc)
                if down_since is None:
                    down_since = time.monotonic()
                    log.warning(
                        "database %s unavailable (%s%s); holding %d job versions and retrying",
                        self.db.display_url,
                        reason(exc),
                        ", locked by another process" if locked else "",
                        len(batch) + self.pending,
                    )
                # a lock: its holder may end at any moment, and each attempt waits busy_timeout
                delay = backoff.next()
                await asyncio.sleep(min(delay, 0.5) if locked else delay)
                continue
            self._locked_since = None
            if down_since is not None:
                log.warning(
                    "database %s is back after %.1f s; writing resumed",
                    self.db.display_url,
                    time.monotonic() - down_since,
                )
            self._committed(batch, *done)
            return

    def _committed(
        self,
        batch: list[JobVersion],
        applied: list[tuple[str, JobSummary]],
        skipped: int,
        older: int,
        events: int,
        ended_before: list[tuple[str, JobSummary]],
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
            self.wake()
        if self.on_commit:
            info = CommitInfo(
                versions=len(batch),
                applied=tuple(applied),
                skipped=skipped,
                events=events,
                committed_at=committed_at,
                oldest_read_at=min(version.read_at for version in batch),
                ended_before=tuple(ended_before),
            )
            for listener in self.on_commit:
                listener(info)
