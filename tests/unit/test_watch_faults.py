"""The queue watcher when things go wrong: the queue directory missing, replaced, not a directory
or unreadable, bad job files, inotify limits; and stopping it (helpers in ``tests/_watch.py``).

Every wait is a poll with a generous deadline, never a timing assertion.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import asyncinotify
import pytest
from asyncinotify import Mask

from synnefo_ganeti.store import Store
from synnefo_ganeti.testing._queue import QueueDir
from synnefo_ganeti.watch import QueueWatcher, check_inotify_limits
from tests._watch import (
    DEADLINE,
    T0,
    WATCH_LOGGER,
    add_watch_attempts,
    bad_files_metric,
    checked_events,
    lifecycle,
    new_backend,
    rename_into_place,
    settle,
    statuses,
    wait_for_statuses,
    watch_records,
    watching,
    write_version,
)
from tests.helpers import eventually

# -- 6. the queue directory missing, replaced, not a directory, unreadable ------------------------


async def test_missing_queue_dir_is_retried_then_watched(
    sqlite_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger=WATCH_LOGGER)
    backend = new_backend("missing")
    queue = tmp_path / "queue"
    attempts = add_watch_attempts(monkeypatch, queue)
    async with Store(sqlite_url) as store, watching(queue, store, backend, retry_interval=0.02) as watcher:
        await eventually(
            lambda: bool(watch_records(caplog, str(queue), "does not exist")), what="the log line"
        )
        await eventually(lambda: len(attempts) >= 4, what="several retries")  # and still one line:
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
        await eventually(lambda: watcher.stats.watch_lost >= 1, what="the watch to be lost")
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
    sqlite_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = new_backend("file")
    queue = tmp_path / "queue"
    queue.write_text("not a directory\n")
    attempts = add_watch_attempts(monkeypatch, queue)
    async with Store(sqlite_url) as store, watching(queue, store, backend, retry_interval=0.02) as watcher:
        await eventually(
            lambda: bool(watch_records(caplog, str(queue), "is not a directory")), what="the log line"
        )
        await eventually(lambda: len(attempts) >= 4, what="several retries")  # and still one line:
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
        await eventually(lambda: len(refused) >= 3, what="a few retries")
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
        await eventually(lambda: len(refused) >= 3, what="a few retries")
        lines = watch_records(caplog, str(queue), "permission denied")
        assert len(lines) == 1
        assert await statuses(store, backend) == {}
        monkeypatch.setattr(os, "scandir", scandir)
        await wait_for_statuses(store, backend, {1: "success"})
        await eventually(
            lambda: bool(watch_records(caplog, str(queue), "usable again")), what="the recovery line"
        )


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
        await eventually(lambda: watcher.stats.bad_files == 7, what="the bad files to be counted")

        (queue / "job-8").mkdir()  # only a scan finds a directory; the overflow's rescan
        watcher.on_event(Mask.Q_OVERFLOW, None, None)  # also reads the bad files again
        await eventually(lambda: watcher.stats.bad_files == 8, what="the directory to be counted")
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
        await eventually(lambda: watcher.stats.bad_files == 9, what="the new bad version to be counted")
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
