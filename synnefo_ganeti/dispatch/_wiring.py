"""Per-backend wiring of the dispatcher: each backend's client, job follower (a queue
watcher when its ``queue_dir`` is local, else a :class:`JobTracker`, handed every job any
process records by :class:`~synnefo_ganeti.dispatch._follow.RecordedJobs` while this
dispatcher holds the backend's follow lease, :mod:`._leases`), its place in
the health monitor and its node stats for placement (:mod:`._stats`; its nodes down or offline:
the mixin :class:`~synnefo_ganeti.dispatch._node_watch.NodeWatch`).

Health, like the nodes and the stats, is checked once per backend on PostgreSQL: the holder of
its follow lease probes it every ``health_interval`` and stores each verdict
(``Store.set_backend_health``, every round); the others take the stored verdict while it is
fresher than :data:`HEALTH_FRESH` x ``health_interval`` (``HealthMonitor.adopt``), else probe it
themselves (said at debug level)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime

from synnefo_ganeti import metrics
from synnefo_ganeti.allocate import BackendView
from synnefo_ganeti.config import BackendSettings
from synnefo_ganeti.dispatch._base import _Backend, _replace
from synnefo_ganeti.dispatch._follow import RecordedJobs
from synnefo_ganeti.dispatch._leases import FollowLeases
from synnefo_ganeti.dispatch._node_watch import NODES_TASK, NodeJobsSink
from synnefo_ganeti.dispatch._stats import StatsReads
from synnefo_ganeti.dispatch._tracker import JobTracker
from synnefo_ganeti.errors import GanetiError
from synnefo_ganeti.health import HealthChange, HealthMonitor
from synnefo_ganeti.watch import QueueWatcher

__all__ = ["BackendWiring"]

log = logging.getLogger("synnefo_ganeti.dispatch")

#: the name of the health monitor's root task
HEALTH_TASK = "dispatch health"
#: a stored health verdict is taken while younger than this many ``health_interval``
HEALTH_FRESH = 2.0


class BackendWiring(StatsReads):
    """Backends added and removed (start, reload, stop), health and node stats."""

    # -- backends --------------------------------------------------------------------------------

    async def _add_backend(self, settings: BackendSettings) -> None:
        name = settings.name
        client = await self.client(name)
        entry = _Backend(
            settings, submit_slots=asyncio.Semaphore(self.settings.dispatcher.submit_concurrency)
        )
        queue_dir = settings.queue_dir
        if queue_dir is not None and await asyncio.to_thread(os.path.isdir, queue_dir):
            # several dispatchers watching one folder: the follow lease's holder reads every
            # file; the others none (their creates' ends they read from the store: _ends)
            entry.watcher = QueueWatcher(
                queue_dir,
                NodeJobsSink(self.store, self._node_job_seen),  # drains held at once (_node_watch)
                name,
                wants=self._watched_jobs(name),
            )
            entry.tasks.append(self.supervisor.start(f"watch {name}", entry.watcher.run()))
        else:
            if queue_dir is not None:
                log.warning(
                    "backend %s: queue_dir %s is not a folder here; following its jobs through RAPI /wait",
                    name,
                    queue_dir,
                )
            # on PostgreSQL the holder of the backend's follow lease reads its recorded jobs
            # (dispatch/_leases.py); this one follows its own creates at least
            entry.tracker = JobTracker(
                name,
                client,
                self.store,
                concurrency=self.settings.dispatcher.track_concurrency,
                discover=self.store.dialect != "postgresql",
            )
            entry.tasks.append(self.supervisor.start(f"track {name}", entry.tracker.run()))
        self._backends[name] = entry
        self.allocator.update(BackendView(name=name, drained=settings.drained))
        metrics.BACKEND_UP.labels(name).set(1)

    async def _remove_backend(self, name: str) -> None:
        entry = self._backends.pop(name, None)
        if entry is None:
            return
        for task in entry.tasks:  # their end is expected now
            self.supervisor.detach(task)
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
        self._nodes_written.pop(name, None)
        self._node_signs.pop(name, None)
        client = self._clients.pop(name, None)
        if client is not None and name in self._own_clients:
            self._own_clients.discard(name)
            await client.close()

    #: the reader handing recorded jobs to the trackers (``dispatch follow jobs``), made on start
    recorded: RecordedJobs | None = None

    def _watched_jobs(self, name: str) -> Callable[[int], bool]:
        """Which of backend ``name``'s job files this dispatcher's watcher reads (see above)."""

        def wants(_job_id: int) -> bool:
            leases = self.leases
            return leases is None or not leases.shared or leases.holds(name)

        return wants

    def _follow_leases(self) -> FollowLeases:
        """The follow leases (PostgreSQL: taken in the root task ``dispatch follow leases``; SQLite:
        every backend's, always); a lease gained has its backend's recorded jobs read at once."""
        assert self._lock is not None

        async def gained(names: set[str]) -> None:
            self.read_nodes_soon()  # its nodes read here from now on
            for name in names:  # its job files read here from now on: what changed meanwhile too
                entry = self._backends.get(name)
                if entry is not None and entry.watcher is not None:
                    entry.watcher.resume()
            if self.recorded is not None:
                await self.recorded.read_once()

        self.leases = FollowLeases(
            self._lock, lambda: list(self._backends), on_gained=gained, on_round=self._pause_watchers
        )
        return self.leases

    def _pause_watchers(self) -> None:
        """Pause the watchers of the backends another dispatcher follows: that one reads their
        folders, and every inotify instance on a folder costs the writer (Ganeti) and its reader
        four events a version; a lease gained resumes its watcher (``gained``: then a scan)."""
        leases = self.leases
        if leases is None or not leases.shared:
            return
        for name, entry in self._backends.items():
            if entry.watcher is not None and not leases.holds(name):
                entry.watcher.pause()

    def _recorded_jobs(self) -> RecordedJobs:
        """The reader handing every recorded job of a backend without a local watcher to its
        tracker (a backend with one is left to its watcher)."""

        def trackers() -> dict[str, JobTracker]:
            leases = self.leases
            return {
                name: e.tracker
                for name, e in self._backends.items()
                if e.tracker is not None and (leases is None or leases.holds(name))
            }

        options = self.settings.dispatcher
        self.recorded = RecordedJobs(self.store, trackers, poll_interval=options.poll_interval)
        return self.recorded

    # -- health ----------------------------------------------------------------------------------

    async def _start_health(self) -> None:
        """A health monitor over the backends of now (the states known carried over), in a
        root task that replaces the one before (reload); and the reader of their nodes (its
        own root task, :data:`~synnefo_ganeti.dispatch._node_watch.NODES_TASK`), likewise."""
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
        if self._health_task is not None:
            self.supervisor.detach(self._health_task)
            self._health_task.cancel()
            self._health_task = None
        if self._nodes_task is not None:
            self.supervisor.detach(self._nodes_task)
            self._nodes_task.cancel()
            self._nodes_task = None
        if not self.supervisor.stopping:
            self._health_task = self.supervisor.start(HEALTH_TASK, self._health_loop(self.health))
            self._nodes_task = self.supervisor.start(NODES_TASK, self._nodes_loop())

    async def _health_loop(self, monitor: HealthMonitor) -> None:
        written: dict[str, bool] = {}
        while True:
            started = time.monotonic()
            leases = self.leases
            shared = leases is not None and leases.shared
            others = [name for name in monitor.clients if leases is not None and not leases.holds(name)]
            adopted = await self._stored_health(monitor, others) if others else set()
            await monitor.run_once([name for name in monitor.clients if name not in adopted])
            for name, state in monitor.tracker.states.items():
                if name in adopted or name not in self._backends:
                    continue
                # the first verdict (and any the listener missed) goes to the database too; the
                # holder's every round, for the others to take (its time says it is fresh)
                if written.get(name) != state.up or (shared and leases is not None and leases.holds(name)):
                    with contextlib.suppress(GanetiError):
                        await self.store.set_backend_health(name, state.up, detail=state.last_error)
                        written[name] = state.up
            await asyncio.sleep(max(0.0, monitor.interval - (time.monotonic() - started)))

    async def _stored_health(self, monitor: HealthMonitor, names: list[str]) -> set[str]:
        """Take the stored verdicts on ``names`` (backends another dispatcher probes) that are
        fresh; the names taken (the others are probed here)."""
        limit = HEALTH_FRESH * monitor.interval
        try:
            states = await self.store.backend_states()
        except GanetiError as exc:
            log.debug("stored health not read (%s); probing %s here", exc, ", ".join(names))
            return set()
        now = datetime.now(UTC)
        taken: set[str] = set()
        for name in names:
            row = states.get(name) or {}
            health, at = row.get("health"), row.get("health_at")
            age = None if not isinstance(at, datetime) else (now - at).total_seconds()
            if health not in ("up", "down") or not isinstance(at, datetime) or age is None or age >= limit:
                log.debug(
                    "backend %s: no fresh stored health (%s); probing it here",
                    name,
                    "none" if age is None else f"{age:.1f} s old",
                )
                continue
            await monitor.adopt(name, health == "up", row.get("health_detail"), checked_at=at.timestamp())
            taken.add(name)
        return taken

    async def _health_changed(self, change: HealthChange) -> None:
        name = change.backend
        metrics.BACKEND_UP.labels(name).set(1 if change.up else 0)
        if name in self._backends:
            view = self.allocator.view(name)
            self.allocator.update(_replace(view, healthy=change.up))
        if change.shared:  # its prober stored it, with its event
            if change.up:
                self._wake.set()
            return
        message = "health checks pass again" if change.up else f"health checks failed: {change.error}"
        try:
            await self.store.set_backend_health(name, change.up, detail=change.error, event=message)
        except GanetiError as exc:
            log.warning("backend %s: cannot store its health change (%s)", name, exc)
        if change.up:
            self._wake.set()

    # -- readiness -------------------------------------------------------------------------------

    async def _check_running(self) -> str | None:
        """Every root task runs (none ended unexpectedly)."""
        return self.supervisor.problem()

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
