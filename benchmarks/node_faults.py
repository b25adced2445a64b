"""A node dies mid-burst: no create lost or sent twice, none placed on it for long (issue 27 item 9).

    python benchmarks/node_faults.py                          # 300 requests, 2 clusters x 7 nodes
    python benchmarks/node_faults.py --requests 40 --create-seconds 0.2

Two fake Ganetis (``FakeGaneti(nodes=7, tls=False)``, in this process so the benchmark can
call ``crash_node``), each create running ``--create-seconds`` (default 0.5 s; a real one takes
tens of seconds, so the run is scaled down), ``--latency`` per RAPI answer (default 0.02 s).
``--requests`` (default 300) durable requests are written at once through
``ControlPlane.request_instance`` and placed, submitted and followed by a real in-process
``Dispatcher`` (``node_placement = "pnode"``: it picks each create's node; the fakes' queue
folders watched; a scratch SQLite file; ``health_interval`` 1 s, so it reads every node's
figures each second; ``stats_interval`` 1 s; ``max_attempts`` 3; ``unknown_outcome_wait``
10 s). Once create jobs for 30 % of the requests exist in the fakes, one node of the first
cluster (not its master) crashes (``crash_node``: Ganeti lists it online but reads nothing
from it, fails the creates placed on it); every RPC to it then takes ``--rpc-timeout``
(default 1 s; Ganeti's connect timeout is 5 s, which makes the crash run about 100 s), so every
read of live node figures from that cluster waits that long too, and so does each create on
it before it fails: a create naming its ``pnode`` holds that node's lock, so the creates
already queued on the dead node fail one after the other (docs/benchmarks.md). Then the same
run again, fresh fakes and store, without the crash.

Figures (one JSON object on stdout, progress on stderr), counted from the fakes' own state
(their jobs, with the request id in each create op's reason trail as ``synnefo-ganeti:<id>``;
their instances, with the tag ``synnefo-ganeti:request:<id>``) and from the store, never from
the dispatcher's bookkeeping:

* ``requests``: requests written; ``succeeded`` / ``failed``: their status in the store at the end;
* ``lost``: requests with no instance carrying their request tag in any fake;
* ``sent_twice``: requests with a create job sent while an earlier create job of theirs had
  not failed (still queued or running when the next was received, or succeeded), over both
  fakes: a create Ganeti failed for its node (the crashed one) and then placed again is a
  second job but not a duplicate (issue 27 item 3 asks for it); stderr says how many
  requests had more than one create job at all (``placed again``);
* ``failed_but_exists``: requests ``failed`` in the store whose instance (with their request
  tag) exists in a fake;
* ``placed_on_dead_after_10s``: create jobs whose ``pnode`` is the crashed node, received by
  the fake more than 10 s after the crash;
* ``makespan_s``: from the first request written to the end of the last successful create
  job (its ``end_timestamp``); ``makespan_no_crash_s``: the same, in the run without the
  crash; ``ratio``: ``makespan_s / makespan_no_crash_s``.

Goal (issue 27; not asserted here): ``succeeded == requests``; ``lost``, ``sent_twice``,
``failed_but_exists`` and ``placed_on_dead_after_10s`` all 0; ``ratio <= 1.25``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys
import tempfile
import time
from collections import Counter
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import orjson

from synnefo_ganeti.config import Settings
from synnefo_ganeti.control import ControlPlane
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.rapi import InstanceSpec
from synnefo_ganeti.store import RequestStatus, Store, request_tag
from synnefo_ganeti.testing import FakeGaneti

REASON_PREFIX = "synnefo-ganeti:"  # how RapiClient.create_instance writes the request id in the reason
CRASH_AT = 0.30  # the share of requests with a create job in the fakes when the node crashes
DEAD_AFTER = 10.0  # seconds after the crash from which a create on the dead node counts
DEADLINE = 300.0  # a run stops here whatever is left open
MEMORY = 128


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def create_ops(fake: FakeGaneti) -> list[tuple[Any, Any]]:
    """(job, op) of every create op the fake received."""
    return [
        (job, op)
        for job in list(fake.cluster.jobs.values())
        for op in job.ops
        if op.luxid.get("OP_ID") == "OP_INSTANCE_CREATE"
    ]


def request_ids(op: Any) -> list[str]:
    return [
        str(item[1]).removeprefix(REASON_PREFIX)
        for item in op.luxid.get("reason") or []
        if item[0] == "gnt:user" and str(item[1]).startswith(REASON_PREFIX)
    ]


def seconds(ts: list[int] | None) -> float | None:
    return None if ts is None else ts[0] + ts[1] / 1e6


def duplicated(creates: list[tuple[float, float | None, bool]]) -> bool:
    """A create job received while an earlier one of the same request had not failed."""
    creates = sorted(creates)
    return any(
        not failed or end is None or end > received
        for (_, end, failed), (received, _, _) in itertools.pairwise(creates)
    )


async def one_run(args: argparse.Namespace, *, crash: bool, folder: Path) -> dict[str, Any]:
    label = "crash" if crash else "no crash"
    op_times = {"OP_INSTANCE_CREATE": args.create_seconds}
    async with AsyncExitStack() as stack:
        fakes = [
            await stack.enter_async_context(
                FakeGaneti(
                    nodes=args.nodes,
                    tls=False,
                    op_times=op_times,
                    latency=args.latency,
                    cluster_name=f"c{i}.fake.test",
                )
            )
            for i in range(2)
        ]
        db = folder / f"{'crash' if crash else 'calm'}.db"
        settings = Settings(
            database={"url": f"sqlite:///{db}"},
            backends=[
                {"name": f"c{i}", "url": fake.url, "username": fake.username, "password": fake.password,
                 "queue_dir": str(fake.queue_dir)}
                for i, fake in enumerate(fakes)
            ],
            dispatcher={
                "node_placement": "pnode", "status_port": None, "poll_interval": 0.05, "claim_batch": 100,
                "health_interval": 1.0, "health_timeout": max(2.0, args.rpc_timeout + 1.0),
                "stats_interval": 1.0, "max_attempts": 3, "unknown_outcome_wait": 10.0,
                "shutdown_timeout": 5.0,
            },
            reconcile={"interval": 3600},
        )  # fmt: skip
        store = await stack.enter_async_context(Store(settings.database.url))
        cp = await stack.enter_async_context(ControlPlane(settings, store=store))
        dispatcher = Dispatcher(settings, store=store, status_server=False)
        running = asyncio.create_task(dispatcher.run(), name="bench dispatcher")
        watching: asyncio.Task[None] | None = None
        try:
            await asyncio.wait_for(dispatcher.ready.wait(), 60)
            victim = next(node.name for node in fakes[0].cluster.nodes.values() if not node.master)
            progress(f"{label}: {args.requests} durable requests")
            started_wall = time.time()
            started = time.perf_counter()
            ids: list[str] = []
            crashed: list[float] = []  # the wall time of the crash, once it happened
            threshold = max(1, round(args.requests * CRASH_AT))

            async def crasher() -> None:
                while True:
                    sent = {rid for fake in fakes for _, op in create_ops(fake) for rid in request_ids(op)}
                    if len(sent) >= threshold:
                        fakes[0].rpc_timeout = args.rpc_timeout
                        fakes[0].crash_node(victim)
                        crashed.append(time.time())
                        progress(
                            f"{label}: {victim} of c0 crashed when {len(sent)} requests had a create job"
                        )
                        return
                    await asyncio.sleep(0.01)

            watching = asyncio.create_task(crasher()) if crash else None
            for i in range(args.requests):
                spec = InstanceSpec(
                    name=f"nf-{i:05d}.fake.test", disk_template="diskless", os="noop",
                    beparams={"memory": MEMORY}, start=True,
                )  # fmt: skip
                ids.append(await cp.request_instance(spec))
                dispatcher.wake()
            open_ = [RequestStatus.PENDING, RequestStatus.SUBMITTED]
            while time.perf_counter() - started <= DEADLINE:
                if not await store.request_counts(status=open_):
                    break
                await asyncio.sleep(0.02)
            else:
                progress(f"{label}: deadline of {DEADLINE:g} s reached with requests still open")
            progress(
                f"{label}: all ended after {time.perf_counter() - started:.2f} s; reading the fakes and store"
            )
        finally:
            if watching is not None:
                watching.cancel()
            dispatcher.stop()
            await running
        crashed_at = crashed[0] if crashed else None

        statuses = Counter()
        stored = {}
        for rid in ids:
            request = await store.get_request(rid)
            stored[rid] = request.status if request is not None else None
            statuses[stored[rid]] += 1
        jobs_of: Counter[str] = Counter()
        creates_of: dict[str, list[tuple[float, float | None, bool]]] = {}
        last_end = started_wall
        on_dead_late = placed_again = 0
        for index, fake in enumerate(fakes):
            for job, op in create_ops(fake):
                rids = request_ids(op)
                jobs_of.update(rids)
                end = seconds(op.end_timestamp)
                if rids and job.status.value == "success" and end is not None:
                    last_end = max(last_end, end)
                received = seconds(job.received_timestamp) or 0.0
                for rid in rids:
                    failed = job.status.value in ("error", "canceled")
                    creates_of.setdefault(rid, []).append((received, end, failed))
                if (
                    crashed_at is not None and index == 0 and op.luxid.get("pnode") == victim
                    and received > crashed_at + DEAD_AFTER
                ):  # fmt: skip
                    on_dead_late += 1
        tags = {tag for fake in fakes for inst in fake.cluster.instances.values() for tag in inst.tags}
        exists = {rid for rid in ids if request_tag(rid) in tags}
        placed_again = sum(1 for rid in ids if jobs_of[rid] > 1)
        failed_ids = [rid for rid in ids if stored[rid] is RequestStatus.FAILED]
        for rid in failed_ids[:20]:
            request = await store.get_request(rid)
            progress(f"{label}: failed {rid}: {getattr(request, 'error', None)!r}")
        twice = [rid for rid in ids if duplicated(creates_of[rid])]
        for rid in twice[:20]:
            progress(f"{label}: sent twice {rid} ({stored[rid]}): {sorted(creates_of[rid])}")
        progress(f"{label}: statuses {dict(statuses)}; placed again: {placed_again}")
        return {
            "requests": len(ids),
            "succeeded": statuses[RequestStatus.SUCCEEDED],
            "failed": statuses[RequestStatus.FAILED],
            "lost": sum(1 for rid in ids if rid not in exists),
            "sent_twice": len(twice),
            "failed_but_exists": sum(1 for rid in failed_ids if rid in exists),
            "placed_on_dead_after_10s": on_dead_late,
            "makespan_s": round(last_end - started_wall, 3),
        }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="node-faults-bench-") as folder:
        figures = await one_run(args, crash=True, folder=Path(folder))
        calm = await one_run(args, crash=False, folder=Path(folder))
    figures["makespan_no_crash_s"] = calm["makespan_s"]
    figures["ratio"] = round(figures["makespan_s"] / calm["makespan_s"], 3) if calm["makespan_s"] else None
    return figures


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="durable requests per run (default 300)")
    parser.add_argument("--nodes", type=int, default=7, help="nodes per cluster (default 7)")
    parser.add_argument("--create-seconds", type=float, default=0.5, help="seconds per create (default 0.5)")
    parser.add_argument("--latency", type=float, default=0.02, help="seconds per RAPI answer (default 0.02)")
    parser.add_argument(
        "--rpc-timeout",
        type=float,
        default=5.0,
        help="seconds an RPC to the dead node takes to fail (default 5)",
    )
    args = parser.parse_args(argv)
    if (
        args.requests < 1
        or args.nodes < 2
        or args.create_seconds < 0
        or args.latency < 0
        or args.rpc_timeout < 0
    ):
        parser.error("--requests >= 1, --nodes >= 2, and times >= 0, please")
    return args


if __name__ == "__main__":
    os.environ.setdefault("SYNNEFO_GANETI_LOG_LEVEL", "error")
    print(orjson.dumps(asyncio.run(main(parse_args()))).decode())
