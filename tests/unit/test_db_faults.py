"""The database under fault: PostgreSQL restarted in the middle of a run, SQLite locked by another process.

The PostgreSQL restart runs on a private instance that the ``private_pg`` fixture
starts itself (``initdb`` and ``pg_ctl`` into a temporary folder, a free port, trust
authentication, as the ``postgres`` user when run as root). Restarting it with
``pg_ctl stop -m fast`` and ``pg_ctl start`` is the same fault as the issue's
``pg_ctlcluster --skip-systemctl-redirect <version> main restart`` (a fast shutdown
ending every session, a new postmaster on the same port and data), without
disturbing the shared cluster at 127.0.0.1:5432 that other tests use meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from synnefo_ganeti import ControlPlane, InstanceSpec
from synnefo_ganeti.config import Settings
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.errors import StoreError
from synnefo_ganeti.jobs import JobStatus
from synnefo_ganeti.store import JobVersion, RequestStatus, Store
from synnefo_ganeti.testing import FakeGaneti
from tests._fault_runs import (
    QUICK,
    RESTART_DB_PASSWORD,
    _create_database,
    _lifecycle_versions,
    pg_restart_run,
    sqlite_locked_run,
)
from tests._private_pg import PrivatePostgres, require_private_pg

pytestmark = pytest.mark.slow  # starts a private PostgreSQL and SQLite lock holders as child processes

SECRET = "S3cr3t-db-down-4Kp"


@pytest.fixture(scope="module")
def private_pg() -> Iterator[PrivatePostgres]:
    """A PostgreSQL instance of this module's own, free to restart; skipped without the server
    binaries, failed in CI."""
    with PrivatePostgres(require_private_pg()) as pg:
        yield pg


# -- PostgreSQL restarted mid-run -------------------------------------------------------------------


@pytest.mark.timeout(90)
async def test_a_postgresql_restart_mid_run_loses_no_event(
    private_pg: PrivatePostgres, tmp_path: Path
) -> None:
    run = await pg_restart_run(private_pg, tmp_path, creates=200, rate=50.0, restart_after=1.5, down_for=1.0)
    # every job the fake wrote is stored, at the fake's final status, with every event
    assert run.problems == []
    assert run.lost == 0
    assert run.jobs == 200
    assert run.versions >= 200 * 7  # a create: three luxid versions, then the executor's
    assert run.events_expected_min <= run.events_stored <= run.events_expected_max
    # the writer saw the outage, said so, retried, and said when it was over
    assert run.retries > 0
    down = [i for i, m in enumerate(run.messages) if "unavailable" in m and "holding" in m]
    back = [i for i, m in enumerate(run.messages) if "is back after" in m and "writing resumed" in m]
    assert down and back and down[0] < back[0], run.messages
    assert run.recovered_after_s is not None
    # its log lines name the database, never its password
    assert all(run.display_url in run.messages[i] for i in down + back)
    assert RESTART_DB_PASSWORD in run.url
    assert not [m for m in run.messages if RESTART_DB_PASSWORD in m]


async def test_postgresql_down_at_start_up_is_a_clear_store_error(private_pg: PrivatePostgres) -> None:
    url = private_pg.url("postgres", password=SECRET)
    private_pg.stop()
    try:
        store = Store(url, busy_timeout=5)
        with pytest.raises(StoreError) as info:
            await store.open()
    finally:
        private_pg.start()
    error = info.value
    message = str(error)
    assert message.startswith("cannot open database postgresql+asyncpg://postgres:***@127.0.0.1:")
    assert f"127.0.0.1:{private_pg.port}/postgres" in message
    assert "ConnectionRefusedError" in message or "OSError" in message, message
    assert error.url == f"postgresql+asyncpg://postgres:***@127.0.0.1:{private_pg.port}/postgres"
    for text in (message, repr(error), error.url, repr(store)):
        assert SECRET not in text
    # once the server is back, the same store opens
    async with store:
        assert await store.count_jobs() == 0


@pytest.mark.timeout(90)
async def test_dispatcher_requests_survive_a_postgresql_restart(private_pg: PrivatePostgres) -> None:
    """Requests made before and during a restart all end succeeded, each instance created once."""
    database = await _create_database(private_pg.url())
    url = private_pg.url(database)
    async with FakeGaneti(tls=False, op_times=QUICK, nodes=3) as fake:
        settings = Settings(
            database={"url": url},
            backends=[{"name": "f1", "url": fake.url, "username": fake.username, "password": fake.password}],
            dispatcher={"status_port": None, "poll_interval": 0.05, "health_interval": 0.5,
                        "stats_interval": 0.5, "shutdown_timeout": 10.0},
        )  # fmt: skip
        async with Store(url, busy_timeout=5) as store, ControlPlane(settings, store=store) as cp:
            dispatcher = Dispatcher(settings, store=store, status_server=False)
            running = asyncio.create_task(dispatcher.run())
            await asyncio.wait_for(dispatcher.ready.wait(), 30)
            spec = {"disk_template": "diskless", "os": "noop", "beparams": {"memory": 128}}
            ids = [await cp.request_instance(InstanceSpec(name=f"a{i}.fake.test", **spec)) for i in range(10)]
            restart = asyncio.create_task(asyncio.to_thread(private_pg.restart, down_for=1.0))
            # requests written while the server is going down and back: add_request is a write
            # of the writer, which waits for the database
            ids += [
                await cp.request_instance(InstanceSpec(name=f"b{i}.fake.test", **spec)) for i in range(10)
            ]
            await restart
            ended = []
            for request_id in ids:
                for _ in range(600):
                    try:
                        request = await cp.wait_request(request_id, timeout=30)
                        break
                    except StoreError:  # a read while the server was restarting
                        await asyncio.sleep(0.1)  # a retry pause, as a caller would make
                ended.append(request)
            assert not running.done(), "the dispatcher stopped during the restart"
            dispatcher.stop()
            await asyncio.wait_for(running, 30)
    assert [r.status for r in ended] == [RequestStatus.SUCCEEDED] * 20, [r.error for r in ended]
    created = [
        op.luxid["instance_name"]
        for job in fake.cluster.jobs.values()
        for op in job.ops
        if op.op_id == "OP_INSTANCE_CREATE"
    ]
    assert sorted(created) == sorted(r.instance for r in ended)  # each once, none twice
    assert len({r.job_id for r in ended}) == 20


# -- SQLite locked by another process ---------------------------------------------------------------


async def test_sqlite_locked_by_another_process_waits_then_says_so(tmp_path: Path) -> None:
    run = await sqlite_locked_run(tmp_path, busy_timeout=0.5, jobs=5)
    # the call waited its busy timeout, then a StoreError naming the file and the cause
    assert run.error_type == "StoreError"
    assert run.waited_s >= run.busy_timeout
    assert run.error.startswith(f"database file {run.path} is locked by another process")
    assert "nothing written" in run.error and "busy_timeout" in run.error
    # the job versions queued meanwhile were held, and written once the lock was released
    assert run.held == 5 * 10 and run.lost == 0
    # the write the caller was told failed was never made afterwards
    assert run.drained_after == set()
    assert any("locked by another process" in m and "holding" in m for m in run.messages), run.messages


_HOLD = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("COMMIT")
"""


async def _hold(path: Path) -> asyncio.subprocess.Process:
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _HOLD, str(path), stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert holder.stdout is not None
    assert (await asyncio.wait_for(holder.stdout.readline(), 30)).strip() == b"locked"
    return holder


async def _release(holder: asyncio.subprocess.Process) -> None:
    assert holder.stdin is not None
    holder.stdin.write(b"go\n")
    await holder.stdin.drain()
    assert await asyncio.wait_for(holder.wait(), 30) == 0


async def test_a_call_on_a_locked_sqlite_file_fails_then_works_once_released(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    async with Store(f"sqlite:///{path}", busy_timeout=0.3) as store:
        await store.ensure_backend("f1")
        holder = await _hold(path)
        try:
            with pytest.raises(StoreError, match="is locked by another process") as info:
                await asyncio.wait_for(store.add_backend_event("f1", "note", "while locked"), 60)
            assert str(path) in str(info.value)
            assert store.stats.retries >= 1
            # a backend the store has not seen yet: its row is written first (by the writer too), same error
            with pytest.raises(StoreError, match="is locked by another process"):
                await asyncio.wait_for(store.add_backend_event("f2", "note", "while locked"), 60)
        finally:
            await _release(holder)
        assert await store.backend_events() == []  # nothing written
        await store.add_backend_event("f1", "note", "after the release")
        await store.add_backend_event("f2", "note", "after the release")
        events = await store.backend_events()
        assert sorted((e["backend"], e["message"]) for e in events) == [
            ("f1", "after the release"),
            ("f2", "after the release"),
        ]


async def test_a_lock_released_within_the_busy_timeout_is_only_waited_for(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    async with Store(f"sqlite:///{path}", busy_timeout=10) as store:
        await store.ensure_backend("f1")
        holder = await _hold(path)
        versions = _lifecycle_versions(7, 1)
        for version in versions:
            await store.put(JobVersion("f1", version))
        drain = asyncio.create_task(store.set_backend_drained("f1", True))
        await asyncio.sleep(0.3)  # not ordering: a window in which the write must NOT go through
        assert not drain.done()  # waiting for the lock
        await _release(holder)
        assert await asyncio.wait_for(drain, 30) is True
        await store.flush()
        assert await store.drained_backends() == {"f1"}
        job = await store.get_job("f1", 7)
        assert job is not None and job.status is JobStatus.SUCCESS


async def test_a_write_cancelled_at_any_point_leaves_no_sqlite_lock_behind(tmp_path: Path) -> None:
    """A caller cancelled while its write is on the way (here: a new backend's row, then its
    health) never leaves the write transaction open: once the writer is idle, another process
    gets the write lock at once. (The backend row was written on a connection of the async
    engine: a health loop cancelled between its INSERT and COMMIT kept SQLite's write lock until
    that connection was collected, and a dispatcher's stop waited on it past shutdown_timeout.)"""
    path = tmp_path / "store.db"
    async with Store(f"sqlite:///{path}", busy_timeout=5) as store:
        for attempt in range(300):
            write = asyncio.create_task(store.set_backend_health(f"b{attempt}", True, detail=None))
            # cancelled at a moment spread over its first 4 ms, the loop turning meanwhile (as in a
            # busy daemon; a timer alone lands between the statements): before, during or after
            # the statements the database thread runs. Not a wait for a condition.
            spin_until = time.perf_counter() + (attempt % 40) * 0.0001
            while time.perf_counter() < spin_until:  # noqa: ASYNC110
                await asyncio.sleep(0)
            write.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await write
            await store.flush()  # the writer is idle: nothing of ours may hold the lock now
            other = sqlite3.connect(path, timeout=0, isolation_level=None)
            try:
                other.execute("BEGIN IMMEDIATE")  # fails at once ("database is locked") if held
                other.execute("ROLLBACK")
            finally:
                other.close()
        await store.set_backend_health("after", True, detail=None)
        assert "after" in await store.backend_states()


async def test_on_a_sqlite_file_only_the_writer_writes(tmp_path: Path) -> None:
    """The rule the test above relies on, checked statement by statement: on a SQLite file no
    write runs on a connection of the async engine (whose callers can be cancelled mid-way);
    every INSERT, UPDATE and DELETE goes through the writer's own thread."""
    path = tmp_path / "store.db"
    async with Store(f"sqlite:///{path}") as store:
        writes: list[str] = []

        def on_execute(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
            if statement.lstrip().split()[0].upper() in {"INSERT", "UPDATE", "DELETE", "REPLACE"}:
                writes.append(statement)

        engine = store.engine.sync_engine
        sqlalchemy.event.listen(engine, "before_cursor_execute", on_execute)
        try:
            await store.ensure_backend("f1")
            await store.set_backend_health("f2", False, detail="down", event="went down")
            await store.add_backend_event("f3", "note", "a new backend's first event")
            await store.set_backend_drained("f4", True)
            for version in _lifecycle_versions(7, 1):
                await store.put(JobVersion("f5", version))
            await store.flush()
            await store.add_instance("f6", "vm1.example")
            await store.prune(timedelta(0))
            assert (await store.get_job("f5", 7)) is None  # (pruned: the writes did happen)
            assert {"f1", "f2", "f3", "f4", "f5", "f6"} <= set(await store.backends())
        finally:
            sqlalchemy.event.remove(engine, "before_cursor_execute", on_execute)
        assert writes == []


def test_the_private_instance_is_not_the_shared_cluster(private_pg: PrivatePostgres) -> None:
    assert private_pg.port != 5432
    assert private_pg.data.is_dir() and str(private_pg.data).startswith(str(private_pg.folder))
    assert f"127.0.0.1:{private_pg.port}" in repr(private_pg)
