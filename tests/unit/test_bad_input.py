"""Bad input to the watcher and the CLI, every case in one place (issue 7), end to end.

Watcher cases: a real :class:`QueueWatcher` on real inotify follows a temporary queue
directory into a real :class:`Store` (SQLite and PostgreSQL) that already holds some good
jobs; then the bad input arrives. Each test checks that the bad file is skipped with one
log line naming the file and what is wrong, that the bad-files counter went up by one per
bad version (and not again when a rescan reads it once more), that the jobs stored
before are unchanged, that a job written after is stored, and that the file, once
rewritten valid, is stored.

Config cases go through the CLI (``reconcile`` and ``backends list``): exit status 2, one
``error:`` line naming the file and the key, no password in the output, and not a row
of the database changed.

Many of these are also covered, less compactly, by older tests; each test names them.
``benchmarks/bad_input.py`` measures the same watcher cases for docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import shutil
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from asyncinotify import Mask
from click.testing import CliRunner

from synnefo_ganeti import metrics
from synnefo_ganeti.cli import main
from synnefo_ganeti.jobs import parse_job_file
from synnefo_ganeti.jobs._files import MAX_JOB_FILE_BYTES
from synnefo_ganeti.store import JobVersion, Store
from synnefo_ganeti.testing._queue import QueueDir
from synnefo_ganeti.watch import QueueWatcher
from tests._watch import (
    WATCH_LOGGER,
    bad_files_metric,
    keys,
    lifecycle,
    new_backend,
    rename_into_place,
    settle,
    temp_name,
    wait_for_statuses,
    watch_records,
    watching,
    write_version,
)
from tests.helpers import eventually

# -- enforcing file modes also for root ------------------------------------------------------------

# CI runs the tests as root, and root reads a file of mode 000: CAP_DAC_OVERRIDE (and
# CAP_DAC_READ_SEARCH) skip the permission check. Capabilities belong to a thread, and the
# event loop (the watcher's reads, the CLI's config loading) runs on this one: dropping the
# two from its effective set makes the kernel itself refuse with EACCES, as it does for
# the unprivileged user a misconfigured watcher runs as. They stay permitted, so they are
# raised again afterwards; other threads (the SQLite writer's) keep them throughout.

_CAP_VERSION_3 = 0x20080522
_CAP_DAC = (1 << 1) | (1 << 2)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _capset(libc: Any, header: _CapHeader, data: Any) -> None:
    if libc.capset(ctypes.byref(header), data) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"capset: {os.strerror(errno)}")


@contextlib.contextmanager
def file_modes_enforced() -> Iterator[None]:
    """File modes stop this thread's reads, also as root (see above); fails loudly if it cannot."""
    if os.geteuid() != 0:
        yield
        return
    libc = ctypes.CDLL(None, use_errno=True)
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"capget: {os.strerror(errno)}")
    saved = data[0].effective
    data[0].effective = saved & ~_CAP_DAC
    _capset(libc, header, data)
    try:
        yield
    finally:
        data[0].effective = saved
        _capset(libc, header, data)


def check_reads_are_refused(folder: Path) -> None:
    """The precondition of the permission tests: a file of mode 000 cannot be read here and now."""
    probe = folder / "probe-000"
    probe.write_bytes(b"x")
    probe.chmod(0)
    try:
        with pytest.raises(PermissionError):
            probe.read_bytes()
    finally:
        probe.unlink()


# -- a watcher that stored good jobs first ---------------------------------------------------------

#: stored before the bad input arrives: what "nothing stored is lost" is checked on
GOOD_BEFORE = {1: "success", 2: "error", 3: "canceled", 4: "running"}
BAD = 100  # the job whose file is bad
AFTER = 200  # jobs written after the bad input: the watcher still works


def good_versions(job_id: int, status: str) -> list[dict[str, Any]]:
    if status == "running":
        return lifecycle(job_id)[:3]
    return lifecycle(job_id, status)


JobSnapshot = tuple[str, int, int, bool, Any, tuple[Any, ...]]


async def snapshot(store: Store, backend: str) -> dict[int, JobSnapshot]:
    """Every stored job as it is: status, revision, events, archived, updated_at."""
    await store.flush()
    jobs = {}
    for job in await store.list_jobs(backend=backend):
        events = await store.list_events(backend=backend, job_id=job.job_id, limit=None)
        jobs[job.job_id] = (
            job.status.value,
            job.revision,
            job.event_count,
            job.archived,
            job.updated_at,
            tuple(keys(events)),
        )
    return jobs


def rescans(backend: str, reason: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "synnefo_ganeti_watch_rescans_total", {"backend": backend, "reason": reason}
    )
    return value or 0.0


@dataclass
class Run:
    watcher: QueueWatcher
    store: Store
    backend: str
    queue: Path
    before: dict[int, JobSnapshot]

    @property
    def bad_counted(self) -> float:
        return bad_files_metric(self.backend)

    async def stored(self) -> dict[int, JobSnapshot]:
        return await snapshot(self.store, self.backend)

    async def assert_nothing_lost_and_still_working(self, job_id: int = AFTER) -> None:
        """The jobs stored before are there unchanged; a job written now is stored."""
        now = await self.stored()
        assert {job: now.get(job) for job in self.before} == self.before
        for content in lifecycle(job_id):
            write_version(self.queue, job_id, content)
        await wait_for_statuses(self.store, self.backend, {job_id: "success"})
        now = await self.stored()
        assert {job: now.get(job) for job in self.before} == self.before


@contextlib.asynccontextmanager
async def good_jobs_stored(
    db_url: str, queue: Path, caplog: pytest.LogCaptureFixture, **kwargs: Any
) -> AsyncIterator[Run]:
    """A running watcher whose store holds GOOD_BEFORE; the log captured from here on."""
    caplog.set_level(logging.INFO, logger=WATCH_LOGGER)
    backend = new_backend("bad-input")
    for job_id, status in GOOD_BEFORE.items():
        for content in good_versions(job_id, status):
            write_version(queue, job_id, content)
    async with (
        Store(db_url) as store,
        watching(queue, store, backend, retry_interval=0.05, **kwargs) as watcher,
    ):
        await wait_for_statuses(store, backend, GOOD_BEFORE)
        await settle(watcher, store, quiet=0.1)
        before = await snapshot(store, backend)
        assert set(before) == set(GOOD_BEFORE)
        assert watcher.stats.bad_files == 0 and bad_files_metric(backend) == 0
        caplog.clear()
        yield Run(watcher, store, backend, queue, before)


def skipped_lines(caplog: pytest.LogCaptureFixture, path: Path) -> list[str]:
    return watch_records(caplog, f"skipping job file {path}:")


def warnings_about(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == WATCH_LOGGER and record.levelno >= logging.WARNING and name in record.getMessage()
    ]


# -- bad job files: each version skipped, logged once, counted once; fixed, stored -----------------


def _good_bytes(job_id: int = BAD) -> bytes:
    return json.dumps(lifecycle(job_id)[-1], separators=(",", ":")).encode()


def _oversize() -> bytes:
    job = lifecycle(BAD)[-1]
    job["ops"][0]["log"].append([3, [1_795_327_455, 0], "message", "x" * MAX_JOB_FILE_BYTES])
    return json.dumps(job).encode()


def _write(data: bytes) -> Callable[[Path], None]:
    return lambda queue: write_version(queue, BAD, data, luxid=True)


def _symlink(target_name: str) -> Callable[[Path], None]:
    def make(queue: Path) -> None:
        elsewhere = queue.parent / "elsewhere"
        elsewhere.mkdir(exist_ok=True)
        target = elsewhere / target_name
        target.write_bytes(_good_bytes())  # a valid job file: following the link would store it
        rename_into_place(queue, BAD, lambda temp: os.symlink(target, temp))

    return make


#: case -> its bad versions, written one after the other, each with what its log line says
BAD_FILES: dict[str, list[tuple[Callable[[Path], None], str]]] = {
    # older: test_watch_faults.py::test_bad_files_are_skipped_logged_and_counted_once (job 1)
    "truncated": [
        (_write(_good_bytes()[: len(_good_bytes()) // 2]), "truncated?"),
        (_write(_good_bytes()[:-1]), "truncated?"),
    ],
    # older: none with garbage; test_watch_faults.py::test_a_bad_file_at_start_does_not_stop_the_others (NUL bytes)
    "invalid_json": [
        (_write(b"{'id': 100, 'ops': []}\n"), "not JSON"),
        (_write(b"{'id': 100, 'ops': []}\n"), "not JSON"),  # the same bytes again: a new version
    ],
    # older: test_watch_faults.py::test_bad_files_are_skipped_logged_and_counted_once (jobs 6, 7)
    "wrong_shape": [
        (_write(b"[100, 101]"), "not a JSON object"),
        (_write(b'{"id": 100, "ops": []}'), "ops is missing or empty"),
        (_write(_good_bytes(7)), "it holds job 7, not 100"),
        (_write(b'{"id": "one hundred", "ops": [{}]}'), "id is 'one hundred', not a job number"),
    ],
    # older: test_watch_faults.py::test_bad_files_are_skipped_logged_and_counted_once (job 2)
    "non_utf8": [
        (_write(_good_bytes().replace(b"inst100.", b"inst100.\xff\xfe")), "not UTF-8"),
    ],
    # older: test_watch_faults.py::test_bad_files_are_skipped_logged_and_counted_once (job 3, a lowered limit);
    # here the real limit
    "oversize": [
        (_write(_oversize()), f"bytes, more than the {MAX_JOB_FILE_BYTES} a job file may have"),
    ],
    # older: test_watch_faults.py::test_bad_files_are_skipped_logged_and_counted_once (job 4),
    # test_a_bad_file_at_start_does_not_stop_the_others (a link to /dev/zero)
    "symlink": [
        (_symlink("job-100"), "a symlink; Ganeti writes job files as regular files"),
        (_symlink("job-100.copy"), "a symlink; Ganeti writes job files as regular files"),
    ],
}


@pytest.fixture
def case_db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database of the kind the test's parameters name (db_url's, for some cases only)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    url: str = request.getfixturevalue("make_pg_url")()
    return url


# every case on SQLite; on PostgreSQL (the slower fixture) two: the store side does not depend on the case
@pytest.mark.parametrize(
    ("case", "case_db"),
    [*((case, "sqlite") for case in BAD_FILES), ("truncated", "postgresql"), ("symlink", "postgresql")],
    indirect=["case_db"],
)
async def test_bad_job_file(case: str, case_db: str, queue: Path, caplog: pytest.LogCaptureFixture) -> None:
    versions = BAD_FILES[case]
    path = queue / f"job-{BAD}"
    async with good_jobs_stored(case_db, queue, caplog) as run:
        watcher = run.watcher
        for count, (make, _) in enumerate(versions, 1):
            make(queue)

            def counted(count: int = count) -> bool:
                return watcher.stats.bad_files == count

            await eventually(counted, what=f"bad version {count}")
        await settle(watcher, run.store, quiet=0.1)
        assert watcher.stats.bad_files == run.bad_counted == len(versions)
        lines = skipped_lines(caplog, path)
        assert len(lines) == len(versions), lines
        for line, (_, reason) in zip(lines, versions, strict=True):
            assert reason in line and "read again on its next change" in line, line
        assert warnings_about(caplog, f"job-{BAD}") == lines  # nothing else said about it
        assert BAD not in await run.stored()

        # a rescan reads the same bad file again: neither counted nor logged again
        watcher.on_event(Mask.Q_OVERFLOW, None, None)
        await settle(watcher, run.store, quiet=0.1)
        assert watcher.stats.bad_files == run.bad_counted == len(versions)
        assert skipped_lines(caplog, path) == lines

        # rewritten valid, it is stored
        write_version(queue, BAD, _good_bytes())
        await wait_for_statuses(run.store, run.backend, {BAD: "success"})
        assert len(watch_records(caplog, f"job file {path} is readable again")) == 1
        assert run.bad_counted == len(versions)
        await run.assert_nothing_lost_and_still_working()


# -- names that are not job files: ignored silently ------------------------------------------------


async def test_unknown_names_are_ignored_silently(
    db_url: str, queue: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Older: test_watch.py::test_replay_of_recorded_files (its junk())."""
    async with good_jobs_stored(db_url, queue, caplog) as run:
        names = [
            "job-abc",
            "foo",
            "job-07x",
            "job-",
            "job-904.bak",
            "JOB-905",
            "job--906",
            "job-907\n",
            "job-\u0669\u0660\u0668",
        ]
        for index, name in enumerate(names):
            data = _good_bytes(900 + index)  # a valid job (907: "job-907\n", 908: "job-٩٠٨"): never read
            temp = queue / f"tmp-{index}"
            temp.write_bytes(data)
            os.rename(temp, queue / name)  # MOVED_TO of the name
            (queue / name).write_bytes(data)  # CLOSE_WRITE of the name
        (queue / "archive" / "abc").mkdir()  # not an archive folder either
        (queue / "archive" / "abc" / "job-950").write_bytes(_good_bytes(950))
        watcher = run.watcher
        events = watcher.stats.events
        await run.assert_nothing_lost_and_still_working()  # written after: its storing is the barrier
        assert watcher.stats.events > events
        watcher.on_event(Mask.Q_OVERFLOW, None, None)  # a rescan ignores them too
        await settle(watcher, run.store, quiet=0.1)
        assert set(await run.stored()) == {*GOOD_BEFORE, AFTER}
        assert watcher.stats.bad_files == run.bad_counted == 0
        for name in names:
            assert not warnings_about(caplog, name), name
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
            f"inotify queue overflow on {queue}: rescanning (no change is lost)"
        ]


# -- Ganeti's temp names: never read; the rename is ------------------------------------------------


async def test_temp_names_are_ignored_until_renamed(
    db_url: str, queue: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Ganeti's real temp names (tests/fixtures/ganeti-3.0-queue/README.md): luxid's
    ``job-<id>-<pid>-<n>.tmp``, the executor's ``job-<id><8 chars>.new``, the serial's
    ``serial-<pid>-<n>.tmp``. Older: test_watch.py::test_replay_of_recorded_files,
    test_fake_queue_inotify.py::test_every_version_arrives_by_rename."""
    async with good_jobs_stored(db_url, queue, caplog) as run:
        watcher = run.watcher
        versions = lifecycle(BAD)
        luxid = queue / temp_name(BAD, luxid=True)
        executor = queue / temp_name(BAD, luxid=False)
        luxid.write_bytes(json.dumps(versions[0]).encode())  # written, closed, not yet renamed
        executor.write_bytes(json.dumps(versions[-1]).encode())  # left behind: a crash before the rename
        QueueDir(queue).write_serial(BAD)
        await run.assert_nothing_lost_and_still_working()  # the barrier: later events are handled
        watcher.on_event(Mask.Q_OVERFLOW, None, None)  # neither does a rescan read them
        await settle(watcher, run.store, quiet=0.1)
        assert BAD not in await run.stored()

        os.rename(luxid, queue / f"job-{BAD}")  # the rename is the version
        await wait_for_statuses(run.store, run.backend, {BAD: "queued"})
        await settle(watcher, run.store, quiet=0.1)
        assert (await run.stored())[BAD][0] == "queued"  # never the leftover's "success"
        assert executor.exists() and watcher.stats.bad_files == run.bad_counted == 0
        assert not [
            r for r in caplog.records if r.levelno >= logging.WARNING and "overflow" not in r.getMessage()
        ]


# -- the queue directory removed and recreated -----------------------------------------------------


async def test_queue_dir_removed_and_recreated(
    db_url: str, queue: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Older: test_watch_faults.py::test_queue_dir_removed_or_replaced_while_watched."""
    async with good_jobs_stored(db_url, queue, caplog) as run:
        watcher = run.watcher
        shutil.rmtree(queue)
        await eventually(lambda: watcher.stats.watch_lost == 1, what="the watch to be lost")
        assert await run.stored() == run.before  # the files are gone, the stored jobs are not
        QueueDir(queue)
        for job_id in (300, 301):
            for content in lifecycle(job_id, "error"):
                write_version(queue, job_id, content)
        await wait_for_statuses(run.store, run.backend, {300: "error", 301: "error"})
        assert rescans(run.backend, "watch_lost") == 1
        assert watcher.stats.bad_files == run.bad_counted == 0
        assert len(watch_records(caplog, f"lost the watch on {queue}")) == 1
        assert len(watch_records(caplog, f"queue directory {queue}: does not exist; retrying every")) == 1
        assert len(watch_records(caplog, f"queue directory {queue} is usable again; rescanning")) == 1
        await run.assert_nothing_lost_and_still_working()


# -- permission denied on one file -----------------------------------------------------------------


async def test_permission_denied_on_one_file(
    db_url: str, queue: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A job file of mode 000, refused by the kernel itself (as root too: file_modes_enforced).
    Older: test_watch.py::test_permission_denied_on_watch and ..._on_scan (the directory, simulated)."""
    path = queue / f"job-{BAD}"
    async with good_jobs_stored(db_url, queue, caplog) as run:
        watcher = run.watcher
        with file_modes_enforced():
            check_reads_are_refused(queue.parent)

            def unreadable(temp: Path) -> None:
                temp.write_bytes(_good_bytes())
                temp.chmod(0)

            rename_into_place(queue, BAD, unreadable)
            await eventually(lambda: watcher.stats.bad_files == 1, what="the unreadable file to be counted")
            watcher.on_event(Mask.Q_OVERFLOW, None, None)  # read again: not counted again
            await settle(watcher, run.store, quiet=0.1)
        assert watcher.stats.bad_files == run.bad_counted == 1
        (line,) = skipped_lines(caplog, path)
        assert "permission denied (run the watcher as a user that can read Ganeti's queue" in line
        assert BAD not in await run.stored()

        write_version(queue, BAD, _good_bytes())  # rewritten readable
        await wait_for_statuses(run.store, run.backend, {BAD: "success"})
        assert len(watch_records(caplog, f"job file {path} is readable again")) == 1
        await run.assert_nothing_lost_and_still_working()


# -- an inotify queue overflow ---------------------------------------------------------------------


async def test_inotify_overflow_rescans(db_url: str, queue: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The kernel's IN_Q_OVERFLOW injected where decoded events enter (QueueWatcher.on_event),
    after events were lost. Older: test_watch.py::test_overflow_rescans."""
    async with good_jobs_stored(db_url, queue, caplog) as run:
        watcher = run.watcher
        write_version(queue, BAD, _good_bytes()[:40])  # a bad file before the overflow
        await eventually(lambda: watcher.stats.bad_files == 1, what="the bad file to be counted")

        lost: list[str] = []
        deliver = watcher.on_event

        def losing(mask: int, watch: Any, name: str | None) -> None:
            if name is not None and name.startswith("job-"):
                lost.append(name)
                return
            deliver(mask, watch, name)

        watcher.on_event = losing  # type: ignore[method-assign]
        for job_id in (400, 401):
            for content in lifecycle(job_id):
                write_version(queue, job_id, content)
        await eventually(lambda: len(lost) == 2 * len(lifecycle(400)), what="the events to be lost")
        await settle(watcher, run.store, quiet=0.1)
        assert 400 not in await run.stored()
        del watcher.on_event

        watcher.on_event(Mask.Q_OVERFLOW, None, None)
        await wait_for_statuses(run.store, run.backend, {400: "success", 401: "success"})
        await settle(watcher, run.store, quiet=0.1)
        assert watcher.stats.overflows == 1 and rescans(run.backend, "overflow") == 1
        assert len(watch_records(caplog, f"inotify queue overflow on {queue}: rescanning")) == 1
        assert watcher.stats.bad_files == run.bad_counted == 1  # the rescan read the bad file again
        assert len(skipped_lines(caplog, queue / f"job-{BAD}")) == 1
        await run.assert_nothing_lost_and_still_working()


# -- bad config files through the CLI: exit 2, one clear line, no secret, no row changed --------------

INLINE_SECRET = "inline-Secret-4711"
FILE_SECRET = "file-Secret-0815"
GOOD_BACKEND = f"""\
[[backends]]
name = "athens"
url = "https://ganeti.athens.example.org:5080"
username = "synnefo"
password = "{INLINE_SECRET}"
"""


@pytest.fixture(autouse=True)
def _no_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("SYNNEFO_GANETI_"):
            monkeypatch.delenv(name)


def database_rows(path: Path) -> list[str]:
    """Every row of every table (SQL text), read without the store."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


def make_database(path: Path) -> Path:
    """A SQLite store at ``path`` holding two jobs of backend athens (the config files below name it)."""

    async def fill() -> None:
        async with Store(f"sqlite:///{path}") as store:
            for job_id in (1, 2):
                await store.put(JobVersion("athens", parse_job_file(_good_bytes(job_id)), False))
            await store.flush()

    asyncio.run(fill())
    return path


@pytest.fixture
def database(tmp_path: Path) -> Path:
    return make_database(tmp_path / "store.db")


def config_file(tmp_path: Path, database: Path, backend: str) -> Path:
    path = tmp_path / "sg.toml"
    path.write_text(f'[database]\nurl = "sqlite:///{database}"\n\n{GOOD_BACKEND}\n{backend}')
    path.chmod(0o644)
    return path


def password_file(tmp_path: Path, mode: int) -> Path:
    path = tmp_path / "patras.password"
    path.write_text(FILE_SECRET + "\n")
    path.chmod(mode)
    return path


def with_password_file(extra: str = "") -> str:
    return (
        '[[backends]]\nname = "patras"\nurl = "https://ganeti.patras.example.org:5080"\n'
        f'username = "synnefo"\npassword_file = "patras.password"\n{extra}'
    )


#: case -> (the second backend's table, the password file's mode or None, the expected lines' tails)
CONFIGS: dict[str, tuple[str, int | None, list[str]]] = {
    # older: test_config.py::test_missing_required_keys
    "missing_keys": (
        '[[backends]]\nname = "patras"\n',
        None,
        ["backends.1.url: this key is required", "backends.1.username: this key is required"],
    ),
    # older: test_config.py::test_wrong_types, test_password_of_the_wrong_type_is_not_echoed
    "wrong_types": (
        with_password_file('timeout = "soon"\nmax_connections = "many"\ndrained = "yes please"\n'),
        0o600,
        [
            "backends.1.drained: Input should be a valid boolean, unable to interpret input",
            "backends.1.timeout: Input should be a valid number, unable to parse string as a number",
            "backends.1.max_connections: Input should be a valid integer, unable to parse string as an integer",
        ],
    ),
    # older: test_config.py::test_unreadable_password_file (read_bytes made to refuse)
    "password_file_unreadable": (
        with_password_file(),
        0o000,
        ["backends.1.password_file: password file {password_file} cannot be read: Permission denied"],
    ),
    # older: test_config.py::test_missing_password_file
    "password_file_missing": (
        with_password_file(),
        None,
        ["backends.1.password_file: password file {password_file} does not exist"],
    ),
    # older: test_config.py::test_world_readable_password_file_is_refused, test_cli.py (the rapi group)
    "password_file_world_readable": (
        with_password_file(),
        0o644,
        [
            "backends.1.password_file: password file {password_file} is readable by others (mode 0644); chmod 600 it"
        ],
    ),
}


def invoke(*args: str) -> Any:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.mark.parametrize("command", [["reconcile"], ["backends", "list"]], ids=["reconcile", "backends-list"])
@pytest.mark.parametrize("case", list(CONFIGS))
def test_bad_config_file(case: str, command: list[str], tmp_path: Path, database: Path) -> None:
    table, mode, tails = CONFIGS[case]
    secret_file = tmp_path / "patras.password"
    if mode is not None:
        password_file(tmp_path, mode)
    config = config_file(tmp_path, database, table)
    rows = database_rows(database)
    db_bytes = database.read_bytes()
    with file_modes_enforced() if mode == 0 else contextlib.nullcontext():
        if mode == 0:
            check_reads_are_refused(tmp_path)
        result = invoke(*command, "--config", str(config))
    assert result.exit_code == 2, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith(f"error: config file {config}: ")
    expected = [f"config file {config}: {tail.format(password_file=secret_file)}" for tail in tails]
    assert sorted(line.removeprefix("error: ") for line in lines) == sorted(expected)
    assert INLINE_SECRET not in result.output and FILE_SECRET not in result.output
    assert database_rows(database) == rows and database.read_bytes() == db_bytes


def test_unknown_backend_in_the_backend_option(tmp_path: Path, database: Path) -> None:
    """Older: test_config.py::test_unknown_backend (Settings.backend), test_cli_drain.py (drain)."""
    config = config_file(tmp_path, database, "")
    rows = database_rows(database)
    db_files = {path.name: path.read_bytes() for path in tmp_path.glob("store.db*")}
    result = invoke("reconcile", "--config", str(config), "--backend", "athens", "--backend", "sparta")
    assert result.exit_code == 2, result.output
    assert result.output.splitlines() == [
        f"error: unknown backend 'sparta'; the config file {config} defines: athens"
    ]
    assert INLINE_SECRET not in result.output
    assert database_rows(database) == rows
    assert {path.name: path.read_bytes() for path in tmp_path.glob("store.db*")} == db_files
