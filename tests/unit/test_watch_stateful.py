"""The queue watcher against a model, driven by hypothesis.

Rules write job files the way Ganeti does (temp file renamed over ``job-<id>``), each
job progressing through a generated lifecycle (queued -> waiting -> running, with log
lines and maybe a lock retry sending it back to waiting -> success/error, or queued ->
canceled); rewrite the same version; delete a job file; archive an ended job into
``archive/<id // 10000>/``; inject an inotify overflow; restart the watcher (and maybe
the store) on the same database; and let the event loop run for a moment.

The model is the last version written of each job. After letting the watcher settle,
every job whose last version is in the queue or the archive must be stored as that
version; a stored final status is never replaced; each job's events are numbered
1..n with no gap, carry every log line once, and never repeat themselves back to back.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import os
import random
import shutil
import string
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from asyncinotify import Mask
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from synnefo_ganeti.jobs import EventKind, JobStatus, calc_job_status
from synnefo_ganeti.store import Store, StoredEvent, StoredJob
from synnefo_ganeti.watch import QueueWatcher
from tests.helpers import eventually

BACKEND = "stateful"
T0 = 1_795_327_455
DEADLINE = 10.0
SHRINK_DEADLINE = 3.0
MAX_JOBS = 10
_SHM = "/dev/shm"
_RANDOM = string.ascii_lowercase + string.digits
_temp_counter = itertools.count(1)

Timestamp = list[int]


def build_lifecycle(
    job_id: int, ops: int, logs: list[int], retry: int | None, outcome: str
) -> list[dict[str, Any]]:
    """Every version Ganeti would write of a job of ``ops`` opcodes, shaped like the fixtures'."""
    clock = itertools.count(T0 + job_id * 1000)

    def tick() -> Timestamp:
        return [next(clock), 0]

    op_list: list[dict[str, Any]] = [
        {
            "input": {
                "OP_ID": "OP_TEST_DELAY" if index else "OP_INSTANCE_REBOOT",
                "instance_name": f"vm{job_id}.example.com",
                "duration": 1.0,
                "dry_run": False,
                "priority": 0,
                "depends": None,
                "comment": None,
                "reason": [
                    ["gnt:client:gnt-debug", "submit-job", T0 * 10**9],
                    ["gnt:opcode:x", f"job={job_id};index={index}", T0 * 10**9],
                ],
            },
            "status": "queued",
            "result": None,
            "log": [],
            "priority": 0,
            "start_timestamp": None,
            "exec_timestamp": None,
            "end_timestamp": None,
        }
        for index in range(ops)
    ]
    job: dict[str, Any] = {
        "id": job_id,
        "ops": op_list,
        "received_timestamp": tick(),
        "start_timestamp": None,
        "end_timestamp": None,
    }
    versions = [copy.deepcopy(job)]

    def snapshot() -> None:
        versions.append(copy.deepcopy(job))

    if outcome == "canceled":  # luxid cancels a queued job
        end = tick()
        for op in op_list:
            op.update(status="canceled", end_timestamp=end)
        job["end_timestamp"] = end
        snapshot()
        return versions
    job.update(livelock=f"/var/run/ganeti/livelocks/job_{job_id:06d}_{T0}", process_id=4000 + job_id)
    serial = 0
    for index, op in enumerate(op_list):
        op.update(status="waiting", start_timestamp=tick())
        if index == 0:
            job["start_timestamp"] = op["start_timestamp"]
        snapshot()
        op.update(status="running", exec_timestamp=tick())
        snapshot()
        if retry == index:  # a lock retry sends it back to waiting, without a new timestamp
            op["status"] = "waiting"
            snapshot()
            op.update(status="running", exec_timestamp=tick())
            snapshot()
        for _ in range(logs[index]):
            serial += 1
            op["log"].append([serial, tick(), "message", f"* job {job_id} op {index} step {serial}"])
            snapshot()
        last = index == ops - 1
        if last and outcome == "error":
            op.update(status="error", end_timestamp=tick(), result=["OpExecError", [f"job {job_id} failed"]])
        else:
            op.update(status="success", end_timestamp=tick(), result=None)
        if last:
            job["end_timestamp"] = tick()
        snapshot()
    return versions


@dataclass
class ModelJob:
    job_id: int
    versions: list[dict[str, Any]]
    written: int = 0  # how many of the versions were written; the last written is in the file
    where: str = "queue"  # queue, archive, deleted

    @property
    def latest(self) -> dict[str, Any]:
        return self.versions[self.written - 1]

    @property
    def status(self) -> JobStatus:
        return calc_job_status(op["status"] for op in self.latest["ops"])

    @property
    def done(self) -> bool:
        return self.written == len(self.versions)

    @property
    def log_serials(self) -> list[int]:
        return sorted(line[0] for op in self.latest["ops"] for line in op["log"])


def _time(value: Timestamp | None) -> float | None:
    return None if value is None else value[0] + value[1] / 1_000_000


def write_file(folder: Path, job_id: int, content: dict[str, Any]) -> None:
    """One version as Ganeti writes it: luxid's compact ``.tmp`` or the executor's ``.new``, renamed."""
    if random.random() < 0.5:
        data = json.dumps(content, separators=(",", ":")).encode()
        temp = folder / f"job-{job_id}-{os.getpid()}-{next(_temp_counter)}.tmp"
    else:
        data = (json.dumps(content) + "\n").encode()
        temp = folder / f"job-{job_id}{''.join(random.choices(_RANDOM, k=8))}.new"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.rename(temp, folder / f"job-{job_id}")


def lifecycles() -> st.SearchStrategy[tuple[int, list[int], int | None, str]]:
    return st.tuples(
        st.integers(1, 3),
        st.lists(st.integers(0, 3), min_size=3, max_size=3),
        st.none() | st.integers(0, 2),
        st.sampled_from(["success", "success", "error", "canceled"]),
    )


class WatcherMachine(RuleBasedStateMachine):
    failed = False  # a check timed out in this process (hypothesis is shrinking it)

    def __init__(self) -> None:
        super().__init__()
        base = _SHM if os.path.isdir(_SHM) and os.access(_SHM, os.W_OK) else None
        self.tmp = Path(tempfile.mkdtemp(prefix="sg-watch-stateful-", dir=base))
        self.queue = self.tmp / "queue"
        (self.queue / "archive").mkdir(parents=True)
        (self.queue / "version").write_text("1\n")
        (self.queue / "lock").touch()
        self.url = f"sqlite:///{self.tmp / 'store.db'}"
        self.model: dict[int, ModelJob] = {}
        self.final_seen: dict[int, JobStatus] = {}
        self.next_ids = {folder: itertools.count(folder * 10000 + 1) for folder in range(3)}
        self.broken = False
        self.loop = asyncio.new_event_loop()
        self.store: Store | None = None
        self.watcher: QueueWatcher | None = None
        self.task: asyncio.Task[None] | None = None
        self.run(self._open_store())
        self.run(self._start_watcher())

    # -- the event loop, the store and the watcher -----------------------------------------------

    def run(self, coroutine: Any) -> Any:
        try:
            return self.loop.run_until_complete(coroutine)
        except BaseException:
            self.broken = True
            raise

    async def _open_store(self) -> None:
        self.store = Store(self.url)
        await self.store.open()

    async def _start_watcher(self) -> None:
        assert self.store is not None
        watcher = QueueWatcher(self.queue, self.store, BACKEND, retry_interval=0.05, read_batch=4)
        self.watcher = watcher
        self.task = asyncio.create_task(watcher.run())
        task = self.task
        await eventually(
            lambda: watcher.ready.is_set() or task.done(), timeout=DEADLINE, what="the watcher ready"
        )

    async def _stop_watcher(self) -> None:
        if self.watcher is not None and self.task is not None:
            self.watcher.stop()
            await asyncio.wait_for(self.task, DEADLINE)
        self.watcher = self.task = None

    def teardown(self) -> None:
        try:
            if not self.broken:
                self.run(self._check())
        finally:
            try:
                if not self.loop.is_closed():
                    self.loop.run_until_complete(self._close())
                    self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            finally:
                self.loop.close()
                shutil.rmtree(self.tmp, ignore_errors=True)

    async def _close(self) -> None:
        try:
            await self._stop_watcher()
        finally:
            if self.store is not None:
                await self.store.close()
                self.store = None

    # -- rules -----------------------------------------------------------------------------------

    def _jobs(self, where: str, *, final: bool | None = None, more: bool = False) -> list[int]:
        return sorted(
            job.job_id
            for job in self.model.values()
            if job.where == where
            and (final is None or job.status.is_final == final)
            and (not more or not job.done)
        )

    @precondition(lambda self: len(self.model) < MAX_JOBS)
    @rule(plan=lifecycles(), folder=st.sampled_from([0, 1, 2]))
    def submit(self, plan: tuple[int, list[int], int | None, str], folder: int) -> None:
        """A new job; ``folder`` picks its id range, so its ``archive/<id // 10000>/`` folder."""
        ops, logs, retry, outcome = plan
        job_id = next(self.next_ids[folder])
        job = ModelJob(
            job_id,
            build_lifecycle(job_id, ops, logs, retry if retry is not None and retry < ops else None, outcome),
        )
        self.model[job_id] = job
        write_file(self.queue, job_id, job.versions[0])
        job.written = 1

    @precondition(lambda self: self._jobs("queue", more=True))
    @rule(data=st.data(), steps=st.integers(1, 4))
    def advance(self, data: st.DataObject, steps: int) -> None:
        job = self.model[data.draw(st.sampled_from(self._jobs("queue", more=True)), label="job")]
        for _ in range(steps):
            if job.done:
                break
            job.written += 1
            write_file(self.queue, job.job_id, job.latest)

    @precondition(lambda self: self._jobs("queue", more=True))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        """The rest of a job's versions in one burst (most are coalesced by the watcher)."""
        job = self.model[data.draw(st.sampled_from(self._jobs("queue", more=True)), label="job")]
        while not job.done:
            job.written += 1
            write_file(self.queue, job.job_id, job.latest)

    @precondition(lambda self: self._jobs("queue"))
    @rule(data=st.data())
    def rewrite(self, data: st.DataObject) -> None:
        job = self.model[data.draw(st.sampled_from(self._jobs("queue")), label="job")]
        write_file(self.queue, job.job_id, job.latest)

    @precondition(lambda self: len(self._jobs("queue")) + len(self._jobs("archive")) >= 2)
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(self._jobs("queue") + self._jobs("archive")), label="job")
        job = self.model[job_id]
        os.unlink(self._path(job))
        job.where = "deleted"

    @precondition(lambda self: self._jobs("queue", final=True))
    @rule(data=st.data())
    def archive(self, data: st.DataObject) -> None:
        job = self.model[data.draw(st.sampled_from(self._jobs("queue", final=True)), label="job")]
        folder = self.queue / "archive" / str(job.job_id // 10000)
        folder.mkdir(exist_ok=True)
        os.rename(self._path(job), folder / f"job-{job.job_id}")
        job.where = "archive"

    @precondition(lambda self: bool(self.model))
    @rule(lose=st.booleans())
    def overflow(self, lose: bool) -> None:
        """An inotify queue overflow: with ``lose``, the events queued meanwhile are lost first."""

        async def inject() -> None:
            watcher = self.watcher
            assert watcher is not None
            if lose:
                watcher.on_event = lambda mask, watch, name: None  # type: ignore[method-assign]
                try:  # a window in which every event is dropped, as the kernel does on overflow
                    await asyncio.sleep(0.02)
                finally:
                    del watcher.on_event
            watcher.on_event(Mask.Q_OVERFLOW, None, None)

        self.run(inject())

    @precondition(lambda self: bool(self.model))
    @rule(reopen_store=st.booleans())
    def restart(self, reopen_store: bool) -> None:
        async def restart() -> None:
            await self._stop_watcher()
            if reopen_store:
                assert self.store is not None
                await self.store.close()
                await self._open_store()
            await self._start_watcher()

        self.run(restart())

    @rule(seconds=st.sampled_from([0.0, 0.002, 0.01, 0.05]))
    def let_it_run(self, seconds: float) -> None:
        self.run(asyncio.sleep(seconds))  # not ordering anything: lets the watcher interleave differently

    @precondition(lambda self: bool(self.model))
    @rule()
    def settle_and_check(self) -> None:
        self.run(self._check())

    @invariant()
    def watcher_alive(self) -> None:
        if self.task is None or self.task.done():
            self.broken = True
            raise AssertionError(f"the watcher ended by itself: {self.task}")

    def _path(self, job: ModelJob) -> Path:
        if job.where == "archive":
            return self.queue / "archive" / str(job.job_id // 10000) / f"job-{job.job_id}"
        return self.queue / f"job-{job.job_id}"

    # -- the check -------------------------------------------------------------------------------

    def _differences(self, stored: dict[int, StoredJob], events: dict[int, list[StoredEvent]]) -> list[str]:
        problems = []
        for job in self.model.values():
            if job.where == "deleted":
                continue
            got = stored.get(job.job_id)
            if got is None:
                problems.append(f"job {job.job_id}: not stored, expected {job.status}")
                continue
            ops = [
                (
                    op["status"],
                    _time(op["start_timestamp"]),
                    _time(op["exec_timestamp"]),
                    _time(op["end_timestamp"]),
                )
                for op in job.latest["ops"]
            ]
            got_ops = [
                (
                    op.status.value,
                    *(
                        None if t is None else t.timestamp()
                        for t in (op.start_time, op.exec_time, op.end_time)
                    ),
                )
                for op in got.ops
            ]
            serials = [e.log_serial for e in events.get(job.job_id, []) if e.kind is EventKind.LOG]
            if got.status is not job.status or got_ops != ops or serials != job.log_serials:
                problems.append(
                    f"job {job.job_id}: stored {got.status} {got_ops} logs {serials}, expected {ops} logs {job.log_serials}"
                )
            elif got.archived != (job.where == "archive"):
                problems.append(f"job {job.job_id}: archived={got.archived}, but it is in the {job.where}")
        return problems

    async def _check(self) -> None:
        store, watcher = self.store, self.watcher
        assert store is not None and watcher is not None
        # generous the first time; once a check has failed, hypothesis shrinks the failing
        # example by running it again and again, and each of those waits need not be as long
        wait = DEADLINE if not WatcherMachine.failed else SHRINK_DEADLINE
        problems: list[str] = []

        async def consistent() -> tuple[Any, Any] | None:
            nonlocal problems
            await store.flush()
            snapshot = await self._snapshot(store)
            problems = self._differences(*snapshot)
            if problems or watcher._pending or store.pending != 0:
                return None
            # jobs and events are two reads: a version of a deleted job (which need not
            # match anything) may be committed between them; check a snapshot that held still
            await store.flush()
            return snapshot if snapshot == await self._snapshot(store) else None

        try:
            stored, events = await eventually(consistent, timeout=wait, what="the store to match the model")
        except AssertionError:
            WatcherMachine.failed = True
            raise AssertionError(f"after {wait} s ({watcher.stats}): " + "; ".join(problems)) from None
        for job_id, job in stored.items():
            self._check_events(job, events.get(job_id, []))
            if job_id in self.final_seen:
                assert job.status is self.final_seen[job_id], (
                    f"job {job_id}: final {self.final_seen[job_id]} replaced by {job.status}"
                )
            if job.status.is_final:
                self.final_seen[job_id] = job.status

    @staticmethod
    async def _snapshot(store: Store) -> tuple[dict[int, StoredJob], dict[int, list[StoredEvent]]]:
        stored = {job.job_id: job for job in await store.list_jobs(backend=BACKEND)}
        events: dict[int, list[StoredEvent]] = {}
        for event in await store.list_events(backend=BACKEND, limit=None):
            events.setdefault(event.job_id, []).append(event)
        return stored, events

    @staticmethod
    def _check_events(job: StoredJob, events: list[StoredEvent]) -> None:
        keys = [(e.kind, e.op_index, e.status, e.log_serial) for e in events]
        assert [e.seq for e in events] == list(range(1, len(events) + 1)), f"job {job.job_id}: seqs {keys}"
        assert job.event_count == len(events), f"job {job.job_id}: event_count {job.event_count}, {keys}"
        assert all(a != b for a, b in itertools.pairwise(keys)), f"job {job.job_id}: repeats {keys}"
        serials = [e.log_serial for e in events if e.kind is EventKind.LOG]
        assert serials == sorted(set(serials)), f"job {job.job_id}: log serials {serials}"
        job_statuses = [e.status for e in events if e.kind is EventKind.JOB_STATUS]
        assert job_statuses and job_statuses[-1] is job.status, f"job {job.job_id}: {keys}"
        assert all(not s.is_final for s in job_statuses[:-1]), (
            f"job {job.job_id}: a final status replaced: {keys}"
        )
        if job.status.is_final:  # nothing after the end
            assert events[-1].kind is EventKind.JOB_STATUS, f"job {job.job_id}: {keys}"


TestWatcherMachine = WatcherMachine.TestCase
# slow: some 20 s of hypothesis-driven runs; the timeout leaves room to shrink a failure and report it
TestWatcherMachine.pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
TestWatcherMachine.settings = settings(
    max_examples=30,
    stateful_step_count=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
