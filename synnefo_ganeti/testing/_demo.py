"""The demo's scenario: the whole loop on loopback, with three fake Ganeti clusters.

``synnefo-ganeti demo`` (:mod:`synnefo_ganeti.cli._demo`) runs it and prints its progress and report.

What it shows, in order:

1. three fake backends of different sizes and speeds (``small``, ``medium``, ``large``),
   each with its job queue written to disk the way Ganeti writes it; ``small`` and
   ``large`` are watched with inotify, ``medium`` is followed through RAPI ``/wait``
   (as a dispatcher off the master node would);
2. the dispatcher (placement by credits, health checks, submitter, reconciler) on a
   SQLite file (or ``--db``), and ``COUNT`` durable requests written through
   ``ControlPlane.request_instance``, with a progress snapshot (:class:`DemoProgress`)
   four times a second for a live table per backend;
3. once a third of them ended, ``small``'s RAPI starts answering 503 to everything
   (its cluster keeps running jobs): health checks take it out of placement and store
   a backend event; a few seconds later it answers again and comes back;
4. when every request ended, an instance is shut down behind the control plane's back
   and a reconcile pass finds and repairs the drift;
5. a summary: requests per backend and status, duplicates and lost requests counted
   from the fakes' own state, backend events, the drift, and the wall time.

``around`` (``demo --web``: the operator console) is entered with the running world
(:class:`DemoWorld`) once the dispatcher is ready and left before it stops; ``hold``,
awaited after the scenario (outside the timeout), keeps the world running until it returns.

No root, no config, nothing beyond loopback; about 30 seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from synnefo_ganeti.config import Settings
from synnefo_ganeti.control import ControlPlane
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.errors import GanetiError
from synnefo_ganeti.rapi import InstanceSpec, RapiClient
from synnefo_ganeti.store import InstanceStatus, RequestStatus, Store
from synnefo_ganeti.testing._fake import FakeGaneti

__all__ = [
    "BACKENDS",
    "DOWN_BACKEND",
    "DemoBackend",
    "DemoProgress",
    "DemoReport",
    "DemoStepError",
    "DemoWorld",
    "run_demo",
]


@dataclass(frozen=True)
class DemoBackend:
    name: str
    nodes: int
    node_memory: int  # MiB
    latency: float  # seconds per RAPI answer
    create_seconds: float  # per create, holding its node's lock
    watched: bool  # queue watched with inotify (else followed through RAPI /wait)


BACKENDS = (
    DemoBackend("small", nodes=2, node_memory=8192, latency=0.15, create_seconds=1.2, watched=True),
    DemoBackend("medium", nodes=4, node_memory=16384, latency=0.08, create_seconds=0.8, watched=False),
    DemoBackend("large", nodes=6, node_memory=32768, latency=0.04, create_seconds=0.5, watched=True),
)
DOWN_BACKEND = "small"


@dataclass
class DemoReport:
    requests: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    per_backend: dict[str, Counter[str]] = field(default_factory=dict)
    instances_in_ganeti: int = 0
    duplicates: int = 0
    lost: int = 0
    backend_events: list[str] = field(default_factory=list)
    down_seen: bool = False
    up_again_seen: bool = False
    placed_while_down: int = 0
    drift: str = ""
    drift_repaired: bool = False
    stored_final_matching: int = 0
    stored_events: int = 0
    wall_seconds: float = 0.0
    database: str = ""
    metrics_url: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "succeeded": self.statuses.get("succeeded", 0),
            "failed": self.statuses.get("failed", 0),
            "canceled": self.statuses.get("canceled", 0),
            "per_backend": {name: dict(counts) for name, counts in self.per_backend.items()},
            "instances_in_ganeti": self.instances_in_ganeti,
            "duplicates": self.duplicates,
            "lost": self.lost,
            "backend_down_seen": self.down_seen,
            "backend_up_again_seen": self.up_again_seen,
            "placed_on_down_backend": self.placed_while_down,
            "backend_events": self.backend_events,
            "drift": self.drift,
            "drift_repaired": self.drift_repaired,
            "stored_final_matching": self.stored_final_matching,
            "stored_events": self.stored_events,
            "wall_seconds": round(self.wall_seconds, 2),
            "database": self.database,
        }

    @property
    def ok(self) -> bool:
        return (
            self.statuses.get("succeeded", 0) == self.requests
            and self.duplicates == 0
            and self.lost == 0
            and self.down_seen
            and self.drift_repaired
        )


@dataclass(frozen=True)
class DemoWorld:
    """The running demo: its settings, store, control plane, dispatcher and fake clusters."""

    settings: Settings
    store: Store
    cp: ControlPlane
    dispatcher: Dispatcher
    fakes: dict[str, FakeGaneti]


class DemoStepError(GanetiError):
    """A step of the demo failed; the message names it."""

    def __init__(self, step: str, detail: str) -> None:
        super().__init__(f"demo step '{step}' failed: {detail}")
        self.step = step


@dataclass(frozen=True)
class DemoProgress:
    """Where the requests stand, while the dispatcher works them off."""

    count: int  # the requests written
    counts: dict[tuple[str | None, str], int]  # (backend or None, status) -> requests
    health: dict[str, str]  # backend -> "up" or "down"
    status: str  # what happens now, in words

    @classmethod
    def starting(cls, count: int) -> DemoProgress:
        return cls(count, {}, {}, "starting")


async def run_demo(
    count: int = 200,
    *,
    speed: float = 1.0,
    db_url: str | None = None,
    timeout: float = 110.0,
    on_progress: Callable[[DemoProgress], None] | None = None,
    around: Callable[[DemoWorld], AbstractAsyncContextManager[object]] | None = None,
    hold: Callable[[DemoWorld], Awaitable[None]] | None = None,
) -> DemoReport:
    """Run the scenario; :class:`DemoStepError` names the step that failed.

    ``on_progress`` is called with a :class:`DemoProgress` four times a second while
    the requests are worked off. ``around`` and ``hold``: see the module docstring.
    """
    with tempfile.TemporaryDirectory(prefix="synnefo-ganeti-demo-") as scratch:
        demo = _Demo(Path(scratch), count, speed=speed, db_url=db_url, on_progress=on_progress)
        demo.around, demo.hold = around, hold
        try:
            async with asyncio.timeout(timeout) as deadline:
                demo.deadline = deadline
                await demo.run()
        except TimeoutError:
            raise DemoStepError(demo.step, f"not done within {timeout:g} s") from None
        except (GanetiError, OSError) as exc:
            raise DemoStepError(demo.step, str(exc)) from None
        return demo.report


class _Demo:
    def __init__(
        self,
        scratch: Path,
        count: int,
        *,
        speed: float,
        db_url: str | None,
        on_progress: Callable[[DemoProgress], None] | None,
    ) -> None:
        self.scratch = scratch
        self.count = count
        self.speed = speed
        self.db_url = db_url or f"sqlite:///{scratch / 'demo.db'}"
        self.on_progress = on_progress
        self.step = "start"
        self.report = DemoReport(requests=count, database=db_url or "a temporary SQLite file")
        self.fakes: dict[str, FakeGaneti] = {}
        self.status_line = "starting"
        self.around: Callable[[DemoWorld], AbstractAsyncContextManager[object]] | None = None
        self.hold: Callable[[DemoWorld], Awaitable[None]] | None = None
        self.deadline: asyncio.Timeout | None = None

    async def run(self) -> None:
        started = time.perf_counter()
        self.step = "start the fake clusters"
        for backend in BACKENDS:
            fake = FakeGaneti(
                nodes=backend.nodes,
                node_memory=backend.node_memory,
                latency=backend.latency / self.speed,
                op_times={"OP_INSTANCE_CREATE": backend.create_seconds / self.speed},
                queue_dir=self.scratch / f"queue-{backend.name}",
                cluster_name=f"{backend.name}.fake.test",
                tls=True,
            )
            await fake.start()
            self.fakes[backend.name] = fake
        try:
            await self._with_fakes()
        finally:
            for fake in self.fakes.values():
                await fake.stop()
        self.report.wall_seconds = time.perf_counter() - started

    def _settings(self) -> Settings:
        backends = []
        for backend in BACKENDS:
            fake = self.fakes[backend.name]
            entry: dict[str, Any] = {
                "name": backend.name,
                "url": fake.url,
                "username": fake.username,
                "password": fake.password,
                "ca_file": fake.ca_file,
            }
            if backend.watched:
                entry["queue_dir"] = str(fake.queue_dir)
            backends.append(entry)
        return Settings(
            database={"url": self.db_url},
            backends=backends,
            dispatcher={
                "health_interval": 0.5,
                "health_timeout": 1.0,
                "fail_after": 2,
                "recover_after": 2,
                "stats_interval": 2.0,
                "status_port": 0,
                "poll_interval": 0.2,
            },
            reconcile={"interval": 3600},  # the demo runs its pass itself, at the end
        )

    async def _with_fakes(self) -> None:
        settings = self._settings()
        self.step = "open the database"
        async with Store(self.db_url) as store:
            self.step = "connect"
            for fake in self.fakes.values():
                async with RapiClient(
                    fake.url, username=fake.username, password=fake.password, ca_file=fake.ca_file
                ) as client:
                    await client.version()
            self.step = "start the dispatcher"
            dispatcher = Dispatcher(settings, store=store)
            running = asyncio.create_task(dispatcher.run())
            ready = asyncio.create_task(dispatcher.ready.wait())
            await asyncio.wait({running, ready}, return_when=asyncio.FIRST_COMPLETED)
            if running.done():
                ready.cancel()
                running.result()  # raises what stopped it
            if dispatcher.status is not None:
                self.report.metrics_url = dispatcher.status.url + "/metrics"
            try:
                async with ControlPlane(settings, store=store) as cp:
                    world = DemoWorld(settings, store, cp, dispatcher, self.fakes)
                    async with self.around(world) if self.around else contextlib.nullcontext():
                        await self._requests(cp, store, dispatcher)
                        self.step = "inject a drift and reconcile"
                        await self._drift(store, dispatcher)
                        if self.hold is not None:
                            self.step = "hold the world open"
                            if self.deadline is not None:
                                self.deadline.reschedule(None)  # as long as the holder wants
                            await self.hold(world)
            finally:
                dispatcher.stop()
                failed = await running
            if failed:  # a root task ended unexpectedly; the dispatcher logged it and stopped
                raise DemoStepError("dispatch", f"the dispatcher stopped: {dispatcher.supervisor.problem()}")
            self.step = "count what Ganeti holds"
            await self._tally(store)

    async def _requests(self, cp: ControlPlane, store: Store, dispatcher: Dispatcher) -> None:
        self.step = "write the durable requests"
        ids = []
        for index in range(self.count):
            spec = InstanceSpec(
                name=f"demo-{index:04d}", disk_template="diskless", os="noop", beparams={"memory": 256}
            )
            ids.append(await cp.request_instance(spec))
            dispatcher.wake()
        self.step = "dispatch"
        outage = _Outage(self.fakes[DOWN_BACKEND], settle_after=max(10, self.count // 3))
        while True:
            counts = await store.request_counts()
            health = {
                name: ("up" if dispatcher.health is None or dispatcher.health.tracker.is_up(name) else "down")
                for name in self.fakes
            }
            ended = sum(n for (_, status), n in counts.items() if RequestStatus(status).is_final)
            self.status_line = await outage.step(ended, health, counts, self.report)
            if self.on_progress is not None:
                self.on_progress(DemoProgress(self.count, counts, health, self.status_line))
            if ended >= self.count and outage.done:
                break
            await asyncio.sleep(0.25)
        for request_id in ids:
            request = await cp.get_request(request_id)
            self.report.statuses[request.status.value] += 1
            per = self.report.per_backend.setdefault(request.backend or "-", Counter())
            per[request.status.value] += 1
        for event in reversed(await store.backend_events(limit=20)):
            self.report.backend_events.append(f"{event['backend']} {event['kind']}: {event['message']}")

    async def _drift(self, store: Store, dispatcher: Dispatcher) -> None:
        victims = await store.list_instances(backend="large", status=[InstanceStatus.STARTED])
        if not victims:
            self.report.drift = "no STARTED instance on large to shut down"
            return
        victim = victims[0].name
        # behind the control plane's back: the operator ran gnt-instance shutdown on the master
        self.fakes["large"].cluster.instances[victim].oper_state = False
        self.report.drift = f"{victim} on large shut down behind the control plane's back"
        report = await dispatcher.reconcile_once()
        found = report is not None and any(
            drift.instance == victim and drift.kind.value == "operstate" for drift in report.drifts
        )
        after = await store.get_instance("large", victim)
        self.report.drift_repaired = found and after is not None and after.status is InstanceStatus.STOPPED
        self.report.drift += (
            f"; the reconciler found it ({'operstate' if found else 'nothing'}) and stored "
            f"{after.status.value if after else 'nothing'}"
        )

    async def _tally(self, store: Store) -> None:
        names: Counter[str] = Counter()
        for fake in self.fakes.values():
            names.update(list(fake.cluster.instances))
        self.report.instances_in_ganeti = sum(names.values())
        self.report.duplicates = sum(n - 1 for n in names.values() if n > 1)
        wanted = {f"demo-{index:04d}" for index in range(self.count)}
        self.report.lost = len(wanted - set(names))
        matching = 0
        for name, fake in self.fakes.items():
            stored = {job.job_id: job.status for job in await store.list_jobs(backend=name)}
            matching += sum(1 for job in fake.cluster.jobs.values() if stored.get(job.id) == job.status)
        self.report.stored_final_matching = matching
        self.report.stored_events = await _count_events(store)


class _Outage:
    """Takes one backend's RAPI down (503 to everything) once a third of the requests ended,
    waits for health checks to call it down, then brings it back and waits for it to be up."""

    def __init__(self, fake: FakeGaneti, *, settle_after: int) -> None:
        self.fake = fake
        self.settle_after = settle_after
        self.phase = "before"
        self.down_at = 0.0
        self.placed_before = 0

    @property
    def done(self) -> bool:
        return self.phase == "after"

    async def step(
        self,
        ended: int,
        health: dict[str, str],
        counts: dict[tuple[str | None, str], int],
        report: DemoReport,
    ) -> str:
        name = DOWN_BACKEND
        placed = sum(n for (backend, _), n in counts.items() if backend == name)
        if self.phase == "before":
            if ended < self.settle_after:
                return f"{ended} requests ended; {name} goes down after {self.settle_after}"
            self.fake.inject_fault("503")
            self.phase = "failing"
            self.down_at = time.monotonic()
            return f"{name}'s RAPI answers 503 to everything now (its cluster keeps running jobs)"
        if self.phase == "failing":
            if health.get(name) == "down":
                report.down_seen = True
                self.phase = "down"
                self.placed_before = placed
                self.down_at = time.monotonic()
            return f"{name}'s RAPI answers 503: waiting for the health checks"
        if self.phase == "down":
            report.placed_while_down = max(0, placed - self.placed_before)
            if time.monotonic() - self.down_at < 4.0:
                return f"{name} is down: out of placement, the others take the requests"
            self.fake.clear_faults()
            self.phase = "recovering"
            return f"{name} answers again: waiting for the health checks"
        if self.phase == "recovering":
            if health.get(name) == "up":
                report.up_again_seen = True
                self.phase = "after"
            return f"{name} answers again: waiting for the health checks"
        return f"{ended} requests ended; {name} was down and is back"


async def _count_events(store: Store) -> int:
    events = 0
    for name in await store.backends():
        events += sum(job.event_count for job in await store.list_jobs(backend=name))
    return events
