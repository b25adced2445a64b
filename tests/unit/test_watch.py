"""The queue watcher on real inotify and real databases.

Job files are written the way Ganeti writes them: a temp file (luxid's
``job-<id>-<pid>-<n>.tmp``, the executor's ``job-<id><8 chars>.new``) renamed over
``job-<id>``; archiving renames ``job-<id>`` into ``archive/<id // 10000>/``. Every wait
is a polling loop with a generous deadline, never a timing assertion.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import errno
import itertools
import json
import logging
import os
import random
import shutil
import string
import types
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import asyncinotify
import pytest
from asyncinotify import Mask

from synnefo_ganeti import metrics
from synnefo_ganeti.jobs import EventKind, JobStatus, parse_job_file
from synnefo_ganeti.store import Store, StoredEvent
from synnefo_ganeti.testing import FakeGaneti
from synnefo_ganeti.testing._queue import QueueDir
from synnefo_ganeti.watch import QueueWatcher, check_inotify_limits
from tests.helpers import QUEUE_FIXTURES

WATCH_LOGGER = "synnefo_ganeti.watch"
DEADLINE = 10.0  # seconds; generous, CI runs on two cores
T0 = 1_795_327_455
_temp_counter = itertools.count(1)
_RANDOM = string.ascii_lowercase + string.digits


# -- writing job files as Ganeti does ------------------------------------------------------------


def temp_name(job_id: int, *, luxid: bool) -> str:
    if luxid:
        return f"job-{job_id}-{os.getpid()}-{next(_temp_counter)}.tmp"
    return f"job-{job_id}{''.join(random.choices(_RANDOM, k=8))}.new"


def write_version(
    folder: Path, job_id: int, data: bytes | dict[str, Any], *, luxid: bool | None = None
) -> None:
    """One version of ``folder/job-<id>``: written to a temp file, closed, renamed over it."""
    if isinstance(data, dict):
        data = json.dumps(data, separators=(",", ":")).encode()
    if luxid is None:  # luxid writes compact JSON, the executor ", "/": " separators
        luxid = not data.startswith(b'{"id": ')
    temp = folder / temp_name(job_id, luxid=luxid)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.rename(temp, folder / f"job-{job_id}")


def rename_into_place(folder: Path, job_id: int, make: Callable[[Path], None]) -> None:
    """Make something (a symlink, a FIFO) under a temp name, then rename it over ``job-<id>``."""
    temp = folder / temp_name(job_id, luxid=True)
    make(temp)
    os.rename(temp, folder / f"job-{job_id}")


def archive(queue: Path, job_id: int) -> Path:
    folder = queue / "archive" / str(job_id // 10000)
    folder.mkdir(exist_ok=True)
    target = folder / f"job-{job_id}"
    os.rename(queue / f"job-{job_id}", target)
    return target


def lifecycle(job_id: int, final: str = "success", *, logs: int = 2) -> list[dict[str, Any]]:
    """Every version of a one-op job, shaped like Ganeti 3.0's files (see the fixtures):
    queued, waiting, running, running with each log line, then ``final``."""
    t = T0 + job_id * 100
    op: dict[str, Any] = {
        "input": {
            "OP_ID": "OP_INSTANCE_STARTUP",
            "instance_name": f"inst{job_id}.example.com",
            "force": False,
            "dry_run": False,
            "priority": 0,
            "depends": None,
            "comment": None,
            "reason": [["gnt:library:rlib2:instances_name_startup", "", t * 10**9]],
        },
        "status": "queued",
        "result": None,
        "log": [],
        "priority": 0,
        "start_timestamp": None,
        "exec_timestamp": None,
        "end_timestamp": None,
    }
    job: dict[str, Any] = {
        "id": job_id,
        "ops": [op],
        "received_timestamp": [t, 0],
        "start_timestamp": None,
        "end_timestamp": None,
    }
    versions = [copy.deepcopy(job)]
    if final == "canceled":
        op.update(status="canceled", end_timestamp=[t + 1, 0])
        job["end_timestamp"] = [t + 1, 0]
        return [*versions, copy.deepcopy(job)]
    op.update(status="waiting", start_timestamp=[t + 1, 0])
    job.update(
        start_timestamp=[t + 1, 0],
        livelock=f"/var/run/ganeti/livelocks/job_{job_id:06d}_{t}",
        process_id=4242,
    )
    versions.append(copy.deepcopy(job))
    op.update(status="running", exec_timestamp=[t + 2, 0])
    versions.append(copy.deepcopy(job))
    for serial in range(1, logs + 1):
        op["log"].append([serial, [t + 2, serial * 1000], "message", f"* step {serial} of {job_id}"])
        versions.append(copy.deepcopy(job))
    op.update(status=final, end_timestamp=[t + 3, 0])
    op["result"] = ["OpExecError", [f"job {job_id} failed"]] if final == "error" else None
    job["end_timestamp"] = [t + 3, 10]
    versions.append(copy.deepcopy(job))
    return versions


def status_of(content: bytes | dict[str, Any]) -> str:
    data = content if isinstance(content, bytes) else json.dumps(content).encode()
    return parse_job_file(data).status.value


# -- running a watcher and waiting for it ---------------------------------------------------------


async def until(
    predicate: Callable[[], Awaitable[bool] | bool], what: str, timeout: float = DEADLINE
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = predicate()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            raise AssertionError(f"gave up after {timeout} s waiting for {what}")
        await asyncio.sleep(0.02)


async def statuses(store: Store, backend: str) -> dict[int, str]:
    return {job.job_id: job.status.value for job in await store.list_jobs(backend=backend)}


async def wait_for_statuses(store: Store, backend: str, expected: dict[int, str]) -> dict[int, str]:
    """Until the store holds every job of ``expected`` with that status; returns all it holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE
    while True:
        got = await statuses(store, backend)
        if all(got.get(job_id) == status for job_id, status in expected.items()):
            return got
        if loop.time() > deadline:
            wrong = {
                job_id: (got.get(job_id), status)
                for job_id, status in expected.items()
                if got.get(job_id) != status
            }
            raise AssertionError(f"gave up after {DEADLINE} s; (stored, expected) differ for {wrong}")
        await asyncio.sleep(0.02)


async def settle(watcher: QueueWatcher, store: Store, quiet: float = 0.2) -> None:
    """Until the watcher has nothing pending and has seen nothing new for ``quiet`` seconds,
    then until the store has written what it was given."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE
    last: tuple[int, ...] | None = None
    since = loop.time()
    while True:
        s = watcher.stats
        now = (s.events, s.scans, s.files_read, s.bad_files, s.vanished, store.pending)
        if now != last or watcher._pending:
            last, since = now, loop.time()
        elif loop.time() - since >= quiet:
            break
        if loop.time() > deadline:
            raise AssertionError(f"the watcher did not settle in {DEADLINE} s: {watcher.stats}")
        await asyncio.sleep(0.02)
    await store.flush()


@contextlib.asynccontextmanager
async def watching(queue: Path, store: Store, backend: str, **kwargs: Any) -> AsyncIterator[QueueWatcher]:
    """A running watcher; on exit it must still be running (it never ends by itself), then it is stopped."""
    watcher = QueueWatcher(queue, store, backend, **kwargs)
    task = asyncio.create_task(watcher.run(), name=f"test watcher {backend}")
    try:
        await until(lambda: watcher.ready.is_set() or task.done(), "the watcher to be ready")
        yield watcher
        assert not task.done(), "the watcher ended before it was stopped"
    finally:
        watcher.stop()
        await asyncio.wait_for(task, DEADLINE)


def watch_records(caplog: pytest.LogCaptureFixture, *words: str) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == WATCH_LOGGER and all(word in record.getMessage() for word in words)
    ]


def new_backend(prefix: str) -> str:
    """A backend name of its own, so that prometheus counters start at zero for it."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def bad_files_metric(backend: str) -> float:
    value = metrics.REGISTRY.get_sample_value("synnefo_ganeti_watch_bad_files_total", {"backend": backend})
    return value or 0.0


EventKey = tuple[str, str, int | None, int | None]


def keys(events: Iterable[StoredEvent]) -> list[EventKey]:
    return [(e.kind.value, e.status.value, e.op_index, e.log_serial) for e in events]


async def checked_events(store: Store, backend: str, job_id: int) -> list[StoredEvent]:
    """A job's events, checked: seq 1..n in id order, matching the job's event_count, no op event
    stored twice, never the same job status twice in a row, the last of them the job's status."""
    events = await store.list_events(backend=backend, job_id=job_id, limit=None)
    job = await store.get_job(backend, job_id)
    assert job is not None
    assert [e.seq for e in events] == list(range(1, len(events) + 1)), f"job {job_id}: {keys(events)}"
    assert job.event_count == len(events)
    op_keys = [key for key in keys(events) if key[0] != EventKind.JOB_STATUS.value]
    assert len(op_keys) == len(set(op_keys)), f"job {job_id} has an op event twice: {op_keys}"
    job_statuses = [e.status for e in events if e.kind is EventKind.JOB_STATUS]
    assert all(a != b for a, b in itertools.pairwise(job_statuses)), f"job {job_id}: {job_statuses}"
    assert job_statuses and job_statuses[-1] is job.status
    if job.status.is_final:
        assert events[-1].kind is EventKind.JOB_STATUS
    times = [e.event_time for e in events if e.event_time is not None]
    assert times == sorted(times), f"job {job_id}: events out of time order"
    return events


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store.db'}"


@pytest.fixture
def queue(tmp_path: Path) -> Path:
    """An empty queue directory as Ganeti leaves it (``version``, ``lock``, ``archive/``)."""
    path = tmp_path / "queue"
    QueueDir(path)
    return path


# -- 1. the recorded fixtures ---------------------------------------------------------------------

LIFECYCLES = {12: "lifecycle-job-12", 20: "lifecycle-job-20", 23: "lifecycle-job-23"}


def fixture_versions() -> dict[int, list[bytes]]:
    """Every recorded job: the ordered versions of the lifecycles, and the single other files."""
    versions: dict[int, list[bytes]] = {
        job_id: [path.read_bytes() for path in sorted((QUEUE_FIXTURES / folder).iterdir())]
        for job_id, folder in LIFECYCLES.items()
    }
    for path in sorted(QUEUE_FIXTURES.glob("job-*.json")):
        job_id = int(path.name.split(".")[0].removeprefix("job-"))
        if job_id not in LIFECYCLES:
            versions[job_id] = [path.read_bytes()]
    return versions


def junk(queue: Path) -> None:
    """Names that are not job files: written in place or renamed into place, with job content."""
    some_job = (QUEUE_FIXTURES / "job-13.op_instance_startup.success.json").read_text()

    def holding(job_id: int) -> bytes:
        return some_job.replace('"id": 13', f'"id": {job_id}', 1).encode()

    serial = QueueDir(queue)  # serial-<pid>-<n>.tmp renamed onto serial, as luxid does
    serial.write_serial(1528)
    (queue / "version").write_text("1\n")
    (queue / "lock").touch()
    (queue / "job-5.tmp").write_bytes(holding(9005))  # CLOSE_WRITE of names that look close
    (queue / "job-20abcdefgh.new").write_bytes(holding(9020))
    (queue / "job-x.tmp").write_bytes(holding(9030))
    os.rename(queue / "job-x.tmp", queue / "job-x")  # MOVED_TO of a name that is not a job's
    (queue / "job-7.new").write_bytes(holding(9007))
    os.rename(queue / "job-7.new", queue / "job-07x")


async def test_replay_of_recorded_files(db_url: str, queue: Path) -> None:
    versions = fixture_versions()
    expected = {job_id: status_of(files[-1]) for job_id, files in versions.items()}
    assert {expected[19], expected[21], expected[22], expected[24]} == {
        "running",
        "queued",
        "canceled",
        "error",
    }
    backend = new_backend("replay")
    async with Store(db_url) as store, watching(queue, store, backend) as watcher:
        # the jobs' versions interleaved, as a busy queue writes them, with the junk in between
        queues = [list(files) for files in versions.values()]
        ids = list(versions)
        for step in itertools.count():
            pending = [(job_id, files) for job_id, files in zip(ids, queues, strict=True) if files]
            if not pending:
                break
            for job_id, files in pending:
                write_version(queue, job_id, files.pop(0))
            if step == 1:
                junk(queue)
        got = await wait_for_statuses(store, backend, expected)
        await settle(watcher, store)
        assert await statuses(store, backend) == expected == got  # junk never made a job
        assert watcher.stats.bad_files == 0 and watcher.stats.scans == 1
        for job_id, files in versions.items():
            events = await checked_events(store, backend, job_id)
            final = parse_job_file(files[-1])
            for op in final.ops:  # every log line once, in order, even if versions were coalesced
                logged = [e.log_serial for e in events if e.kind is EventKind.LOG and e.op_index == op.index]
                assert logged == [line.serial for line in op.log], f"job {job_id} op {op.index}"
            ops = [e for e in events if e.kind is EventKind.OP_STATUS and e.status.is_final]
            assert [(e.op_index, e.status) for e in ops] == [
                (op.index, op.status) for op in final.ops if op.status.is_final
            ]
            job = await store.get_job(backend, job_id)
            assert job is not None and not job.archived
            assert [op.status for op in job.ops] == [op.status for op in final.ops]


# what the store holds of a lifecycle read one version at a time (the queued rewrites change nothing)
JOB_20_EVENTS: list[EventKey] = [
    ("op_status", "queued", 0, None), ("job_status", "queued", None, None),
    ("op_status", "waiting", 0, None), ("job_status", "waiting", None, None),
    ("op_status", "running", 0, None), ("job_status", "running", None, None),
    ("log", "running", 0, 1), ("log", "running", 0, 2), ("log", "running", 0, 3), ("log", "running", 0, 4),
    ("op_status", "success", 0, None), ("job_status", "success", None, None),
]  # fmt: skip
JOB_23_EVENTS: list[EventKey] = [
    ("op_status", "queued", 0, None), ("op_status", "queued", 1, None), ("op_status", "queued", 2, None),
    ("job_status", "queued", None, None),
    ("op_status", "waiting", 0, None), ("job_status", "waiting", None, None),
    ("op_status", "running", 0, None), ("job_status", "running", None, None),
    ("op_status", "success", 0, None), ("job_status", "queued", None, None),
    ("op_status", "waiting", 1, None), ("job_status", "waiting", None, None),
    ("op_status", "running", 1, None), ("job_status", "running", None, None),
    ("op_status", "success", 1, None), ("job_status", "queued", None, None),
    ("op_status", "waiting", 2, None), ("job_status", "waiting", None, None),
    ("op_status", "running", 2, None), ("job_status", "running", None, None),
    ("op_status", "success", 2, None), ("job_status", "success", None, None),
]  # fmt: skip


async def test_lifecycles_read_one_version_at_a_time(db_url: str, queue: Path) -> None:
    backend = new_backend("steps")
    async with Store(db_url) as store, watching(queue, store, backend) as watcher:
        for job_id in (20, 23):
            for data in fixture_versions()[job_id]:
                read = watcher.stats.versions
                write_version(queue, job_id, data)
                await until(lambda read=read: watcher.stats.versions > read, "the version to be read")
                await store.flush()
                job = await store.get_job(backend, job_id)
                assert job is not None and job.status.value == status_of(data)
        await settle(watcher, store)
        assert keys(await checked_events(store, backend, 20)) == JOB_20_EVENTS
        assert keys(await checked_events(store, backend, 23)) == JOB_23_EVENTS
        assert watcher.stats.versions == 10 + 12 and watcher.stats.coalesced == 0
        job_20 = await store.get_job(backend, 20)
        assert job_20 is not None and job_20.instance == "inst5.ganeti.test"
        assert job_20.revision == 8  # the two queued rewrites changed nothing


# -- 2. the fake Ganeti's own writer --------------------------------------------------------------

QUICK = {"OP_INSTANCE_CREATE": 0.02, "OP_INSTANCE_REMOVE": 0.01, "OP_INSTANCE_SHUTDOWN": 0.01,
         "OP_INSTANCE_STARTUP": 0.01, "OP_INSTANCE_REBOOT": 0.01, "OP_TEST_DELAY": 0.01}  # fmt: skip


def create_params(name: str, **extra: Any) -> dict[str, Any]:
    params = {
        "instance_name": name, "mode": "create", "disk_template": "diskless", "disks": [], "nics": [{}],
        "os_type": "noop", "pnode": "node1.fake.test", "beparams": {"memory": 128}, "hypervisor": "fake",
        "name_check": False, "ip_check": False,
    }  # fmt: skip
    return params | extra


async def test_fake_ganeti_jobs_are_stored_as_the_fake_ends_them(db_url: str, tmp_path: Path) -> None:
    backend = new_backend("fake")
    async with (
        FakeGaneti(tls=False, queue_dir=tmp_path / "queue", op_times=QUICK, max_running_jobs=2) as fake,
        Store(db_url) as store,
    ):
        assert fake.queue_dir is not None
        async with watching(fake.queue_dir, store, backend) as watcher:
            cluster = fake.cluster
            submitted = [
                cluster.submit(
                    [("OP_INSTANCE_CREATE", create_params("vm1.fake.test"))], resource="instances"
                ),
                cluster.submit(
                    [("OP_INSTANCE_CREATE", create_params("vm2.fake.test"))], resource="instances"
                ),
                cluster.submit(
                    [("OP_INSTANCE_CREATE", create_params("vm1.fake.test"))], resource="instances"
                ),
                cluster.submit([("OP_INSTANCE_SHUTDOWN", {"instance_name": "vm2.fake.test"})], resource="x"),
                cluster.submit(
                    [
                        ("OP_TEST_DELAY", {"duration": 0.01}),
                        ("OP_INSTANCE_STARTUP", {"instance_name": "nope"}),
                        ("OP_TEST_DELAY", {"duration": 0.01}),
                    ],
                    client=("gnt-debug", "submit-job"),
                ),
                cluster.submit([("OP_INSTANCE_REBOOT", {"instance_name": "vm1.fake.test"})], resource="x"),
                cluster.submit([("OP_INSTANCE_REMOVE", {"instance_name": "vm2.fake.test"})], resource="x"),
            ]
            canceled = submitted[-1]
            assert cluster.cancel(canceled)[0]  # still queued behind max_running_jobs=2

            def fake_jobs_ended() -> bool:
                return all(cluster.jobs[job_id].status.is_final for job_id in submitted)

            await until(fake_jobs_ended, "the fake's jobs to end")
            expected = {job_id: cluster.jobs[job_id].status.value for job_id in submitted}
            assert expected[canceled] == "canceled" and {"success", "error"} <= set(expected.values())
            await wait_for_statuses(store, backend, expected)
            await settle(watcher, store)
            assert await statuses(store, backend) == expected
            for job_id in submitted:
                events = await checked_events(store, backend, job_id)
                fake_job = cluster.jobs[job_id]
                logged = [e.log_serial for e in events if e.kind is EventKind.LOG]
                assert logged == sorted(entry[0] for op in fake_job.ops for entry in op.log)
                job = await store.get_job(backend, job_id)
                assert job is not None
                assert [op.status for op in job.ops] == [op.status for op in fake_job.ops]
            assert fake.archive_jobs() == len(submitted)

            async def all_archived() -> bool:
                return all(job.archived for job in await store.list_jobs(backend=backend))

            await until(all_archived, "the archived jobs to be marked")
            assert await statuses(store, backend) == expected
            assert watcher.stats.bad_files == 0


# -- 3. catching up at start ----------------------------------------------------------------------


async def test_start_scan_catches_up_and_a_restart_duplicates_nothing(db_url: str, queue: Path) -> None:
    backend = new_backend("restart")
    jobs = {job_id: lifecycle(job_id, final) for job_id, final in
            [(1, "success"), (2, "error"), (3, "canceled"), (4, "success"), (5, "success"), (6, "error")]}  # fmt: skip
    written = {1: 99, 2: 99, 3: 99, 4: 2, 5: 0, 6: 3}  # how far each got before the first start
    for job_id, upto in written.items():
        for content in jobs[job_id][: upto + 1]:
            write_version(queue, job_id, content)
    first_expected = {
        job_id: status_of(jobs[job_id][min(upto, len(jobs[job_id]) - 1)]) for job_id, upto in written.items()
    }
    assert first_expected == {
        1: "success",
        2: "error",
        3: "canceled",
        4: "running",
        5: "queued",
        6: "running",
    }

    async with Store(db_url) as store, watching(queue, store, backend) as watcher:
        await wait_for_statuses(store, backend, first_expected)
        await settle(watcher, store)
        assert watcher.stats.scans == 1 and watcher.stats.files_read == 6
        before = {job_id: keys(await checked_events(store, backend, job_id)) for job_id in jobs}

    # while no watcher runs: the running jobs end, and the ended ones are archived
    for job_id in (4, 5, 6):
        for content in jobs[job_id][written[job_id] + 1 :]:
            write_version(queue, job_id, content)
    for job_id in (1, 2, 5):
        archive(queue, job_id)
    expected = {job_id: status_of(versions[-1]) for job_id, versions in jobs.items()}

    async with Store(db_url) as store, watching(queue, store, backend) as watcher:  # a new process
        await wait_for_statuses(store, backend, expected)
        await settle(watcher, store)
        assert await statuses(store, backend) == expected
        for job_id in jobs:
            events = keys(await checked_events(store, backend, job_id))
            assert events[: len(before[job_id])] == before[job_id]  # kept, and only added to
        for job_id in (1, 2, 3):
            assert keys(await store.list_events(backend=backend, job_id=job_id, limit=None)) == before[job_id]
        archived = {job.job_id for job in await store.list_jobs(backend=backend) if job.archived}
        assert archived == {1, 2, 5}

    async with Store(db_url) as store, watching(queue, store, backend) as watcher:  # once more: nothing new
        await settle(watcher, store)
        # the archived jobs the store holds as final are not even read again
        assert watcher.stats.files_read == 3 and watcher.stats.versions == 3
        assert store.stats.applied == 0 and store.stats.events == 0
        assert await statuses(store, backend) == expected


# -- 4. the archive -------------------------------------------------------------------------------


async def test_archive_folders_old_and_new(db_url: str, queue: Path) -> None:
    backend = new_backend("archive")
    (queue / "archive" / "0").mkdir()
    shutil.copyfile(QUEUE_FIXTURES / "archive" / "0" / "job-2", queue / "archive" / "0" / "job-2")
    for content in lifecycle(7):
        write_version(queue, 7, content)
    for content in lifecycle(8)[:3]:
        write_version(queue, 8, content)

    async with Store(db_url) as store, watching(queue, store, backend) as watcher:
        await wait_for_statuses(store, backend, {2: "success", 7: "success", 8: "running"})
        await settle(watcher, store)
        jobs = {job.job_id: job for job in await store.list_jobs(backend=backend)}
        assert jobs[2].archived and not jobs[7].archived and not jobs[8].archived
        events_7 = keys(await checked_events(store, backend, 7))

        archive(queue, 7)  # an ended job: same state, now archived

        async def archived(job_id: int) -> bool:
            job = await store.get_job(backend, job_id)
            return job is not None and job.archived

        await until(lambda: archived(7), "job 7 to be archived")
        job_7 = await store.get_job(backend, 7)
        assert job_7 is not None and job_7.status is JobStatus.SUCCESS and job_7.revision == jobs[7].revision
        assert keys(await checked_events(store, backend, 7)) == events_7

        for content in lifecycle(8)[3:]:
            write_version(queue, 8, content)
        archive(queue, 8)
        await until(lambda: archived(8), "job 8 to be archived")
        await wait_for_statuses(store, backend, {8: "success"})

        # jobs 10000 and up go to archive/1/, a folder made after the watcher started
        for job_id in (10003, 10004):
            for content in lifecycle(job_id, "error"):
                write_version(queue, job_id, content)
        await wait_for_statuses(store, backend, {10003: "error", 10004: "error"})
        assert not (queue / "archive" / "1").exists()
        archive(queue, 10003)  # makes archive/1/ and renames into it at once
        await until(lambda: archived(10003), "job 10003 to be archived")
        archive(queue, 10004)  # through the new folder's own watch
        await until(lambda: archived(10004), "job 10004 to be archived")
        await settle(watcher, store)
        assert watcher.stats.scans == 1 and watcher.stats.bad_files == 0
        assert await statuses(store, backend) == {
            2: "success",
            7: "success",
            8: "success",
            10003: "error",
            10004: "error",
        }
        for job_id in (2, 7, 8, 10003, 10004):
            await checked_events(store, backend, job_id)


# -- 5. inotify queue overflow --------------------------------------------------------------------


async def test_overflow_rescans(db_url: str, queue: Path) -> None:
    backend = new_backend("overflow")
    async with Store(db_url) as store, watching(queue, store, backend) as watcher:
        for content in lifecycle(1)[:2]:
            write_version(queue, 1, content)
        await wait_for_statuses(store, backend, {1: "waiting"})
        await settle(watcher, store)  # nothing left to read that could be newer

        # from now on the kernel "loses" every job-file event, as an overflowing queue does
        lost: list[str] = []
        deliver = watcher.on_event

        def losing(mask: Mask, watch: Any, name: Path | None) -> None:
            if name is not None and name.name.startswith("job-"):
                if mask & Mask.MOVED_TO:
                    lost.append(name.name)
                return
            deliver(mask, watch, name)

        watcher.on_event = losing  # type: ignore[method-assign]
        written = 0
        for content in lifecycle(1)[2:]:
            write_version(queue, 1, content)
            written += 1
        for job_id in (2, 3):
            for content in lifecycle(job_id, "error"):
                write_version(queue, job_id, content)
                written += 1
        await until(lambda: len(lost) >= written, "the events to be lost")
        await settle(watcher, store)
        assert await statuses(store, backend) == {1: "waiting"}
        del watcher.on_event  # the kernel's overflow event comes through the real boundary

        watcher.on_event(Mask.Q_OVERFLOW, None, None)
        expected = {1: "success", 2: "error", 3: "error"}
        await wait_for_statuses(store, backend, expected)
        assert watcher.stats.overflows == 1 and watcher.stats.scans == 2
        rescans = metrics.REGISTRY.get_sample_value(
            "synnefo_ganeti_watch_rescans_total", {"backend": backend, "reason": "overflow"}
        )
        assert rescans == 1
        await settle(watcher, store)
        before = {job_id: keys(await checked_events(store, backend, job_id)) for job_id in expected}

        watcher.on_event(Mask.Q_OVERFLOW, None, None)  # an overflow that lost nothing adds nothing
        await settle(watcher, store)
        assert watcher.stats.overflows == 2 and watcher.stats.scans == 3
        assert {job_id: keys(await checked_events(store, backend, job_id)) for job_id in expected} == before


async def test_an_archive_folder_made_while_events_were_lost_is_watched_after_the_rescan(
    sqlite_url: str, queue: Path
) -> None:
    backend = new_backend("lost-folder")
    async with Store(sqlite_url) as store, watching(queue, store, backend) as watcher:
        for job_id in (10003, 10004):
            for content in lifecycle(job_id):
                write_version(queue, job_id, content)
        await wait_for_statuses(store, backend, {10003: "success", 10004: "success"})
        await settle(watcher, store)

        lost: list[tuple[Mask, Path | None]] = []
        watcher.on_event = lambda mask, watch, name: lost.append((mask, name))  # type: ignore[method-assign]
        archive(queue, 10003)  # makes archive/1/, and its CREATE is lost with the rest
        await until(lambda: (Mask.CREATE | Mask.ISDIR, Path("1")) in lost, "the folder's event to be lost")
        del watcher.on_event
        watcher.on_event(Mask.Q_OVERFLOW, None, None)

        async def archived(job_id: int) -> bool:
            job = await store.get_job(backend, job_id)
            return job is not None and job.archived

        await until(lambda: archived(10003), "the rescan to find job 10003 archived")
        archive(queue, 10004)  # the rescan watches the new folder from now on
        await until(lambda: archived(10004), "job 10004 to be seen archived")
        assert watcher.stats.scans == 2


async def test_a_path_marked_again_before_it_is_read_is_read_once(sqlite_url: str, queue: Path) -> None:
    backend = new_backend("coalesce")
    for content in lifecycle(1):
        write_version(queue, 1, content)
    async with Store(sqlite_url) as store:
        watcher = QueueWatcher(queue, store, backend)
        root = types.SimpleNamespace(path=queue)  # what a decoded event's watch offers
        watcher.on_event(Mask.MOVED_TO, root, Path("job-1"))  # type: ignore[arg-type]
        watcher.on_event(Mask.MOVED_TO, root, Path("job-1"))  # type: ignore[arg-type]
        watcher.on_event(Mask.MOVED_TO, root, Path("job-1.tmp"))  # type: ignore[arg-type]
        watcher.on_event(Mask.CREATE, root, Path("job-1"))  # type: ignore[arg-type]
        assert watcher.stats.coalesced == 1 and watcher.stats.events == 4
        task = asyncio.create_task(watcher.run())
        await watcher.ready.wait()  # the start scan marks it once more
        watcher.stop()
        await asyncio.wait_for(task, DEADLINE)
        assert watcher.stats.coalesced == 2 and watcher.stats.files_read == 1
        await store.flush()
        assert await statuses(store, backend) == {1: "success"}


# -- 6. the queue directory missing, replaced, not a directory, unreadable ------------------------


async def test_missing_queue_dir_is_retried_then_watched(
    sqlite_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=WATCH_LOGGER)
    backend = new_backend("missing")
    queue = tmp_path / "queue"
    async with Store(sqlite_url) as store, watching(queue, store, backend, retry_interval=0.02) as watcher:
        await until(lambda: bool(watch_records(caplog, str(queue), "does not exist")), "the log line")
        await asyncio.sleep(0.2)  # several retries: still one line
        assert len(watch_records(caplog, str(queue), "does not exist", "retrying")) == 1
        assert watcher.stats.scans == 0
        QueueDir(queue)
        for content in lifecycle(1):
            write_version(queue, 1, content)
        await wait_for_statuses(store, backend, {1: "success"})
        assert watch_records(caplog, str(queue), "usable again")
        for content in lifecycle(2):  # and it is watched, not just scanned once
            write_version(queue, 2, content)
        await wait_for_statuses(store, backend, {1: "success", 2: "success"})


async def test_queue_dir_removed_or_replaced_while_watched(
    sqlite_url: str, queue: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend = new_backend("replaced")
    async with Store(sqlite_url) as store, watching(queue, store, backend, retry_interval=0.02) as watcher:
        for content in lifecycle(1)[:3]:
            write_version(queue, 1, content)
        await wait_for_statuses(store, backend, {1: "running"})

        shutil.rmtree(queue)
        await until(lambda: watcher.stats.watch_lost >= 1, "the watch to be lost")
        assert watch_records(caplog, "lost the watch", str(queue))
        QueueDir(queue)
        for content in lifecycle(1)[3:]:  # the same job, further on, in the new directory
            write_version(queue, 1, content)
        await wait_for_statuses(store, backend, {1: "success"})
        for content in lifecycle(2):
            write_version(queue, 2, content)
        await wait_for_statuses(store, backend, {1: "success", 2: "success"})

        lost = watcher.stats.watch_lost
        os.rename(queue, queue.with_name("queue.old"))  # moved away, and a new one put in its place
        QueueDir(queue)
        for content in lifecycle(3, "error"):
            write_version(queue, 3, content)
        await wait_for_statuses(store, backend, {3: "error"})
        assert watcher.stats.watch_lost > lost
        await settle(watcher, store)
        assert watcher.stats.scans >= 3
        for job_id in (1, 2, 3):
            await checked_events(store, backend, job_id)


async def test_queue_dir_that_is_a_file(
    sqlite_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend = new_backend("file")
    queue = tmp_path / "queue"
    queue.write_text("not a directory\n")
    async with Store(sqlite_url) as store, watching(queue, store, backend, retry_interval=0.02) as watcher:
        await until(lambda: bool(watch_records(caplog, str(queue), "is not a directory")), "the log line")
        await asyncio.sleep(0.2)
        assert len(watch_records(caplog, str(queue), "is not a directory")) == 1
        assert watcher.stats.scans == 0
        queue.unlink()
        QueueDir(queue)
        for content in lifecycle(1):
            write_version(queue, 1, content)
        await wait_for_statuses(store, backend, {1: "success"})


async def test_permission_denied_on_watch(
    sqlite_url: str, queue: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tests run as root, which reads everything: inotify_add_watch is made to refuse."""
    backend = new_backend("eacces")
    for content in lifecycle(1):
        write_version(queue, 1, content)
    add_watch = asyncinotify.Inotify.add_watch
    refused: list[str] = []

    def refusing(self: asyncinotify.Inotify, path: Any, mask: Mask) -> asyncinotify.Watch:
        if Path(path) == queue:
            refused.append(os.fspath(path))
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
        return add_watch(self, path, mask)

    monkeypatch.setattr(asyncinotify.Inotify, "add_watch", refusing)
    async with Store(sqlite_url) as store, watching(queue, store, backend, retry_interval=0.02) as watcher:
        await until(lambda: len(refused) >= 3, "a few retries")
        lines = watch_records(caplog, str(queue), "permission denied")
        assert len(lines) == 1 and "gnt-masterd" in lines[0]
        assert watcher.stats.scans == 0 and await statuses(store, backend) == {}
        monkeypatch.setattr(asyncinotify.Inotify, "add_watch", add_watch)
        await wait_for_statuses(store, backend, {1: "success"})


async def test_permission_denied_on_scan(
    sqlite_url: str, queue: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = new_backend("eacces-scan")
    for content in lifecycle(1):
        write_version(queue, 1, content)
    scandir = os.scandir
    refused: list[str] = []

    def refusing(path: Any = ".") -> Any:
        if isinstance(path, str | os.PathLike) and os.fspath(path).startswith(os.fspath(queue)):
            refused.append(os.fspath(path))
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refusing)
    async with Store(sqlite_url) as store, watching(queue, store, backend, retry_interval=0.02):
        await until(lambda: len(refused) >= 3, "a few retries")
        lines = watch_records(caplog, str(queue), "permission denied")
        assert len(lines) == 1
        assert await statuses(store, backend) == {}
        monkeypatch.setattr(os, "scandir", scandir)
        await wait_for_statuses(store, backend, {1: "success"})
        await until(lambda: bool(watch_records(caplog, str(queue), "usable again")), "the recovery line")


# -- 7. bad files ---------------------------------------------------------------------------------


async def test_bad_files_are_skipped_logged_and_counted_once(
    sqlite_url: str, queue: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=WATCH_LOGGER)
    backend = new_backend("bad")
    limit = 2048
    good = {job_id: json.dumps(lifecycle(job_id)[-1]).encode() for job_id in range(1, 9)}
    assert all(len(data) < limit for data in good.values())
    big = lifecycle(3)[-1]
    big["ops"][0]["log"].append([3, [T0, 0], "message", "x" * limit])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "job-4").write_bytes(good[4])
    wrong_id = lifecycle(60)[-1]
    reasons = {
        1: "not JSON",
        2: "not UTF-8",
        3: f"more than the {limit}",
        4: "a symlink",
        5: "not a regular file",
        6: "it holds job 60, not 6",
        7: "ops is missing or empty",
        8: "not a regular file",
    }

    async with (
        Store(sqlite_url) as store,
        watching(queue, store, backend, max_file_bytes=limit, retry_interval=0.02) as watcher,
    ):
        write_version(queue, 1, good[1][: len(good[1]) // 2])
        write_version(queue, 2, good[2].replace(b"inst2.example.com", b"inst2.\xff\xfe.example.com"))
        write_version(queue, 3, json.dumps(big).encode())
        rename_into_place(queue, 4, lambda temp: os.symlink(elsewhere / "job-4", temp))
        rename_into_place(queue, 5, os.mkfifo)  # opened and read, it would block a reader
        write_version(queue, 6, wrong_id)
        write_version(queue, 7, {"id": 7, "ops": [], "received_timestamp": [T0, 0]})
        await until(lambda: watcher.stats.bad_files == 7, "the bad files to be counted")

        (queue / "job-8").mkdir()  # only a scan finds a directory; the overflow's rescan
        watcher.on_event(Mask.Q_OVERFLOW, None, None)  # also reads the bad files again
        await until(lambda: watcher.stats.bad_files == 8, "the directory to be counted")
        await settle(watcher, store)
        assert watcher.stats.bad_files == 8 and bad_files_metric(backend) == 8
        assert await statuses(store, backend) == {}
        for job_id, reason in reasons.items():
            path = queue / f"job-{job_id}"
            lines = watch_records(caplog, f"skipping job file {path}:")
            assert len(lines) == 1, (job_id, lines)
            assert reason in lines[0], (job_id, lines[0])

        # a later good version of each is read and stored
        (queue / "job-8").rmdir()
        for job_id, data in good.items():
            write_version(queue, job_id, data)
        await wait_for_statuses(store, backend, dict.fromkeys(good, "success"))
        await settle(watcher, store)
        assert watcher.stats.bad_files == 8 and bad_files_metric(backend) == 8
        for job_id in good:
            assert len(watch_records(caplog, f"job file {queue / f'job-{job_id}'} is readable again")) == 1
            await checked_events(store, backend, job_id)

        # a bad version after a good one: skipped, the stored job stays as it was
        write_version(queue, 1, b'{"id": 1, "ops": [')
        await until(lambda: watcher.stats.bad_files == 9, "the new bad version to be counted")
        assert len(watch_records(caplog, f"skipping job file {queue / 'job-1'}:")) == 2
        assert (await statuses(store, backend))[1] == "success"
        assert bad_files_metric(backend) == 9


async def test_a_bad_file_at_start_does_not_stop_the_others(sqlite_url: str, queue: Path) -> None:
    backend = new_backend("bad-start")
    write_version(queue, 1, b"\x00\x01\x02")
    os.symlink("/dev/zero", queue / "job-2")  # a huge "file" behind a symlink: never opened
    os.mkfifo(queue / "job-3")
    for content in lifecycle(4):
        write_version(queue, 4, content)
    async with Store(sqlite_url) as store, watching(queue, store, backend) as watcher:
        await wait_for_statuses(store, backend, {4: "success"})
        await settle(watcher, store)
        assert watcher.stats.bad_files == 3 and bad_files_metric(backend) == 3
        assert await statuses(store, backend) == {4: "success"}


# -- 8. inotify limits ----------------------------------------------------------------------------


def test_inotify_limits(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    low = tmp_path / "low"
    low.mkdir()
    (low / "max_queued_events").write_text("1024\n")
    (low / "max_user_watches").write_text("100\n")
    (low / "max_user_instances").write_text("128\n")
    with caplog.at_level(logging.WARNING, logger=WATCH_LOGGER):
        warnings = check_inotify_limits(low)
    assert len(warnings) == 2
    assert "fs.inotify.max_queued_events is 1024" in warnings[0] and "sysctl" in warnings[0]
    assert "fs.inotify.max_user_watches is 100" in warnings[1]
    assert watch_records(caplog, "max_queued_events is 1024") and watch_records(
        caplog, "max_user_watches is 100"
    )

    caplog.clear()
    high = tmp_path / "high"
    high.mkdir()
    (high / "max_queued_events").write_text("1048576\n")
    (high / "max_user_watches").write_text("524288\n")
    with caplog.at_level(logging.WARNING, logger=WATCH_LOGGER):
        assert check_inotify_limits(high) == []
    assert not watch_records(caplog, "fs.inotify")

    odd = tmp_path / "odd"  # missing and unreadable values are not warned about
    odd.mkdir()
    (odd / "max_queued_events").write_text("lots\n")
    assert check_inotify_limits(odd) == []
    assert check_inotify_limits(tmp_path / "nowhere") == []


# -- 9. stopping ----------------------------------------------------------------------------------


async def test_stop_hands_pending_versions_to_the_store(db_url: str, queue: Path) -> None:
    backend = new_backend("stop")
    count = 120
    for job_id in range(1, count + 1):
        write_version(queue, job_id, lifecycle(job_id, logs=1)[-1])
    async with Store(db_url) as store:
        watcher = QueueWatcher(queue, store, backend, read_batch=16)
        task = asyncio.create_task(watcher.run())
        await watcher.ready.wait()  # the start scan marked every file; few (if any) are read yet
        watcher.stop()
        await asyncio.wait_for(task, DEADLINE)
        assert watcher.stats.versions == count
        await store.flush()
        assert await statuses(store, backend) == dict.fromkeys(range(1, count + 1), "success")
        assert await store.count_jobs(backend=backend) == count


async def test_cancel_also_hands_pending_versions_to_the_store(sqlite_url: str, queue: Path) -> None:
    backend = new_backend("cancel")
    for job_id in range(1, 41):
        write_version(queue, job_id, lifecycle(job_id)[-1])
    async with Store(sqlite_url) as store:
        watcher = QueueWatcher(queue, store, backend, read_batch=8)
        task = asyncio.create_task(watcher.run())
        await watcher.ready.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert watcher.stats.versions == 40
        await store.flush()
        assert await store.count_jobs(backend=backend) == 40


async def test_stop_while_idle_and_stop_twice(sqlite_url: str, queue: Path) -> None:
    backend = new_backend("idle")
    async with Store(sqlite_url) as store:
        watcher = QueueWatcher(queue, store, backend)
        task = asyncio.create_task(watcher.run())
        await watcher.ready.wait()
        for content in lifecycle(1):
            write_version(queue, 1, content)
        await wait_for_statuses(store, backend, {1: "success"})
        watcher.stop()
        watcher.stop()
        await asyncio.wait_for(task, DEADLINE)
        assert watcher.stats.scans == 1
