"""The store's engine and writer, on SQLite and on PostgreSQL: URLs, the schema check on open,
and the writer riding out database trouble. The helpers here serve the other store tests
(``test_store_jobs.py``: applying versions; ``test_store_events.py``: events and pruning).

Every test that takes ``db_url`` runs against a fresh SQLite file and a fresh
PostgreSQL database. Versions that Ganeti writes without a fixture of their own
(a lock retry, a late duplicate) are made by editing the recorded JSON.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import create_async_engine

from synnefo_ganeti.errors import ConfigError, StoreError
from synnefo_ganeti.jobs import EventKind, JobFile, JobStatus, parse_job_file
from synnefo_ganeti.store import (
    JobVersion,
    Store,
    StoredEvent,
    StoredJob,
    display_url,
    head_revision,
    normalize_url,
)
from synnefo_ganeti.store.db._engine import _WRITE_LOCK_KEY
from tests.helpers import QUEUE_FIXTURES, eventually

BACKEND = "cluster1"
LIFECYCLES = {
    job_id: sorted((QUEUE_FIXTURES / f"lifecycle-job-{job_id}").iterdir()) for job_id in (20, 12, 23)
}
LIFE20 = LIFECYCLES[20]
SECRET = "SECRETPW"
WAIT = 20.0  # generous: only a hang should hit it

OP = EventKind.OP_STATUS.value
JOB = EventKind.JOB_STATUS.value
LOG = EventKind.LOG.value


# -- helpers -------------------------------------------------------------------------------------------


def raw(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = orjson.loads(path.read_bytes())
    return data


def job(source: Path | dict[str, Any]) -> JobFile:
    data = source.read_bytes() if isinstance(source, Path) else orjson.dumps(source)
    return parse_job_file(data)


def ts(pair: list[int]) -> datetime:
    """A Ganeti ``[seconds, microseconds]`` timestamp as the store returns it."""
    return datetime.fromtimestamp(pair[0], UTC) + timedelta(microseconds=pair[1])


def shape(events: Iterable[StoredEvent]) -> list[tuple[str, str, int | None, int | None]]:
    return [(e.kind.value, e.status.value, e.op_index, e.log_serial) for e in events]


async def store_all(store: Store, versions: Iterable[JobFile], backend: str = BACKEND) -> None:
    for version in versions:
        await store.put(JobVersion(backend, version))
    async with asyncio.timeout(WAIT):
        await store.flush()


async def one_job(store: Store, job_id: int = 20, backend: str = BACKEND) -> StoredJob:
    stored = await store.get_job(backend, job_id)
    assert stored is not None, f"job {backend}/{job_id} not stored"
    return stored


async def job_events_of(store: Store, job_id: int = 20, backend: str = BACKEND) -> list[StoredEvent]:
    return await store.list_events(backend=backend, job_id=job_id, limit=None)


def assert_consistent(stored: StoredJob, events: Sequence[StoredEvent]) -> None:
    """What must hold of any stored job, whoever wrote it and in whatever order."""
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert stored.event_count == len(events)
    assert [e.id for e in events] == sorted({e.id for e in events})
    logs = Counter((e.op_index, e.log_serial) for e in events if e.kind is EventKind.LOG)
    assert all(n == 1 for n in logs.values()), logs
    # no change reported twice in a row: every status event is a change
    last_job: JobStatus | None = None
    last_op: dict[int | None, JobStatus] = {}
    for e in events:
        if e.kind is EventKind.JOB_STATUS:
            assert e.status is not last_job, shape(events)
            last_job = e.status
        elif e.kind is EventKind.OP_STATUS:
            assert e.status is not last_op.get(e.op_index), shape(events)
            last_op[e.op_index] = e.status
    assert last_job is stored.status
    for op in stored.ops:
        assert last_op[op.index] is op.status
    if stored.is_final:
        assert events[-1].kind is EventKind.JOB_STATUS and events[-1].status is stored.status
        finals = Counter(e.op_index for e in events if e.kind is EventKind.OP_STATUS and e.status.is_final)
        assert finals == Counter(op.index for op in stored.ops if op.status.is_final)


#: the events of lifecycle-job-20 replayed version by version: (kind, status, op index, log serial)
JOB20_EVENTS = [
    (OP, "queued", 0, None),
    (JOB, "queued", None, None),
    (OP, "waiting", 0, None),
    (JOB, "waiting", None, None),
    (OP, "running", 0, None),
    (JOB, "running", None, None),
    (LOG, "running", 0, 1),
    (LOG, "running", 0, 2),
    (LOG, "running", 0, 3),
    (LOG, "running", 0, 4),
    (OP, "success", 0, None),
    (JOB, "success", None, None),
]


# -- 1. URLs -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "driver", "database"),
    [
        ("sqlite:///var/lib/sg/jobs.db", "sqlite+aiosqlite", "var/lib/sg/jobs.db"),
        ("sqlite:////var/lib/sg/jobs.db", "sqlite+aiosqlite", "/var/lib/sg/jobs.db"),
        ("sqlite+aiosqlite:////var/lib/sg/jobs.db", "sqlite+aiosqlite", "/var/lib/sg/jobs.db"),
        ("sqlite://", "sqlite+aiosqlite", ":memory:"),
        ("postgresql://sg@db.example.com/synnefo", "postgresql+asyncpg", "synnefo"),
        ("postgres://sg@db.example.com:5433/synnefo", "postgresql+asyncpg", "synnefo"),
        ("postgresql+asyncpg://sg@db.example.com/synnefo", "postgresql+asyncpg", "synnefo"),
    ],
)
def test_accepted_url_forms_are_normalised_to_the_async_drivers(url: str, driver: str, database: str) -> None:
    normal = normalize_url(url)
    assert normal.drivername == driver
    assert normal.database == database
    store = Store(url)
    assert store.dialect == driver.split("+")[0]
    assert store.url == normal


def test_postgres_url_keeps_host_port_user() -> None:
    normal = normalize_url(f"postgres://sg:{SECRET}@db.example.com:5433/synnefo")
    assert (normal.host, normal.port, normal.username, normal.password) == (
        "db.example.com",
        5433,
        "sg",
        SECRET,
    )


@pytest.mark.parametrize(
    "url",
    [
        f"mysql://sg:{SECRET}@db.example.com/synnefo",
        f"postgresql+psycopg2://sg:{SECRET}@db.example.com/synnefo",
        "sqlite+pysqlite:///jobs.db",
    ],
)
def test_other_schemes_are_refused_with_a_clear_config_error(url: str) -> None:
    scheme = url.split("://", 1)[0]
    with pytest.raises(ConfigError) as info:
        Store(url)
    message = str(info.value)
    assert f"{scheme!r} is not supported" in message
    assert "sqlite:///PATH" in message and "postgresql://" in message
    assert SECRET not in message and SECRET not in repr(info.value)
    assert isinstance(info.value, ValueError)


def test_a_non_url_is_refused_without_echoing_it() -> None:
    with pytest.raises(ConfigError, match="not a URL") as info:
        normalize_url(f"{SECRET} is not a url")
    assert SECRET not in str(info.value)
    assert display_url(f"{SECRET} is not a url") == "<unparsable database URL>"


def test_the_password_is_never_displayed() -> None:
    url = f"postgresql://sg:{SECRET}@db.example.com/synnefo"
    assert display_url(url) == "postgresql://sg:***@db.example.com/synnefo"
    store = Store(url)
    assert SECRET not in store.display_url
    assert store.display_url == "postgresql+asyncpg://sg:***@db.example.com/synnefo"
    assert SECRET not in repr(store) and "db.example.com" in repr(store)


async def test_unreachable_postgresql_error_names_the_host_not_the_password() -> None:
    store = Store(f"postgresql://u:{SECRET}@127.0.0.1:1/x", busy_timeout=5)
    with pytest.raises(StoreError) as info:
        async with asyncio.timeout(WAIT):
            await store.open()
    error = info.value
    assert "cannot open database" in str(error) and "127.0.0.1:1" in str(error)
    assert SECRET not in str(error) and SECRET not in repr(error)
    assert error.url is not None and SECRET not in error.url and "***" in error.url
    assert error.__cause__ is None and error.__suppress_context__
    await store.close()  # never opened: a no-op


async def test_a_password_in_a_working_url_stays_out_of_logs_and_reprs(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # the test server trusts local users, so any password works: the URL carries one here
    url = pg_url.replace("postgresql://postgres@", f"postgresql://postgres:{SECRET}@")
    caplog.set_level(logging.DEBUG)
    async with Store(url) as store:
        await store_all(store, [job(LIFE20[0])])
        assert (await one_job(store)).status is JobStatus.QUEUED
        assert SECRET not in repr(store) and SECRET not in store.display_url
    assert caplog.records, "expected at least the schema creation to be logged"
    assert all(SECRET not in record.getMessage() for record in caplog.records)


async def test_in_memory_sqlite_works() -> None:
    async with Store("sqlite://") as store:
        await store_all(store, [job(p) for p in LIFE20])
        assert (await one_job(store)).status is JobStatus.SUCCESS
        assert len(await job_events_of(store)) == len(JOB20_EVENTS)


# -- 10. schema checks ---------------------------------------------------------------------------------


async def test_an_empty_database_without_create_is_refused(db_url: str) -> None:
    store = Store(db_url, create=False)
    with pytest.raises(StoreError, match="db upgrade") as info:
        await store.open()
    assert "has no synnefo-ganeti tables" in str(info.value)
    await store.close()
    # nothing was created by that attempt
    async with Store(db_url) as created:
        assert await created.list_jobs() == []


async def test_a_database_at_an_unknown_revision_is_refused(db_url: str) -> None:
    async with Store(db_url) as store:
        await store_all(store, [job(LIFE20[0])])
        async with store.engine.begin() as conn:
            await conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    for create in (True, False):
        with pytest.raises(StoreError) as info:
            async with Store(db_url, create=create):
                pass
        message = str(info.value)
        assert "revision 9999" in message and head_revision() in message and "db upgrade" in message
    # refusing touched nothing: stamped back at head, the database opens with its job
    engine = create_async_engine(normalize_url(db_url))
    try:
        async with engine.begin() as conn:
            assert (
                await conn.execute(text("SELECT version_num FROM alembic_version"))
            ).scalar_one() == "9999"
            await conn.execute(
                text("UPDATE alembic_version SET version_num = :head"), {"head": head_revision()}
            )
    finally:
        await engine.dispose()
    async with Store(db_url, create=False) as store:
        assert (await one_job(store)).status is JobStatus.QUEUED


async def test_sqlite_in_a_missing_folder_is_refused_naming_the_folder(tmp_path: Path) -> None:
    folder = tmp_path / "no" / "such"
    store = Store(f"sqlite:///{folder / 'jobs.db'}")
    with pytest.raises(StoreError, match="does not exist") as info:
        await store.open()
    assert str(folder) in str(info.value)
    assert not folder.exists()


# -- 11. the writer rides out database trouble ---------------------------------------------------------


async def test_sqlite_writer_waits_out_a_held_write_lock(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    async with Store(f"sqlite:///{path}", busy_timeout=0.2) as store:
        await store_all(store, [job(LIFE20[0])])
        locked = threading.Event()
        release = threading.Event()

        def hold_lock() -> None:
            conn = sqlite3.connect(path, isolation_level=None, timeout=5)
            try:
                conn.execute("BEGIN IMMEDIATE")
                locked.set()
                release.wait(10)
                conn.execute("COMMIT")
            finally:
                conn.close()

        holder = asyncio.create_task(asyncio.to_thread(hold_lock))
        assert await asyncio.to_thread(locked.wait, 5)
        for path_ in LIFE20[1:]:
            await store.put(JobVersion(BACKEND, job(path_)))
        # several 0.2 s busy timeouts go by, the writer holding the versions
        await eventually(lambda: store.stats.retries >= 3, what="the writer to retry behind the lock")
        assert (await one_job(store)).status is JobStatus.QUEUED  # readers are not blocked (WAL)
        release.set()
        await holder
        async with asyncio.timeout(WAIT):
            await store.flush()
        stored = await one_job(store)
        events = await job_events_of(store)
    assert stored.status is JobStatus.SUCCESS
    # what was held through the trouble was written in order: the same events as a clean replay
    assert shape(events) == JOB20_EVENTS
    assert_consistent(stored, events)


async def test_postgresql_writer_survives_its_connections_being_killed(pg_url: str) -> None:
    url = pg_url
    database = url.rsplit("/", 1)[1]
    async with Store(url) as store, Store(url) as killer:
        await store_all(store, [job(p) for p in LIFE20[:5]])
        async with killer.engine.connect() as conn:
            killed = (
                await conn.execute(
                    select(text("count(pg_terminate_backend(pid))"))
                    .select_from(text("pg_stat_activity"))
                    .where(text("datname = :db AND pid <> pg_backend_pid()")),
                    {"db": database},
                )
            ).scalar_one()
            assert killed >= 1
        await store_all(store, [job(p) for p in LIFE20[5:]])
        stored = await one_job(store)
        events = await job_events_of(store)
    assert stored.status is JobStatus.SUCCESS
    assert shape(events) == JOB20_EVENTS


async def test_postgresql_writer_retries_when_its_connection_dies_mid_write(pg_url: str) -> None:
    """The writer's connection is killed while it waits for the write lock: it retries, loses nothing."""
    versions = [job(p) for p in LIFE20]
    waiting_for_lock = (
        "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
        "AND wait_event_type = 'Lock'"
    )
    async with Store(pg_url) as store:
        await store_all(store, versions[:5])
        admin = await asyncpg.connect(pg_url, timeout=5)
        try:
            await admin.execute(
                "SELECT pg_advisory_lock(hashtext(current_database()), $1)", _WRITE_LOCK_KEY
            )  # a writer
            for version in versions[5:]:
                await store.put(JobVersion(BACKEND, version))
            await eventually(lambda: admin.fetchval(f"SELECT count(*) > 0 {waiting_for_lock}"))
            killed = await admin.fetchval(f"SELECT count(pg_terminate_backend(pid)) {waiting_for_lock}")
            assert killed == 1

            async def retried() -> bool:
                return store.stats.retries > 0

            await eventually(retried)
            assert (await one_job(store)).status is JobStatus.RUNNING  # nothing of the batch went in
            await admin.execute(
                "SELECT pg_advisory_unlock(hashtext(current_database()), $1)", _WRITE_LOCK_KEY
            )
        finally:
            await admin.close()
        async with asyncio.timeout(WAIT):
            await store.flush()
        stored = await one_job(store)
        events = await job_events_of(store)
    assert stored.status is JobStatus.SUCCESS
    assert shape(events) == JOB20_EVENTS
    assert_consistent(stored, events)


async def test_two_stores_adding_the_same_backend_at_once_need_no_retry(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Two watchers starting together on a new database: the backend row is made once, quietly.

    (On SQLite a deferred transaction that reads and then writes fails at once with
    "database is locked" when another writer got in between, whatever the busy timeout.)
    """
    caplog.set_level(logging.WARNING, logger="synnefo_ganeti.store")
    async with Store(db_url) as a, Store(db_url) as b:
        await asyncio.gather(store_all(a, [job(LIFE20[0])]), store_all(b, [job(LIFE20[0])]))
        assert (a.stats.retries, b.stats.retries) == (0, 0)
        assert sorted([a.stats.applied, b.stats.applied]) == [0, 1]
        assert await a.backends() == [BACKEND]
        assert len(await job_events_of(a)) == 2
    assert [r.getMessage() for r in caplog.records] == []
