"""A delete always wins (issue 28 item 2): users delete servers at every stage of their build.

    python benchmarks/deletes.py                         # 200 requests, creates of 2 s
    python benchmarks/deletes.py --requests 40 --create-seconds 0.5

One fake Ganeti (``FakeGaneti(tls=False)``, ``max_running_jobs`` 8, so creates queue behind
each other as on a busy cluster), each create running ``--create-seconds``, each shutdown a
quarter of that; a real in-process ``Dispatcher`` (a scratch SQLite file) places, submits and
follows ``--requests`` durable requests written at once through ``request_instance``. Each
server is then deleted by its one id (``Request.instance_id``, given at once) at one stage,
in turn: ``pending`` (at once, before the dispatcher sent it), ``sent`` (once its create job
is recorded: queued in Ganeti or running), ``stopping`` (built, while a shutdown runs), or
``kept`` (never deleted, the control). The figures (one JSON object on stdout, progress on
stderr), from the fake's own state and the store:

* ``requests``; ``deleted``: servers deleted; ``destroyed``: of those, DESTROYED in the store;
* ``came_back``: deleted servers whose instance (by name) exists in the fake at the end;
* ``kept_started``: control servers STARTED at the end;
* ``refused_busy``: deletes refused (any exception: the library refuses none);
* ``delete_call_p50_ms`` / ``delete_call_p99_ms`` / ``delete_call_max_ms``: how long a
  ``delete_instance`` call took (it never waits for what runs);
* ``delete_call_p50_ms_by_stage``: the same by stage (``sent``: a queued create is canceled
  and its end awaited, a running one's delete written; ``stopping``: written);
* ``create_s``: a create's duration; ``ratio``: ``delete_call_max_ms / 1000 / create_s`` (the
  old delete of a running create waited it out: about 1);
* ``to_destroyed_p50_s`` / ``to_destroyed_p99_s``: from each delete call to its DESTROYED.

Goal (not asserted here): ``destroyed == deleted``, ``came_back`` and ``refused_busy`` 0,
``kept_started`` all kept, ``ratio`` far below 1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import orjson

from synnefo_ganeti.config import Settings
from synnefo_ganeti.control import ControlPlane
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.rapi import InstanceSpec
from synnefo_ganeti.store import InstanceStatus, Store
from synnefo_ganeti.testing import FakeGaneti

STAGES = ("pending", "sent", "stopping", "kept")
DEADLINE = 300.0


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def until(predicate: Any, what: str) -> None:
    deadline = time.perf_counter() + DEADLINE
    while not await predicate():
        if time.perf_counter() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        await asyncio.sleep(0.02)


async def run(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    op_times = {
        "OP_INSTANCE_CREATE": args.create_seconds,
        "OP_INSTANCE_SHUTDOWN": args.create_seconds / 4,
        "OP_INSTANCE_REMOVE": 0.05,
    }
    async with AsyncExitStack() as stack:
        fake = await stack.enter_async_context(
            FakeGaneti(tls=False, op_times=op_times, max_running_jobs=8, nodes=4)
        )
        settings = Settings(
            database={"url": f"sqlite:///{folder / 'deletes.db'}"},
            backends=[{"name": "f1", "url": fake.url, "username": fake.username, "password": fake.password,
                       "queue_dir": str(fake.queue_dir)}],
            dispatcher={"status_port": None, "poll_interval": 0.05, "health_interval": 1.0,
                        "stats_interval": 1.0, "shutdown_timeout": 5.0},
            reconcile={"interval": 3600},
        )  # fmt: skip
        store = await stack.enter_async_context(Store(settings.database.url))
        cp = await stack.enter_async_context(ControlPlane(settings, store=store))
        dispatcher = Dispatcher(settings, store=store, status_server=False)
        running = asyncio.create_task(dispatcher.run(), name="bench dispatcher")
        calls: list[float] = []
        by_stage: dict[str, list[float]] = {kind: [] for kind in STAGES[:-1]}
        asked: dict[str, float] = {}  # instance id -> when its delete was called
        refused = 0
        try:
            await asyncio.wait_for(dispatcher.ready.wait(), 60)
            servers: list[tuple[str, str, str]] = []  # (stage, name, instance id)
            for i in range(args.requests):
                name = f"del-{i:05d}.fake.test"
                spec = InstanceSpec(name=name, disk_template="diskless", os="noop", beparams={"memory": 128})
                rid = await cp.request_instance(spec)
                iid = (await cp.get_request(rid)).instance_id
                assert iid is not None
                servers.append((STAGES[i % len(STAGES)], name, iid))
            dispatcher.wake()
            progress(f"{args.requests} requests written; deleting at every stage")

            async def delete(iid: str, kind: str) -> None:
                nonlocal refused
                start = time.perf_counter()
                try:
                    await cp.delete_instance(iid)
                except Exception as exc:  # the library refuses none: counted, never hidden
                    refused += 1
                    progress(f"delete of {iid} refused: {exc!r}")
                    return
                calls.append(time.perf_counter() - start)
                by_stage[kind].append(calls[-1])
                asked[iid] = time.time()

            async def stage(kind: str, iid: str) -> None:
                if kind == "pending":
                    await delete(iid, kind)
                elif kind == "sent":

                    async def recorded() -> bool:
                        found = await cp.get_instance(iid)
                        return found is not None and found.create_job_id is not None

                    await until(recorded, f"{iid}'s create recorded")
                    await delete(iid, kind)
                elif kind == "stopping":

                    async def built() -> bool:
                        found = await cp.get_instance(iid)
                        return (
                            found is not None
                            and found.status is InstanceStatus.STARTED
                            and found.task is None
                        )

                    await until(built, f"{iid} built")
                    await cp.shutdown_instance(iid)
                    await delete(iid, kind)

            await asyncio.gather(*(stage(kind, iid) for kind, _, iid in servers))
            deleted = [(name, iid) for kind, name, iid in servers if kind != "kept"]
            done_at: dict[str, float] = {}

            async def all_ended() -> bool:
                for _, iid in deleted:
                    if iid in done_at:
                        continue
                    found = await cp.get_instance(iid)
                    if found is not None and found.status is InstanceStatus.DESTROYED:
                        done_at[iid] = time.time()
                kept = [iid for kind, _, iid in servers if kind == "kept"]
                built = [await cp.get_instance(iid) for iid in kept]
                return len(done_at) == len(deleted) and all(
                    b is not None and b.status is InstanceStatus.STARTED for b in built
                )

            try:
                await until(all_ended, "every deleted server DESTROYED and the others STARTED")
            except TimeoutError as exc:
                progress(str(exc))
            await asyncio.sleep(args.create_seconds * 2)  # a create that would come back: given time to
        finally:
            dispatcher.stop()
            await running
        names_in_ganeti = set(fake.cluster.instances)
        kept_started = 0
        for kind, _, iid in servers:
            if kind == "kept":
                found = await store.get_instance(None, None, id=iid)
                kept_started += found is not None and found.status is InstanceStatus.STARTED
        to_destroyed = [done_at[iid] - asked[iid] for _, iid in deleted if iid in done_at and iid in asked]
        slowest = max(calls) if calls else 0.0
        return {
            "requests": len(servers),
            "deleted": len(deleted),
            "destroyed": len(done_at),
            "came_back": sum(1 for name, _ in deleted if name in names_in_ganeti),
            "kept_started": kept_started,
            "refused_busy": refused,
            "delete_call_p50_ms": round(1000 * statistics.median(calls), 1) if calls else None,
            "delete_call_p99_ms": round(1000 * (quantile(calls, 0.99) or 0.0), 1),
            "delete_call_max_ms": round(1000 * slowest, 1),
            "delete_call_p50_ms_by_stage": {
                kind: round(1000 * statistics.median(times), 1) if times else None
                for kind, times in by_stage.items()
            },
            "create_s": args.create_seconds,
            "ratio": round(slowest / args.create_seconds, 3) if args.create_seconds else None,
            "to_destroyed_p50_s": round(quantile(to_destroyed, 0.5) or 0.0, 3),
            "to_destroyed_p99_s": round(quantile(to_destroyed, 0.99) or 0.0, 3),
        }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="durable requests (default 200)")
    parser.add_argument("--create-seconds", type=float, default=2.0, help="seconds per create (default 2)")
    args = parser.parse_args(argv)
    if args.requests < len(STAGES) or args.create_seconds <= 0:
        parser.error(f"--requests >= {len(STAGES)} and --create-seconds > 0, please")
    return args


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="deletes-bench-") as folder:
        return await run(args, Path(folder))


if __name__ == "__main__":
    os.environ.setdefault("SYNNEFO_GANETI_LOG_LEVEL", "error")
    figures = asyncio.run(main(parse_args()))
    sys.stdout.write(orjson.dumps(figures).decode() + "\n")
