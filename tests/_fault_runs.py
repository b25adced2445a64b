"""The fault and security runs that tests/unit/test_db_faults.py and test_security.py check, and
benchmarks/db_faults.py measures.

* :func:`pg_restart_run`: a fake Ganeti writes its job queue (a stream of instance
  creates), a :class:`QueueWatcher` stores it into a :class:`Store` on a private
  PostgreSQL instance, and that instance is restarted (fast shutdown, down for a
  while, started again) in the middle. Then every job the fake wrote is compared
  with what the database holds.
* :func:`sqlite_locked_run`: another process holds ``BEGIN EXCLUSIVE`` on the SQLite
  file; a store call waits out its busy timeout and gets a clear :class:`StoreError`,
  versions queued meanwhile are held and written once the lock is released.
* :func:`security_run`: a full run with known secrets (RAPI passwords, a database
  password), everything it prints, logs and shows collected and searched for them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import signal
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import asyncpg
import orjson

from synnefo_ganeti.errors import StoreError
from synnefo_ganeti.jobs import EventKind, JobFile, JobStatus, job_events, parse_job_file
from synnefo_ganeti.rapi import InstanceSpec, RapiClient
from synnefo_ganeti.store import JobVersion, Store
from synnefo_ganeti.testing import FakeGaneti
from synnefo_ganeti.watch import QueueWatcher
from tests._private_pg import PrivatePostgres
from tests.helpers import eventually, spec

__all__ = [
    "DB_SECRET",
    "QUICK",
    "RAPI_SECRETS",
    "PgRestartRun",
    "SecurityRun",
    "SqliteLockedRun",
    "capture_logs",
    "pg_restart_run",
    "secret_forms",
    "security_run",
    "sqlite_locked_run",
    "with_password",
]

QUICK = {"OP_INSTANCE_CREATE": 0.05, "OP_INSTANCE_REMOVE": 0.01, "OP_INSTANCE_SHUTDOWN": 0.01,
         "OP_INSTANCE_STARTUP": 0.01, "OP_INSTANCE_REBOOT": 0.01, "OP_INSTANCE_SET_PARAMS": 0.01}  # fmt: skip
BACKEND = "f1"
RESTART_DB_PASSWORD = "S3cr3t-db-restart-7Qx"
ROOT = Path(__file__).resolve().parent.parent


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def capture_logs(
    name: str = "synnefo_ganeti", level: int = logging.DEBUG
) -> Iterator[list[logging.LogRecord]]:
    """Every record of logger ``name`` (and below) at ``level`` or above, while the block runs."""
    handler = _Records()
    logger = logging.getLogger(name)
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def _spec(index: int) -> InstanceSpec:
    return spec(f"vm{index}.fake.test", memory=128)


async def _create_database(admin_url: str) -> str:
    name = f"sg_fault_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(admin_url, timeout=10)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return name


@dataclass
class PgRestartRun:
    """What a PostgreSQL restart in the middle of a watcher run did, and what the database holds after."""

    #: job-file versions the fake wrote, and its jobs
    versions: int
    jobs: int
    #: events the database holds of those jobs; the fewest the jobs' final versions alone give;
    #: the most that every version read one by one would give
    events_stored: int
    events_expected_min: int
    events_expected_max: int
    #: jobs missing from the database, at another status, or short of events; and why
    lost: int
    problems: list[str]
    retries: int
    #: how long the server was down (stop returned .. start returned)
    outage_s: float
    #: from the server being back to the writer's "is back" log line (None: no such line)
    recovered_after_s: float | None
    messages: list[str] = field(default_factory=list)
    url: str = ""
    display_url: str = ""

    def figures(self) -> dict[str, Any]:
        return {
            "versions": self.versions,
            "jobs": self.jobs,
            "events_stored": self.events_stored,
            "events_expected_min": self.events_expected_min,
            "events_expected_max": self.events_expected_max,
            "lost": self.lost,
            "retries": self.retries,
            "outage_s": round(self.outage_s, 3),
            "recovered_after_s": None if self.recovered_after_s is None else round(self.recovered_after_s, 3),
        }


def _compare(
    written: dict[int, list[JobFile]], stored: dict[int, Any], events: dict[int, list[Any]]
) -> tuple[list[str], int, int]:
    """Problems of the stored jobs against the versions the fake wrote; (problems, min events, max events)."""
    problems: list[str] = []
    least = most = 0
    for job_id, versions in sorted(written.items()):
        final = versions[-1]
        minimum = len(job_events(None, final))
        least += minimum
        previous: JobFile | None = None
        for version in versions:
            most += len(job_events(previous, version))
            previous = version
        job = stored.get(job_id)
        if job is None:
            problems.append(f"job {job_id}: not stored")
            continue
        if job.status is not final.status:
            problems.append(f"job {job_id}: stored {job.status.value}, the fake wrote {final.status.value}")
        got = events.get(job_id, [])
        if len(got) != job.event_count or [e.seq for e in got] != list(range(1, len(got) + 1)):
            problems.append(
                f"job {job_id}: {len(got)} events stored, event_count {job.event_count}, gaps in seq"
            )
        if len(got) < minimum:
            problems.append(
                f"job {job_id}: {len(got)} events stored, its final version alone gives {minimum}"
            )
        # every log line Ganeti wrote is an event of its own: none may be missing
        logs = {(i, entry.serial) for i, op in enumerate(final.ops) for entry in op.log}
        stored_logs = {(e.op_index, e.log_serial) for e in got if e.kind is EventKind.LOG}
        if logs != stored_logs:
            problems.append(f"job {job_id}: log events {sorted(stored_logs)}, the fake wrote {sorted(logs)}")
        job_ends = [e.status for e in got if e.kind is EventKind.JOB_STATUS]
        if not job_ends or job_ends[-1] is not final.status:
            problems.append(f"job {job_id}: the last job-status event is not {final.status.value}")
    problems.extend(
        f"job {job_id}: stored, but the fake never wrote it" for job_id in sorted(set(stored) - set(written))
    )
    return problems, least, most


async def pg_restart_run(
    pg: PrivatePostgres,
    folder: Path,
    *,
    creates: int = 200,
    rate: float = 50.0,
    restart_after: float = 1.5,
    down_for: float = 1.0,
    settle_timeout: float = 60.0,
) -> PgRestartRun:
    """``creates`` instance creates at ``rate`` per second, the watcher storing the fake's queue
    on ``pg``; ``restart_after`` seconds in, ``pg`` is stopped for ``down_for`` s and started."""
    database = await _create_database(pg.url())
    url = pg.url(database, password=RESTART_DB_PASSWORD)
    queue = folder / "queue"
    written: dict[int, list[JobFile]] = {}

    def on_write(job_id: int, content: dict[str, Any], _luxid: bool) -> None:
        written.setdefault(job_id, []).append(parse_job_file(orjson.dumps(content)))

    with capture_logs("synnefo_ganeti.store", logging.INFO) as records:
        async with FakeGaneti(tls=False, queue_dir=queue, op_times=QUICK, max_running_jobs=20) as fake:
            fake.cluster.queue.listeners.append(on_write)  # type: ignore[union-attr]
            client = RapiClient(fake.url, username=fake.username, password=fake.password, name=BACKEND)
            async with Store(url, busy_timeout=5.0) as store, client:
                watcher = QueueWatcher(queue, store, BACKEND)
                watching = asyncio.create_task(watcher.run(), name="watcher")
                await watcher.ready.wait()

                async def submit() -> None:
                    started = time.monotonic()
                    for index in range(creates):
                        await client.create_instance(_spec(index))
                        pause = started + (index + 1) / rate - time.monotonic()
                        if pause > 0:
                            await asyncio.sleep(pause)  # submitting at ``rate``, as a client would

                submitting = asyncio.create_task(submit(), name="submit")
                await asyncio.sleep(restart_after)  # the scenario: the server goes down mid-run
                # pg_ctl blocks: in a thread, so the fake, the watcher and the writer go on meanwhile
                stopped_at, started_at = await asyncio.to_thread(pg.restart, down_for=down_for)
                await submitting
                # wait until the fake has ended every job, then until the database holds them all
                deadline = time.monotonic() + settle_timeout
                await eventually(
                    lambda: all(job.status.is_final for job in fake.cluster.jobs.values()),
                    timeout=settle_timeout,
                    interval=0.05,
                    what="the fake's jobs to end",
                )

                async def all_stored() -> bool:
                    await store.flush()
                    final = await store.list_jobs(status=[s for s in JobStatus if s.is_final])
                    return len(final) >= len(written)

                with contextlib.suppress(AssertionError):  # what is missing then, the run reports as lost
                    await eventually(
                        all_stored,
                        timeout=max(0.0, deadline - time.monotonic()),
                        interval=0.1,
                        what="all stored",
                    )
                watcher.stop()
                await watching
                await store.flush()
                stored = {job.job_id: job for job in await store.list_jobs(backend=BACKEND)}
                events: dict[int, list[Any]] = {}
                since = 0
                while batch := await store.list_events(since=since, limit=10_000):
                    for event in batch:
                        events.setdefault(event.job_id, []).append(event)
                    since = batch[-1].id
                retries = store.stats.retries
                display = store.display_url
    messages = [record.getMessage() for record in records]
    back = [r for r in records if "is back after" in r.getMessage()]
    problems, least, most = _compare(written, stored, events)
    lost_jobs = {int(problem.split(":")[0].split()[1]) for problem in problems}
    return PgRestartRun(
        versions=sum(len(v) for v in written.values()),
        jobs=len(written),
        events_stored=sum(len(e) for e in events.values()),
        events_expected_min=least,
        events_expected_max=most,
        lost=len(lost_jobs),
        problems=problems,
        retries=retries,
        outage_s=started_at - stopped_at,
        recovered_after_s=back[0].created - started_at if back else None,
        messages=messages,
        url=url,
        display_url=display,
    )


# -- SQLite locked by another process ---------------------------------------------------------------

_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("COMMIT")
conn.close()
"""


@dataclass
class SqliteLockedRun:
    """What a store did while another process held the SQLite file locked."""

    #: how long the call waited before its error
    waited_s: float
    error: str
    error_type: str
    #: versions queued while locked, and the ones missing from the database after the release
    held: int
    lost: int
    busy_timeout: float
    path: str
    #: the backend the failed call would have drained: it must not be drained later
    drained_after: set[str]
    messages: list[str] = field(default_factory=list)

    def figures(self) -> dict[str, Any]:
        return {
            "waited_s": round(self.waited_s, 3),
            "busy_timeout_s": self.busy_timeout,
            "error": self.error,
            "held": self.held,
            "lost": self.lost,
        }


def _lifecycle_versions(first_job_id: int, jobs: int) -> list[JobFile]:
    """Every version of ``jobs`` copies of the recorded create job 20, as jobs ``first_job_id``..."""
    from tests.helpers import QUEUE_FIXTURES

    paths = sorted((QUEUE_FIXTURES / "lifecycle-job-20").iterdir())
    versions = []
    for offset in range(jobs):
        for path in paths:
            raw = orjson.loads(path.read_bytes())
            raw["id"] = first_job_id + offset
            versions.append(parse_job_file(orjson.dumps(raw)))
    return versions


async def sqlite_locked_run(folder: Path, *, busy_timeout: float = 0.5, jobs: int = 5) -> SqliteLockedRun:
    """A second process holds ``BEGIN EXCLUSIVE`` on the file; a call waits, then fails clearly;
    versions put meanwhile are stored once the lock goes."""
    path = folder / "locked.db"
    with capture_logs("synnefo_ganeti.store", logging.INFO) as records:
        async with Store(f"sqlite:///{path}", busy_timeout=busy_timeout) as store:
            await store.ensure_backend(BACKEND)
            holder = await asyncio.create_subprocess_exec(
                sys.executable, "-c", _HOLDER, str(path),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            )  # fmt: skip
            assert holder.stdout is not None and holder.stdin is not None
            try:
                assert (await asyncio.wait_for(holder.stdout.readline(), 30)).strip() == b"locked"
                versions = _lifecycle_versions(1000, jobs)
                for version in versions:
                    await store.put(JobVersion(BACKEND, version))
                started = time.monotonic()
                try:
                    await asyncio.wait_for(store.set_backend_drained(BACKEND, True), 120)
                except StoreError as exc:
                    error, error_type = str(exc), type(exc).__name__
                else:
                    error, error_type = "", ""
                waited = time.monotonic() - started
                before_release = await store.count_jobs()
            finally:
                if holder.returncode is None:
                    holder.stdin.write(b"go\n")
                    await holder.stdin.drain()
                await asyncio.wait_for(holder.wait(), 30)
            await asyncio.wait_for(store.flush(), 60)
            stored = {job.job_id: job for job in await store.list_jobs()}
            drained_after = await store.drained_backends()
    expected = {version.job_id: version.status for version in versions}
    lost = sum(
        1
        for job_id, status in expected.items()
        if job_id not in stored or stored[job_id].status is not status
    )
    assert before_release == 0, "a write went through while the file was locked"
    return SqliteLockedRun(
        waited_s=waited,
        error=error,
        error_type=error_type,
        held=len(versions),
        lost=lost,
        busy_timeout=busy_timeout,
        path=str(path),
        drained_after=drained_after,
        messages=[record.getMessage() for record in records],
    )


# -- security: no secret in any output of a full run --------------------------------------------------

DB_SECRET = "S3cr3t-db-Pw!9x"
RAPI_SECRETS = {"a": "S3cr3t-rapi-a-7Hq", "b": "S3cr3t-rapi-b-2Lm"}
WRONG_SECRET = "S3cr3t-rapi-wrong-5Tz"
RAPI_USER = "fake"


def secret_forms() -> list[str]:
    """Every secret of :func:`security_run`, as written, URL-encoded (both ways) and inside a
    Basic authorization header."""
    forms: set[str] = set()
    for secret in [DB_SECRET, WRONG_SECRET, *RAPI_SECRETS.values()]:
        forms |= {secret, quote(secret, safe=""), quote_plus(secret)}
        forms.add(base64.b64encode(f"{RAPI_USER}:{secret}".encode()).decode())
    return sorted(forms)


def with_password(url: str, password: str) -> str:
    """``postgresql://user@host/db`` with ``password`` (URL-encoded) after the user."""
    scheme, rest = url.split("://", 1)
    user, host = rest.split("@", 1)
    return f"{scheme}://{user.split(':', 1)[0]}:{quote(password, safe='')}@{host}"


@dataclass
class Command:
    args: list[str]
    code: int
    stdout: str
    stderr: str


@dataclass
class SecurityRun:
    """Everything a full run printed, logged and showed (one text per item), and where secrets were."""

    texts: list[str]
    commands: dict[str, Command]
    dispatcher_log: list[str]
    in_process: dict[str, str]
    found: list[tuple[str, str]]

    @property
    def lines(self) -> int:
        return sum(len(text.splitlines()) or 1 for text in self.texts)

    def figures(self) -> dict[str, Any]:
        return {"lines_scanned": self.lines, "secrets_found": len(self.found)}


async def _cli(*args: str, cwd: Path) -> Command:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "synnefo_ganeti", "--log-level", "debug", "--log-format", "json", *args,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return Command(list(args), process.returncode, out.decode(errors="replace"), err.decode(errors="replace"))


def _private_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


async def security_run(folder: Path, base_db_url: str) -> SecurityRun:
    """A full run with known secrets: the dispatcher daemon and the CLI as processes (debug JSON
    logs), then the objects in this process (their reprs and strs, the errors of a wrong
    password and of a database that is down, every log record). ``base_db_url`` is a
    scratch PostgreSQL database (``postgresql://USER@HOST/DB``, trust authentication):
    the run puts :data:`DB_SECRET` in it."""
    from synnefo_ganeti import ControlPlane
    from synnefo_ganeti.config import Settings
    from synnefo_ganeti.dispatch import Dispatcher
    from synnefo_ganeti.errors import GanetiError

    db_url = with_password(base_db_url, DB_SECRET)
    down_url = with_password("postgresql://postgres@127.0.0.1:1/nowhere", DB_SECRET)
    texts: list[str] = []
    in_process: dict[str, str] = {}
    commands: dict[str, Command] = {}
    root = ROOT
    with capture_logs("synnefo_ganeti", logging.DEBUG) as records:
        async with (
            FakeGaneti(tls=True, password=RAPI_SECRETS["a"], username=RAPI_USER, op_times=QUICK) as a,
            FakeGaneti(tls=False, password=RAPI_SECRETS["b"], username=RAPI_USER, op_times=QUICK) as b,
        ):
            files = {
                name: _private_file(folder / f"{name}.password", RAPI_SECRETS[name] + "\n") for name in "ab"
            }
            wrong = _private_file(folder / "wrong.password", WRONG_SECRET + "\n")
            config = folder / "config.toml"
            config.write_text(
                f'[database]\nurl = "{db_url}"\n\n[dispatcher]\nhealth_interval = 0.5\npoll_interval = 0.05\n\n'
                f'[[backends]]\nname = "a"\nurl = "{a.url}"\nusername = "{RAPI_USER}"\n'
                f'password_file = "{files["a"]}"\nca_file = "{a.ca_file}"\nqueue_dir = "{a.queue_dir}"\n\n'
                f'[[backends]]\nname = "b"\nurl = "{b.url}"\nusername = "{RAPI_USER}"\n'
                f'password_file = "{files["b"]}"\n'
            )
            config.chmod(0o600)
            specs = folder / "specs.json"
            specs.write_text(
                orjson.dumps(
                    [
                        {
                            "name": f"sec{i}.fake.test",
                            "disk_template": "diskless",
                            "os": "noop",
                            "beparams": {"memory": 128},
                        }
                        for i in range(6)
                    ]
                ).decode()
            )
            daemon = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "synnefo_ganeti", "--log-level", "debug", "--log-format", "json",
                "dispatcher", "--config", str(config), "--no-status",
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=root,
            )  # fmt: skip
            daemon_lines: list[str] = []

            async def read_daemon() -> None:
                assert daemon.stderr is not None
                async for raw in daemon.stderr:
                    daemon_lines.append(raw.decode(errors="replace"))  # noqa: PERF401  (as they come)

            reading = asyncio.create_task(read_daemon())
            try:
                # the daemon first (it creates the schema of the fresh database), then the commands
                def started() -> bool:
                    assert daemon.returncode is None, "".join(daemon_lines)
                    return any('"dispatcher ' in line and " started: " in line for line in daemon_lines)

                await eventually(started, timeout=60, interval=0.05, what="the dispatcher to start")
                cfg = str(config)
                commands["submit"] = await _cli(
                    "submit", "--config", cfg, str(specs), "--json", "--timeout", "90", cwd=root
                )
                commands["requests list"] = await _cli(
                    "requests", "list", "--config", cfg, "--json", cwd=root
                )
                commands["backends list"] = await _cli(
                    "backends", "list", "--config", cfg, "--json", cwd=root
                )
                commands["reconcile"] = await _cli("reconcile", "--config", cfg, "--json", cwd=root)
                commands["jobs list"] = await _cli("jobs", "list", "--db", db_url, cwd=root)
                commands["jobs list --json"] = await _cli("jobs", "list", "--db", db_url, "--json", cwd=root)
                commands["rapi wrong password"] = await _cli(
                    "rapi", "--url", a.url, "--username", RAPI_USER, "--password-file", str(wrong),
                    "--ca-file", str(a.ca_file), "info", cwd=root,
                )  # fmt: skip
                commands["jobs list db down"] = await _cli("jobs", "list", "--db", down_url, cwd=root)
            finally:
                if daemon.returncode is None:
                    daemon.send_signal(signal.SIGTERM)
                assert daemon.stdout is not None
                out = await asyncio.wait_for(daemon.stdout.read(), 60)
                await asyncio.wait_for(daemon.wait(), 60)
                await asyncio.wait_for(reading, 60)
            assert daemon.returncode is not None
            commands["dispatcher"] = Command(
                ["dispatcher"], daemon.returncode, out.decode(errors="replace"), "".join(daemon_lines)
            )

            # in this process: the objects, their errors and their logs
            settings = Settings.from_file(config)
            in_process["Settings repr"] = repr(settings)
            in_process["Settings str"] = str(settings)
            for backend in settings.backends:
                in_process[f"BackendSettings {backend.name} repr"] = repr(backend)
                in_process[f"BackendSettings {backend.name} str"] = str(backend)
            in_process["DatabaseSettings repr"] = repr(settings.database)
            for backend in settings.backends:
                async with backend.rapi_client() as client:
                    in_process[f"RapiClient {backend.name} repr"] = repr(client)
                    in_process[f"RapiClient {backend.name} info"] = repr(await client.info())
            bad = RapiClient(a.url, username=RAPI_USER, password=WRONG_SECRET, ca_file=a.ca_file, name="a")
            async with bad:
                in_process["RapiClient wrong repr"] = repr(bad)
                try:
                    await bad.info()
                except GanetiError as exc:
                    in_process["401 error"] = _describe(exc)
                else:
                    raise AssertionError("a wrong password was accepted")
            async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
                in_process["Store repr"] = repr(store)
                in_process["ControlPlane repr"] = repr(cp)
                dispatcher = Dispatcher(settings, store=store, status_server=False)
                in_process["Dispatcher repr"] = repr(dispatcher)
                jobs = await store.list_jobs()
                requests = await store.list_requests()
                in_process["StoredJob reprs"] = "\n".join(repr(job) for job in jobs)
                in_process["Request reprs"] = "\n".join(repr(request) for request in requests)
                in_process["Request strs"] = "\n".join(str(request) for request in requests)
                in_process["counts"] = f"{len(jobs)} jobs, {len(requests)} requests"
            down = Store(down_url, busy_timeout=5)
            in_process["down Store repr"] = repr(down)
            try:
                await down.open()
            except GanetiError as exc:
                in_process["db down error"] = _describe(exc)
            else:
                raise AssertionError("a database on port 1 opened")
    formatter = logging.Formatter("%(levelname)s %(name)s %(message)s")
    texts.extend(formatter.format(record) for record in records)
    for command in commands.values():
        texts.extend([command.stdout, command.stderr])
    texts.extend(in_process.values())
    needles = secret_forms()
    found = [(needle, text) for text in texts for needle in needles if needle in text]
    return SecurityRun(
        texts=texts,
        commands=commands,
        dispatcher_log=commands["dispatcher"].stderr.splitlines(),
        in_process=in_process,
        found=found,
    )


def _describe(exc: BaseException) -> str:
    """Everything an operator could see of an error: str, repr, its url, the whole traceback."""
    url = getattr(exc, "url", None)
    return "\n".join([str(exc), repr(exc), str(url), "".join(traceback.format_exception(exc))])
