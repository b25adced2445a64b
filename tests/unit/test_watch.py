"""The queue watcher on real inotify and real databases: the recorded fixtures, the fake Ganeti's
writer, catching up at start, the archive and inotify overflows (``test_watch_faults.py`` has the
queue directory's troubles, bad files, inotify limits and stopping; ``tests/_watch.py`` the helpers).

Every wait is a poll with a generous deadline, never a timing assertion.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import types
from pathlib import Path
from typing import Any

from asyncinotify import Mask

from synnefo_ganeti import metrics
from synnefo_ganeti.jobs import EventKind, JobStatus, parse_job_file
from synnefo_ganeti.store import Store
from synnefo_ganeti.testing import FakeGaneti
from synnefo_ganeti.testing._queue import QueueDir
from synnefo_ganeti.watch import QueueWatcher
from tests._watch import (
    DEADLINE,
    EventKey,
    archive,
    checked_events,
    keys,
    lifecycle,
    new_backend,
    settle,
    status_of,
    statuses,
    wait_for_statuses,
    watching,
    write_version,
)
from tests.helpers import QUEUE_FIXTURES, eventually

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
                await eventually(
                    lambda read=read: watcher.stats.versions > read, what="the version to be read"
                )
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

            await eventually(fake_jobs_ended, what="the fake's jobs to end")
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

            await eventually(all_archived, what="the archived jobs to be marked")
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


async def test_a_paused_watch_holds_no_inotify_and_a_resume_reads_what_changed(
    sqlite_url: str, queue: Path
) -> None:
    """While paused (another dispatcher reads the folder) the watcher has no inotify instance:
    nothing it would be told of is made or read; resumed, it watches again and scans."""
    backend = new_backend("paused")
    jobs = {job_id: lifecycle(job_id, "success") for job_id in (1, 2)}
    write_version(queue, 1, jobs[1][0])
    async with Store(sqlite_url) as store, watching(queue, store, backend) as watcher:
        await wait_for_statuses(store, backend, {1: status_of(jobs[1][0])})
        watcher.pause()
        watcher.pause()  # (once is enough)
        await eventually(lambda: watcher._inotify is None, what="the inotify instance closed")
        assert watcher.paused and watcher.stats.pauses == 1
        read, scans = watcher.stats.files_read, watcher.stats.scans
        for job_id, versions in jobs.items():
            for content in versions:
                write_version(queue, job_id, content)
        assert watcher.stats.files_read == read and watcher._inotify is None  # nothing seen
        watcher.resume()
        expected = {job_id: status_of(versions[-1]) for job_id, versions in jobs.items()}
        await wait_for_statuses(store, backend, expected)
        assert not watcher.paused and watcher.stats.scans == scans + 1
        write_version(queue, 3, lifecycle(3, "success")[0])  # watched again: inotify tells
        await wait_for_statuses(store, backend, {**expected, 3: "queued"})


async def test_a_watch_paused_before_it_starts_is_ready_and_reads_at_its_resume(
    sqlite_url: str, queue: Path
) -> None:
    backend = new_backend("paused-first")
    versions = lifecycle(1, "success")
    for content in versions:
        write_version(queue, 1, content)
    async with Store(sqlite_url) as store:
        watcher = QueueWatcher(queue, store, backend)
        watcher.pause()  # (a dispatcher's first lease round can come before its watcher runs)
        task = asyncio.create_task(watcher.run())
        try:
            await asyncio.wait_for(watcher.ready.wait(), DEADLINE)
            assert watcher._inotify is None and watcher.stats.files_read == 0
            watcher.resume()
            await wait_for_statuses(store, backend, {1: status_of(versions[-1])})
        finally:
            watcher.stop()
            await asyncio.wait_for(task, DEADLINE)


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

        await eventually(lambda: archived(7), what="job 7 to be archived")
        job_7 = await store.get_job(backend, 7)
        assert job_7 is not None and job_7.status is JobStatus.SUCCESS and job_7.revision == jobs[7].revision
        assert keys(await checked_events(store, backend, 7)) == events_7

        for content in lifecycle(8)[3:]:
            write_version(queue, 8, content)
        archive(queue, 8)
        await eventually(lambda: archived(8), what="job 8 to be archived")
        await wait_for_statuses(store, backend, {8: "success"})

        # jobs 10000 and up go to archive/1/, a folder made after the watcher started
        for job_id in (10003, 10004):
            for content in lifecycle(job_id, "error"):
                write_version(queue, job_id, content)
        await wait_for_statuses(store, backend, {10003: "error", 10004: "error"})
        assert not (queue / "archive" / "1").exists()
        archive(queue, 10003)  # makes archive/1/ and renames into it at once
        await eventually(lambda: archived(10003), what="job 10003 to be archived")
        archive(queue, 10004)  # through the new folder's own watch
        await eventually(lambda: archived(10004), what="job 10004 to be archived")
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

        def losing(mask: int, watch: Any, name: str | None) -> None:
            if name is not None and name.startswith("job-"):
                if mask & Mask.MOVED_TO:
                    lost.append(name)
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
        await eventually(lambda: len(lost) >= written, what="the events to be lost")
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

        lost: list[tuple[int, str | None]] = []
        watcher.on_event = lambda mask, watch, name: lost.append((mask, name))  # type: ignore[method-assign]
        archive(queue, 10003)  # makes archive/1/, and its CREATE is lost with the rest
        await eventually(
            lambda: (Mask.CREATE | Mask.ISDIR, "1") in lost, what="the folder's event to be lost"
        )
        del watcher.on_event
        watcher.on_event(Mask.Q_OVERFLOW, None, None)

        async def archived(job_id: int) -> bool:
            job = await store.get_job(backend, job_id)
            return job is not None and job.archived

        await eventually(lambda: archived(10003), what="the rescan to find job 10003 archived")
        archive(queue, 10004)  # the rescan watches the new folder from now on
        await eventually(lambda: archived(10004), what="job 10004 to be seen archived")
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
