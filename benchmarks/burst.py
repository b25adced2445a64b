"""A cloud API's burst: 2,000 durable creates written by 4 API tasks, PostgreSQL, one dispatcher,
then two; each request's end read from the change feed in another process.

    python benchmarks/burst.py                                  # 2,000 requests, 1 then 2 dispatchers
    python benchmarks/burst.py --requests 200 --dispatchers 1   # the test's run
    python benchmarks/burst.py --rate 100                       # the API paced: 100 requests a second

The database starts as an established cloud's does (``--history``, default 20,000: past requests
and instances, ended and DESTROYED, with the create jobs that made them and their events, then
``ANALYZE``; ``benchmarks/_history.py``); the fake's job ids go on after the past ones; ``--history
0`` starts it empty.

One fake Ganeti (plain HTTP, zero latency, in a process of its own) with 20 roomy nodes and
0.05 s creates; the dispatchers run in processes of their own (a real ``Dispatcher`` each,
following the fake's queue directory); this process plays the cloud API: 4 tasks write the
requests through ``ControlPlane.request_instance`` while a fifth reads ``cp.changes()``.

One JSON line per run (progress on stderr):

* ``offered_per_s``: ``--rate`` (``null``: none, the API tasks write as fast as they can, which is
  faster than the rest of a 2-core machine can follow: the requests wait in the database, and
  ``p99_submit_ms`` is that backlog's wait); ``written_per_s``: the requests over the time the API
  tasks took to write them all;
* ``submitted_per_s``: requests over the time from the first request written to the last
  create job recorded (``submitted_at``); ``succeeded_per_s`` likewise to the last end;
* ``p50_submit_ms``/``p99_submit_ms``: a request written -> its create job recorded;
* ``p99_end_to_feed_ms``: the fake's ``end_ts`` of the create job -> the request's end came out
  of ``cp.changes()`` here (both clocks this machine's); ``end_path_ms``: that path's legs,
  [p50, p99] ms each: ``stored`` (-> the job's end stored: its final event's ``stored_at``),
  ``settled`` (-> the request's end written: its change's ``at``), ``feed`` (-> read here);
* ``duplicates`` (an instance created twice) and ``lost`` (a request not succeeded, or its
  instance missing from the fake), from the fake's own state at the end;
* ``cpu_ms_per_request``: CPU (user + system, from ``/proc``, ``benchmarks/_cpu.py``) from the
  first request written to the last end seen in the feed, over the requests, of the dispatcher
  processes (summed), this API process, the fake's process and PostgreSQL (this run's database's
  backends and the server's own processes, polled; ``null`` with ``postgresql_cpu.why`` if the
  server is not on this machine); ``postgresql_cpu`` has the whole server's too (exact, other
  databases' work included) and the other databases' backends; ``dispatcher_cpu_ms_each``: each
  dispatcher process's share, in the order they started;
* ``control_cpu_ratio``: (dispatchers + API + PostgreSQL) over the fake's CPU a create;
* ``cpu_busy``: all of that CPU over the run's wall time times this machine's CPUs.

With one and two dispatchers in the runs (the default) a last line, ``"benchmark": "burst-scale"``:
``scale_2_to_1`` (two dispatchers' ``submitted_per_s`` over one's), each run's
``control_cpu_ratio``, the runs' lost and duplicates, and the goals with whether each is met.

Goals (issue 14), one dispatcher: ``submitted_per_s`` >= 200, ``p99_submit_ms`` <= 1,000,
``p99_end_to_feed_ms`` <= 250; always 0 duplicates and 0 lost. Issue 31, on a 2-core machine:
``scale_2_to_1`` >= 1.0 and ``control_cpu_ratio`` <= 2.0, the p99 goals kept.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from contextlib import AsyncExitStack
from typing import Any

import orjson

from _children import serve_fake, stop_children
from _cpu import PostgresCpu, database_name, locate_postmaster, process_cpu_s
from _databases import database
from _history import queue_serial
from _history import seed as seed_history
from synnefo_ganeti.config import DispatcherSettings
from synnefo_ganeti.daemon import loop_name, run_daemon

NODES = 20
CREATE_S = 0.05
MEMORY = 128
API_TASKS = 4
DEADLINE_S = 600.0
#: the past rows an established store holds (benchmarks/_history.py)
HISTORY = 20_000
GOALS = {"scale_2_to_1": 1.0, "control_cpu_ratio": 2.0, "p99_submit_ms": 1000.0, "p99_end_to_feed_ms": 250.0}
QUIET = False


def progress(message: str) -> None:
    if not QUIET:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def settings_of(world: dict[str, Any], db_url: str) -> Any:
    from synnefo_ganeti.config import Settings

    return Settings(
        database={"url": db_url},
        backends=[
            {"name": "burst", "url": world["url"], "username": world["username"],
             "password": world["password"], "queue_dir": world["queue_dir"]}
        ],
        dispatcher={"status_port": None, "poll_interval": 0.05, "claim_batch": 100, "health_interval": 5.0},
        reconcile={"interval": 3600},
    )  # fmt: skip


# -- the children ---------------------------------------------------------------------------------


def queue_after_history(history: int) -> tuple[tempfile.TemporaryDirectory[str], str]:
    """A queue folder for the fake (tmpfs where there is one) whose job ids go on after the past
    jobs the database holds (benchmarks/_history.py): Ganeti never gives a job id twice."""
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    temp = tempfile.TemporaryDirectory(prefix="burst-queue-", dir=base)
    queue = os.path.join(temp.name, "queue")
    os.makedirs(queue)
    with open(os.path.join(queue, "serial"), "w") as serial:
        serial.write(f"{queue_serial(history)}\n")
    return temp, queue


async def fake_child(args: argparse.Namespace) -> None:
    """``--fake-child``: the fake Ganeti; prints its world, serves until stdin closes."""
    from synnefo_ganeti.testing import FakeGaneti

    temp, queue = queue_after_history(args.history)
    fake = FakeGaneti(
        tls=False, nodes=NODES, node_memory=1024 + MEMORY * (args.requests * 2 // NODES + 10),
        op_times={"OP_INSTANCE_CREATE": CREATE_S, "OP_INSTANCE_CREATE/disks": CREATE_S / 2},
        queue_dir=queue,
    )  # fmt: skip
    with temp:
        await serve_fake(fake)


async def dispatcher_child(args: argparse.Namespace) -> None:
    """``--dispatcher-child DB_URL``: one dispatcher of the fake whose world (URL, credentials,
    queue folder) is the first line on stdin (not the command line: ``ps`` shows that to every
    user); "ready" on stdout, runs until stdin closes."""
    from synnefo_ganeti.dispatch import Dispatcher

    world, db_url = orjson.loads(sys.stdin.buffer.readline()), args.dispatcher_child
    # as ``synnefo-ganeti dispatch`` runs it: the garbage collector set for a daemon (_gc.py), on
    # the daemon's event loop (__main__ below: --dispatcher-loop, [dispatcher] event_loop's default)
    dispatcher = Dispatcher(settings_of(world, db_url), status_server=False, freeze_gc=True)
    running = asyncio.create_task(dispatcher.run())
    await asyncio.wait_for(dispatcher.ready.wait(), 120)
    sys.stdout.write(orjson.dumps({"event_loop": loop_name()}).decode() + "\n")
    sys.stdout.flush()
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.buffer.read)
    stats = (dispatcher.stats.to_json(), dataclasses.asdict(dispatcher.store.stats))
    dispatcher.stop()
    await running
    if os.environ.get("SYNNEFO_GANETI_BENCH_STATS"):  # what each dispatcher and its writer did
        progress(f"dispatcher {os.getpid()}: {orjson.dumps(stats[0]).decode()}")
        progress(f"its writer: {orjson.dumps(stats[1]).decode()}")


async def child(*argv: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, __file__, *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )


async def first_line(process: asyncio.subprocess.Process, what: str) -> bytes:
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), 120)
    if not line:
        raise SystemExit(f"{what} did not start (exit {await process.wait()})")
    return line


# -- the API's side -------------------------------------------------------------------------------


async def run(args: argparse.Namespace, dispatchers: int) -> dict[str, Any]:
    from synnefo_ganeti.control import ControlPlane
    from synnefo_ganeti.jobs import JobStatus
    from synnefo_ganeti.rapi import InstanceSpec, RapiClient
    from synnefo_ganeti.store import RequestStatus, Store

    processes: list[asyncio.subprocess.Process] = []
    with tempfile.TemporaryDirectory(prefix="sg-burst-") as scratch:
        async with AsyncExitStack() as stack:
            db_url = await stack.enter_async_context(database(args.db, scratch))
            postmaster, no_postgres = await locate_postmaster(db_url)
            fake = await child(
                "--fake-child", "--requests", str(args.requests), "--history", str(args.history)
            )
            processes.append(fake)
            stack.push_async_callback(stop_children, processes)
            world = orjson.loads(await first_line(fake, "the fake Ganeti"))
            settings = settings_of(world, db_url)
            store = await stack.enter_async_context(Store(db_url))  # creates the schema first
            cp = await stack.enter_async_context(ControlPlane(settings, store=store))
            if args.history:
                await seed_history(store, "burst", args.history)
                progress(f"the database holds {args.history} past requests and instances, analyzed")
            loops: set[str] = set()  # the dispatchers' event loop, as each says
            for number in range(dispatchers):
                process = await child("--dispatcher-child", db_url, "--dispatcher-loop", args.dispatcher_loop)
                processes.append(process)
                assert process.stdin is not None
                process.stdin.write(orjson.dumps(world) + b"\n")
                await process.stdin.drain()
                loops.add(orjson.loads(await first_line(process, f"dispatcher {number + 1}"))["event_loop"])
            progress(
                f"{dispatchers} dispatcher(s) ready; {args.requests} requests from {API_TASKS} API tasks"
            )

            ended_at: dict[str, float] = {}  # request id -> when its end came out of the feed
            all_ended = asyncio.Event()
            feed_ready = asyncio.Event()

            since = await store.last_change_id()

            async def follow() -> None:
                feed = cp.changes(since=since)
                feed_ready.set()
                async for change in feed:
                    if change.kind == "request" and change.status in {"succeeded", "failed", "canceled"}:
                        ended_at.setdefault(change.key, time.time())
                        if len(ended_at) >= args.requests:
                            all_ended.set()

            follower = asyncio.create_task(follow())
            await feed_ready.wait()
            names = [f"burst-{dispatchers}-{i:05d}.fake.test" for i in range(args.requests)]
            request_ids: list[str] = []

            async def api_task(first: int) -> None:
                for index in range(first, args.requests, API_TASKS):
                    if args.rate:  # the cloud's users' pace: request ``index`` comes at index / rate
                        await asyncio.sleep(max(0.0, started + index / args.rate - time.time()))
                    spec = InstanceSpec(
                        name=names[index], disk_template="diskless", os="noop", beparams={"memory": MEMORY}
                    )
                    request_ids.append(await cp.request_instance(spec))

            cpu = CpuSample(processes, postmaster, database_name(db_url))
            started = time.time()
            await asyncio.gather(*(api_task(k) for k in range(API_TASKS)))
            written_s = time.time() - started
            progress(f"written in {written_s:.2f} s; waiting for every end in the feed")
            try:
                await asyncio.wait_for(all_ended.wait(), DEADLINE_S)
            except TimeoutError:
                progress(f"deadline: {len(ended_at)} of {args.requests} ends seen")
            cpu_s = cpu.stop()
            progress(f"every end in the feed {time.time() - started:.2f} s after the first request")
            follower.cancel()
            requests = await cp.list_requests()
            async with RapiClient(
                world["url"], username=world["username"], password=world["password"]
            ) as client:
                instances, jobs = await asyncio.gather(client.list_instances(), client.list_jobs())
            stored_at, settled_at = await store.call_read(end_marks)
    ours = set(request_ids)
    requests = [r for r in requests if r.id in ours]
    end_of = {job.id: job.end_ts.as_float for job in jobs if job.end_ts is not None}
    creates_of: Counter[str] = Counter()
    for job in jobs:
        if job.status is JobStatus.SUCCESS and any(s.startswith("INSTANCE_CREATE") for s in job.summary):
            creates_of.update(job.summary)
    held = Counter(instance.name for instance in instances)
    submit_ms = sorted(
        (r.submitted_at - r.created_at).total_seconds() * 1000 for r in requests if r.submitted_at is not None
    )
    to_feed_ms = sorted(
        (ended_at[r.id] - end_of[r.job_id]) * 1000
        for r in requests
        if r.job_id in end_of and r.id in ended_at
    )
    path = end_path(requests, end_of, stored_at, settled_at, ended_at)
    first = min(r.created_at for r in requests).timestamp()
    submitted = [r.submitted_at.timestamp() for r in requests if r.submitted_at is not None]
    finished = [
        r.finished_at.timestamp() for r in requests if r.status is RequestStatus.SUCCEEDED and r.finished_at
    ]
    lost = sum(1 for r in requests if r.status is not RequestStatus.SUCCEEDED or held[r.instance] == 0)
    lost += args.requests - len(requests)
    duplicates = sum(n - 1 for n in held.values() if n > 1) + sum(n - 1 for n in creates_of.values() if n > 1)
    return {
        "requests": args.requests,
        "dispatchers": dispatchers,
        "offered_per_s": args.rate or None,
        "written_per_s": round(args.requests / max(written_s, 1e-9), 1),
        "submitted_per_s": round(len(submitted) / max(max(submitted) - first, 1e-9), 1) if submitted else 0.0,
        "succeeded_per_s": round(len(finished) / max(max(finished) - first, 1e-9), 1) if finished else 0.0,
        "p50_submit_ms": round(statistics.median(submit_ms), 1) if submit_ms else None,
        "p99_submit_ms": round(percentile(submit_ms, 0.99), 1) if submit_ms else None,
        "p99_end_to_feed_ms": round(percentile(to_feed_ms, 0.99), 1) if to_feed_ms else None,
        "end_path_ms": path,
        "duplicates": duplicates,
        "lost": lost,
        "db": args.db,
        "history": args.history,
        "event_loop": ", ".join(sorted(loops)),
        **cpu_fields(cpu_s, args.requests, no_postgres, in_process=db_url.startswith("sqlite")),
    }


def end_marks(conn: Any) -> tuple[dict[tuple[int, int], float], dict[str, float]]:
    """From the store: when each job's end was stored (its first final ``job_status`` event's
    ``stored_at``, stamped as the writer's transaction of versions begins), by (backend id, job
    id); and when each request's end was written (its first final change's ``at``, the change
    trigger's clock), by request id."""
    from sqlalchemy import func, select

    from synnefo_ganeti.store.changes._changes import changes_t
    from synnefo_ganeti.store.jobs._jobs import events_t

    final = ("success", "error", "canceled")
    stored = {
        (row.backend_id, row.job_id): row.at.timestamp()
        for row in conn.execute(
            select(events_t.c.backend_id, events_t.c.job_id, func.min(events_t.c.stored_at).label("at"))
            .where(events_t.c.kind == "job_status", events_t.c.status.in_(final))
            .group_by(events_t.c.backend_id, events_t.c.job_id)
        )
    }
    settled = {
        row.key: row.at
        for row in conn.execute(
            select(changes_t.c.key, func.min(changes_t.c.at).label("at"))
            .where(changes_t.c.kind == "request", changes_t.c.status.in_(("succeeded", "failed", "canceled")))
            .group_by(changes_t.c.key)
        )
    }
    return stored, settled


def end_path(
    requests: list[Any],
    end_of: dict[int, float],
    stored_at: dict[tuple[int, int], float],
    settled_at: dict[str, float],
    ended_at: dict[str, float],
) -> dict[str, list[float]] | None:
    """Where a create's end waits on its way to the feed, [p50, p99] ms of each leg: ``stored``
    (the fake's end -> the end stored by the dispatcher's writer), ``settled`` (-> the request's
    end written, in the same transaction or a later one), ``feed`` (-> read from the feed here)."""
    legs: dict[str, list[float]] = {"stored": [], "settled": [], "feed": []}
    backend_ids = {key[0] for key in stored_at}
    for request in requests:
        end = end_of.get(request.job_id)
        stored = [stored_at[(b, request.job_id)] for b in backend_ids if (b, request.job_id) in stored_at]
        settled, seen = settled_at.get(request.id), ended_at.get(request.id)
        if end is None or len(stored) != 1 or settled is None or seen is None:
            continue
        legs["stored"].append((stored[0] - end) * 1000)
        legs["settled"].append((settled - stored[0]) * 1000)
        legs["feed"].append((seen - settled) * 1000)
    if not legs["stored"]:
        return None
    return {
        leg: [round(percentile(sorted(values), 0.5), 1), round(percentile(sorted(values), 0.99), 1)]
        for leg, values in legs.items()
    }


class CpuSample:
    """The CPU of a run's processes, from its ``__init__`` to ``stop()``: ``processes[0]`` is the
    fake, the others the dispatchers; PostgreSQL's if ``postmaster`` is known (``benchmarks/_cpu.py``)."""

    def __init__(self, processes: list[asyncio.subprocess.Process], postmaster: int | None, db: str) -> None:
        self.fake, self.dispatchers = processes[0].pid, [p.pid for p in processes[1:]]
        self.postgres = PostgresCpu(postmaster, db) if postmaster is not None else None
        if self.postgres is not None:
            self.postgres.start()
        self.started = (time.monotonic(), *self._own())
        self.each_started = [process_cpu_s(pid) for pid in self.dispatchers]

    def _own(self) -> tuple[float, float, float]:
        """Seconds of CPU so far: the dispatchers', this process's, the fake's."""
        return sum(map(process_cpu_s, self.dispatchers)), process_cpu_s(), process_cpu_s(self.fake)

    def stop(self) -> dict[str, Any]:
        dispatchers, api, fake = self._own()
        each = [process_cpu_s(pid) - s for pid, s in zip(self.dispatchers, self.each_started, strict=True)]
        wall = time.monotonic() - self.started[0]
        split = self.postgres.stop() if self.postgres is not None else None
        seconds: dict[str, Any] = {
            "dispatchers": dispatchers - self.started[1],
            "api": api - self.started[2] - (split.sampler_s if split is not None else 0.0),
            "fake": fake - self.started[3],
            "postgresql": split.ours_s if split is not None else None,
        }
        busy = sum(v for v in seconds.values() if v is not None)
        busy += split.other_databases_s if split is not None else 0.0
        return {
            "seconds": seconds,
            "each": each,
            "split": split,
            "busy": busy / max(wall * (os.cpu_count() or 1), 1e-9),
        }


def cpu_fields(cpu: dict[str, Any], requests: int, why: str | None, *, in_process: bool) -> dict[str, Any]:
    """The run's CPU figures for its JSON line (milliseconds a request); ``in_process``: no
    server (SQLite), the database's work counted in the API's and the dispatchers'."""
    per = {k: None if v is None else round(v * 1000 / requests, 2) for k, v in cpu["seconds"].items()}
    control = [per["dispatchers"], per["api"], per["postgresql"]]
    if per["postgresql"] is None and not in_process:
        ratio = None  # a server elsewhere: its share unknown
    else:
        ratio = round(sum(v or 0.0 for v in control) / per["fake"], 2) if per["fake"] else None
    split = cpu["split"]
    detail: dict[str, Any] = {"why": why} if split is None else {
        "whole_server_ms_per_request": round(split.whole_server_s * 1000 / requests, 2),
        "database_ms_per_request": round(split.database_s * 1000 / requests, 2),
        "server_processes_ms_per_request": round(split.server_processes_s * 1000 / requests, 2),
        "other_databases_ms_per_request": round(split.other_databases_s * 1000 / requests, 2),
    }  # fmt: skip
    each = [round(v * 1000 / requests, 2) for v in cpu["each"]]
    return {"cpu_ms_per_request": per, "dispatcher_cpu_ms_each": each, "control_cpu_ratio": ratio, "postgresql_cpu": detail,
            "cpu_busy": round(cpu["busy"], 2)}  # fmt: skip


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile of sorted ``values`` (nearest rank)."""
    return values[min(len(values) - 1, max(0, round(q * len(values)) - 1))]


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    runs = [await run(args, n) for n in args.dispatchers]
    return [*runs, summary] if (summary := scale_summary(runs)) else runs


def scale_summary(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The ``burst-scale`` line: two dispatchers against one in the same invocation, and the goals."""
    one = next((r for r in runs if r["dispatchers"] == 1), None)
    two = next((r for r in runs if r["dispatchers"] == 2), None)
    if one is None or two is None:
        return None
    scale = round(two["submitted_per_s"] / one["submitted_per_s"], 2) if one["submitted_per_s"] else None
    ratios = [one["control_cpu_ratio"], two["control_cpu_ratio"]]
    lost, duplicates = sum(r["lost"] for r in runs), sum(r["duplicates"] for r in runs)

    def at_most(key: str) -> bool:
        return all(r[key] is not None and r[key] <= GOALS[key] for r in runs)

    met = {
        "scale_2_to_1": scale is not None and scale >= GOALS["scale_2_to_1"],
        "control_cpu_ratio": all(r is not None and r <= GOALS["control_cpu_ratio"] for r in ratios),
        "lost": lost == 0,
        "duplicates": duplicates == 0,
        "p99_submit_ms": at_most("p99_submit_ms"),
        "p99_end_to_feed_ms": at_most("p99_end_to_feed_ms"),
    }
    return {
        "benchmark": "burst-scale",
        "requests": one["requests"],
        "scale_2_to_1": scale,
        "control_cpu_ratio_1": ratios[0],
        "control_cpu_ratio_2": ratios[1],
        "lost": lost,
        "duplicates": duplicates,
        "goals": {"scale_2_to_1_min": GOALS["scale_2_to_1"], "control_cpu_ratio_max": GOALS["control_cpu_ratio"],
                  "lost": 0, "duplicates": 0, "p99_submit_ms_max": GOALS["p99_submit_ms"],
                  "p99_end_to_feed_ms_max": GOALS["p99_end_to_feed_ms"]},
        "met": met,
        "all_met": all(met.values()),
        "db": one["db"],
    }  # fmt: skip


def counts(text: str) -> list[int]:
    """``--dispatchers 1,2`` (or ``1 2``): the runs' dispatcher counts."""
    return [int(part) for part in text.split(",") if part.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument(
        "--dispatchers", type=counts, nargs="+", default=[[1, 2]], help="one run per count: 1 2 or 1,2"
    )
    parser.add_argument(
        "--db", default="postgresql", help="postgresql (a scratch database), sqlite, or a URL"
    )
    parser.add_argument(
        "--history", type=int, default=HISTORY,
        help="past requests and instances in the database before the burst, analyzed (0: an empty one)",
    )  # fmt: skip
    parser.add_argument(
        "--rate", type=float, default=0.0,
        help="requests a second the API tasks write, paced (default 0: as fast as they can, the burst)",
    )  # fmt: skip
    parser.add_argument(
        "--dispatcher-loop", choices=["auto", "uvloop", "asyncio"], default=DispatcherSettings().event_loop,
        help="the dispatchers' event loop, as [dispatcher] event_loop (default: its default, auto: uvloop "
        "where it can be imported); the API's and the fake's stay asyncio's",
    )  # fmt: skip
    parser.add_argument("--fake-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dispatcher-child", metavar="DB_URL", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.dispatchers = [n for group in args.dispatchers for n in group]
    return args


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.fake_child:
        asyncio.run(fake_child(arguments))
    elif arguments.dispatcher_child:
        run_daemon(dispatcher_child(arguments), arguments.dispatcher_loop)
    else:
        for line in asyncio.run(main(arguments)):
            print(orjson.dumps(line).decode(), flush=True)
