"""Crashes: the dispatcher killed with SIGKILL at random moments, and every promise checked after.

    python benchmarks/chaos.py                          # 500 requests, 10 kills, scratch PostgreSQL
    python benchmarks/chaos.py --requests 60 --kills 3  # the test suite's run
    python benchmarks/chaos.py --db sqlite              # the embedded store instead

Three fake Ganetis run in processes of their own (plain HTTP, job queues on disk, 3, 4 and
6 nodes, 0.15 s per create holding the node's lock), so they outlive every dispatcher. A
burst of ``--requests`` durable requests is written through ``ControlPlane.request_instance``;
then ``synnefo-ganeti dispatcher --config FILE`` is started, and killed with SIGKILL
``--kills`` times, each after a random 0.3-2.5 s of work, and started again at once. The last
one runs until every request has ended, then stops with SIGTERM.

Afterwards, from the fakes' own state (read through RAPI) and the database:

* ``lost``: requests that did not end ``succeeded`` with their instance in a fake;
* ``duplicates``: instances created twice (the same name in two fakes, or two successful
  creates carrying one request id), plus creates sent twice (two create jobs, of any
  status, carrying one request id: a resubmit that Ganeti would refuse with "already
  exists" still breaks the promise);
* ``db_equals_ganeti``: after one reconcile pass (``synnefo-ganeti reconcile --fix-all``),
  the instances the database holds (not DESTROYED) and their states are exactly what the
  fakes hold, and a second pass finds no drift;
* ``missing_final_states``: jobs that ended in a fake whose final status the database
  does not hold (the watchers must have stored every one, restarts notwithstanding).

One JSON object on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from _databases import database

BACKENDS = (("a", 3), ("b", 4), ("c", 6))  # name, nodes
CREATE_SECONDS = 0.15
REASON_PREFIX = "synnefo-ganeti:"
QUIET = False


def progress(message: str) -> None:
    if not QUIET:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


async def start_fake(
    name: str, nodes: int, folder: Path
) -> tuple[asyncio.subprocess.Process, dict[str, Any]]:
    queue = folder / f"queue-{name}"
    queue.mkdir()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "synnefo_ganeti", "fake-ganeti", "--port", "0", "--no-tls", "--json",
        "--nodes", str(nodes), "--queue-dir", str(queue), "--op-time", f"OP_INSTANCE_CREATE={CREATE_SECONDS}",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    assert process.stdout is not None
    text = b""
    while True:  # the JSON object may span lines
        line = await asyncio.wait_for(process.stdout.readline(), 60)
        if not line:
            raise SystemExit(f"fake {name} did not start (exit {await process.wait()})")
        text += line
        try:
            world = json.loads(text)
            break
        except json.JSONDecodeError:
            continue
    return process, world


def write_config(path: Path, db_url: str, worlds: dict[str, dict[str, Any]], folder: Path) -> None:
    lines = ["[database]", f"url = {json.dumps(db_url)}", ""]
    for name, world in worlds.items():
        password_file = folder / f"{name}.password"
        password_file.write_text(world["password"] + "\n")
        password_file.chmod(0o600)
        lines += [
            "[[backends]]",
            f"name = {json.dumps(name)}",
            f"url = {json.dumps(world['url'])}",
            f"username = {json.dumps(world['username'])}",
            f"password_file = {json.dumps(str(password_file))}",
            f"queue_dir = {json.dumps(world['queue_dir'])}",
            "",
        ]
    lines += [
        "[dispatcher]",
        "status_port = 0",  # any free port: a restarted dispatcher must not wait for the old one's
        "poll_interval = 0.1",
        "health_interval = 2",
        "stats_interval = 2",
        "",
        "[reconcile]",
        "interval = 3600",  # the run's own reconcile pass comes at the end
    ]
    path.write_text("\n".join(lines) + "\n")


async def dispatcher(config: Path, log: Path) -> asyncio.subprocess.Process:
    handle = log.open("ab")
    try:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "synnefo_ganeti", "--log-format", "json", "--log-level", "info", "dispatcher",
            "--config", str(config), stdout=handle, stderr=handle,
        )  # fmt: skip
    finally:
        handle.close()


async def open_requests(db_url: str) -> int:
    from synnefo_ganeti.store import RequestStatus, Store

    async with Store(db_url) as store:
        counts = await store.request_counts(status=[RequestStatus.PENDING, RequestStatus.SUBMITTED])
    return sum(counts.values())


async def ganeti_state(worlds: dict[str, dict[str, Any]]) -> dict[str, Any]:
    from synnefo_ganeti.rapi import RapiClient

    out: dict[str, Any] = {}
    for name, world in worlds.items():
        async with RapiClient(world["url"], username=world["username"], password=world["password"]) as client:
            instances, jobs = await asyncio.gather(client.list_instances(), client.list_jobs())
        out[name] = {"instances": instances, "jobs": jobs}
    return out


async def run_cli(*argv: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "synnefo_ganeti", *argv,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def main(args: argparse.Namespace) -> dict[str, Any]:
    from synnefo_ganeti import ControlPlane, InstanceSpec
    from synnefo_ganeti.config import Settings
    from synnefo_ganeti.jobs import JobStatus
    from synnefo_ganeti.store import InstanceStatus, RequestStatus, Store

    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="sg-chaos-") as scratch:
        folder = Path(scratch)
        fakes: list[asyncio.subprocess.Process] = []
        try:
            worlds = {}
            for name, nodes in BACKENDS:
                process, world = await start_fake(name, nodes, folder)
                fakes.append(process)
                worlds[name] = world
            async with database(args.db, scratch) as db_url:
                config = folder / "config.toml"
                write_config(config, db_url, worlds, folder)
                settings = Settings.from_file(config)
                names = [f"chaos-{index:05d}" for index in range(args.requests)]
                async with ControlPlane(settings) as cp:
                    ids = [
                        await cp.request_instance(
                            InstanceSpec(
                                name=name, disk_template="diskless", os="noop", beparams={"memory": 128}
                            )
                        )
                        for name in names
                    ]
                progress(f"{args.requests} durable requests written; dispatching with {args.kills} kills")
                log = folder / "dispatcher.log"
                started = time.perf_counter()
                kills = 0
                process = await dispatcher(config, log)
                while kills < args.kills:
                    await asyncio.sleep(rng.uniform(0.3, 2.5))
                    if process.returncode is not None:
                        raise SystemExit(f"the dispatcher exited by itself ({process.returncode}); see {log}")
                    process.send_signal(signal.SIGKILL)
                    await process.wait()
                    kills += 1
                    left = await open_requests(db_url)
                    progress(f"kill {kills}: SIGKILL with {left} requests open; starting it again")
                    process = await dispatcher(config, log)
                deadline = time.monotonic() + args.timeout
                left = await open_requests(db_url)
                while left and time.monotonic() < deadline:
                    # another process writes: nothing here to wait on but the clock
                    await asyncio.sleep(0.2)
                    left = await open_requests(db_url)
                wall = time.perf_counter() - started
                process.send_signal(signal.SIGTERM)
                code = await process.wait()
                progress(f"all ended after {wall:.1f} s ({left} open); the last dispatcher exited {code}")

                # the promises, from the fakes' own state
                state = await ganeti_state(worlds)
                instances_of: Counter[str] = Counter()
                creates_of: Counter[str] = Counter()
                successes_of: Counter[str] = Counter()
                final_jobs: dict[tuple[str, int], str] = {}
                for name, held in state.items():
                    instances_of.update(instance.name for instance in held["instances"])
                    for job in held["jobs"]:
                        if job.status.is_final:
                            final_jobs[(name, job.id)] = job.status.value
                        if not any(summary.startswith("INSTANCE_CREATE") for summary in job.summary):
                            continue
                        rids = [text.removeprefix(REASON_PREFIX) for text in job.request_ids]
                        creates_of.update(rids)
                        if job.status is JobStatus.SUCCESS:
                            successes_of.update(rids)
                async with Store(db_url) as store:
                    requests = [await store.get_request(request_id) for request_id in ids]
                    statuses = Counter(r.status.value if r else "missing" for r in requests)
                    lost = sum(
                        1
                        for request, name in zip(requests, names, strict=True)
                        if request is None
                        or request.status is not RequestStatus.SUCCEEDED
                        or instances_of[name] == 0
                    )
                    created_twice = sum(n - 1 for n in instances_of.values() if n > 1) + sum(
                        n - 1 for n in successes_of.values() if n > 1
                    )
                    sent_twice = sum(n - 1 for n in creates_of.values() if n > 1)
                    stored = {
                        (job.backend, job.job_id): job.status.value
                        for backend in worlds
                        for job in await store.list_jobs(backend=backend, limit=None)
                    }
                missing = sum(1 for key, status in final_jobs.items() if stored.get(key) != status)

                code, out, _ = await run_cli("reconcile", "--config", str(config), "--fix-all", "--json")
                first = json.loads(out) if out.strip() else {}
                code2, out2, _ = await run_cli("reconcile", "--config", str(config), "--json")
                second = json.loads(out2) if out2.strip() else {}
                drifts_after = sum(len(b["drifts"]) for b in second.get("backends", [])) if second else None
                async with Store(db_url) as store:
                    db_view = {
                        (i.backend, i.name): i.status.value
                        for i in await store.list_instances()
                        if i.status is not InstanceStatus.DESTROYED
                    }
                ganeti_view = {
                    (name, instance.name): "STARTED" if instance.oper_state else "STOPPED"
                    for name, held in state.items()
                    for instance in held["instances"]
                }
                db_equals = code2 == 0 and drifts_after == 0 and db_view == ganeti_view
                log_lines = log.read_text(errors="replace").splitlines()
                recovered = sum("found as job" in line or "with its tag" in line for line in log_lines)
                resubmitted = sum("Ganeti has no job or instance of it" in line for line in log_lines)
                return {
                    "requests": args.requests,
                    "kills": kills,
                    "lost": lost,
                    "duplicates": created_twice + sent_twice,
                    "db_equals_ganeti": db_equals,
                    "missing_final_states": missing,
                    "request_statuses": dict(statuses),
                    "instances_in_ganeti": sum(instances_of.values()),
                    "created_twice": created_twice,
                    "sent_twice": sent_twice,
                    "recovered_after_kill": recovered,
                    "resent_after_kill": resubmitted,
                    "drifts_first_pass": sum(len(b["drifts"]) for b in first.get("backends", []))
                    if first
                    else None,
                    "drifts_second_pass": drifts_after,
                    "wall_s": round(wall, 2),
                    "db": "postgresql" if db_url.startswith("postgresql") else "sqlite",
                    "seed": args.seed,
                }
        finally:
            for process in fakes:
                if process.returncode is None:
                    process.send_signal(signal.SIGTERM)
            for process in fakes:
                try:
                    await asyncio.wait_for(process.wait(), 10)
                except TimeoutError:
                    process.kill()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument(
        "--db", default="postgresql", help="postgresql (a scratch database), sqlite, or a URL"
    )
    parser.add_argument("--seed", type=int, default=None, help="for the kill moments (default: random)")
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds for the last dispatcher to finish"
    )
    parser.add_argument("--json-only", action="store_true", help="no progress on stderr")
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = random.randrange(1_000_000)
    return args


if __name__ == "__main__":
    os.environ.setdefault("SYNNEFO_GANETI_LOG_LEVEL", "error")
    arguments = parse_args()
    QUIET = arguments.json_only
    print(json.dumps(asyncio.run(main(arguments))))
