"""One reconcile cycle over many fake backends: wall time, database statements, drifts found.

    python benchmarks/reconcile.py                  # 10 backends x 1,000 instances, 1 s per answer
    python benchmarks/reconcile.py --backends 50 --instances 2000   # 100,000 instances
    python benchmarks/reconcile.py --backends 3 --instances 50 --latency 0.05 --drift 0.2

Per backend, a fake Ganeti (plain HTTP, in a process of its own) holds ``--instances`` owned
instances, built as its engine builds a created one, and the database holds the rows the
facade records for them with what Ganeti made of them (as the dispatcher's observer records
it when a create ends: a pass in the steady state; ``--unobserved``: without, the first pass
after an upgrade, which writes every row), one bulk insert per backend. Every RAPI answer takes
``--latency`` seconds (counted from the connection's accept, the fake's own work
included), so each backend's two bulk GETs take that long. Then ``--drift`` of the
instances (1%: 10 per backend) are made to differ, spread evenly over the nine drift
kinds, and one report-only ``Reconciler.run_once()`` checks every backend at once.

Drift kinds injected (the reconciler needs no ``GET /2/jobs/ID`` for any of them; the
jobs they use are in ``/2/jobs?bulk=1``):

* stale: the instance removed from the fake; orphan: an owned instance only in the fake;
* operstate: the fake's instance stopped, the row STARTED; flavor: the fake's maxmem
  changed; nics: the fake's NIC link changed, or a second NIC; disks: a disk size
  changed; tags: a tag of our namespace added in the fake;
* building: a BUILD row whose create job failed in the fake (a create with a disk
  template the cluster does not enable), or a BUILD row with no create job, an hour old,
  that the fake does not have;
* job: a reboot job that ended in the fake, the database holding its queued version.

Figures (one JSON object on stdout, progress on stderr): ``cycle_s`` the wall time of
``run_once()``; ``serial_estimate_s`` the sum of every backend's own duration (the same
work one backend after another, overstated: each duration holds its waits for the others);
``db_queries`` the SQL statements run during the cycle (``BEGIN`` included); ``gc_s`` the
garbage collector's share of ``cycle_s``; ``cycle_cpu_s`` this process's CPU time during the
cycle (its threads included: against ``cycle_s``, what it waited for); ``bytes_per_instance``
the bytes of RAPI answers read in the cycle per instance, ``bytes_per_instance_bulk`` the same
for the two bulk listings the reconciler read before (``GET /2/instances?bulk=1`` and
``/2/jobs?bulk=1``, read after the cycle from the same fakes); ``peak_rss_mb`` this process's
peak resident memory (``getrusage``) right after the cycle, its setup included;
``settled`` the instances found as their rows expect by comparing Ganeti's cells whole
(the pass's fast path, ``reconcile/_pass.py``); ``drifts_expected`` those injected, ``drifts_found`` those of the report matching one
(kind, backend, instance), ``drifts_unexpected`` the others. The same cycle is run again
on ``--backends`` x ``--instances``/10 (``db_queries_small``) and on 2 x ``--instances``
(``db_queries_2_backends``): the statements grow with backends, not with instances; above
20,000 instances those two are not run (null).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import os
import random
import resource
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from typing import Any

import orjson

from _children import stop_children
from _counters import ByteCounter, GcTimer, QueryCounter
from _databases import database  # benchmarks/, the script's folder

KINDS = ("stale", "orphan", "operstate", "flavor", "nics", "disks", "tags", "building", "job")
LINK = "gntbr0"
MEMORY = 512
DISK = 5120
NODES = 10


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- one backend's fake Ganeti, in its own process ----------------------------------------------------


def spec_for(name: str) -> Any:
    from synnefo_ganeti.rapi import InstanceSpec

    return InstanceSpec(
        name=name,
        disk_template="file",
        os="noop",
        disks=[{"size": DISK}],
        nics=[{"mode": "bridged", "link": LINK}],
        beparams={"memory": MEMORY, "vcpus": 1},
    )


def fake_instance(spec: Any, tags: list[str], pnode: str) -> Any:
    """The instance the fake engine makes of a create of ``spec`` that ran (see ``_op_instance_create``)."""
    from synnefo_ganeti.testing._cluster import FakeInstance, new_mac
    from synnefo_ganeti.testing._engine import _BEPARAMS_DEFAULTS

    beparams = dict(spec.beparams)
    memory = beparams.pop("memory", None)
    if memory is not None:
        beparams.setdefault("maxmem", memory)
        beparams.setdefault("minmem", memory)
    full = _BEPARAMS_DEFAULTS | beparams
    full["memory"] = full["maxmem"]
    return FakeInstance(
        name=spec.name, pnode=pnode, os=spec.os, disk_template=spec.disk_template, hypervisor="fake",
        beparams=full, custom_beparams=dict(beparams),
        nics=[{"mac": new_mac(), "uuid": str(uuid.uuid4()), "mode": nic.get("mode", "bridged"),
               "link": nic.get("link", LINK), "ip": nic.get("ip"), "name": nic.get("name"),
               "network": nic.get("network")} for nic in spec.nics],
        disks=[{"size": int(d["size"]), "uuid": str(uuid.uuid4()), "name": d.get("name")} for d in spec.disks],
        tags=list(tags), admin_state="up", oper_state=True,
    )  # fmt: skip


def row_for(
    spec: Any, tags: list[str], status: str, now: float, observed: dict[str, Any] | None
) -> dict[str, Any]:
    """The row the facade records at create, its create job's success applied (times as epoch),
    and with ``observed`` what Ganeti made (the dispatcher's observer records it when the
    create ends, and every reconcile pass after; ``--unobserved``: not yet)."""
    from synnefo_ganeti.reconcile._observe import expectation

    return {
        "name": spec.name,
        "status": status,
        "owned": True,
        **expectation(spec, tags),
        "create_job_id": None,
        "state_time": None,
        "created_at": now,
        "updated_at": now,
        **(observed or {}),
    }


def observed_of(fake_instance: Any, link: str) -> dict[str, Any]:
    """What the reconciler records of the fake's instance (from its ``GET /2/instances`` view)."""
    from synnefo_ganeti.rapi import Instance
    from synnefo_ganeti.reconcile._observe import observed_values
    from synnefo_ganeti.testing._cluster import instance_view

    return observed_values(Instance.model_validate(instance_view(fake_instance, link)))


async def populate(fake: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Fill the fake and make the rows, then make ``--drifts`` instances differ (kinds from ``--first-drift``).

    Returns what the benchmark needs: the rows to insert, the queued job versions to
    store, and the drifts made as (kind, backend, instance).
    """
    from synnefo_ganeti.config import DEFAULT_OWNERSHIP_TAG

    name = backend_name(args.index)
    rng = random.Random(args.seed * 1000 + args.index)
    cluster = fake.cluster
    nodes = sorted(cluster.nodes)
    tags = [DEFAULT_OWNERSHIP_TAG]
    now = time.time()
    names = [f"snf-{args.index:02d}-{i:05d}.bench.test" for i in range(args.instances)]
    specs = {}
    for i, instance in enumerate(names):
        spec = specs[instance] = spec_for(instance)
        cluster.instances[instance] = fake_instance(spec, tags, nodes[i % len(nodes)])
    rows = {
        instance: row_for(
            specs[instance], tags, "STARTED", now,
            None if args.unobserved else observed_of(cluster.instances[instance], cluster.link),
        )
        for instance in names
    }  # fmt: skip

    expected: list[tuple[str, str, str]] = []
    queued: list[Any] = []
    jobs: list[int] = []
    for offset, instance in enumerate(rng.sample(names, min(args.drifts, len(names)))):
        kind = KINDS[(args.first_drift + offset) % len(KINDS)]
        inst = cluster.instances[instance]
        if kind == "stale":
            del cluster.instances[instance]
        elif kind == "orphan":
            del rows[instance]
        elif kind == "operstate":
            inst.admin_state, inst.oper_state = "down", False
        elif kind == "flavor":
            inst.beparams["maxmem"] = inst.beparams["memory"] = MEMORY * 2
        elif kind == "nics":
            if offset % 2:
                inst.nics[0]["link"] = "gntbr1"
            else:
                inst.nics.append(
                    dict(
                        inst.nics[0], mac=f"aa:01:00:{args.index:02x}:{offset // 256:02x}:{offset % 256:02x}"
                    )
                )
        elif kind == "disks":
            inst.disks[0]["size"] = DISK * 2
        elif kind == "tags":
            inst.tags.append("synnefo-ganeti:added-by-hand")  # ours (operator tags are not compared)
        elif kind == "building":
            del cluster.instances[instance]
            row = rows[instance]
            row.update(status="BUILD", memory=None, vcpus=None, pnode=None)
            if offset % 2:  # no create job recorded, not in Ganeti, past the grace
                row["updated_at"] = row["created_at"] = now - 3600
            else:  # a create that failed: "plain" is not an enabled disk template
                body = spec_for(instance).model_copy(update={"disk_template": "plain", "tags": tags})
                params = {("instance_name" if k == "name" else k): v for k, v in body.to_rapi_body().items()}
                params.pop("__version__")
                job_id = cluster.submit([("OP_INSTANCE_CREATE", params)], resource="instances")
                row["disk_template"] = "plain"
                row["create_job_id"] = job_id
                jobs.append(job_id)
        elif kind == "job":  # the database holds its first (queued) version
            job_id = cluster.submit(
                [("OP_INSTANCE_REBOOT", {"instance_name": instance})], resource="instances_name"
            )
            queued.append(cluster.jobs[job_id].luxid_file())
            jobs.append(job_id)
        expected.append((kind, name, instance))
    # the jobs end before the cycle (a job ending after the database snapshot is left alone)
    for job_id in jobs:
        job = cluster.jobs[job_id]
        while not job.status.is_final:
            await job.changed.wait()  # set on each change of the job
    return {"rows": list(rows.values()), "queued": queued, "expected": expected}


async def fake_child(args: argparse.Namespace) -> None:
    """``--fake-child``: one populated fake Ganeti; prints its JSON, serves until stdin closes."""
    from synnefo_ganeti.testing import FakeGaneti

    fake = FakeGaneti(
        tls=False, nodes=NODES, node_memory=256 * 1024, node_disk=16 * 1024 * 1024,
        op_times={"OP_INSTANCE_REBOOT": 0.01},
    )  # fmt: skip
    async with fake:
        world = await populate(fake, args)
        fake.latency = args.latency
        world |= {"url": fake.url, "username": fake.username, "password": fake.password}
        sys.stdout.buffer.write(orjson.dumps(world) + b"\n")
        sys.stdout.flush()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, sys.stdin.buffer.read)


def backend_name(index: int) -> str:
    return f"b{index:02d}"


class Fakes:
    """The child processes of one configuration (one per fake backend), started at once."""

    def __init__(self, backends: int, instances: int, drifts: int, args: argparse.Namespace) -> None:
        self.backends, self.instances, self.drifts, self.args = backends, instances, drifts, args
        self.processes: list[asyncio.subprocess.Process] = []
        self.lines: list[bytes] = []

    async def start(self) -> None:
        for index in range(self.backends):
            process = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--fake-child", "--index", str(index),
                "--instances", str(self.instances), "--drifts", str(self.drifts),
                "--first-drift", str(index * self.drifts), "--latency", str(self.args.latency),
                "--seed", str(self.args.seed), *(["--unobserved"] if self.args.unobserved else []),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=256 * 1024 * 1024,
            )  # fmt: skip
            self.processes.append(process)

    async def ready(self) -> None:
        """Wait until every child has printed its world (then it only waits for requests)."""
        for index, process in enumerate(self.processes):
            assert process.stdout is not None
            line = await asyncio.wait_for(process.stdout.readline(), 900)
            if not line:
                raise SystemExit(f"fake backend {index} did not start (exit {await process.wait()})")
            self.lines.append(line)  # bytes: no burden to the garbage collector

    def worlds(self) -> Iterator[dict[str, Any]]:
        """What each child printed, in order (each parsed when asked for, then forgotten)."""
        while self.lines:
            index = self.backends - len(self.lines)
            yield orjson.loads(self.lines.pop(0)) | {"name": backend_name(index)}

    async def stop(self) -> None:
        await stop_children(self.processes)


def insert_rows(conn: Any, rows: list[dict[str, Any]]) -> None:
    """One backend's rows in one statement (in the store's writer transaction)."""
    from sqlalchemy import insert

    from synnefo_ganeti.store.instances._instances import instances_t

    conn.execute(insert(instances_t), rows)


# -- one configuration --------------------------------------------------------------------------------


async def run_config(fakes: Fakes, args: argparse.Namespace, folder: str) -> dict[str, Any]:
    from synnefo_ganeti.config import Settings
    from synnefo_ganeti.jobs import parse_job_file
    from synnefo_ganeti.reconcile import Reconciler
    from synnefo_ganeti.store import Store

    backends, instances = fakes.backends, fakes.instances
    progress(f"{backends} backends x {instances} instances, {fakes.drifts} drifts each: setting up")
    expected: set[tuple[str, str, str]] = set()
    backend_settings = []
    async with AsyncExitStack() as stack:
        stack.push_async_callback(fakes.stop)
        url = await stack.enter_async_context(database(args.db, folder))
        store = await stack.enter_async_context(Store(url))
        for world in fakes.worlds():
            name = world["name"]
            backend_id = await store.ensure_backend(name)
            rows = [
                row | {
                    "backend_id": backend_id,
                    "created_at": datetime.fromtimestamp(row["created_at"], UTC),
                    "updated_at": datetime.fromtimestamp(row["updated_at"], UTC),
                }
                for row in world["rows"]
            ]  # fmt: skip
            await store.call(functools.partial(insert_rows, rows=rows))
            for job in world["queued"]:
                await store.record(name, parse_job_file(orjson.dumps(job)))
            expected.update((kind, backend, instance) for kind, backend, instance in world["expected"])
            backend_settings.append(
                {
                    "name": name,
                    "url": world["url"],
                    "username": world["username"],
                    "password": world["password"],
                }
            )
            del world, rows  # only what the cycle needs stays: the benchmark's own heap is no burden to it

        settings = Settings(
            database={"url": url},
            backends=backend_settings,
            reconcile={"timeout": max(60.0, args.latency * 10)},
        )
        clients = {}
        for backend in settings.backends:
            client = backend.rapi_client(timeout=settings.reconcile_timeout(backend))
            clients[backend.name] = await stack.enter_async_context(client)
        reconciler = await stack.enter_async_context(Reconciler(settings, store=store, clients=clients))
        counter = QueryCounter()
        stack.callback(counter.close)

        gc_timer = GcTimer()
        stack.callback(gc_timer.close)
        read = ByteCounter()
        stack.callback(read.close)

        progress("running one reconcile cycle")
        gc.collect()  # the setup's garbage is not the cycle's
        counter.counting = gc_timer.timing = read.counting = True
        started, cpu_started = time.perf_counter(), time.process_time()
        report = await reconciler.run_once()
        cycle, cycle_cpu = time.perf_counter() - started, time.process_time() - cpu_started
        counter.counting = gc_timer.timing = read.counting = False
        peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        cycle_bytes, read.count = read.count, 0

        # what the same cycle read before (issue 15): every backend's two bulk listings
        progress("reading the bulk listings, for bytes_per_instance_bulk")
        read.counting = True
        await asyncio.gather(
            *(c.list_instances() for c in clients.values()), *(c.list_jobs() for c in clients.values())
        )
        read.counting = False

        found = {(d.kind.value, d.backend, d.instance or "") for d in report.drifts}
        failed = [b.error for b in report.backends if not b.ok]
        for error in failed:
            progress(f"backend failed: {error}")
        for missing in sorted(expected - found):
            progress(f"drift not found: {missing}")
        result = {
            "backends": backends,
            "instances": backends * instances,
            "cycle_s": round(cycle, 3),
            "cycle_cpu_s": round(cycle_cpu, 3),
            "serial_estimate_s": round(sum(b.duration for b in report.backends), 3),
            "db_queries": counter.count,
            "settled": sum(b.settled for b in report.backends),
            "drifts_found": len(found & expected),
            "drifts_expected": len(expected),
            "drifts_unexpected": len(report.drifts) - len(found & expected),
            "backends_failed": len(failed),
            "gc_s": round(gc_timer.seconds, 3),
            "bytes_per_instance": round(cycle_bytes / (backends * instances), 1),
            "bytes_per_instance_bulk": round(read.count / (backends * instances), 1),
            "peak_rss_mb": round(peak_rss_mb, 1),
        }
        progress(f"done: {orjson.dumps(result).decode()}")
        return result


#: above this many instances the two statement-count configurations are not run (null): at
#: 50 x 2,000 they would start 52 more fake processes, too many for a 2-CPU machine to start
#: in 15 minutes, and the statement counts are the small run's business
EXTRA_UP_TO = 20_000


async def main(args: argparse.Namespace) -> dict[str, Any]:
    small_instances = max(1, args.instances // 10)
    shapes = [(args.backends, args.instances)]  # the figures
    extra = args.backends * args.instances <= EXTRA_UP_TO
    if extra:
        shapes += [
            (args.backends, small_instances),  # db_queries_small: a tenth of the instances
            (min(2, args.backends), args.instances),  # db_queries_2_backends
        ]
    # every configuration's fakes start at once (their start is mostly imports), and wait idle
    configs = [
        Fakes(backends, instances, round(instances * args.drift), args) for backends, instances in shapes
    ]
    try:
        for fakes in configs:
            await fakes.start()
        for fakes in configs:  # all idle before any cycle: none takes a core from another's cycle
            await fakes.ready()
        with tempfile.TemporaryDirectory(prefix="sg-bench-reconcile-") as folder:
            figures, *others = [await run_config(fakes, args, folder) for fakes in configs]
    finally:
        for fakes in configs:
            await fakes.stop()
    db = args.db if args.db in ("sqlite", "postgresql") else "url"
    return figures | {
        "db": db,
        "latency_s": args.latency,
        "instances_small": args.backends * small_instances,
        "db_queries_small": others[0]["db_queries"] if extra else None,
        "db_queries_2_backends": others[1]["db_queries"] if extra else None,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", type=int, default=10, help="fake backends (default 10)")
    parser.add_argument("--instances", type=int, default=1000, help="instances per backend (default 1,000)")
    parser.add_argument("--latency", type=float, default=1.0, help="seconds per RAPI answer (default 1.0)")
    parser.add_argument("--drift", type=float, default=0.01, help="share of instances made to differ (0.01)")
    parser.add_argument(
        "--db", default="sqlite", help="sqlite (default), postgresql (a scratch database), or a database URL"
    )
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    parser.add_argument(
        "--unobserved", action="store_true",
        help="rows without what Ganeti made (the first pass after an upgrade: every row is written)",
    )  # fmt: skip
    parser.add_argument("--fake-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--drifts", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--first-drift", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.backends < 1 or args.instances < 1:
        parser.error("--backends and --instances must be >= 1")
    if not 0 <= args.drift <= 1:
        parser.error("--drift is a share, between 0 and 1")
    return args


if __name__ == "__main__":
    os.environ.setdefault("SYNNEFO_GANETI_LOG_LEVEL", "error")
    arguments = parse_args()
    if arguments.fake_child:
        asyncio.run(fake_child(arguments))
    else:
        print(orjson.dumps(asyncio.run(main(arguments))).decode())
