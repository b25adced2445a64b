"""The store: one database (SQLite or PostgreSQL), one batching writer task, and the readers.

:class:`Store` is a facade: each method hands over to one part, which is where to
read (and change) what it does:

* :mod:`._engine`: engines, SQLite WAL and its write lock, PostgreSQL's advisory
  lock, the schema check on open, :func:`upgrade_database`;
* :mod:`._writer`: the bounded queue and the one writer task, batching and retries;
* :mod:`._jobs` and :mod:`._events`: applying job versions, reading jobs, pruning;
  reading and following events;
* :mod:`._backends`, :mod:`._instances_repo`, :mod:`._requests_repo`: backends,
  instances, durable create requests (the facade's request methods are in
  :mod:`._store_requests`, a mixin the Store inherits).

Errors: :class:`NotFoundError` (an instance or request the database lacks),
:class:`ConflictError` (a name taken, a clashing write; :class:`RequestNotHeldError`),
:class:`InvalidError` (arguments refused); :class:`StoreError` only when the database
could not do it (unreachable, locked by another process, another schema).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Collection, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from datetime import datetime, timedelta
from typing import Any, Self, TypeVar, Unpack

from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from synnefo_ganeti.jobs import JobFile, JobStatus, JobSummary
from synnefo_ganeti.store._pinned import PinnedRead, pinned_read
from synnefo_ganeti.store.backends._backends import Backends, NodeRow
from synnefo_ganeti.store.changes._changes import Change, Changes
from synnefo_ganeti.store.db._commits import CommitInfo, WriterStats
from synnefo_ganeti.store.db._engine import Database, upgrade_database
from synnefo_ganeti.store.db._writer import Writer
from synnefo_ganeti.store.instances import _recorded
from synnefo_ganeti.store.instances._apply import apply_final_jobs
from synnefo_ganeti.store.instances._instances import InstanceAction, InstanceStatus, StoredInstance
from synnefo_ganeti.store.instances._instances_repo import InstancePage, Instances
from synnefo_ganeti.store.jobs._events import Events, EventsSignal
from synnefo_ganeti.store.jobs._jobs import Jobs
from synnefo_ganeti.store.jobs._models import (
    JobVersion,
    PruneResult,
    StoredEvent,
    StoredJob,
    StoredOp,
)
from synnefo_ganeti.store.requests._names import UniqueNames
from synnefo_ganeti.store.requests._requests_repo import Requests
from synnefo_ganeti.store.requests._store_requests import RequestMethods

__all__ = [
    "CommitInfo",
    "JobVersion",
    "PruneResult",
    "Store",
    "StoredEvent",
    "StoredJob",
    "StoredOp",
    "WriterStats",
    "upgrade_database",
]

T = TypeVar("T")


class Store(RequestMethods):
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
        db = self._db = Database(url, create=create, busy_timeout=busy_timeout)
        self.url = db.url
        self.display_url = db.display_url
        self.dialect = db.dialect
        self.create = create
        self.busy_timeout = busy_timeout
        self.batch_size = batch_size
        # the writer hands its batches of versions to the jobs repository
        self._writer = Writer(
            db, lambda batch: self._jobs.write_batch(batch), batch_size=batch_size, queue_size=queue_size
        )
        self._backends = Backends(db, self._writer)
        self._jobs = Jobs(db, self._backends, apply_final_jobs)
        self._events = Events(db, self._backends, self._writer, poll_interval=poll_interval)
        self._changes = Changes(db, self._writer, poll_interval=poll_interval)
        self._instances = Instances(db, self._backends, self._writer)
        self._requests = Requests(db, self._backends, self._writer)
        self._open = False

    def __repr__(self) -> str:
        return f"<Store {self.display_url}>"

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def open(self) -> None:
        if self._open:
            return
        await self._db.open()
        self._open = True
        self._writer.start()

    async def close(self, *, flush_timeout: float = 30.0) -> None:
        """Store what is queued (waiting up to ``flush_timeout`` for the database), then close."""
        if not self._open:
            return
        self._open = False  # (a second close does nothing)
        await self._writer.stop(flush_timeout)
        await self._db.close()

    @property
    def engine(self) -> AsyncEngine:
        return self._db.engine

    @property
    def _sync_engine(self) -> Engine | None:  # SQLite files: the writer's (benchmarks count on it)
        return self._db.sync_engine

    @property
    def poll_interval(self) -> float:
        return self._events.poll_interval

    @poll_interval.setter
    def poll_interval(self, value: float) -> None:
        self._events.poll_interval = self._changes.poll_interval = value

    @property
    def stats(self) -> WriterStats:
        return self._writer.stats

    @property
    def on_commit(self) -> list[Callable[[CommitInfo], None]]:
        """Called after each commit of the writer (in the writer task; keep them quick)."""
        return self._writer.on_commit

    # -- writing -------------------------------------------------------------------------------

    async def put(self, version: JobVersion) -> None:
        """Queue one version for the writer; waits while the queue is full."""
        await self._writer.put(version)

    async def record(self, backend: str, job: JobFile, *, archived: bool = False) -> None:
        """Store one version and wait until it is committed (a convenience for one-off writes)."""
        await self.put(JobVersion(backend, job, archived))
        await self.flush()

    async def flush(self) -> None:
        """Wait until everything queued so far is committed."""
        await self._writer.flush()

    @property
    def pending(self) -> int:
        return self._writer.pending

    async def call(self, fn: Callable[[Connection], T], *, exclusive: bool = True) -> T:
        """Run ``fn(connection)`` in a write transaction of the writer task; its result.

        ``exclusive=False`` (PostgreSQL): without the writers' advisory lock, for
        transactions that serialise on row locks of their own (request claims)."""
        return await self._writer.call(fn, exclusive=exclusive)

    async def call_read(self, fn: Callable[[Connection], T]) -> T:
        """Run a synchronous read ``fn(connection)`` on a connection of the async engine."""
        return await self._db.call_read(fn)

    def pinned_read(self) -> AbstractAsyncContextManager[PinnedRead]:
        """``async with store.pinned_read() as read``: reads of one snapshot taken on entering
        (``await read.call(fn)``; see :mod:`._pinned`)."""
        return pinned_read(self._db)

    async def wait_for_change(self, timeout: float) -> bool:
        """Wait until this store's writer commits something, or ``timeout`` seconds; True if it did.

        Only this process's commits wake it: code waiting on another process's writes
        polls with it (the timeout is the poll interval)."""
        return await self._writer.wait_for_change(timeout)

    # -- jobs and events -----------------------------------------------------------------------
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
        return await self._jobs.list_jobs(
            backend=backend, job_id=job_id, status=status, instance=instance, limit=limit
        )

    async def archived_final_job_ids(self, backend: str) -> set[int]:
        """Ids of this backend's jobs stored as final and seen in the archive (a rescan skips them)."""
        return await self._jobs.archived_final_ids(backend)

    async def ended_jobs(self, backend: str, job_ids: Collection[int]) -> list[JobSummary]:
        """Of ``backend``'s jobs ``job_ids``, the summaries of those stored as final (by any process)."""
        return await self._jobs.ended(backend, job_ids)

    def events_signal(self) -> AbstractAsyncContextManager[EventsSignal | None]:
        """PostgreSQL: a signal set whenever any process stores job events; SQLite: None (poll)."""
        return self._events.signal()

    async def count_jobs(self, *, backend: str | None = None) -> int:
        return await self._jobs.count(backend=backend)

    async def list_events(
        self,
        *,
        since: int | datetime = 0,
        backend: str | None = None,
        job_id: int | None = None,
        limit: int | None = 1000,
    ) -> list[StoredEvent]:
        """Stored events after event id ``since`` (or stored at/after a datetime), in id order."""
        return await self._events.list_events(since=since, backend=backend, job_id=job_id, limit=limit)

    def events(
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
        return self._events.follow(since, backend=backend, job_id=job_id, follow=follow)

    # -- the change feed (rows written by triggers; see _changes) ---------------------------------
    async def list_changes(self, *, after: int = 0, limit: int | None = 1000) -> list[Change]:
        """The changes with an id above ``after``, in id order, at most ``limit``."""
        return await self._changes.list_changes(after=after, limit=limit)

    async def last_change_id(self) -> int:
        return await self._changes.last_id()

    def changes(self, since: int | None = None) -> AsyncGenerator[Change, None]:
        """Every change after id ``since`` (None: from now on), forever; woken as events() is."""
        return self._changes.follow(since)

    @property
    def feed(self) -> Changes:  # the repository: waiter(), cursor(name), advance(name, id)
        return self._changes

    async def prune(self, older_than: timedelta) -> PruneResult:
        """Delete jobs that ended more than ``older_than`` ago (with their events), and the
        events of other ended jobs stored before then. Unfinished jobs and their events stay."""
        return await self._jobs.prune(older_than)

    # -- backends ------------------------------------------------------------------------------

    async def ensure_backend(self, name: str) -> int:
        """The id of backend ``name``, creating its row if needed."""
        return await self._backends.ensure(name)

    async def backends(self) -> list[str]:
        return await self._backends.all_names()

    async def set_backend_drained(self, name: str, drained: bool) -> bool:
        """Drain (no new instances) or undrain a backend; True when that changed its state."""
        return await self._backends.set_drained(name, drained)

    async def drained_backends(self) -> set[str]:
        """The backends an operator drained in the database."""
        return await self._backends.drained()

    async def set_backend_health(
        self, name: str, up: bool, *, detail: str | None = None, event: str | None = None
    ) -> None:
        """Record a backend's health (shown by ``backends list``); ``event`` also stores a backend event."""
        await self._backends.set_health(name, up, detail=detail, event=event)

    async def add_backend_event(self, name: str, kind: str, message: str) -> None:
        await self._backends.add_event(name, kind, message)

    async def backend_states(self) -> dict[str, dict[str, Any]]:
        """Per backend in the database: drained, drained_at, health, health_at, health_detail."""
        return await self._backends.states()

    async def backend_events(self, *, backend: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """The newest backend events first: backend, kind, message, at."""
        return await self._backends.events(backend=backend, limit=limit)

    async def set_backend_nodes(
        self, name: str, nodes: Mapping[str, NodeRow], *, complete: bool = False
    ) -> dict[str, str]:
        """Store nodes of backend ``name`` as the dispatcher read them (``backend_nodes``: up, down or
        offline, since, seen_at, the first sign); ``complete``: every node it has. The nodes whose
        state changed, with their new state (each change a backend event)."""
        return await self._backends.set_nodes(name, nodes, complete=complete)

    async def backend_nodes(self, name: str | None = None) -> dict[str, list[dict[str, Any]]]:
        """Per backend (or ``name`` only), its nodes as the dispatcher last stored them: name,
        state ("up", "down", "offline"), since, seen_at, detail (why it is not up)."""
        return await self._backends.nodes(name)

    async def set_backend_stats(
        self, backend: str, stats: dict[str, Any], *, read_at: datetime | None = None
    ) -> None:
        """Keep ``stats`` (JSON) as ``backend``'s latest whole node stats, read at ``read_at``
        (default now): the other dispatchers take them from here (``backend_stats``)."""
        await self._backends.set_stats(backend, stats, read_at=read_at)

    async def backend_stats(self, backend: str) -> tuple[dict[str, Any], datetime] | None:
        """``backend``'s latest whole node stats as stored, and when their read began; None: none."""
        return await self._backends.stats(backend)

    # -- instances -----------------------------------------------------------------------------

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
        unique_names: UniqueNames | None = None,
    ) -> StoredInstance:
        """Write an instance row (BUILD by default). A name whose instance was DESTROYED or
        ended in ERROR starts a new life; any other existing row is a :class:`ConflictError`,
        as is (``unique_names``) the name held on another backend or by an open request."""
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
        return await self._instances.add(backend, name, values, unique_names=unique_names)

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
        return await self._instances.record_job(
            backend, name, job_id, InstanceAction(action), start=start, params=params
        )

    async def update_instance(self, backend: str, name: str, **values: Any) -> StoredInstance:
        """Set columns of one instance (the reconciler's DB-side fixes)."""
        return await self._instances.update(backend, name, values)

    async def get_instance(
        self, backend: str | None, name: str | None, *, id: str | None = None
    ) -> StoredInstance | None:
        """The instance ``name`` of ``backend`` (its live row, else its newest DESTROYED one), or
        (``id``) the one with that id, DESTROYED ones too (ids are never reused), a request's
        instance also before it is placed (``backend`` None); None: none."""
        found = await self.list_instances(backend=backend, name=name, id=id)
        if found:
            return found[0]
        if id is not None and backend is None and name is None:
            # a request's instance without its row (not placed yet, between two attempts, or
            # ended with nothing made): its request tells it (store/requests/_request_view.py)
            return await self.request_instance_view(id)
        return None

    async def list_instances(
        self,
        *,
        backend: str | None = None,
        name: str | None = None,
        status: Iterable[InstanceStatus | str] | None = None,
        **page: Unpack[InstancePage],
    ) -> list[StoredInstance]:
        """Instances ordered by backend and name; by id with ``limit`` or ``after`` (the last id seen)."""
        return await self._instances.list_instances(backend=backend, name=name, status=status, **page)

    async def instance_jobs(self, backend: str, name: str) -> list[dict[str, Any]]:
        """The jobs recorded for an instance: job_id, action, recorded_at, applied_at, result."""
        return await self._instances.jobs_of(backend, name)

    async def unapplied_jobs(self, backend: str) -> list[int]:
        """Jobs recorded against instances of ``backend`` whose end is not applied yet (oldest first)."""
        return await self._instances.unapplied_jobs(backend)

    async def unapplied_jobs_by_backend(self, backends: Iterable[str] | None = None) -> dict[str, list[int]]:
        """Backend -> its recorded jobs whose end is not applied yet (oldest first), in one read."""
        return await _recorded.unapplied_jobs(self._db, backends)

    def listen_jobs(self) -> AbstractAsyncContextManager[_recorded.JobSignal | None]:
        """PostgreSQL: a signal set whenever any process records a job; SQLite: None (poll)."""
        return _recorded.listen_jobs(self._db)

    async def destroy_unbuilt(
        self, backend: str, name: str, job_id: int, result: JobStatus, *, error: str | None = None
    ) -> StoredInstance:
        """The create ``job_id`` of BUILD instance ``name`` ended ``result`` (canceled by a delete,
        or failed): the instance never exists. In one transaction it becomes DESTROYED, the
        create's end counts as applied (stored later, it moves nothing) and its request ends
        (canceled, or failed with ``error``)."""
        return await self._instances.destroy_unbuilt(backend, name, job_id, result, error=error)

    async def set_node_state(
        self, backend: str, node: str, state: str | None, *, detail: str | None = None
    ) -> int:
        """Mark every live instance of ``backend`` whose primary node is ``node``: ``state`` "down"
        (Ganeti's ``ERROR_nodedown``), "offline" (``ERROR_nodeoffline``) or None (up again); how
        many rows changed (each one a change in the feed). ``detail``: why (logged)."""
        return await self._instances.set_node_state(backend, node, state, detail=detail)

    async def store_node_states(self, backend: str, states: Mapping[str, str | None]) -> int:
        """Set the node state of each named live instance (a reconcile pass: from Ganeti's
        instance status, see :func:`._node_state.node_state_of`); how many rows changed."""
        return await self._instances.store_node_states(backend, states)

    async def mark_not_owned(self, backend: str, rows: Mapping[str, str]) -> int:
        """Mark the named live rows ``owned`` False (name -> the status they were seen in): Ganeti's
        instance of that name lacks the ownership marks (see :mod:`._not_owned`); how many changed."""
        return await self._instances.mark_not_owned(backend, rows)
