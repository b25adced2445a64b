"""The dispatcher: durable requests placed and submitted, job ends followed, backends watched.

One :class:`Dispatcher` runs, per backend of the configuration:

* the **queue watcher** when the backend's ``queue_dir`` is on this machine, else a
  :class:`~synnefo_ganeti.dispatch.JobTracker` long-polling RAPI ``/wait`` for every job
  any process records (handed to it by ``_follow``, within 1 s of the recording);
* **node stats** refreshes for placement (``GET /2/nodes?bulk=1`` and ``/2/info``),
  on an interval and after placements ran;

and, over all backends: the **health monitor** (down after K failed probes: out of
placement, a backend event in the database, a log line, the webhook), the
**reconciler** every ``[reconcile] interval`` (each backend by one dispatcher at a time),
the **observer** (Ganeti's values of an instance stored after its create or modify ends,
:mod:`._observe`),
the change-feed **webhook** when ``[notify] url`` is set (``_webhook``), its **AMQP publisher**
when ``[notify] amqp_url`` is (``_amqp``), and the **submitter**, which claims pending requests and, for each:

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

Every loop above (and each backend's watcher or tracker) is a root task of the
dispatcher's :class:`~synnefo_ganeti.daemon.Supervisor`: one that raises (anything), or
returns, is logged with its traceback; at once ``/readyz`` answers 503 and the watchdog
pings stop; then the dispatcher stops as on SIGTERM, all within ``shutdown_timeout``,
and :meth:`Dispatcher.run` returns 1 (the daemon's exit status).

This module holds the lifecycle; the rest lives in layers below it: shared state in
``_base``, per-backend wiring in ``_wiring``, crash recovery in ``_recovery``, the
submitter in ``_submitter``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from synnefo_ganeti import metrics
from synnefo_ganeti._gc import gc_for_daemon
from synnefo_ganeti._where import where
from synnefo_ganeti.config import Settings
from synnefo_ganeti.control._deletes import FOLLOW_EVERY, follow_deletes
from synnefo_ganeti.daemon import StatusServer, loop_name
from synnefo_ganeti.dispatch._amqp import AmqpPublisher
from synnefo_ganeti.dispatch._base import DispatcherStats, _replace
from synnefo_ganeti.dispatch._ends import OWN_ENDS_TASK
from synnefo_ganeti.dispatch._follow import FOLLOW_TASK
from synnefo_ganeti.dispatch._leases import LEASES_TASK
from synnefo_ganeti.dispatch._liveness import DispatcherLock
from synnefo_ganeti.dispatch._observe import Observer
from synnefo_ganeti.dispatch._repair import REPAIR_TASK, Repairer
from synnefo_ganeti.dispatch._report import REPORT_TASK, SelfReport
from synnefo_ganeti.dispatch._submitter import Submitter
from synnefo_ganeti.dispatch._webhook import WebhookDeliverer
from synnefo_ganeti.errors import GanetiError, StoreError
from synnefo_ganeti.reconcile import Fix, Reconciler, Report
from synnefo_ganeti.store import RequestStatus

__all__ = ["DAEMON_FIXES", "Dispatcher", "DispatcherStats"]

log = logging.getLogger("synnefo_ganeti.dispatch")

#: the reconciler's fixes the daemon applies on its own (all database-side ones; orphans are
#: only reported: deleting a VM is an operator's call, ``synnefo-ganeti reconcile --delete-orphans``)
DAEMON_FIXES = frozenset(Fix)

#: the names of the dispatcher's own root tasks (besides ``dispatch health`` and each backend's
#: ``watch NAME`` or ``track NAME``); the liveness lock and the own ends (the creates' ends another
#: dispatcher stored) run on PostgreSQL only, the watchdog
#: under a systemd that asks for it, the webhook when ``[notify] url`` is set, the AMQP publisher
#: when ``[notify] amqp_url`` (or ``amqp_url_file``) is
ROOT_TASKS = (
    "dispatch submitter",
    "dispatch node stats",
    "dispatch reconciler",
    "dispatch metrics",
    "dispatch follow jobs",
    LEASES_TASK,
    OWN_ENDS_TASK,
    "dispatch observer",
    REPORT_TASK,
    REPAIR_TASK,
    "dispatch liveness lock",
    "dispatch watchdog",
    "dispatch webhook",
    "dispatch amqp",
)


class Dispatcher(Submitter):
    """``await Dispatcher(settings).run(stop=event)``: the daemon's work until ``stop`` is set.

    ``store`` and ``clients`` may be given (tests); ``config_path`` is re-read by
    :meth:`reload`. ``status_server=False`` runs without /metrics (tests, the demo's
    embedded dispatcher). ``supervisor`` runs the root tasks; :meth:`run` returns 1 when
    one of them failed, 0 after a clean stop.
    """

    #: stores Ganeti's values of instances after their creates and modifies (set on start)
    observer: Observer | None = None
    #: incidents and repairs by policy (set on start)
    repairer: Repairer | None = None
    #: writes the dispatcher's report of itself and its reconcile reports in the database (set on start)
    self_report: SelfReport | None = None

    # -- life ------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask :meth:`run` to stop (SIGTERM): no new claims, drain, flush, return."""
        self._stop.set()
        self._wake.set()

    def wake(self) -> None:
        """Look for new requests now (a request written in this process)."""
        self._count_pending_again()
        self._wake.set()

    async def run(self, *, stop: asyncio.Event | None = None) -> int:
        """Run until :meth:`stop` (or ``stop`` is set), or until a root task fails; everything
        is flushed when it returns. The exit status: 0 after a stop, 1 after a failure."""
        watcher = asyncio.create_task(self._relay_stop(stop)) if stop is not None else None
        try:
            await self.open()
            try:
                await self._start()
                await self.supervisor.wait(self._stop)
            finally:
                try:
                    await self._shutdown()
                finally:  # (a step of the shutdown that failed does not keep the store open)
                    await self.close()
        finally:
            if watcher is not None:
                watcher.cancel()
            if self._restore_gc is not None:  # the collector as it was, however it ended (_gc.py)
                self._restore_gc()
                self._restore_gc = None
        if not self.supervisor.healthy:
            log.error(
                "dispatcher %s stopped because a root task failed: %s", self.id, self.supervisor.problem()
            )
            return 1
        return 0

    async def _relay_stop(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self.stop()

    async def _start(self) -> None:
        store = self.store
        self._lock = DispatcherLock(store, self.id)
        await self._lock.acquire()
        leases = self._follow_leases()  # whose recorded jobs this one follows (dispatch/_leases.py)
        store.on_commit.append(self._on_commit)
        observer = self.observer = Observer(store, self.client)  # Ganeti's values after jobs end
        store.on_commit.append(observer.on_commit)
        self.supervisor.on_failure.append(self._root_task_failed)
        for backend in self.settings.backends:
            await self._add_backend(backend)
        await self._start_health()
        if self._status_wanted and self.settings.dispatcher.status_port is not None:
            self.status = StatusServer(
                host=self.settings.dispatcher.status_host,
                port=self.settings.dispatcher.status_port,
                checks={
                    "database": self._check_database,
                    "backends": self._check_backends,
                    "tasks": self._check_running,
                },
                setup=self.status_setup,
            )
            await self.status.start()
        await self._refresh_stats(list(self._backends))
        supervisor = self.supervisor  # the health loop runs already (_start_health)
        supervisor.start("dispatch submitter", self._submit_loop())
        supervisor.start("dispatch node stats", self._stats_loop())
        supervisor.start("dispatch reconciler", self._reconcile_loop())
        supervisor.start("dispatch metrics", self._metrics_loop())
        supervisor.start("dispatch deletes", self._deletes_loop())
        supervisor.start(FOLLOW_TASK, self._recorded_jobs().run())  # jobs other processes record
        if leases.shared:  # PostgreSQL: one dispatcher at a time follows a backend's jobs
            supervisor.start(LEASES_TASK, leases.run())
            # the others learn their creates' ends from the store (dispatch/_ends.py)
            supervisor.start(OWN_ENDS_TASK, self._own_ends_loop())
        supervisor.start("dispatch observer", observer.run())
        self.self_report = SelfReport(self)  # what a console of its own reads (dispatch/_report.py)
        supervisor.start(REPORT_TASK, self.self_report.run())
        self.repairer = Repairer(self)  # incidents and repairs by policy ([repair], dispatch/_repair.py)
        supervisor.start(REPAIR_TASK, self.repairer.run())
        if self.store.dialect == "postgresql":
            supervisor.start("dispatch liveness lock", self._lock_loop())
        if self.notifier.watchdog_interval() is not None:
            supervisor.start("dispatch watchdog", self._watchdog_loop())
        if self.settings.notify.enabled:  # [notify] url: every change POSTed (see _webhook)
            self.webhook = WebhookDeliverer(self.store, self.settings.notify, lock=self._lock)
            supervisor.start("dispatch webhook", self.webhook.run())
        if self.settings.notify.amqp_enabled:  # [notify] amqp_url: every change published (_amqp)
            self.amqp = AmqpPublisher(self.store, self.settings.notify, lock=self._lock)
            supervisor.start("dispatch amqp", self.amqp.run())
        if self._freeze_gc:  # everything built so far lives as long as the process (_gc.py)
            self._restore_gc = gc_for_daemon()
        self.ready.set()
        if supervisor.healthy:
            self.notifier.ready(f"dispatching for {len(self._backends)} backends")
        log.info(
            "dispatcher %s started: %d backends (%s), database %s%s, event loop %s",
            self.id,
            len(self._backends),
            ", ".join(self._backends) or "none",
            store.display_url,
            f", status on {self.status.url}" if self.status is not None else "",
            loop_name(),
        )

    def _root_task_failed(self, name: str, error: BaseException) -> None:
        """At once: no more claims (the watchdog and /readyz read the supervisor's state)."""
        self._claiming = False
        self.notifier.status(f"failing: {self.supervisor.problem()}; stopping")

    async def _shutdown(self) -> None:
        """Stop in order, all within ``shutdown_timeout``: creates in flight recorded, the root
        tasks stopped (the last started first), the backends' followers, unplaced claims given
        back, the writer flushed; the status server last (so /readyz tells why meanwhile)."""
        loop = asyncio.get_running_loop()
        timeout = self.settings.dispatcher.shutdown_timeout
        deadline = loop.time() + timeout
        self.notifier.stopping()
        self.supervisor.begin_stopping()  # the loops told to stop below may return: expected now
        self._claiming = False
        self._stop.set()  # pauses end at once (also when a root task failed)
        self._wake.set()
        if self._inflight:
            log.info("stopping: %d creates in flight get %g s to be recorded", len(self._inflight), timeout)
            _, pending = await asyncio.wait(set(self._inflight), timeout=max(0.0, deadline - loop.time()))
            for task in pending:
                task.cancel()
            if pending:
                log.warning(
                    "%d creates still in flight after %g s were cut off; the next dispatcher asks Ganeti "
                    "about them before sending anything again",
                    len(pending),
                    timeout,
                )
                await asyncio.gather(*pending, return_exceptions=True)
        # moves off a dead node under way: cut off (a note without its cancel is taken back by
        # the job's own end; a cancel sent is settled by the canceled job's end)
        moving = list(self._moving_tasks)
        for move in moving:
            move.cancel()
        await asyncio.gather(*moving, return_exceptions=True)
        for entry in self._backends.values():
            for task in entry.tasks:  # stopped one by one below (a watcher stores what it read)
                self.supervisor.detach(task)
        await self.supervisor.stop(max(deadline - loop.time(), min(1.0, timeout)))
        self._health_task = None
        # what is left of shutdown_timeout (a slow database must not hold the exit)
        tail = asyncio.create_task(self._stop_backends_and_give_back(), name="dispatch stopping")
        done, _ = await asyncio.wait([tail], timeout=max(deadline - loop.time(), 0.5))
        if not done:
            log.warning(
                "stopping took longer than shutdown_timeout (%g s): the backends' followers and the "
                "claims not given back yet were cut off (it was at %s); a dispatcher taking over "
                "gets the claims",
                timeout,
                where(tail),
            )
            tail.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await tail
            await self._last_steps()
        else:
            try:
                tail.result()
            finally:  # (raised after the last steps: the status server stopped, the lock given back)
                await self._last_steps()
        log.info("dispatcher %s stopped: %s", self.id, self.stats.to_json())

    async def _last_steps(self) -> None:
        """The shutdown's last steps, each taken whether or not one before it failed: the store's
        listeners removed, the status server stopped, the dispatcher's lock given back (so that
        a failed step never leaves a port or the lock held in a process that goes on: a
        ``Dispatcher`` inside a cloud API's). The first failure is raised once all ran."""
        if self._store is not None:
            with contextlib.suppress(ValueError):
                self.store.on_commit.remove(self._on_commit)
            if self.observer is not None:
                with contextlib.suppress(ValueError):
                    self.store.on_commit.remove(self.observer.on_commit)
        try:
            if self.status is not None:
                status, self.status = self.status, None
                await status.stop()
        finally:
            if self._lock is not None:
                lock, self._lock = self._lock, None
                await lock.release()

    async def _stop_backends_and_give_back(self) -> None:
        """The backends' followers stopped (a watcher stores what it read), unplaced claims given
        back, the writer flushed."""
        for name in list(self._backends):
            await self._remove_backend(name)
        if self._store is not None:
            with contextlib.suppress(GanetiError):
                released = await self.store.release_requests(self.id)
                if released:
                    log.info("gave back %d requests not placed yet", released)
            if self.self_report is not None:
                with contextlib.suppress(GanetiError):
                    await self.self_report.write(stopped=True)
            with contextlib.suppress(Exception):
                await self.store.flush()

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
            for listener in self.on_reconcile:
                listener(report)
            if self.self_report is not None:
                await self.self_report.reconciled(report)
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

    async def _deletes_loop(self) -> None:
        """The deletes asked while a create or another action ran (control/_deletes.py), each one
        sent once that ended: looked for after this process's writes (a job's end applied), at
        least every :data:`FOLLOW_EVERY` seconds (another process's)."""
        while True:
            ownership = self.settings.ownership  # (as reloaded)
            owns = ownership.owns if ownership.prefix is not None or ownership.tag is not None else None
            try:
                self.stats.deletes_followed += await follow_deletes(self.store, self.client, owns=owns)
            except GanetiError as exc:
                log.warning("cannot follow the deferred deletes (%s); trying again", exc)
            await asyncio.sleep(0.5)  # (a busy writer commits all the time: not a pass per commit)
            await self.store.wait_for_change(FOLLOW_EVERY)

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
            if self.supervisor.healthy:  # a failed root task: systemd must stop hearing all is well
                self.notifier.watchdog()
            await asyncio.sleep(interval)
