"""The seed's real-world case: 100 creates onto 2 clusters of 7 nodes, once per node placement.

    python benchmarks/seed_scenario.py                                   # 100 creates, full times
    python benchmarks/seed_scenario.py --requests 20 --time-scale 0.1    # the test's run

Two fake Ganetis (plain HTTP, each in a process of its own) of 7 nodes each, nodes big enough
for every instance; every create runs 3 s, of which the first 1 s is its locked phase (the
disks: ``op_times["OP_INSTANCE_CREATE/disks"]``) and the other 2 s its unlocked phase (OS
install and start, holding no node lock), as Ganeti 3.0's ``LUInstanceCreate.Exec`` releases
its locks. ``max_running_jobs`` is Ganeti's 20 (a job waiting for locks counts as running).

Durable requests go through ``ControlPlane.request_instance`` and a real ``Dispatcher``
(credits across the two backends, queue watchers, a scratch SQLite file), as
``benchmarks/placement.py`` drives it, once per ``[dispatcher] node_placement``, each on fresh
fakes:

* ``ganeti``: no ``pnode``, no ``iallocator``: the cluster's default iallocator, which locks
  every node: the locked phases of one cluster run one at a time (about 50 x 1 + 2 s);
* ``opportunistic``: the same with ``opportunistic_locking``: the free node locks only;
* ``pnode``: the dispatcher picks the node, and Ganeti locks just that one.

One JSON object on stdout (progress on stderr), every figure from the fakes' state at the end:
``makespan_<mode>_s`` from the first request written to the ``end_ts`` of the last successful
create; ``limit_s`` = ceil(requests / 14) x 1 + 2 s (every node running one locked phase after
another, the last create's unlocked 2 s after it); ``ratio_to_limit_best`` the best mode's
makespan over it; ``duplicates`` and ``lost`` over every mode.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from typing import Any

import orjson

import placement
from _children import serve_fake, stop_children

MODES = ("ganeti", "opportunistic", "pnode")
CLUSTERS = 2
NODES = 7
LOCKED_SECONDS = 1.0  # the disks
UNLOCKED_SECONDS = 2.0  # OS install and start
MEMORY = 128
MAX_RUNNING_JOBS = 20  # Ganeti's default
DEADLINE = 900.0


def progress(message: str) -> None:
    if not placement.QUIET:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


async def fake_child(args: argparse.Namespace) -> None:
    """``--fake-child``: one fake Ganeti; prints its URL and credentials, serves until stdin closes."""
    from synnefo_ganeti.testing import FakeGaneti

    scale = args.time_scale
    fake = FakeGaneti(
        tls=False, nodes=NODES, node_memory=1024 + MEMORY * max(args.requests, 1) + 1024,
        max_running_jobs=MAX_RUNNING_JOBS,
        op_times={
            "OP_INSTANCE_CREATE": (LOCKED_SECONDS + UNLOCKED_SECONDS) * scale,
            "OP_INSTANCE_CREATE/disks": LOCKED_SECONDS * scale,
        },
    )  # fmt: skip
    await serve_fake(fake)


class Clusters:
    """One mode's fake clusters (child processes)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.processes: list[asyncio.subprocess.Process] = []
        self.worlds: dict[str, dict[str, Any]] = {}

    async def start(self) -> None:
        for _ in range(CLUSTERS):
            process = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--fake-child", "--requests", str(self.args.requests),
                "--time-scale", str(self.args.time_scale),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            self.processes.append(process)

    async def ready(self) -> None:
        for number, process in enumerate(self.processes, 1):
            assert process.stdout is not None
            line = await asyncio.wait_for(process.stdout.readline(), 60)
            if not line:
                raise SystemExit(f"fake cluster {number} did not start (exit {await process.wait()})")
            self.worlds[f"c{number}"] = orjson.loads(line)

    async def stop(self) -> None:
        await stop_children(self.processes)


async def run_mode(mode: str, clusters: Clusters, args: argparse.Namespace) -> dict[str, Any]:
    """Every request through a real Dispatcher with ``node_placement = mode``, until all ended."""
    from collections import Counter

    from synnefo_ganeti.config import Settings
    from synnefo_ganeti.control import ControlPlane
    from synnefo_ganeti.dispatch import Dispatcher
    from synnefo_ganeti.rapi import InstanceSpec, RapiClient
    from synnefo_ganeti.store import RequestStatus, Store

    with tempfile.TemporaryDirectory(prefix="sg-seed-") as scratch:
        settings = Settings(
            database={"url": f"sqlite:///{scratch}/seed.db"},
            backends=[
                {"name": name, "url": world["url"], "username": world["username"],
                 "password": world["password"], "queue_dir": world["queue_dir"]}
                for name, world in clusters.worlds.items()
            ],
            dispatcher={
                "node_placement": mode, "status_port": None, "stats_interval": 2.0, "poll_interval": 0.05,
                "claim_batch": 100, "health_interval": 5.0,
            },
            reconcile={"interval": 3600},
        )  # fmt: skip
        async with AsyncExitStack() as stack:
            store = await stack.enter_async_context(Store(settings.database.url))
            cp = await stack.enter_async_context(ControlPlane(settings, store=store))
            dispatcher = Dispatcher(settings, store=store, status_server=False)
            running = asyncio.create_task(dispatcher.run())
            await asyncio.wait_for(dispatcher.ready.wait(), 60)
            requests = []
            progress(f"{mode}: {args.requests} durable requests")
            started_wall = time.time()
            started = time.perf_counter()
            for i in range(args.requests):
                spec = InstanceSpec(
                    name=f"seed-{mode[0]}-{i:04d}.fake.test", disk_template="diskless", os="noop",
                    beparams={"memory": MEMORY},
                )  # fmt: skip
                request_id = await cp.request_instance(spec)
                dispatcher.wake()
                requests.append(placement.Request(index=i, spec=spec, request_id=request_id))
            still_open = [RequestStatus.PENDING, RequestStatus.SUBMITTED]
            while time.perf_counter() - started <= DEADLINE * args.time_scale + 60:
                if not await store.request_counts(status=still_open):
                    break
                await asyncio.sleep(0.05)
            seen = time.perf_counter() - started
            counts = await store.request_counts()
            statuses = Counter(status for (_, status), n in counts.items() for _ in range(n))
            stats = dispatcher.stats.to_json()
            dispatcher.stop()
            await running
            backends = {}
            for name, world in clusters.worlds.items():
                client = RapiClient(world["url"], username=world["username"], password=world["password"])
                backends[name] = placement.Backend(name=name, client=await stack.enter_async_context(client))
            progress(f"{mode}: all ended after {seen:.2f} s ({dict(statuses)}); reading the fakes")
            state = await placement.final_state(backends, requests, started_wall)
    return state | {
        "seen_s": seen,
        "request_statuses": {getattr(k, "value", str(k)): v for k, v in statuses.items()},
        "capacity_retries": stats["capacity_retries"],
        "failed": stats["failed"],
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    runs = {mode: Clusters(args) for mode in args.modes}
    try:
        for clusters in runs.values():  # all start at once, then idle until their run
            await clusters.start()
        for clusters in runs.values():
            await clusters.ready()
        results = {mode: await run_mode(mode, clusters, args) for mode, clusters in runs.items()}
    finally:
        for clusters in runs.values():
            await clusters.stop()
    scale = args.time_scale
    limit = math.ceil(args.requests / (CLUSTERS * NODES)) * LOCKED_SECONDS * scale + UNLOCKED_SECONDS * scale
    makespans = {mode: round(result["makespan_s"], 3) for mode, result in results.items()}
    best = min(makespans, key=lambda mode: makespans[mode])
    out: dict[str, Any] = {"requests": args.requests}
    out |= {f"makespan_{mode}_s": makespans.get(mode) for mode in MODES}
    out |= {
        "limit_s": round(limit, 3),
        "ratio_to_limit_best": round(makespans[best] / limit, 3),
        "duplicates": sum(result["duplicates"] for result in results.values()),
        "lost": sum(result["lost"] for result in results.values()),
        "best": best,
        "ratio_to_limit": {mode: round(makespan / limit, 3) for mode, makespan in makespans.items()},
        "placed": {mode: result["placed"] for mode, result in results.items()},
        "failed_creates": {mode: result["failed_creates"] for mode, result in results.items()},
        "capacity_retries": {mode: result["capacity_retries"] for mode, result in results.items()},
        "scenario": {
            "clusters": CLUSTERS, "nodes_per_cluster": NODES, "locked_s": LOCKED_SECONDS * scale,
            "unlocked_s": UNLOCKED_SECONDS * scale, "max_running_jobs": MAX_RUNNING_JOBS,
            "memory_mib": MEMORY, "strategy": "credits",
        },
    }  # fmt: skip
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100, help="instances to create (default 100)")
    parser.add_argument("--time-scale", type=float, default=1.0, help="multiply the create times (test runs)")
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help="node placements to run, comma-separated (default: all three)",
    )
    parser.add_argument("--json-only", action="store_true", help="no progress on stderr")
    parser.add_argument("--fake-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.requests < 1:
        parser.error("--requests must be >= 1")
    if args.time_scale <= 0:
        parser.error("--time-scale must be > 0")
    args.modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    unknown = sorted(set(args.modes) - set(MODES))
    if unknown or not args.modes:
        parser.error(f"--modes: choose among {', '.join(MODES)}")
    return args


if __name__ == "__main__":
    os.environ.setdefault("SYNNEFO_GANETI_LOG_LEVEL", "error")
    arguments = parse_args()
    if arguments.fake_child:
        asyncio.run(fake_child(arguments))
    else:
        placement.QUIET = arguments.json_only
        print(orjson.dumps(asyncio.run(main(arguments))).decode())
