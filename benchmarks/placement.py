"""Placement: credits (weighing how fast each backend drains) against round-robin, in one run.

    python benchmarks/placement.py                     # 1,000 requests
    python benchmarks/placement.py --requests 60 --time-scale 0.25 --capacity-scale 0.1
    python benchmarks/placement.py --no-start          # stopped instances: no memory caps

Three fake Ganetis (plain HTTP, each in a process of its own, so their event loops do
not share one core with the driver's), fresh ones for each strategy:

* S: 2 nodes of 4 GiB, 300 ms per RAPI answer;
* M: 4 nodes of 8 GiB, 100 ms;
* L: 8 nodes of 16 GiB, 50 ms.

Every create runs 0.2 s, all of it locked (no ``OP_INSTANCE_CREATE/disks`` phase). The fake
locks as Ganeti does: a create naming its ``pnode`` locks that node, one without (the cluster's
default iallocator) every node. ``--node-placement`` (default ``pnode``, the dispatcher's
default) says who picks the node: with ``pnode`` the dispatcher does, so each node runs one
create at a time; with ``ganeti`` each backend runs one at a time. Each node keeps ``mnode`` (the fake's 1,024 MiB) for itself and the instances
are started (128 MiB each, ``start=True``), so S holds 48 of them, M 224 and L 960.
With ``--no-start`` they are created stopped: a stopped instance takes no node memory
(in the fake as in Ganeti), so only the node locks bound the makespan.

``--driver dispatcher`` (the default) measures the product: durable requests written
through ``ControlPlane.request_instance`` and a real ``Dispatcher`` (credits or
round-robin, queue watchers on the fakes' queue folders, a scratch SQLite file); a
create that fails for lack of room is put back by the store and placed again.

``--driver direct`` measures the placement policy alone with a compact driver: a pool of submitters
(``SUBMITTERS`` per backend) takes the next request, ``Allocator.place``s it and sends
``create_instance(spec, request_id=...)``, then ``Allocator.submitted``; ``TRACKERS`` per backend follow the jobs
(oldest first) with ``wait_for_job``, then ``Allocator.finished(reservation,
end_ts - received_ts, ok=...)``. A create that failed for lack of room is counted
and placed again by the same policy, until every instance exists. One refresher per
backend reads ``/2/nodes?bulk=1`` and ``/2/info`` into a ``BackendView`` whenever
``Allocator.due_for_refresh`` names it (after creates ended, or every
``REFRESH_INTERVAL``).

Figures (one JSON object on stdout, progress on stderr), all from the fakes' own
state read through RAPI at the end, not from the driver's bookkeeping:

* ``makespan_*_s``: from the first request to the end of the last successful create
  job (its ``end_ts``, the moment its instance exists);
* ``bound_s``: the issue's bound, 14 nodes each finishing one create per 0.2 s:
  ``requests * 0.2 / 14`` (14.3 s for 1,000); it ignores memory;
* ``bound_capacity_s``: the best makespan possible given each node's room (its
  ``mfree`` before the run, in instances) and 0.2 s per create, by water-filling: the
  smallest ``k * 0.2`` such that ``sum(min(room(node), k))`` reaches the requests;
* ``capacity_failures_*``: create jobs that failed for lack of memory or disk;
* ``duplicates``: requests with more than one instance or successful create job (by
  instance name and by the request id in the jobs' reason trail); ``lost``: requests
  with no instance in any fake; both over both strategies;
* ``placed_*``: instances per backend at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from collections import Counter
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import orjson

from _children import stop_children

CREATE_SECONDS = 0.2
MEMORY = 128
REASON_PREFIX = "synnefo-ganeti:"  # how RapiClient.create_instance writes the request id in the reason
# name, nodes, node memory (MiB), RAPI latency (s)
BACKENDS = (("S", 2, 4096, 0.3), ("M", 4, 8192, 0.1), ("L", 8, 16384, 0.05))
MNODE = 1024  # the fake's default memory a node keeps for itself (FakeNode.mnode)
# Ganeti's default (20 jobs per cluster). A job waiting for its node's lock counts as
# running, so 20 >= 8 nodes keeps every node's lock busy whenever enough creates are in
# flight: node locks, as the bound assumes, not the job limit, set the pace.
MAX_RUNNING_JOBS = 20
SUBMITTERS = 4  # concurrent POST /2/instances per backend
TRACKERS = 8  # concurrent wait_for_job per backend (4 + 8 + 2 refresh GETs < ganeti-rapi's 20)
REFRESH_INTERVAL = 2.0  # seconds between node stats reads when nothing ended
DEADLINE = 600.0  # a run stops here whatever is left (counted as lost)
NODE_PLACEMENT = "pnode"  # --node-placement: who picks the node inside a backend (the dispatcher's default)


QUIET = False  # --json-only


def progress(message: str) -> None:
    if not QUIET:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- one fake backend, in its own process ---------------------------------------------------------


async def fake_child(args: argparse.Namespace) -> None:
    """``--fake-child``: one fake Ganeti; prints its URL and credentials, serves until stdin closes."""
    from synnefo_ganeti.testing import FakeGaneti

    fake = FakeGaneti(
        tls=False, nodes=args.nodes, node_memory=args.node_memory, latency=args.latency,
        op_times={"OP_INSTANCE_CREATE": args.create_seconds}, max_running_jobs=MAX_RUNNING_JOBS,
    )  # fmt: skip
    async with fake:
        world = {
            "url": fake.url, "username": fake.username, "password": fake.password, "queue_dir": str(fake.queue_dir),
        }  # fmt: skip
        sys.stdout.buffer.write(orjson.dumps(world) + b"\n")
        sys.stdout.flush()
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.buffer.read)


@dataclass
class Shape:
    """One backend of the scenario, scaled."""

    name: str
    nodes: int
    node_memory: int
    latency: float


def shapes(args: argparse.Namespace) -> list[Shape]:
    out = []
    for name, nodes, memory, latency in BACKENDS:
        room = int((memory - MNODE) * args.capacity_scale) // MEMORY * MEMORY
        out.append(Shape(name, nodes, MNODE + room, latency * args.time_scale))
    return out


class Fakes:
    """One strategy's fake backends (child processes), started at once."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.shapes = shapes(args)
        self.processes: list[asyncio.subprocess.Process] = []
        self.worlds: dict[str, dict[str, Any]] = {}

    async def start(self) -> None:
        for shape in self.shapes:
            process = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--fake-child", "--nodes", str(shape.nodes),
                "--node-memory", str(shape.node_memory), "--latency", str(shape.latency),
                "--create-seconds", str(CREATE_SECONDS * self.args.time_scale),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            self.processes.append(process)

    async def ready(self) -> None:
        for shape, process in zip(self.shapes, self.processes, strict=True):
            assert process.stdout is not None
            line = await asyncio.wait_for(process.stdout.readline(), 60)
            if not line:
                raise SystemExit(f"fake backend {shape.name} did not start (exit {await process.wait()})")
            self.worlds[shape.name] = orjson.loads(line)

    async def stop(self) -> None:
        await stop_children(self.processes)


# -- the driver ------------------------------------------------------------------------------------


@dataclass
class Request:
    index: int
    spec: Any
    request_id: str
    attempts: int = 0


@dataclass
class Backend:
    name: str
    client: Any
    submit: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(SUBMITTERS))
    tracking: asyncio.Queue[tuple[Request, Any, int]] = field(default_factory=asyncio.Queue)
    wake: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Tally:
    total: int
    capacity_failures: int = 0
    other_failures: int = 0
    submit_errors: int = 0
    given_up: int = 0
    done: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    finished: asyncio.Event = field(default_factory=asyncio.Event)

    def pulse(self) -> None:
        """Wake everyone waiting for room (a create ended, or fresh node stats came)."""
        self.changed.set()
        self.changed = asyncio.Event()

    def settled(self) -> None:
        """One request more is settled (its instance exists, or it was given up)."""
        if self.done + self.given_up >= self.total:
            self.finished.set()


def is_capacity_failure(failure: Any) -> bool:
    """Ganeti's "no room": ``insufficient_resources``, or a memory/disk shortage message."""
    if failure is None:
        return False
    text = failure.message.lower()
    return (
        failure.ecode in ("insufficient_resources", "temp_insufficient_resources")
        or "not enough memory" in text
        or "not enough disk" in text
    )


async def refresh(alloc: Any, backend: Backend) -> None:
    from synnefo_ganeti.allocate import BackendView

    at = time.monotonic()  # before the reads: creates accounted up to here are in them
    nodes, info = await asyncio.gather(backend.client.list_nodes(), backend.client.info())
    alloc.update(
        BackendView(
            name=backend.name, nodes=nodes, disk_templates=frozenset(info.enabled_disk_templates), stats_at=at
        )
    )


async def refresher(alloc: Any, backend: Backend, tally: Tally) -> None:
    """One read at a time per backend (an older answer never overwrites a newer one)."""
    while True:
        if backend.name in alloc.due_for_refresh(interval=REFRESH_INTERVAL):
            await refresh(alloc, backend)
            tally.pulse()
            continue
        backend.wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(backend.wake.wait(), REFRESH_INTERVAL)


async def submitter(
    alloc: Any, backends: dict[str, Backend], todo: asyncio.Queue[Request], tally: Tally
) -> None:
    from synnefo_ganeti.allocate import NoCapacityError, chooses_nodes, placed_spec
    from synnefo_ganeti.errors import GanetiError

    while True:
        request = await todo.get()
        while True:
            try:
                reservation = alloc.place(request.spec, nodes=chooses_nodes(request.spec, NODE_PLACEMENT))
                break
            except NoCapacityError:
                changed = tally.changed
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), 1.0)
        backend = backends[reservation.name]
        request.attempts += 1
        async with backend.submit:
            try:
                sent = placed_spec(request.spec, reservation, NODE_PLACEMENT)
                job_id = await backend.client.create_instance(sent, request_id=request.request_id)
            except GanetiError as exc:
                progress(f"{backend.name}: submit failed: {exc}")
                alloc.release(reservation)
                tally.submit_errors += 1
                retry(request, todo, tally)
                continue
        alloc.submitted(reservation)
        backend.tracking.put_nowait((request, reservation, job_id))


def retry(request: Request, todo: asyncio.Queue[Request], tally: Tally) -> None:
    if request.attempts < 20:
        todo.put_nowait(request)
    else:
        tally.given_up += 1  # counted as lost by the fakes' state
        tally.settled()


async def tracker(alloc: Any, backend: Backend, todo: asyncio.Queue[Request], tally: Tally) -> None:
    from synnefo_ganeti.jobs import JobStatus

    while True:
        request, reservation, job_id = await backend.tracking.get()
        job = await backend.client.wait_for_job(job_id, timeout=DEADLINE)
        seconds = 0.0
        if job.end_ts is not None and job.received_ts is not None:
            seconds = job.end_ts.as_float - job.received_ts.as_float
        ok = job.status is JobStatus.SUCCESS
        if not ok and is_capacity_failure(job.failure):
            alloc.node_full(reservation)  # its node had no room after all: not again until fresh stats
        alloc.finished(reservation, seconds, ok=ok)
        backend.wake.set()
        if ok:
            tally.done += 1
        else:
            if is_capacity_failure(job.failure):
                tally.capacity_failures += 1
            else:
                tally.other_failures += 1
                progress(f"{backend.name}: create failed: {job.failure}")
            retry(request, todo, tally)
        tally.pulse()
        tally.settled()


async def drive(strategy: str, fakes: Fakes, args: argparse.Namespace) -> dict[str, Any]:
    from synnefo_ganeti.allocate import Allocator
    from synnefo_ganeti.rapi import RapiClient

    alloc = Allocator(strategy)  # type: ignore[arg-type]
    backends: dict[str, Backend] = {}
    async with AsyncExitStack() as stack:
        for name, world in fakes.worlds.items():
            client = RapiClient(
                world["url"], username=world["username"], password=world["password"],
                max_connections=SUBMITTERS + TRACKERS + 2, long_poll_slots=TRACKERS, timeout=60.0,
            )  # fmt: skip
            backends[name] = Backend(name=name, client=await stack.enter_async_context(client))
        return await run(strategy, alloc, backends, args)


async def drive_dispatcher(strategy: str, fakes: Fakes, args: argparse.Namespace) -> dict[str, Any]:
    """The product itself: durable requests through ``ControlPlane.request_instance``, placed,
    submitted and followed (queue watchers on the fakes' queue folders) by a real
    :class:`~synnefo_ganeti.dispatch.Dispatcher` on a scratch SQLite file. A create that fails
    for lack of room is put back by the store and placed again by the same policy."""
    import tempfile

    from synnefo_ganeti.config import Settings
    from synnefo_ganeti.control import ControlPlane
    from synnefo_ganeti.dispatch import Dispatcher
    from synnefo_ganeti.rapi import InstanceSpec, RapiClient
    from synnefo_ganeti.store import RequestStatus, Store

    with tempfile.TemporaryDirectory(prefix="sg-placement-") as scratch:
        settings = Settings(
            database={"url": f"sqlite:///{scratch}/placement.db"},
            backends=[
                {"name": name, "url": world["url"], "username": world["username"],
                 "password": world["password"], "queue_dir": world["queue_dir"]}
                for name, world in fakes.worlds.items()
            ],
            dispatcher={
                "strategy": strategy, "node_placement": NODE_PLACEMENT, "status_port": None, "stats_interval": REFRESH_INTERVAL,
                "submit_concurrency": SUBMITTERS, "poll_interval": 0.05, "claim_batch": 100,
                "health_interval": 5.0,
            },
            reconcile={"interval": 3600},
        )  # fmt: skip
        async with AsyncExitStack() as stack:
            store = await stack.enter_async_context(Store(settings.database.url))
            cp = await stack.enter_async_context(ControlPlane(settings, store=store))
            dispatcher = Dispatcher(settings, store=store, status_server=False)
            running = asyncio.create_task(dispatcher.run())
            await asyncio.wait_for(dispatcher.ready.wait(), 60)
            rooms = {
                name: [
                    (node.mfree or 0) // MEMORY if args.start else args.requests
                    for node in dispatcher.allocator.view(name).usable_nodes
                ]
                for name in fakes.worlds
            }
            tag = "c" if strategy == "credits" else "r"
            requests = []
            progress(f"{strategy} (dispatcher): {args.requests} durable requests")
            started_wall = time.time()
            started = time.perf_counter()
            for i in range(args.requests):
                spec = InstanceSpec(
                    name=f"pl-{tag}-{i:05d}.fake.test", disk_template="diskless", os="noop",
                    beparams={"memory": MEMORY}, start=args.start,
                )  # fmt: skip
                request_id = await cp.request_instance(spec)
                dispatcher.wake()
                requests.append(Request(index=i, spec=spec, request_id=request_id))
            written = time.perf_counter() - started
            still_open = [RequestStatus.PENDING, RequestStatus.SUBMITTED]
            while time.perf_counter() - started <= DEADLINE:
                if not await store.request_counts(status=still_open):
                    break
                await asyncio.sleep(0.05)
            seen = time.perf_counter() - started
            counts = await store.request_counts()
            statuses = Counter(status for (_, status), n in counts.items() for _ in range(n))
            learned = {name: round(dispatcher.allocator.create_seconds(name), 3) for name in fakes.worlds}
            stats = dispatcher.stats.to_json()
            dispatcher.stop()
            await running
            backends = {}
            for name, world in fakes.worlds.items():
                client = RapiClient(world["url"], username=world["username"], password=world["password"])
                backends[name] = Backend(name=name, client=await stack.enter_async_context(client))
            progress(
                f"{strategy} (dispatcher): all ended after {seen:.2f} s ({dict(statuses)}); reading the fakes"
            )
            state = await final_state(backends, requests, started_wall)
    return state | {
        "rooms": rooms,
        "seen_s": seen,
        "requests_written_s": written,
        "request_statuses": dict(statuses),
        "capacity_failures_seen": stats["capacity_retries"],
        "other_failures": stats["failed"],
        "submit_errors": stats["placement_retries"],
        "learned_create_s": learned,
    }


async def run(
    strategy: str, alloc: Any, backends: dict[str, Backend], args: argparse.Namespace
) -> dict[str, Any]:
    """One strategy's run: initial node stats, then every request until all instances exist."""
    from synnefo_ganeti.rapi import InstanceSpec, new_request_id

    await asyncio.gather(*(refresh(alloc, backend) for backend in backends.values()))
    # Each node's room in instances: its free memory, or no limit for stopped instances
    # (the fake, as Ganeti, counts only running instances against a node's memory).
    rooms = {
        name: [
            (node.mfree or 0) // MEMORY if args.start else args.requests
            for node in alloc.view(name).usable_nodes
        ]
        for name in backends
    }
    tag = "c" if strategy == "credits" else "r"
    requests = [
        Request(
            index=i,
            spec=InstanceSpec(
                name=f"pl-{tag}-{i:05d}.fake.test",
                disk_template="diskless",
                os="noop",
                beparams={"memory": MEMORY},
                start=args.start,
            ),
            request_id=new_request_id(),
        )
        for i in range(args.requests)
    ]
    todo: asyncio.Queue[Request] = asyncio.Queue()
    for request in requests:
        todo.put_nowait(request)
    tally = Tally(total=args.requests)
    progress(f"{strategy}: {args.requests} requests")
    started_wall = time.time()
    started = time.perf_counter()
    tasks = [
        asyncio.create_task(submitter(alloc, backends, todo, tally), name=f"submitter-{i}")
        for i in range(SUBMITTERS * len(backends))
    ]
    for backend in backends.values():
        tasks.append(asyncio.create_task(refresher(alloc, backend, tally), name=f"refresh-{backend.name}"))
        tasks += [
            asyncio.create_task(tracker(alloc, backend, todo, tally), name=f"track-{backend.name}-{i}")
            for i in range(TRACKERS)
        ]
    try:
        await asyncio.wait_for(tally.finished.wait(), DEADLINE)
    except TimeoutError:
        progress(f"{strategy}: deadline reached with {tally.done} of {args.requests} done")
    seen = time.perf_counter() - started
    for task in tasks:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
            progress(f"{strategy}: a driver task failed: {result!r}")
    progress(f"{strategy}: all done as seen by the driver after {seen:.2f} s; reading the fakes")
    state = await final_state(backends, requests, started_wall)
    return state | {
        "rooms": rooms,
        "seen_s": seen,
        "capacity_failures_seen": tally.capacity_failures,
        "other_failures": tally.other_failures,
        "submit_errors": tally.submit_errors,
        "learned_create_s": {name: round(alloc.create_seconds(name), 3) for name in backends},
    }


async def final_state(
    backends: dict[str, Backend], requests: list[Request], started: float
) -> dict[str, Any]:
    """What the fakes hold at the end: instances, and create jobs with their request ids and ends."""
    from synnefo_ganeti.jobs import JobStatus

    by_name = {request.spec.name for request in requests}
    instances_of: Counter[str] = Counter()  # instance name -> backends holding it
    successes_of: Counter[str] = Counter()  # request id -> successful create jobs
    placed: dict[str, int] = {}
    last_end = started
    capacity_failures = failed_creates = 0
    for name, backend in backends.items():
        instances, jobs = await asyncio.gather(backend.client.list_instances(), backend.client.list_jobs())
        ours = [instance.name for instance in instances if instance.name in by_name]
        placed[name] = len(ours)
        instances_of.update(ours)
        for job in jobs:
            if not any(summary.startswith("INSTANCE_CREATE") for summary in job.summary):
                continue
            request_ids = [text.removeprefix(REASON_PREFIX) for text in job.request_ids]
            if job.status is JobStatus.SUCCESS:
                successes_of.update(request_ids)
                if job.end_ts is not None:
                    last_end = max(last_end, job.end_ts.as_float)
            elif job.status.is_final:
                failed_creates += 1
                full = await backend.client.get_job(job.id)  # the bulk listing has no opresult
                capacity_failures += is_capacity_failure(full.failure)
    duplicates = max(
        sum(count - 1 for count in instances_of.values() if count > 1),
        sum(count - 1 for count in successes_of.values() if count > 1),
    )
    lost = sum(1 for r in requests if instances_of[r.spec.name] == 0 or successes_of[r.request_id] == 0)
    return {
        "makespan_s": last_end - started,
        "placed": placed,
        "capacity_failures": capacity_failures,
        "failed_creates": failed_creates,
        "duplicates": duplicates,
        "lost": lost,
    }


def water_fill(rooms: dict[str, list[int]], requests: int, create: float) -> float | None:
    """The smallest ``k * create`` with ``sum(min(room, k))`` >= requests over all nodes; None if they do not fit."""
    every = [room for backend in rooms.values() for room in backend]
    if sum(every) < requests:
        return None
    low, high = 0, max(every)
    while low < high:  # the fewest creates per node that place everything
        k = (low + high) // 2
        if sum(min(room, k) for room in every) >= requests:
            high = k
        else:
            low = k + 1
    return low * create


async def main(args: argparse.Namespace) -> dict[str, Any]:
    runs = {"credits": Fakes(args), "round_robin": Fakes(args)}
    try:
        for fakes in runs.values():  # all start at once, then idle until their run
            await fakes.start()
        for fakes in runs.values():
            await fakes.ready()
        driver = drive_dispatcher if args.driver == "dispatcher" else drive
        results = {strategy: await driver(strategy, fakes, args) for strategy, fakes in runs.items()}
    finally:
        for fakes in runs.values():
            await fakes.stop()
    credit, rr = results["credits"], results["round_robin"]
    create = CREATE_SECONDS * args.time_scale
    nodes = sum(shape.nodes for shape in runs["credits"].shapes)
    bound = args.requests * create / nodes
    bound_capacity = water_fill(credit["rooms"], args.requests, create)
    scenario = {
        "driver": args.driver,
        "node_placement": NODE_PLACEMENT,
        "create_s": create,
        "memory_mib": MEMORY,
        "start": args.start,
        "max_running_jobs": MAX_RUNNING_JOBS,
        "submitters_per_backend": SUBMITTERS,
        "trackers_per_backend": TRACKERS,
        "refresh_interval_s": REFRESH_INTERVAL,
        "backends": {
            shape.name: {
                "nodes": shape.nodes,
                "node_memory_mib": shape.node_memory,
                "mnode_mib": MNODE,
                "latency_s": shape.latency,
                "capacity": sum(credit["rooms"][shape.name]) if args.start else None,  # None: no memory cap
            }
            for shape in runs["credits"].shapes
        },
    }

    def r3(value: float | None) -> float | None:
        return None if value is None else round(value, 3)

    return {
        "requests": args.requests,
        "makespan_credit_s": r3(credit["makespan_s"]),
        "makespan_rr_s": r3(rr["makespan_s"]),
        "bound_s": r3(bound),
        "ratio_to_bound": r3(credit["makespan_s"] / bound),
        "ratio_to_rr": r3(credit["makespan_s"] / rr["makespan_s"]),
        "capacity_failures_credit": credit["capacity_failures"],
        "capacity_failures_rr": rr["capacity_failures"],
        "duplicates": credit["duplicates"] + rr["duplicates"],
        "lost": credit["lost"] + rr["lost"],
        "bound_capacity_s": r3(bound_capacity),
        "ratio_to_capacity_bound": r3(credit["makespan_s"] / bound_capacity) if bound_capacity else None,
        "ratio_to_capacity_bound_rr": r3(rr["makespan_s"] / bound_capacity) if bound_capacity else None,
        "placed_credit": credit["placed"],
        "placed_rr": rr["placed"],
        "other_failures_credit": credit["failed_creates"] - credit["capacity_failures"],
        "other_failures_rr": rr["failed_creates"] - rr["capacity_failures"],
        "submit_errors": credit["submit_errors"] + rr["submit_errors"],
        "driver_done_credit_s": r3(credit["seen_s"]),
        "driver_done_rr_s": r3(rr["seen_s"]),
        "learned_create_credit_s": credit["learned_create_s"],
        "scenario": scenario,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000, help="instances to create (default 1,000)")
    parser.add_argument("--json-only", action="store_true", help="no progress on stderr")
    parser.add_argument(
        "--time-scale", type=float, default=1.0, help="multiply latencies and the create time (test runs)"
    )
    parser.add_argument(
        "--capacity-scale",
        type=float,
        default=1.0,
        help="multiply each node's room for instances (test runs)",
    )
    parser.add_argument(
        "--no-start", dest="start", action="store_false",
        help="create stopped instances (they take no node memory: the memory caps vanish)",
    )  # fmt: skip
    parser.add_argument(
        "--driver", choices=("dispatcher", "direct"), default="dispatcher",
        help="dispatcher: durable requests through the real Dispatcher (default); "
        "direct: the compact in-benchmark driver (the Allocator and RapiClient alone)",
    )  # fmt: skip
    parser.add_argument(
        "--node-placement", choices=("pnode", "opportunistic", "ganeti"), default=NODE_PLACEMENT,
        help="[dispatcher] node_placement: pnode (the default), opportunistic, or ganeti "
        "(the direct driver: pnode or not)",
    )  # fmt: skip
    parser.add_argument("--fake-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--nodes", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--node-memory", type=int, default=4096, help=argparse.SUPPRESS)
    parser.add_argument("--latency", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--create-seconds", type=float, default=CREATE_SECONDS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.requests < 1:
        parser.error("--requests must be >= 1")
    if args.time_scale <= 0 or args.capacity_scale <= 0:
        parser.error("--time-scale and --capacity-scale must be > 0")
    return args


if __name__ == "__main__":
    os.environ.setdefault("SYNNEFO_GANETI_LOG_LEVEL", "error")
    arguments = parse_args()
    if arguments.fake_child:
        asyncio.run(fake_child(arguments))
    else:
        QUIET = arguments.json_only
        NODE_PLACEMENT = arguments.node_placement
        print(orjson.dumps(asyncio.run(main(arguments))).decode())
