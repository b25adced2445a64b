"""Queue-watcher throughput and rename-to-commit latency, against a separate writer process.

    python benchmarks/watch.py                      # 20,000 versions, every db x fs
    python benchmarks/watch.py --versions 400 --paced-versions 100 --db sqlite --fs tmpfs

For each database (SQLite, PostgreSQL) and each file system (tmpfs under /dev/shm, and
a disk), one watcher process (this one: a :class:`QueueWatcher` and its :class:`Store`)
follows a fresh queue directory, and a writer process (this file again, with
``--writer-child``) writes job-file versions into it exactly as Ganeti does: every
version a temp file (luxid's ``job-<id>-<pid>-<n>.tmp``, compact JSON; the job
executor's ``job-<id><8 chars>.new``, ``", "`` separators and a newline) renamed over
``job-<id>``, the ``serial`` file rewritten before each new job. The versions are the
10 real versions of an instance-create job (tests/fixtures/ganeti-3.0-queue/
lifecycle-job-20) with the job id, instance name and livelock replaced and every
timestamp shifted per job; 20 jobs are in flight at once, each step writing the next
version of one of them at random, a finished job replaced by a new one.

Phase 1, throughput: ``--versions`` versions as fast as the writer can. Phase 2,
latency: ``--paced-versions`` more (new jobs, same queue and database) at the paced
rate (tmpfs 1,000/s, disk 500/s, or ``--paced-rate``); the writer notes the time of
each rename.

Prints one JSON object per combination (see docs/benchmarks.md for every figure).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import string
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import orjson

from _databases import database  # benchmarks/, the script's folder

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "ganeti-3.0-queue" / "lifecycle-job-20"
FIXTURE_JOB_ID = 20
FIXTURE_INSTANCE = "inst5.ganeti.test"
IN_FLIGHT = 20  # jobs being written at once (Ganeti's default --max-running-jobs)
BACKEND = "bench"
PACED_RATE = {"tmpfs": 1000.0, "disk": 500.0}
_TIME_KEYS = ("received_timestamp", "start_timestamp", "end_timestamp", "exec_timestamp")
_RANDOM = string.ascii_lowercase + string.digits


# -- the versions: real fixture files made into many jobs --------------------------------------------


@cache
def _fixture() -> list[tuple[dict[str, Any], bool]]:
    """The fixture's versions in order, each with whether luxid wrote it (compact JSON)."""
    versions = []
    for path in sorted(FIXTURE.glob("*.json")):
        data = path.read_bytes()
        versions.append((json.loads(data), not data.startswith(b'{"id": ')))
    return versions


def _shift(value: Any, shift_us: int) -> Any:
    if value is None:
        return None
    seconds, micros = divmod(value[0] * 1_000_000 + value[1] + shift_us, 1_000_000)
    return [seconds, micros]


def _rewrite(raw: dict[str, Any], job_id: int, shift_us: int) -> dict[str, Any]:
    """One fixture version as version of job ``job_id``, its times moved by ``shift_us``."""
    job = json.loads(json.dumps(raw))
    job["id"] = job_id
    for key in _TIME_KEYS:
        if key in job:
            job[key] = _shift(job[key], shift_us)
    for op in job["ops"]:
        for key in _TIME_KEYS:
            if key in op:
                op[key] = _shift(op[key], shift_us)
        for entry in op.get("log") or []:
            entry[1] = _shift(entry[1], shift_us)
        op_input = op["input"]
        op_input["reason"] = [
            [source, text.replace(f"job={FIXTURE_JOB_ID};", f"job={job_id};"), stamp + shift_us * 1000]
            for source, text, stamp in op_input.get("reason") or []
        ]
    if "livelock" in job:
        folder, _, name = job["livelock"].rpartition("/")
        kind, _, stamp = name.rpartition("_")
        if kind.startswith("job_"):
            kind = f"job_{job_id:06d}"
        job["livelock"] = f"{folder}/{kind}_{int(stamp) + shift_us // 1_000_000}"
    return job


def job_versions(job_id: int, shift_us: int, fixture: list[tuple[dict[str, Any], bool]]) -> list[bytes]:
    """The bytes of every version of one job, as Ganeti writes them."""
    out = []
    for raw, luxid in fixture:
        job = _rewrite(raw, job_id, shift_us)
        text = json.dumps(job, separators=(",", ":")) if luxid else json.dumps(job) + "\n"
        out.append(text.replace(FIXTURE_INSTANCE, f"bench-{job_id}.ganeti.test").encode())
    return out


@dataclass(frozen=True)
class Plan:
    """What one phase writes: jobs ``first_job_id``.., ``versions`` versions in all."""

    first_job_id: int
    versions: int
    base_time: float
    seed: int

    @property
    def jobs(self) -> int:
        return -(-self.versions // len(_fixture_names()))

    def shift_us(self, ordinal: int) -> int:
        received = _fixture()[0][0]["received_timestamp"]
        # each job received 1 ms after the one before, the first at base_time
        return int(self.base_time * 1_000_000) - (received[0] * 1_000_000 + received[1]) + ordinal * 1000

    def contents(self) -> dict[int, list[bytes]]:
        fixture = _fixture()
        return {
            self.first_job_id + ordinal: job_versions(
                self.first_job_id + ordinal, self.shift_us(ordinal), fixture
            )
            for ordinal in range(self.jobs)
        }

    def schedule(self) -> list[tuple[int, int]]:
        """(job id, version index) in write order: IN_FLIGHT jobs at once, one step at random."""
        per_job = len(_fixture_names())
        rng = random.Random(self.seed)
        next_job = self.first_job_id
        active: list[int] = []
        written: dict[int, int] = {}
        order: list[tuple[int, int]] = []
        while len(order) < self.versions:
            while len(active) < IN_FLIGHT and next_job < self.first_job_id + self.jobs:
                active.append(next_job)
                written[next_job] = 0
                next_job += 1
            slot = rng.randrange(len(active))
            job_id = active[slot]
            order.append((job_id, written[job_id]))
            written[job_id] += 1
            if written[job_id] == per_job:
                active[slot] = active[-1]
                active.pop()
        return order


@cache
def _fixture_names() -> list[str]:
    return sorted(path.name for path in FIXTURE.glob("*.json"))


# -- the writer process ----------------------------------------------------------------------------


def writer_child(config: dict[str, Any]) -> dict[str, Any]:
    """Write one plan into the queue directory; the times of its first and last rename (and of each)."""
    plan = Plan(config["first_job_id"], config["versions"], config["base_time"], config["seed"])
    queue = config["queue"]
    rate = config["rate"]
    contents = plan.contents()
    order = plan.schedule()
    luxid = [not data.startswith(b'{"id": ') for data in next(iter(contents.values()))]
    pid = os.getpid()
    counter = 0
    renaming: list[float] = []  # just before each rename of a job file
    renamed: list[float] = []  # just after it
    rng = random.Random(plan.seed + 1)

    def atomic(name: str, data: bytes, by_luxid: bool) -> float:
        nonlocal counter
        if by_luxid:
            counter += 1
            temp = f"{queue}/{name}-{pid}-{counter}.tmp"
        else:
            temp = f"{queue}/{name}{''.join(rng.choices(_RANDOM, k=8))}.new"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        before = time.time()
        os.rename(temp, f"{queue}/{name}")
        return before

    start = time.time()
    for number, (job_id, index) in enumerate(order):
        if rate:
            delay = start + number / rate - time.time()
            if delay > 0:
                time.sleep(delay)
        if index == 0:
            atomic("serial", f"{job_id}\n".encode(), True)
        renaming.append(atomic(f"job-{job_id}", contents[job_id][index], luxid[index]))
        renamed.append(time.time())
    end = renamed[-1]
    if not config["record"]:
        return {"start": start, "end": end}
    return {"start": start, "end": end, "renaming": renaming, "renamed": renamed}


# -- the watcher side ------------------------------------------------------------------------------


def fs_type(path: str) -> str:
    """The type of the file system holding ``path`` (from /proc/self/mounts)."""
    path = os.path.realpath(path)
    best, kind = "", "unknown"
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            point = fields[1].replace("\\040", " ")
            if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
                best, kind = point, fields[2]
    return kind


def default_disk_dir() -> str | None:
    for candidate in ("/var/tmp", tempfile.gettempdir(), str(ROOT)):
        usable = os.path.isdir(candidate) and os.access(candidate, os.W_OK)
        if usable and fs_type(candidate) not in ("tmpfs", "ramfs", "devtmpfs"):
            return candidate
    return None


def fingerprint(job: Any) -> tuple[tuple[str, ...], int]:
    """Tells the versions of one job apart as far as the store can (its ops' statuses, last log serial)."""
    return tuple(op.status.value for op in job.ops), job.last_serial


@dataclass
class Recorder:
    """What the watcher handed to the store, and when each writer transaction committed.

    Only small tuples are kept: holding on to every version read would grow the heap
    by millions of objects and make the garbage collector's full passes (and so the
    latencies measured) the benchmark's own doing.
    """

    puts: list[tuple[int, float, Any]] = field(default_factory=list)  # job id, read at, fingerprint
    commits: list[tuple[int, float, float]] = field(default_factory=list)  # versions, time, cpu

    def on_commit(self, info: Any) -> None:
        self.commits.append((info.versions, info.committed_at, time.process_time()))

    def commit_times(self) -> list[float]:
        """The commit time of each put (the writer takes them in order, ``versions`` per commit)."""
        times: list[float] = []
        for versions, committed_at, _ in self.commits:
            times.extend([committed_at] * versions)
        return times


async def run_writer(plan: Plan, queue: Path, rate: float | None, *, record: bool) -> dict[str, Any]:
    config = {
        "first_job_id": plan.first_job_id, "versions": plan.versions, "base_time": plan.base_time,
        "seed": plan.seed, "queue": str(queue), "rate": rate, "record": record,
    }  # fmt: skip
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(HERE), "--writer-child", json.dumps(config),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"the writer process failed: {err.decode().strip()}")
    result: dict[str, Any] = orjson.loads(out)
    return result


async def settle(
    watcher: Any, store: Any, recorder: Recorder, quiet: float = 0.5, limit: float = 300
) -> None:
    """Wait until the watcher has read nothing new and the store committed nothing for ``quiet`` s."""
    deadline = time.monotonic() + limit
    seen = (-1, -1)
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        now = (watcher.stats.events, len(recorder.commits))
        if now != seen or store.pending:
            seen = now
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= quiet:
            await store.flush()
            return
    raise SystemExit(f"the watcher did not settle within {limit:.0f} s")


def _percentile(values: list[float], pct: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(pct / 100 * len(ordered) + 0.5) - 1))]


def latencies(
    plan: Plan, renaming: list[float], renamed: list[float], puts: list[Any], commit_times: list[float]
) -> tuple[list[float], list[float]]:
    """Rename-to-commit latencies (ms): of each version read and committed; of every version written.

    A version read is matched to the version written by its content (:func:`fingerprint`)
    and the time it was read: the last one with that content whose rename had begun
    before the read (the three "queued" versions of the fixture differ only in fields the
    store ignores; the watcher may read a version before its writer has noted the rename
    done). Latencies count from the end of the rename.
    For every version written: until the commit of the first version of its job read
    after it (itself, or a later one that replaced it before the watcher read it).
    """
    from synnefo_ganeti.jobs import parse_job_file

    contents = plan.contents()
    written: dict[int, list[tuple[int, float, float, Any]]] = {}
    for (job_id, index), began, at in zip(plan.schedule(), renaming, renamed, strict=True):
        seen = fingerprint(parse_job_file(contents[job_id][index]))
        written.setdefault(job_id, []).append((index, began, at, seen))
    committed: list[float] = []
    reflected_at: dict[tuple[int, int], float] = {}  # (job, index read) -> its commit
    for (job_id, read_at, seen), commit_at in zip(puts, commit_times, strict=True):
        if job_id not in written:
            continue
        match = [
            (index, at)
            for index, began, at, candidate in written[job_id]
            if candidate == seen and began <= read_at
        ]
        if not match:
            continue
        index, at = max(match)
        committed.append((commit_at - at) * 1000)
        reflected_at.setdefault((job_id, index), commit_at)
    every: list[float] = []
    for job_id, versions in written.items():
        reads = [(i, t) for (j, i), t in reflected_at.items() if j == job_id]
        for index, _, at, _ in versions:
            later = [t for i, t in reads if i >= index]
            if later:
                every.append((min(later) - at) * 1000)
    return committed, every


async def count_lost(store: Any, plans: list[Plan]) -> int:
    """Jobs whose last version written is not what the database holds (missing or different)."""
    from sqlalchemy import select

    from synnefo_ganeti.jobs import JobSummary, parse_job_file
    from synnefo_ganeti.store.jobs._jobs import jobs_t

    expected: dict[int, JobSummary] = {}
    for plan in plans:
        contents = plan.contents()
        last = dict(plan.schedule())  # job id -> the index of its last version written
        for job_id, index in last.items():
            expected[job_id] = JobSummary.of(parse_job_file(contents[job_id][index]))
    async with store.engine.connect() as conn:
        rows = await conn.execute(select(jobs_t.c.job_id, jobs_t.c.summary))
        held = {row.job_id: JobSummary.from_json(row.summary) for row in rows}
    return sum(1 for job_id, summary in expected.items() if held.get(job_id) != summary)


async def run_one(db: str, fs: str, folder: str, args: argparse.Namespace) -> dict[str, Any]:
    from synnefo_ganeti.store import Store
    from synnefo_ganeti.watch import QueueWatcher

    root = tempfile.mkdtemp(prefix="sg-bench-watch-", dir=folder)
    try:
        queue = Path(root) / "queue"
        (queue / "archive").mkdir(parents=True)
        (queue / "version").write_bytes(b"1\n")
        (queue / "lock").touch()
        paced_rate = args.paced_rate or PACED_RATE[fs]
        fast = Plan(first_job_id=1, versions=args.versions, base_time=time.time(), seed=args.seed)
        paced = Plan(
            first_job_id=fast.first_job_id + fast.jobs + 100,
            versions=args.paced_versions,
            base_time=time.time() + 3600,
            seed=args.seed + 7,
        )
        async with database(db, root) as url, Store(url) as store:
            recorder = Recorder()
            store.on_commit.append(recorder.on_commit)
            put: Callable[[Any], Any] = store.put

            async def recording_put(version: Any) -> None:
                recorder.puts.append((version.job.job_id, version.read_at, fingerprint(version.job)))
                await put(version)

            store.put = recording_put  # type: ignore[method-assign]
            await store.ensure_backend(BACKEND)
            watcher = QueueWatcher(queue, store, BACKEND)
            running = asyncio.create_task(watcher.run())
            await asyncio.wait_for(watcher.ready.wait(), 30)

            # phase 1: as fast as the writer can
            stats0 = (watcher.stats.versions, watcher.stats.coalesced, watcher.stats.overflows)
            writer0 = (store.stats.applied, store.stats.skipped, store.stats.batches)
            commits0 = len(recorder.commits)
            cpu0 = time.process_time()
            written = await run_writer(fast, queue, None, record=False)
            await settle(watcher, store, recorder)
            phase = recorder.commits[commits0:]
            last_commit, cpu_end = phase[-1][1], phase[-1][2]
            writer_per_s = fast.versions / (written["end"] - written["start"])
            versions_per_s = fast.versions / (last_commit - written["start"])
            read = watcher.stats.versions - stats0[0]
            fast_figures = {
                "read": read,
                "read_per_s": round(read / (last_commit - written["start"]), 1),
                "coalesced": watcher.stats.coalesced - stats0[1],
                "overflows": watcher.stats.overflows - stats0[2],
                "applied": store.stats.applied - writer0[0],
                "skipped": store.stats.skipped - writer0[1],
                "batches": store.stats.batches - writer0[2],
                "lag_ms": round((last_commit - written["end"]) * 1000, 1),
            }

            # phase 2: paced; every rename's time noted
            puts0 = len(recorder.puts)
            coalesced0 = watcher.stats.coalesced
            paced_written = await run_writer(paced, queue, paced_rate, record=True)
            await settle(watcher, store, recorder)
            paced_coalesced = watcher.stats.coalesced - coalesced0
            watcher.stop()
            await running
            await store.flush()
            commit_times = recorder.commit_times()
            committed, every = latencies(
                paced,
                paced_written["renaming"],
                paced_written["renamed"],
                recorder.puts[puts0:],
                commit_times[puts0:],
            )
            lost = await count_lost(store, [fast, paced])
        paced_per_s = paced.versions / max(paced_written["end"] - paced_written["start"], 1e-9)
        return {
            "db": db,
            "fs": fs,
            "versions": fast.versions,
            "writer_per_s": round(writer_per_s, 1),
            "versions_per_s": round(versions_per_s, 1),
            "keeps_up": round(versions_per_s / writer_per_s, 3),
            "p50_ms": round(_percentile(committed, 50), 2),
            "p99_ms": round(_percentile(committed, 99), 2),
            "lost": lost,
            "cpu_us_per_version": round((cpu_end - cpu0) / fast.versions * 1e6, 1),
            "cpu_us_per_read": round((cpu_end - cpu0) / max(fast_figures["read"], 1) * 1e6, 1),
            **fast_figures,
            "paced_rate": paced_rate,
            "paced_versions": paced.versions,
            "paced_writer_per_s": round(paced_per_s, 1),
            "paced_committed": len(committed),
            "paced_coalesced": paced_coalesced,
            "p99_ms_every_version": round(_percentile(every, 99), 2),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    folders = {"tmpfs": args.tmpfs_dir, "disk": args.disk_dir}
    results = []
    for db in ("sqlite", "postgresql") if args.db == "all" else (args.db,):
        for fs in ("tmpfs", "disk") if args.fs == "all" else (args.fs,):
            folder = folders[fs]
            if folder is None:
                raise SystemExit(f"no folder for fs={fs}: pass --{fs}-dir")
            kind = fs_type(folder)
            if (fs == "tmpfs") != (kind == "tmpfs"):
                raise SystemExit(f"{folder} is on {kind}, not on {'tmpfs' if fs == 'tmpfs' else 'a disk'}")
            figures = await run_one(db, fs, folder, args)
            print(orjson.dumps(figures).decode(), flush=True)
            results.append(figures)
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", type=int, default=20_000, help="versions of the fast phase (20000)")
    parser.add_argument("--paced-versions", type=int, default=3000, help="versions of the paced phase (3000)")
    parser.add_argument(
        "--paced-rate", type=float, default=None, help="versions/s of the paced phase (tmpfs 1000, disk 500)"
    )
    parser.add_argument("--db", choices=("sqlite", "postgresql", "all"), default="all")
    parser.add_argument("--fs", choices=("tmpfs", "disk", "all"), default="all")
    parser.add_argument("--tmpfs-dir", default="/dev/shm", help="a folder on tmpfs (/dev/shm)")
    parser.add_argument("--disk-dir", default=default_disk_dir(), help="a folder on a disk (/var/tmp)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--writer-child", metavar="JSON", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.writer_child is None and min(args.versions, args.paced_versions) < 1:
        parser.error("counts must be >= 1")
    if args.paced_rate is not None and args.paced_rate <= 0:
        parser.error("--paced-rate must be > 0")
    return args


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.writer_child is not None:
        sys.stdout.write(json.dumps(writer_child(json.loads(arguments.writer_child))))
    else:
        os.environ.setdefault("SYNNEFO_GANETI_LOG_LEVEL", "error")
        asyncio.run(main(arguments))
