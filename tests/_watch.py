"""Writing job files the way Ganeti does, and running a queue watcher and waiting for it: shared by
``tests/unit/test_watch*.py``, ``test_bad_input.py`` and ``benchmarks/bad_input.py``.

Job files are written the way Ganeti writes them: a temp file (luxid's
``job-<id>-<pid>-<n>.tmp``, the executor's ``job-<id><8 chars>.new``) renamed over
``job-<id>``; archiving renames ``job-<id>`` into ``archive/<id // 10000>/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import json
import os
import random
import string
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any

import asyncinotify
import pytest
from asyncinotify import Mask

from synnefo_ganeti import metrics
from synnefo_ganeti.jobs import EventKind, parse_job_file
from synnefo_ganeti.store import Store, StoredEvent
from synnefo_ganeti.watch import QueueWatcher
from tests.helpers import eventually

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


async def statuses(store: Store, backend: str) -> dict[int, str]:
    return {job.job_id: job.status.value for job in await store.list_jobs(backend=backend)}


async def wait_for_statuses(store: Store, backend: str, expected: dict[int, str]) -> dict[int, str]:
    """Until the store holds every job of ``expected`` with that status; returns all it holds."""
    got: dict[int, str] = {}

    async def reached() -> bool:
        nonlocal got
        got = await statuses(store, backend)
        return all(got.get(job_id) == status for job_id, status in expected.items())

    try:
        await eventually(reached, timeout=DEADLINE, what=f"the statuses {expected}")
    except AssertionError:
        wrong = {
            job_id: (got.get(job_id), status)
            for job_id, status in expected.items()
            if got.get(job_id) != status
        }
        raise AssertionError(f"gave up after {DEADLINE} s; (stored, expected) differ for {wrong}") from None
    return got


async def settle(watcher: QueueWatcher, store: Store, quiet: float = 0.2) -> None:
    """Until the watcher has nothing pending and has seen nothing new for ``quiet`` seconds,
    then until the store has written what it was given."""
    loop = asyncio.get_running_loop()
    last: tuple[int, ...] | None = None
    since = loop.time()

    def settled() -> bool:
        nonlocal last, since
        s = watcher.stats
        now = (s.events, s.scans, s.files_read, s.bad_files, s.vanished, store.pending)
        if now != last or watcher._pending:
            last, since = now, loop.time()
            return False
        return loop.time() - since >= quiet

    await eventually(settled, timeout=DEADLINE, what=f"the watcher to settle ({watcher.stats})")
    await store.flush()


def add_watch_attempts(monkeypatch: pytest.MonkeyPatch, path: Path) -> list[str]:
    """Every ``inotify_add_watch`` of ``path`` from now on (each retry of a watcher tries one)."""
    add_watch = asyncinotify.Inotify.add_watch
    attempts: list[str] = []

    def counting(self: asyncinotify.Inotify, watched: Any, mask: Mask) -> asyncinotify.Watch:
        if Path(watched) == path:
            attempts.append(os.fspath(watched))
        return add_watch(self, watched, mask)

    monkeypatch.setattr(asyncinotify.Inotify, "add_watch", counting)
    return attempts


@contextlib.asynccontextmanager
async def watching(queue: Path, store: Store, backend: str, **kwargs: Any) -> AsyncIterator[QueueWatcher]:
    """A running watcher; on exit it must still be running (it never ends by itself), then it is stopped."""
    watcher = QueueWatcher(queue, store, backend, **kwargs)
    task = asyncio.create_task(watcher.run(), name=f"test watcher {backend}")
    try:
        await eventually(lambda: watcher.ready.is_set() or task.done(), what="the watcher to be ready")
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
