"""A delete always wins (issue 28 item 2): users delete servers at every stage of their build.

    python benchmarks/deletes.py                         # 200 requests, creates of 2 s
    python benchmarks/deletes.py --requests 40 --create-seconds 0.5
    python benchmarks/deletes.py --db postgresql              # a scratch PostgreSQL database

One fake Ganeti (``FakeGaneti(tls=False)``, ``max_running_jobs`` 8, so creates queue behind
each other as on a busy cluster), each create running ``--create-seconds``, each shutdown a
quarter of that; a real in-process ``Dispatcher`` (a scratch SQLite file) places, submits and
follows ``--requests`` durable requests written at once through ``request_instance``. Each
server is then deleted by its one id (``Request.instance_id``, given at once) at one stage,
in turn (one delete call at a time, as users' deletes come, while the dispatcher works through
the burst): ``pending`` (at once, before the dispatcher sent it), ``sent`` (once its create job
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
* ``create_s``: a create's duration; ``ratio``: the ``sent`` stage's median call time over
  ``create_s`` (the delete of a create Ganeti runs used to wait it out: about 1 then);
* ``to_destroyed_p50_s`` / ``to_destroyed_p99_s``: from each delete call to its DESTROYED (or
  its request canceled), by the change feed's times: for a ``stopping`` server, the remove
  waits in Ganeti's queue behind the creates still queued there.

The cloud API's control plane has its own store (its own writer), as a separate process would.

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

from _databases import database
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


async def run(args: argparse.Namespace, folder: Path, db_url: str) -> dict[str, Any]:
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
            database={"url": db_url},
            backends=[{"name": "f1", "url": fake.url, "username": fake.username, "password": fake.password,
                       "queue_dir": str(fake.queue_dir)}],
            dispatcher={"status_port": None, "poll_interval": 0.05, "health_interval": 1.0,
                        "stats_interval": 1.0, "shutdown_timeout": 5.0},
            reconcile={"interval": 3600},
        )  # fmt: skip
        store = await stack.enter_async_context(Store(settings.database.url))
        # the cloud API's own store (its process, its writer), as beside a real dispatcher
        api_store = await stack.enter_async_context(Store(settings.database.url))
        cp = await stack.enter_async_context(ControlPlane(settings, store=api_store))
        first_change = (await store.list_changes(after=0, limit=None) or [None])[-1]
        start_change = 0 if first_change is None else first_change.id
        dispatcher = Dispatcher(settings, store=store, status_server=False)
        running = asyncio.create_task(dispatcher.run(), name="bench dispatcher")
        calls: list[float] = []
        by_stage: dict[str, list[float]] = {kind: [] for kind in STAGES[:-1]}
        asked: dict[str, float] = {}  # instance id -> when its delete was called
        refused = 0
        try:
            await asyncio.wait_for(dispatcher.ready.wait(), 60)
            servers: list[tuple[str, str, str]] = []  # (stage, name, instance id)
            request_of: dict[str, str] = {}  # instance id -> request id
            for i in range(args.requests):
                name = f"del-{i:05d}.fake.test"
                spec = InstanceSpec(name=name, disk_template="diskless", os="noop", beparams={"memory": 128})
                rid = await cp.request_instance(spec)
                iid = (await cp.get_request(rid)).instance_id
                assert iid is not None
                servers.append((STAGES[i % len(STAGES)], name, iid))
                request_of[iid] = rid
            dispatcher.wake()
            progress(f"{args.requests} requests written; deleting at every stage")

            one_at_a_time = asyncio.Lock()  # users' deletes, not a burst of them: each call's own time

            async def delete(iid: str, kind: str) -> None:
                nonlocal refused
                async with one_at_a_time:
                    asked[iid] = time.time()
                    start = time.perf_counter()
                    try:
                        await cp.delete_instance(iid)
                    except Exception as exc:  # the library refuses none: counted, never hidden
                        refused += 1
                        progress(f"delete of {iid} refused: {exc!r}")
                        return
                    calls.append(time.perf_counter() - start)
                    by_stage[kind].append(calls[-1])

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

            async def all_ended() -> bool:
                for _, iid in deleted:
                    found = await cp.get_instance(iid)
                    if found is None or found.status is not InstanceStatus.DESTROYED:
                        return False
                for kind, _, iid in servers:
                    if kind == "kept":
                        built = await cp.get_instance(iid)
                        if built is None or built.status is not InstanceStatus.STARTED:
                            return False
                return True

            try:
                await until(all_ended, "every deleted server DESTROYED and the others STARTED")
            except TimeoutError as exc:
                progress(str(exc))
            await asyncio.sleep(args.create_seconds * 2)  # a create that would come back: given time to
        finally:
            dispatcher.stop()
            await running
        # when each deleted server ended, by the change feed (the instance DESTROYED, or its
        # request canceled before it had a row)
        done_at: dict[str, float] = {}
        for change in await store.list_changes(after=start_change, limit=None):
            ended = (change.kind == "instance" and change.status == "DESTROYED") or (
                change.kind == "request" and change.status == "canceled"
            )
            if ended:
                done_at.setdefault(change.key, change.at.timestamp())
        for _, iid in deleted:
            times = [done_at[k] for k in (iid, request_of[iid]) if k in done_at]
            if times:
                done_at[iid] = min(times)
        destroyed = 0
        for _, iid in deleted:
            found = await store.get_instance(None, None, id=iid)
            destroyed += found is not None and found.status is InstanceStatus.DESTROYED
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
            "destroyed": destroyed,
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
            "ratio": round(statistics.median(by_stage["sent"]) / args.create_seconds, 3)
            if by_stage["sent"]
            else None,
            "to_destroyed_p50_s": round(quantile(to_destroyed, 0.5) or 0.0, 3),
            "to_destroyed_p99_s": round(quantile(to_destroyed, 0.99) or 0.0, 3),
        }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="durable requests (default 200)")
    parser.add_argument("--create-seconds", type=float, default=2.0, help="seconds per create (default 2)")
    parser.add_argument(
        "--db", default="sqlite", help="sqlite (default), postgresql (a scratch database), or a URL"
    )
    args = parser.parse_args(argv)
    if args.requests < len(STAGES) or args.create_seconds <= 0:
        parser.error(f"--requests >= {len(STAGES)} and --create-seconds > 0, please")
    return args


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="deletes-bench-") as folder:
        async with database(args.db, folder) as db_url:
            figures = await run(args, Path(folder), db_url)
    return {"db": args.db if args.db in ("sqlite", "postgresql") else "url", **figures}


if __name__ == "__main__":
    os.environ.setdefault("SYNNEFO_GANETI_LOG_LEVEL", "error")
    figures = asyncio.run(main(parse_args()))
    sys.stdout.write(orjson.dumps(figures).decode() + "\n")
