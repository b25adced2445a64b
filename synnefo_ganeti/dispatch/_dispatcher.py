"""The dispatcher: durable requests placed and submitted, job ends followed, backends watched.

One :class:`Dispatcher` runs, per backend of the configuration:

* the **queue watcher** when the backend's ``queue_dir`` is on this machine, else a
  :class:`~synnefo_ganeti.dispatch.JobTracker` long-polling RAPI ``/wait``;
* **node stats** refreshes for placement (``GET /2/nodes?bulk=1`` and ``/2/info``),
  on an interval and after placements ran;

and, over all backends: the **health monitor** (down after K failed probes: out of
placement, a backend event in the database, a log line, the webhook), the
**reconciler** every ``[reconcile] interval`` (each backend by one dispatcher at a time),
and the **submitter**, which claims pending requests and, for each:

1. places it with the :class:`~synnefo_ganeti.allocate.Allocator` (or on the backend the
   request names); no room anywhere: it waits and tries again, until
   ``[dispatcher] placement_timeout`` has passed since the request was made;
2. writes the placement (backend, attempt, instance row BUILD) *before* sending;
3. sends the create with the request id in its reason and as a tag;
4. records the job (request ``submitted``), or, when Ganeti certainly got nothing
   (502/503/504, connection refused, credentials or TLS refused, an answer that is
   not a job id and no job found), forgets the placement
   and places it again, that backend left out for a while; when the create may have been
   sent (reset, timeout), keeps it placed and asks Ganeti again before placing it anew
   (step below); a create Ganeti refused (400...) fails the request.

If the dispatcher dies after step 2, the request stays claimed by a dead dispatcher:
the next one to start (or a live one, on PostgreSQL) takes it over and asks Ganeti
first: a job carrying the request id is recorded, an instance carrying its tag
settles it, and only when Ganeti holds neither is it sent again. So a create is
never lost and never sent twice.

SIGTERM (:meth:`Dispatcher.stop`): no more claims, in-flight creates get
``shutdown_timeout`` seconds to be recorded, unplaced claims are given back, the
writer is flushed. SIGHUP (:meth:`Dispatcher.reload`): backends added, changed,
drained or removed take effect at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from synnefo_ganeti import metrics
from synnefo_ganeti._backends import BackendResources
from synnefo_ganeti.allocate import Allocator, BackendView, NoCapacityError, Requirement, Reservation
from synnefo_ganeti.config import BackendSettings, Settings
from synnefo_ganeti.daemon import StatusServer, SystemdNotifier
from synnefo_ganeti.dispatch._liveness import DispatcherLock, new_dispatcher_id
from synnefo_ganeti.dispatch._tracker import JobTracker
from synnefo_ganeti.errors import (
    AuthenticationError,
    CreateOutcomeUnknownError,
    GanetiError,
    NotFoundError,
    RapiError,
    StoreError,
    TransportError,
    UnavailableError,
)
from synnefo_ganeti.health import HealthChange, HealthMonitor
from synnefo_ganeti.jobs import JobStatus
from synnefo_ganeti.rapi import REASON_PREFIX, InstanceSpec, RapiClient, is_transient, is_unsent
from synnefo_ganeti.reconcile import Fix, Reconciler, Report
from synnefo_ganeti.reconcile._observe import expectation
from synnefo_ganeti.store import (
    CommitInfo,
    InstanceStatus,
    Request,
    RequestNotHeldError,
    RequestStatus,
    Store,
    is_capacity_error,
    request_tag,
)
from synnefo_ganeti.watch import QueueWatcher

__all__ = ["Dispatcher", "DispatcherStats"]

log = logging.getLogger("synnefo_ganeti.dispatch")

#: the reconciler's fixes the daemon applies on its own (all database-side ones; orphans are
#: only reported: deleting a VM is an operator's call, ``synnefo-ganeti reconcile --delete-orphans``)
DAEMON_FIXES = frozenset(Fix)
#: how long a backend that refused a create (503, unreachable, auth or TLS failure) is left out of placement
REFUSING_SECONDS = 15.0
#: PostgreSQL: seconds between looks for dispatchers that are gone, and how long a dispatcher's
#: lock must stay free before its requests are taken over
TAKEOVER_CHECK = 5.0
TAKEOVER_CONFIRM = 2.5


@dataclass(slots=True)
class DispatcherStats:
    claimed: int = 0
    submitted: int = 0
    resubmitted: int = 0  # sent again after Ganeti was asked and had nothing
    recovered: int = 0  # found in Ganeti after a crash (job or instance): not sent again
    failed: int = 0
    canceled: int = 0
    placement_retries: int = 0
    capacity_retries: int = 0  # creates that failed for lack of room, placed again
    reconcile_passes: int = 0
    started_at: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(slots=True)
class _Backend:
    settings: BackendSettings
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    tracker: JobTracker | None = None
    watcher: QueueWatcher | None = None
    submit_slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(8))


class Dispatcher(BackendResources):
    """``await Dispatcher(settings).run(stop=event)``: the daemon's work until ``stop`` is set.

    ``store`` and ``clients`` may be given (tests); ``config_path`` is re-read by
    :meth:`reload`. ``status_server=False`` runs without /metrics (tests, the demo's
    embedded dispatcher).
    """

    _usage = "use 'await Dispatcher(settings).run()'"

    def __init__(
        self,
        settings: Settings,
        *,
        store: Store | None = None,
        clients: Mapping[str, RapiClient] | None = None,
        config_path: str | Path | None = None,
        dispatcher_id: str | None = None,
        status_server: bool = True,
        notifier: SystemdNotifier | None = None,
        freeze_gc: bool = False,
    ) -> None:
        super().__init__(settings, store=store, clients=clients)
        self.id = dispatcher_id or new_dispatcher_id()
        self.config_path = Path(config_path) if config_path is not None else settings.source
        self.stats = DispatcherStats()
        self.allocator = Allocator(settings.dispatcher.strategy)  # type: ignore[arg-type]
        self.health: HealthMonitor | None = None
        self.status: StatusServer | None = None
        self.notifier = notifier or SystemdNotifier()
        self.ready = asyncio.Event()
        self._status_wanted = status_server
        self._freeze_gc = freeze_gc
        self._lock: DispatcherLock | None = None
        self._backends: dict[str, _Backend] = {}
        self._stop = asyncio.Event()
        self._claiming = True
        self._wake = asyncio.Event()
        self._inflight: set[asyncio.Task[None]] = set()
        # (backend, job id) -> the reservation and when the job was recorded
        self._jobs: dict[tuple[str, int], Reservation] = {}
        self._loops: list[asyncio.Task[Any]] = []
        self._reload_lock = asyncio.Lock()
        # backend -> (when, the listing of its jobs by reason) for crash recovery
        self._job_listings: dict[str, tuple[float, asyncio.Future[dict[str, int]]]] = {}
        # request id -> since when its create's fate is unknown (Ganeti is asked about it)
        self._check_since: dict[str, float] = {}
        # dispatcher id -> when its lock was first seen free (PostgreSQL)
        self._suspects: dict[str, float] = {}

    def __repr__(self) -> str:
        return (
            f"<Dispatcher {self.id} backends=[{', '.join(self._backends)}] in flight={len(self._inflight)}>"
        )

    # -- life ------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask :meth:`run` to stop (SIGTERM): no new claims, drain, flush, return."""
        self._stop.set()
        self._wake.set()

    def wake(self) -> None:
        """Look for new requests now (a request written in this process)."""
        self._wake.set()

    async def run(self, *, stop: asyncio.Event | None = None) -> None:
        """Run until :meth:`stop` (or ``stop`` is set); everything is flushed when it returns."""
        watcher = asyncio.create_task(self._relay_stop(stop)) if stop is not None else None
        try:
            await self.open()
            try:
                await self._start()
                await self._stop.wait()
            finally:
                await self._shutdown()
                await self.close()
        finally:
            if watcher is not None:
                watcher.cancel()

    async def _relay_stop(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self.stop()

    async def _start(self) -> None:
        store = self.store
        self._lock = DispatcherLock(store, self.id)
        await self._lock.acquire()
        store.on_commit.append(self._on_commit)
        for backend in self.settings.backends:
            await self._add_backend(backend)
        await self._start_health()
        if self._status_wanted and self.settings.dispatcher.status_port is not None:
            self.status = StatusServer(
                host=self.settings.dispatcher.status_host,
                port=self.settings.dispatcher.status_port,
                checks={"database": self._check_database, "backends": self._check_backends},
            )
            await self.status.start()
        await self._refresh_stats(list(self._backends))
        self._loops += [  # the health loop is in already (_start_health)
            asyncio.create_task(self._submit_loop(), name="dispatch submitter"),
            asyncio.create_task(self._stats_loop(), name="dispatch node stats"),
            asyncio.create_task(self._reconcile_loop(), name="dispatch reconciler"),
            asyncio.create_task(self._metrics_loop(), name="dispatch metrics"),
        ]
        if self.store.dialect == "postgresql":
            self._loops.append(asyncio.create_task(self._lock_loop(), name="dispatch liveness lock"))
        if self.notifier.watchdog_interval() is not None:
            self._loops.append(asyncio.create_task(self._watchdog_loop(), name="dispatch watchdog"))
        if self._freeze_gc:
            # Everything built so far (settings, clients, tables, models) lives as long as the
            # process: out of the collector's generations, each collection walks far fewer
            # objects (measured: ~0.1 s less per reconcile pass of 10 x 1,000 instances).
            gc.collect()
            gc.freeze()
        self.ready.set()
        self.notifier.ready(f"dispatching for {len(self._backends)} backends")
        log.info(
            "dispatcher %s started: %d backends (%s), database %s%s",
            self.id,
            len(self._backends),
            ", ".join(self._backends) or "none",
            store.display_url,
            f", status on {self.status.url}" if self.status is not None else "",
        )

    async def _shutdown(self) -> None:
        self.notifier.stopping()
        self._claiming = False
        deadline = self.settings.dispatcher.shutdown_timeout
        if self._inflight:
            log.info("stopping: %d creates in flight get %g s to be recorded", len(self._inflight), deadline)
            _, pending = await asyncio.wait(set(self._inflight), timeout=deadline)
            for task in pending:
                task.cancel()
            if pending:
                log.warning(
                    "%d creates still in flight after %g s were cut off; the next dispatcher asks Ganeti "
                    "about them before sending anything again",
                    len(pending),
                    deadline,
                )
                await asyncio.gather(*pending, return_exceptions=True)
        for task in self._loops:
            task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        self._loops = []
        for name in list(self._backends):
            await self._remove_backend(name)
        if self.status is not None:
            await self.status.stop()
            self.status = None
        if self._store is not None:
            with contextlib.suppress(GanetiError):
                released = await self.store.release_requests(self.id)
                if released:
                    log.info("gave back %d requests not placed yet", released)
            with contextlib.suppress(Exception):
                await self.store.flush()
            with contextlib.suppress(ValueError):
                self.store.on_commit.remove(self._on_commit)
        if self._lock is not None:
            await self._lock.release()
            self._lock = None
        if self._freeze_gc:
            gc.unfreeze()
        log.info("dispatcher %s stopped: %s", self.id, self.stats.to_json())

    # -- backends --------------------------------------------------------------------------------

    async def _add_backend(self, settings: BackendSettings) -> None:
        name = settings.name
        client = await self.client(name)
        entry = _Backend(
            settings, submit_slots=asyncio.Semaphore(self.settings.dispatcher.submit_concurrency)
        )
        queue_dir = settings.queue_dir
        if queue_dir is not None and await asyncio.to_thread(os.path.isdir, queue_dir):
            entry.watcher = QueueWatcher(queue_dir, self.store, name)
            entry.tasks.append(asyncio.create_task(entry.watcher.run(), name=f"watch {name}"))
        else:
            if queue_dir is not None:
                log.warning(
                    "backend %s: queue_dir %s is not a folder here; following its jobs through RAPI /wait",
                    name,
                    queue_dir,
                )
            entry.tracker = JobTracker(
                name, client, self.store, concurrency=self.settings.dispatcher.track_concurrency
            )
            entry.tasks.append(asyncio.create_task(entry.tracker.run(), name=f"track {name}"))
        self._backends[name] = entry
        self.allocator.update(BackendView(name=name, drained=settings.drained))
        metrics.BACKEND_UP.labels(name).set(1)

    async def _remove_backend(self, name: str) -> None:
        entry = self._backends.pop(name, None)
        if entry is None:
            return
        if entry.watcher is not None:
            entry.watcher.stop()
        for task in entry.tasks:
            if entry.watcher is None:
                task.cancel()
        results = await asyncio.gather(*entry.tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                log.warning(
                    "backend %s: %s ended with %r", name, "watcher" if entry.watcher else "tracker", result
                )
        self.allocator.forget(name)
        client = self._clients.pop(name, None)
        if client is not None and name in self._own_clients:
            self._own_clients.discard(name)
            await client.close()

    async def reload(self, settings: Settings | None = None) -> list[str]:
        """Apply a new configuration (SIGHUP re-reads ``config_path``); what changed, in words.

        Backends added start at once; removed ones stop (their requests in flight stay
        in the database, settled by the reconciler or a dispatcher that has them);
        changed ones (URL, credentials, TLS, queue_dir) restart; ``drained`` applies to
        the next placement. ``[database]`` is not reloaded: restart for that.
        """
        async with self._reload_lock:
            if settings is None:
                if self.config_path is None:
                    raise StoreError("no configuration file to reload (the dispatcher was given settings)")
                settings = Settings.from_file(self.config_path)
            if settings.database.url != self.settings.database.url:
                log.warning("reload: [database] changed; it takes effect on restart only")
            old = {b.name: b for b in self.settings.backends}
            new = {b.name: b for b in settings.backends}
            changes: list[str] = []
            self.settings = settings
            for name in old.keys() - new.keys():
                await self._remove_backend(name)
                changes.append(f"removed {name}")
            for name, backend in new.items():
                before = old.get(name)
                if before is None:
                    await self._add_backend(backend)
                    changes.append(f"added {name}")
                elif before.model_dump(exclude={"drained"}) != backend.model_dump(exclude={"drained"}):
                    await self._remove_backend(name)
                    await self._add_backend(backend)
                    changes.append(f"changed {name}")
                else:
                    entry = self._backends.get(name)
                    if entry is not None:  # the node-stats refreshes read ``drained`` from here
                        entry.settings = backend
                        self.allocator.update(_replace(self.allocator.view(name), drained=backend.drained))
                    if before.drained != backend.drained:
                        changes.append(f"{'drained' if backend.drained else 'undrained'} {name}")
            await self._start_health()
            await self._refresh_stats(list(self._backends))
            log.warning("configuration reloaded: %s", "; ".join(changes) or "no backend changed")
            return changes

    # -- health ----------------------------------------------------------------------------------

    async def _start_health(self) -> None:
        options = self.settings.dispatcher
        old = self.health
        clients = {name: await self.client(name) for name in self._backends}
        self.health = HealthMonitor(
            clients,
            interval=options.health_interval,
            timeout=options.health_timeout,
            fail_after=options.fail_after,
            recover_after=options.recover_after,
            webhook=options.webhook,
        )
        if old is not None:
            for name, state in old.tracker.states.items():
                if name in clients:
                    self.health.tracker.states[name] = state
        self.health.on_change.append(self._health_changed)
        for task in [t for t in self._loops if t.get_name() == "dispatch health"]:
            task.cancel()
            self._loops.remove(task)
        self._loops.append(asyncio.create_task(self._health_loop(self.health), name="dispatch health"))

    async def _health_loop(self, monitor: HealthMonitor) -> None:
        written: dict[str, bool] = {}
        while True:
            started = time.monotonic()
            await monitor.run_once()
            for name, state in monitor.tracker.states.items():
                if written.get(name) != state.up and name in self._backends:
                    # the first verdict (and any the listener missed) goes to the database too
                    with contextlib.suppress(GanetiError):
                        await self.store.set_backend_health(name, state.up, detail=state.last_error)
                        written[name] = state.up
            await asyncio.sleep(max(0.0, monitor.interval - (time.monotonic() - started)))

    async def _health_changed(self, change: HealthChange) -> None:
        name = change.backend
        metrics.BACKEND_UP.labels(name).set(1 if change.up else 0)
        if name in self._backends:
            view = self.allocator.view(name)
            self.allocator.update(_replace(view, healthy=change.up))
        message = "health checks pass again" if change.up else f"health checks failed: {change.error}"
        try:
            await self.store.set_backend_health(name, change.up, detail=change.error, event=message)
        except GanetiError as exc:
            log.warning("backend %s: cannot store its health change (%s)", name, exc)
        if change.up:
            self._wake.set()

    async def _check_database(self) -> str | None:
        try:
            await self.store.backends()
        except GanetiError as exc:
            return str(exc)
        return None

    async def _check_backends(self) -> str | None:
        if not self._backends:
            return "no backends configured"
        if self.health is not None and not any(self.health.tracker.is_up(name) for name in self._backends):
            return "every backend is down"
        return None

    # -- node stats ------------------------------------------------------------------------------

    async def _refresh_stats(self, names: list[str]) -> None:
        await asyncio.gather(*(self._refresh_one(name) for name in names if name in self._backends))

    async def _refresh_one(self, name: str) -> None:
        client = await self.client(name)
        read_at = time.monotonic()
        try:
            nodes, info = await asyncio.gather(client.list_nodes(), client.info())
        except GanetiError as exc:
            log.info("backend %s: node stats not refreshed (%s)", name, exc)
            return
        if name not in self._backends:
            return
        view = self.allocator.view(name)
        settings = self._backends[name].settings
        self.allocator.update(
            _replace(
                view,
                nodes=nodes,
                disk_templates=frozenset(info.enabled_disk_templates or ()),
                drained=settings.drained,
                healthy=self.health.tracker.is_up(name) if self.health is not None else True,
                stats_at=read_at,
            )
        )

    async def _stats_loop(self) -> None:
        interval = self.settings.dispatcher.stats_interval
        while True:
            await asyncio.sleep(min(1.0, interval))
            due = self.allocator.due_for_refresh(interval=interval)
            if due:
                await self._refresh_stats(due)

    # -- the submitter ---------------------------------------------------------------------------

    def _capacity(self) -> int:
        per_backend = self.settings.dispatcher.submit_concurrency
        return max(1, per_backend * max(1, len(self._backends)) * 2)

    async def _submit_loop(self) -> None:
        await self._take_over_dead()
        options = self.settings.dispatcher
        last_takeover = time.monotonic()
        while self._claiming:
            room = self._capacity() - len(self._inflight)
            claimed: list[Request] = []
            if room > 0:
                try:
                    claimed = await self.store.claim_requests(self.id, min(room, options.claim_batch))
                except GanetiError as exc:
                    log.warning("cannot claim requests (%s); trying again", exc)
            for request in claimed:
                self.stats.claimed += 1
                self._spawn(request)
            if len(claimed) >= min(room, options.claim_batch) > 0:
                await asyncio.sleep(0)  # more may be waiting: claim again at once
                continue
            if self.store.dialect == "postgresql" and (
                time.monotonic() - last_takeover > TAKEOVER_CHECK or self._suspects
            ):
                await self._take_over_dead()
                last_takeover = time.monotonic()
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(options.poll_interval):
                    await self._wake.wait()

    def _spawn(self, request: Request) -> None:
        task = asyncio.create_task(self._process(request), name=f"request {request.id}")
        self._inflight.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        self._wake.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("request task %s failed", task.get_name(), exc_info=task.exception())

    async def _take_over_dead(self) -> None:
        """Requests held by dispatchers that are gone become ours (checked against Ganeti)."""
        assert self._lock is not None
        try:
            claimants = await self.store.request_claimants(exclude=self.id)
            for other in list(self._suspects):
                if other not in claimants:
                    del self._suspects[other]
            for other in claimants:
                if await self._lock.is_alive(other):
                    self._suspects.pop(other, None)
                    continue
                if self.store.dialect == "postgresql":
                    # Seen dead twice, TAKEOVER_CONFIRM seconds apart: a database restart ends every
                    # session and so frees every dispatcher's lock, but a live one takes its own
                    # again within a second (_lock_loop); a dead one stays free.
                    first = self._suspects.setdefault(other, time.monotonic())
                    if time.monotonic() - first < TAKEOVER_CONFIRM:
                        continue
                    del self._suspects[other]
                since = time.monotonic()
                taken = await self.store.take_over_requests(other, self.id)
                if taken:
                    log.warning(
                        "took over %d requests of dispatcher %s, which is gone (%d placed: Ganeti is asked "
                        "about those before anything is sent again)",
                        len(taken),
                        other,
                        sum(1 for r in taken if r.placed),
                    )
                for request in taken:
                    self.stats.claimed += 1
                    self._check_since[request.id] = since
                    self._spawn(request)
        except GanetiError as exc:
            log.warning("cannot look for requests of dead dispatchers (%s)", exc)

    async def _process(self, request: Request) -> None:
        """Work on one claimed request until it is submitted or ended (or no longer ours).

        A database that fails under it (a restart) does not drop it: the request stays
        claimed by this live dispatcher, so nobody else would take it; it is worked on again
        once the database answers, from what the database then says (a create sent before
        the failure is found in Ganeti by its request id, not sent again)."""
        outage = 0.5
        while True:
            try:
                await self._work_on(request)
                return
            except RequestNotHeldError as exc:
                log.info("request %s: %s", request.id, exc)
                return
            except GanetiError as exc:
                if not self._claiming:
                    log.warning("request %s: %s; stopping: the next dispatcher takes it up", request.id, exc)
                    return
                log.warning("request %s: %s; trying again in %g s", request.id, exc, outage)
                self._check_since.setdefault(request.id, time.monotonic())
                await self._pause(outage)
                outage = min(outage * 2, 10.0)

    async def _work_on(self, request: Request) -> None:
        delay = 0.5
        while True:
            fresh = await self.store.get_request(request.id)
            if fresh is None or fresh.is_final or fresh.claimed_by != self.id:
                return
            request = fresh
            if request.placed:  # before a cancel: the create may be in Ganeti already
                if await self._recover(request):
                    return
                continue  # Ganeti has nothing of it: place it again (or cancel it)
            if request.cancel_requested:
                await self._cancel(request)
                return
            outcome = await self._place_and_submit(request)
            if outcome is None:
                return
            if not self._claiming:
                return  # stopping: a placed request is picked up by the next dispatcher
            self.stats.placement_retries += 1
            if request.id in self._check_since:
                # maybe sent: Ganeti is asked (next round) before the request may fail or go elsewhere
                await self._pause(delay)
                delay = min(delay * 2, 10.0)
                continue
            age = time.time() - request.created_at.timestamp()
            if age > self.settings.dispatcher.placement_timeout:
                await self._fail(
                    request,
                    f"not placed within {self.settings.dispatcher.placement_timeout:g} s: {outcome}",
                )
                return
            await self._pause(delay)
            delay = min(delay * 2, 10.0)

    async def _place_and_submit(self, request: Request) -> str | None:
        """None when the request is done with (submitted, failed); else why to try again later."""
        spec = InstanceSpec.model_validate(request.spec)
        try:
            reservation = self._reserve(request, spec)
        except NoCapacityError as exc:
            return str(exc)
        name = reservation.name
        tags = list(
            dict.fromkeys([*spec.tags, *self.settings.ownership.tags_for_new(), request_tag(request.id)])
        )
        submitted = spec.model_copy(update={"tags": tags})
        try:
            await self.store.place_request(request.id, self.id, name, expectation(spec, tags))
        except RequestNotHeldError:
            self.allocator.release(reservation)
            raise
        except StoreError as exc:  # e.g. the name is taken on that backend
            self.allocator.release(reservation)
            await self._fail(request, str(exc))
            return None
        entry = self._backends.get(name)
        if entry is None:
            self.allocator.release(reservation)
            await self.store.unplace_request(request.id, self.id, error=f"backend {name} was removed")
            return f"backend {name} was removed"
        client = await self.client(name)
        try:
            async with entry.submit_slots:
                job_id = await client.create_instance(submitted, request_id=request.id)
        except CreateOutcomeUnknownError as exc:
            self._check_since[request.id] = _settled_after(client)
            self.allocator.release(reservation)
            metrics.SUBMISSIONS.labels(name, "unknown").inc()
            log.warning(
                "request %s on %s: outcome unknown (%s); Ganeti is asked again shortly", request.id, name, exc
            )
            return str(exc)
        except GanetiError as exc:
            self.allocator.release(reservation)
            if _not_taken(exc):
                view = self.allocator.view(name)
                self.allocator.update(_replace(view, refusing_until=time.monotonic() + REFUSING_SECONDS))
                outcome = "refused" if isinstance(exc, UnavailableError) else "error"
                metrics.SUBMISSIONS.labels(name, outcome).inc()
                await self.store.unplace_request(request.id, self.id, error=f"{name}: {exc}")
                log.info("request %s: %s did not take it (%s); placing it again", request.id, name, exc)
                return f"{name}: {exc}"
            if is_transient(exc):
                # Sent, maybe: the client's own look found nothing, but a slow Ganeti may take it
                # yet. The request stays placed; _recover asks Ganeti again before it goes elsewhere.
                self._check_since[request.id] = _settled_after(client)
                view = self.allocator.view(name)
                self.allocator.update(_replace(view, refusing_until=time.monotonic() + REFUSING_SECONDS))
                metrics.SUBMISSIONS.labels(name, "unknown").inc()
                log.warning(
                    "request %s on %s: no answer (%s); Ganeti is asked again shortly", request.id, name, exc
                )
                return f"{name}: {exc}"
            metrics.SUBMISSIONS.labels(name, "error").inc()
            await self._fail(request, f"{name} refused the create: {exc}", placed=True)
            return None
        self._jobs[(name, job_id)] = reservation
        self.allocator.submitted(reservation)
        recorded = await self.store.submitted_request(request.id, job_id, start=spec.start)
        self.stats.submitted += 1
        metrics.SUBMISSIONS.labels(name, "ok").inc()
        metrics.REQUESTS.labels("submitted").inc()
        if entry.tracker is not None:
            entry.tracker.track(job_id)
        log.debug("request %s: %s on %s as job %d", request.id, spec.name, name, job_id)
        if recorded.cancel_requested:
            await self._cancel_sent(recorded, client)
        return None

    async def _cancel_sent(self, request: Request, client: RapiClient) -> None:
        """A cancel asked for while the create was being sent: cancel its job if still queued."""
        assert request.job_id is not None
        try:
            result = await client.cancel_job(request.job_id)
        except GanetiError as exc:
            log.warning("request %s: cancel of job %d failed (%s)", request.id, request.job_id, exc)
            return
        if result.success:
            await self.store.finish_request(
                request.id, RequestStatus.CANCELED, error=f"job {request.job_id} canceled"
            )
            self.stats.canceled += 1
            metrics.REQUESTS.labels("canceled").inc()
        else:
            log.warning(
                "request %s: canceled while its create was sent, but job %d runs already (%s)",
                request.id,
                request.job_id,
                result.message,
            )

    def _reserve(self, request: Request, spec: InstanceSpec) -> Reservation:
        wanted = request.want_backend
        if wanted is not None and wanted not in self._backends:
            raise NoCapacityError(
                Requirement.of(spec), {wanted: "not a backend of this dispatcher's configuration"}
            )
        return self.allocator.place(spec, only=wanted)

    async def _recover(self, request: Request) -> bool:
        """A create may have reached Ganeti: ask it. True when settled; False: send it again."""
        name = request.backend
        assert name is not None
        if name not in self._backends:
            await self._fail(request, f"backend {name} is no longer configured; its create's fate is unknown")
            return True
        client = await self.client(name)
        wanted = f"{REASON_PREFIX}{request.id}"
        since = self._check_since.pop(request.id, time.monotonic())
        if since > time.monotonic():
            await self._pause(since - time.monotonic())
            if not self._claiming:
                return True  # stopping: still placed, the next dispatcher asks Ganeti
        try:
            job_id = (await self._jobs_by_reason(name, client, since)).get(wanted)
            if job_id is not None:
                log.warning(
                    "request %s: found as job %d on %s (sent before a crash); recorded",
                    request.id,
                    job_id,
                    name,
                )
                self.stats.recovered += 1
                spec = InstanceSpec.model_validate(request.spec)
                recorded = await self.store.submitted_request(request.id, job_id, start=spec.start)
                metrics.REQUESTS.labels("submitted").inc()
                entry = self._backends.get(name)
                if entry is not None and entry.tracker is not None:
                    entry.tracker.track(job_id)
                if recorded.cancel_requested:  # canceled meanwhile: cancel the job while it is queued
                    await self._cancel_sent(recorded, client)
                return True
            try:
                instance = await client.get_instance(request.instance)
            except NotFoundError:
                instance = None
        except GanetiError as exc:
            # still placed: the caller's loop asks again (nothing is sent before Ganeti answers)
            log.warning(
                "request %s: cannot ask %s about it (%s); asking again shortly", request.id, name, exc
            )
            await self._pause(2.0)
            return not self._claiming
        if instance is None:
            await self.store.unplace_request(request.id, self.id, error=None)
            self.stats.resubmitted += 1
            log.info("request %s: Ganeti has no job or instance of it; placing it again", request.id)
            return False
        if request_tag(request.id) in instance.tags:
            self.stats.recovered += 1
            status = InstanceStatus.STARTED if instance.oper_state else InstanceStatus.STOPPED
            await self.store.update_instance(name, request.instance, status=status)
            await self.store.finish_request(request.id, RequestStatus.SUCCEEDED, dispatcher=self.id)
            metrics.REQUESTS.labels("succeeded").inc()
            log.warning(
                "request %s: instance %s exists on %s with its tag (job archived); succeeded",
                request.id,
                request.instance,
                name,
            )
            return True
        await self._fail(
            request,
            f"instance {request.instance} exists on {name} but is not this request's (no tag {request_tag(request.id)})",
        )
        return True

    async def _jobs_by_reason(self, name: str, client: RapiClient, since: float) -> dict[str, int]:
        """Reason text -> job id of every job Ganeti holds (``GET /2/jobs?bulk=1``), as listed
        after ``since`` (when the request's fate became unknown: a listing begun before that
        could miss a create sent just before it).

        After a crash hundreds of requests taken over at once share one listing per backend.
        """
        now = time.monotonic()
        cached = self._job_listings.get(name)
        if cached is not None and cached[0] >= since:
            return await asyncio.shield(cached[1])
        task: asyncio.Future[dict[str, int]] = asyncio.ensure_future(self._list_reasons(client))
        self._job_listings[name] = (now, task)
        try:
            return await asyncio.shield(task)
        except GanetiError:
            self._job_listings.pop(name, None)
            raise

    @staticmethod
    async def _list_reasons(client: RapiClient) -> dict[str, int]:
        found: dict[str, int] = {}
        for job in await client.list_jobs():
            for reason in job.request_ids:
                found.setdefault(reason, job.id)
        return found

    async def _pause(self, seconds: float) -> None:
        """Sleep, but wake at once when the dispatcher stops (a request waiting for room or for
        an answer from Ganeti then leaves its claim for the next dispatcher)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stop.wait()

    async def _cancel(self, request: Request) -> None:
        await self.store.finish_request(
            request.id,
            RequestStatus.CANCELED,
            error="canceled before it was submitted",
            dispatcher=self.id,
            instance_status=InstanceStatus.DESTROYED,
        )
        self.stats.canceled += 1
        metrics.REQUESTS.labels("canceled").inc()

    async def _fail(self, request: Request, error: str, *, placed: bool = False) -> None:
        await self.store.finish_request(
            request.id,
            RequestStatus.FAILED,
            error=error,
            dispatcher=self.id,
            instance_status=InstanceStatus.ERROR if placed else None,
        )
        self.stats.failed += 1
        metrics.REQUESTS.labels("failed").inc()
        log.warning("request %s failed: %s", request.id, error)

    def _on_commit(self, info: CommitInfo) -> None:
        """Job ends the writer stored: the allocator learns, capacity is accounted."""
        ended = False
        for backend, summary in info.applied:
            if not summary.status.is_final:
                continue
            reservation = self._jobs.pop((backend, summary.job_id), None)
            if reservation is None:
                continue
            ended = True
            ok = summary.status is JobStatus.SUCCESS
            error = next((op.error for op in summary.ops if op.error), None)
            if not ok and is_capacity_error(error):
                self.stats.capacity_retries += 1  # the store put the request back to be placed again
            else:
                metrics.REQUESTS.labels(_REQUEST_END.get(summary.status, "failed")).inc()
            seconds = None
            if summary.end_time is not None and summary.received_time is not None:
                seconds = max(0.0, summary.end_time - summary.received_time)
            if seconds is not None:
                self.allocator.finished(reservation, seconds, ok=ok)
            elif ok:
                self.allocator.accounted(reservation)
            else:
                self.allocator.release(reservation)
        if ended:
            self._wake.set()

    # -- the reconciler --------------------------------------------------------------------------

    async def _reconcile_loop(self) -> None:
        assert self._lock is not None
        while True:
            await asyncio.sleep(self.settings.reconcile.interval)
            await self.reconcile_once()

    async def reconcile_once(self) -> Report | None:
        """One reconcile pass over the backends no other dispatcher is reconciling now
        (None when there were none, or the pass failed)."""
        assert self._lock is not None
        mine = []
        for name in list(self._backends):
            try:
                if await self._lock.try_reconcile(name):
                    mine.append(name)
            except GanetiError as exc:
                log.warning("reconcile: %s", exc)
        if not mine:
            return None
        report: Report | None = None
        try:
            reconciler = Reconciler(self.settings, store=self.store, clients=dict(self._clients))
            async with reconciler:
                report = await reconciler.run_once(backends=mine, fixes=DAEMON_FIXES)
            self.stats.reconcile_passes += 1
            level = logging.INFO if report.clean else logging.WARNING
            log.log(level, "reconcile pass: %s", report.summary())
        except Exception:
            log.exception("reconcile pass failed")
        finally:
            for name in mine:
                with contextlib.suppress(GanetiError):
                    await self._lock.done_reconciling(name)
        return report

    # -- metrics and watchdog --------------------------------------------------------------------

    async def _metrics_loop(self) -> None:
        while True:
            with contextlib.suppress(GanetiError):
                counts = await self.store.request_counts(status=[RequestStatus.PENDING])
                metrics.REQUESTS_PENDING.set(sum(counts.values()))
            await asyncio.sleep(5.0)

    async def _lock_loop(self) -> None:
        """Keep this dispatcher's liveness lock: a database restart ends the session holding it,
        and until it is taken again other dispatchers would take this one for dead."""
        assert self._lock is not None
        while True:
            await asyncio.sleep(1.0)
            try:
                if not await self._lock.check():
                    log.warning(
                        "dispatcher %s: its liveness lock was lost (database restart?); taken again", self.id
                    )
            except GanetiError as exc:
                log.warning("dispatcher %s: cannot keep its liveness lock (%s); trying again", self.id, exc)

    async def _watchdog_loop(self) -> None:
        interval = self.notifier.watchdog_interval()
        assert interval is not None
        while True:
            self.notifier.watchdog()
            await asyncio.sleep(interval)


def _settled_after(client: RapiClient) -> float:
    """When a create whose answer was lost is surely in Ganeti's job list if Ganeti took it: a
    ganeti-rapi slower than our timeout may still be queueing it, and asking before it is done
    would find nothing and send the create again."""
    return time.monotonic() + min(float(client.timeout), 60.0)


def _replace(view: BackendView, **changes: Any) -> BackendView:
    return dataclasses.replace(view, **changes)


_REQUEST_END = {JobStatus.SUCCESS: "succeeded", JobStatus.ERROR: "failed", JobStatus.CANCELED: "canceled"}


def _not_taken(error: GanetiError) -> bool:
    """A create this backend certainly did not take: place it elsewhere. A 502/504 and a success
    answer that is not a job id count (an answer came, and the client looked for the job after
    it and found none), and so do refused credentials and a TLS failure (no HTTP was spoken):
    the backend is at fault, not the request."""
    return (
        isinstance(error, UnavailableError | AuthenticationError)
        or is_unsent(error)
        or (isinstance(error, TransportError) and not error.maybe_sent)
        or (type(error) is RapiError and (error.status or 0) < 400)
    )
