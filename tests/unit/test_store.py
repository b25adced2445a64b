"""The job store, on SQLite and on PostgreSQL, fed with real Ganeti 3.0 job files.

Every test that takes ``db_url`` runs against a fresh SQLite file and a fresh
PostgreSQL database. Versions that Ganeti writes without a fixture of their own
(a lock retry, a late duplicate) are made by editing the recorded JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import logging
import sqlite3
import threading
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import pytest
from sqlalchemy import select, text, update
from sqlalchemy.ext.asyncio import create_async_engine

from synnefo_ganeti.errors import ConfigError, StoreError
from synnefo_ganeti.jobs import EventKind, JobFile, JobStatus, parse_job_file
from synnefo_ganeti.store import (
    JobVersion,
    PruneResult,
    Store,
    StoredEvent,
    StoredJob,
    display_url,
    head_revision,
    normalize_url,
)
from synnefo_ganeti.store._schema import Job, JobEventRow
from synnefo_ganeti.store._store import _WRITE_LOCK_KEY
from tests.helpers import QUEUE_FIXTURES

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


async def wait_until(check: Callable[[], Awaitable[Any]]) -> None:
    """Polls ``check`` until it is true (a hang fails at WAIT)."""
    async with asyncio.timeout(WAIT):
        for _ in itertools.count():
            if await check():
                return
            await asyncio.sleep(0.02)


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


@pytest.fixture
def pg_url(make_pg_url: Any) -> str:
    """A fresh PostgreSQL database, for the tests specific to PostgreSQL (made outside the event loop)."""
    url: str = make_pg_url()
    return url


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


# -- 2. lifecycle replay -------------------------------------------------------------------------------


async def test_lifecycle_replay_stores_the_final_job_and_every_event(db_url: str) -> None:
    final = raw(LIFE20[-1])
    waiting = raw(LIFE20[3])
    final_op = final["ops"][0]
    async with Store(db_url) as store:
        await store_all(store, [job(p) for p in LIFE20])
        stored = await one_job(store)
        events = await job_events_of(store)
        assert await store.list_events(limit=None) == events
        stats = store.stats

    assert stored.backend == BACKEND and stored.job_id == 20
    assert stored.status is JobStatus.SUCCESS and stored.is_final
    assert stored.instance == "inst5.ganeti.test"
    assert not stored.archived
    (op,) = stored.ops
    assert (op.index, op.op_id, op.status, op.instance, op.error) == (
        0,
        "OP_INSTANCE_CREATE",
        JobStatus.SUCCESS,
        "inst5.ganeti.test",
        None,
    )
    assert op.start_time == ts(final_op["start_timestamp"])
    assert op.exec_time == ts(final_op["exec_timestamp"])
    assert op.end_time == ts(final_op["end_timestamp"])
    assert stored.received_at == ts(final["received_timestamp"])
    assert stored.started_at == ts(final["start_timestamp"])
    assert stored.ended_at == ts(final["end_timestamp"])
    # 02 and 03 differ from 01 only in things the store does not keep (livelock): not new versions
    assert stored.revision == 8
    assert (stats.versions, stats.applied, stats.skipped, stats.older, stats.events) == (10, 8, 2, 0, 12)

    assert shape(events) == JOB20_EVENTS
    assert [e.seq for e in events] == list(range(1, 13))
    assert [e.id for e in events] == sorted(e.id for e in events)
    assert stored.event_count == 12
    assert all(e.backend == BACKEND and e.job_id == 20 for e in events)
    assert all(e.instance == "inst5.ganeti.test" for e in events)
    assert [e.op_id for e in events if e.kind is not EventKind.JOB_STATUS] == ["OP_INSTANCE_CREATE"] * 8
    logs = [e for e in events if e.kind is EventKind.LOG]
    assert [e.log_message for e in logs] == [line[3] for line in final_op["log"]]
    assert [e.event_time for e in logs] == [ts(line[1]) for line in final_op["log"]]

    # Synnefo eventd's choice of time: queued -> job received, waiting -> op start,
    # running -> op exec, final -> op end; the job's status at the op change behind it,
    # a final one at the job's end.
    received = ts(final["received_timestamp"])
    start = ts(waiting["ops"][0]["start_timestamp"])
    exec_ = ts(final_op["exec_timestamp"])
    times = [e.event_time for e in events if e.kind is not EventKind.LOG]
    assert times == [
        received,
        received,
        start,
        start,
        exec_,
        exec_,
        ts(final_op["end_timestamp"]),
        ts(final["end_timestamp"]),
    ]
    assert all(e.stored_at.tzinfo is not None for e in events)
    assert stored.first_seen_at <= stored.updated_at


async def test_multi_op_lifecycle_replay(db_url: str) -> None:
    async with Store(db_url) as store:
        await store_all(store, [job(p) for p in LIFECYCLES[23]])
        stored = await one_job(store, 23)
        events = await job_events_of(store, 23)
    assert stored.status is JobStatus.SUCCESS
    assert [(op.index, op.op_id, op.status) for op in stored.ops] == [
        (0, "OP_TEST_DELAY", JobStatus.SUCCESS),
        (1, "OP_INSTANCE_SHUTDOWN", JobStatus.SUCCESS),
        (2, "OP_TEST_DELAY", JobStatus.SUCCESS),
    ]
    assert_consistent(stored, events)
    for index in range(3):
        assert [e.status.value for e in events if e.op_index == index and e.kind is EventKind.OP_STATUS] == [
            "queued",
            "waiting",
            "running",
            "success",
        ]


# -- 3. idempotency ------------------------------------------------------------------------------------


async def test_the_same_versions_again_change_nothing(db_url: str) -> None:
    versions = [job(p) for p in LIFE20]
    async with Store(db_url) as store:
        await store_all(store, versions)
        before = await one_job(store)
        events = await store.list_events(limit=None)

        await store_all(store, versions)  # a rescan of the same files
        await store_all(store, [versions[-1]] * 3)
        assert await one_job(store) == before
        assert await store.list_events(limit=None) == events
        assert (store.stats.applied, store.stats.events) == (8, 12)

    async with Store(db_url) as second:  # a second watcher of the same queue
        await store_all(second, versions)
        assert await one_job(second) == before
        assert await second.list_events(limit=None) == events
        assert (second.stats.applied, second.stats.skipped, second.stats.events) == (0, 10, 0)
        assert second.stats.older == 9  # every version but the stored one is older than it


async def test_a_second_watcher_continues_where_the_first_stopped(db_url: str) -> None:
    versions = [job(p) for p in LIFE20]
    async with Store(db_url) as first:
        await store_all(first, versions[:6])
        assert (await one_job(first)).status is JobStatus.RUNNING
    async with Store(db_url) as second:
        await store_all(second, versions)  # rescans everything from the start
        stored = await one_job(second)
        events = await job_events_of(second)
        assert second.stats.applied == 4  # 07, 08, 09, 10
    assert stored.status is JobStatus.SUCCESS and stored.revision == 8
    assert shape(events) == JOB20_EVENTS
    assert_consistent(stored, events)


async def test_archiving_marks_the_job_without_a_new_revision(db_url: str) -> None:
    versions = [job(p) for p in LIFE20]
    async with Store(db_url) as store:
        await store_all(store, versions)
        before = await one_job(store)
        assert await store.archived_final_job_ids(BACKEND) == set()
        await store.put(JobVersion(BACKEND, versions[-1], archived=True))
        await store.flush()
        after = await one_job(store)
        assert after.archived and not before.archived
        assert (after.revision, after.event_count, after.status) == (
            before.revision,
            before.event_count,
            before.status,
        )
        assert await store.archived_final_job_ids(BACKEND) == {20}
        assert await store.archived_final_job_ids("other") == set()
        # seen again in the queue directory (not archived): stays archived
        await store.record(BACKEND, versions[-1])
        assert (await one_job(store)).archived
        assert len(await store.list_events(limit=None)) == len(JOB20_EVENTS)


# -- 4. monotonic --------------------------------------------------------------------------------------


async def test_an_older_version_after_a_newer_one_changes_nothing(db_url: str) -> None:
    async with Store(db_url) as store:
        await store_all(store, [job(LIFE20[8])])  # running, 4 log lines
        before = await one_job(store)
        events = await job_events_of(store)
        await store_all(store, [job(LIFE20[4]), job(LIFE20[3]), job(LIFE20[0])])  # late arrivals
        assert await one_job(store) == before
        assert await job_events_of(store) == events
        assert (store.stats.older, store.stats.skipped, store.stats.applied) == (3, 3, 1)
    assert before.status is JobStatus.RUNNING and before.revision == 1
    assert shape(events) == [
        (OP, "running", 0, None),
        (LOG, "running", 0, 1),
        (LOG, "running", 0, 2),
        (LOG, "running", 0, 3),
        (LOG, "running", 0, 4),
        (JOB, "running", None, None),
    ]


async def test_a_final_status_is_never_replaced(db_url: str) -> None:
    final = raw(LIFE20[-1])
    # a running version stamped later than the end, with more log lines: still not newer than final
    later = copy.deepcopy(raw(LIFE20[8]))
    op = later["ops"][0]
    op["exec_timestamp"] = [final["end_timestamp"][0] + 100, 0]
    op["log"] = [*op["log"], *([n, [final["end_timestamp"][0] + 100, n], "message", "late"] for n in (5, 6))]
    # another final status, later: the first final status stands too
    error = copy.deepcopy(final)
    error["ops"][0].update(status="error", result=["OpExecError", ["too late"]])
    error["ops"][0]["end_timestamp"] = error["end_timestamp"] = [final["end_timestamp"][0] + 200, 0]

    async with Store(db_url) as store:
        await store_all(store, [job(final)])
        before = await one_job(store)
        events = await job_events_of(store)
        await store_all(store, [job(later)])
        await store_all(store, [job(error)])
        await store_all(store, [job(LIFE20[0])])
        assert await one_job(store) == before
        assert await job_events_of(store) == events
        assert store.stats.older == 3
    assert before.status is JobStatus.SUCCESS


async def test_out_of_order_in_one_batch_and_in_separate_batches_end_the_same(db_url: str) -> None:
    order = [LIFE20[i] for i in (0, 4, 3, 9, 8, 5)]
    expected = [
        (OP, "queued", 0, None),
        (JOB, "queued", None, None),
        (OP, "running", 0, None),
        (JOB, "running", None, None),
        # 05 -> 10 in one step: the log lines carry the op's status of the version they came in
        (LOG, "success", 0, 1),
        (LOG, "success", 0, 2),
        (LOG, "success", 0, 3),
        (LOG, "success", 0, 4),
        (OP, "success", 0, None),
        (JOB, "success", None, None),
    ]
    async with Store(db_url) as store:
        batches = store.stats.batches
        for path in order:  # no await in between that yields: the writer takes them as one batch
            await store.put(JobVersion("one-batch", job(path)))
        await store.flush()
        assert store.stats.batches == batches + 1
        assert (store.stats.applied, store.stats.older) == (3, 3)

        for path in order:
            await store_all(store, [job(path)], backend="separate")
        assert store.stats.batches == batches + 1 + len(order)
        assert (store.stats.applied, store.stats.older) == (6, 6)

        one = await one_job(store, backend="one-batch")
        separate = await one_job(store, backend="separate")
        one_events = await job_events_of(store, backend="one-batch")
        separate_events = await job_events_of(store, backend="separate")
        assert await store.backends() == ["one-batch", "separate"]

    assert one.status is separate.status is JobStatus.SUCCESS
    assert one.revision == separate.revision == 3
    assert shape(one_events) == shape(separate_events) == expected
    assert [e.event_time for e in one_events] == [e.event_time for e in separate_events]
    assert_consistent(one, one_events)
    assert_consistent(separate, separate_events)


# -- 5. lock retry -------------------------------------------------------------------------------------


async def test_a_lock_retry_running_to_waiting_is_a_change(db_url: str) -> None:
    running = raw(LIFE20[4])  # running, no log yet
    # Ganeti's NotifyRetry: the op goes back to waiting, timestamps untouched
    retry = copy.deepcopy(running)
    retry["ops"][0]["status"] = "waiting"
    # a second retry, this time with a log line written while waiting
    exec_ = running["ops"][0]["exec_timestamp"]
    retry_log = copy.deepcopy(retry)
    retry_log["ops"][0]["log"] = [[1, [exec_[0] + 1, 0], "message", "waiting for locks"]]
    running_log = copy.deepcopy(retry_log)
    running_log["ops"][0]["status"] = "running"

    sequence = [job(LIFE20[3]), job(running), job(retry), job(retry), job(running), job(retry_log)]
    sequence += [job(running_log)]
    async with Store(db_url) as store:
        await store_all(store, sequence[:2])
        for version in sequence[2:]:  # each read by the watcher after the previous was stored
            await store_all(store, [version])
        stored = await one_job(store)
        events = await job_events_of(store)
        assert store.stats.older == 0
        assert store.stats.skipped == 1  # the repeated retry

    assert stored.status is JobStatus.RUNNING
    assert stored.revision == 6
    assert shape(events) == [
        (OP, "waiting", 0, None),
        (JOB, "waiting", None, None),
        (OP, "running", 0, None),
        (JOB, "running", None, None),
        (OP, "waiting", 0, None),  # the retry
        (JOB, "waiting", None, None),
        (OP, "running", 0, None),
        (JOB, "running", None, None),
        (OP, "waiting", 0, None),  # the second retry, with its log line
        (LOG, "waiting", 0, 1),
        (JOB, "waiting", None, None),
        (OP, "running", 0, None),
        (JOB, "running", None, None),
    ]
    assert events[9].log_message == "waiting for locks"
    # waiting is timed by the op's start, running by its exec (both untouched by a retry);
    # the job's status by the latest op change behind it (the second retry: its log line)
    start = ts(running["ops"][0]["start_timestamp"])
    exec_time = ts(exec_)
    log_time = ts([exec_[0] + 1, 0])
    assert [e.event_time for e in events] == [
        start,
        start,
        exec_time,
        exec_time,
        start,
        start,
        exec_time,
        exec_time,
        start,
        log_time,
        log_time,
        exec_time,
        exec_time,
    ]
    assert_consistent(stored, events)


# -- 6. coalescing -------------------------------------------------------------------------------------


@pytest.mark.parametrize("job_id", [20, 23])
async def test_only_the_first_and_last_version_still_give_the_final_state(db_url: str, job_id: int) -> None:
    paths = LIFECYCLES[job_id]
    async with Store(db_url) as store:
        await store_all(store, [job(paths[0])])
        await store_all(store, [job(paths[-1])])
        stored = await one_job(store, job_id)
        events = await job_events_of(store, job_id)
    final = raw(paths[-1])
    assert stored.status is JobStatus.SUCCESS and stored.revision == 2
    assert stored.ended_at == ts(final["end_timestamp"])
    assert_consistent(stored, events)
    times = [e.event_time for e in events]
    assert None not in times and times == sorted(times)  # type: ignore[type-var]
    n_ops = len(final["ops"])
    logs = [(i, line[0]) for i, op in enumerate(final["ops"]) for line in op["log"]]
    assert sorted((e.op_index, e.log_serial) for e in events if e.kind is EventKind.LOG) == sorted(logs)
    assert shape(events)[: n_ops + 1] == [
        *((OP, "queued", i, None) for i in range(n_ops)),
        (JOB, "queued", None, None),
    ]
    assert shape(events)[-1] == (JOB, "success", None, None)
    assert Counter(e.op_index for e in events if e.kind is EventKind.OP_STATUS) == Counter(
        {i: 2 for i in range(n_ops)}
    )


# -- 7. two stores, one database -----------------------------------------------------------------------


async def _feed(store: Store, versions: Sequence[JobFile]) -> None:
    for version in versions:
        await store_all(store, [version])
        await asyncio.sleep(0)


async def test_two_stores_writing_different_versions_concurrently_end_consistent(db_url: str) -> None:
    mine: list[JobFile] = []
    theirs: list[JobFile] = []
    for paths in LIFECYCLES.values():
        versions = [job(p) for p in paths]
        mine += [*versions[0::2], versions[-1]]
        theirs += versions[1::2]
    async with Store(db_url) as a, Store(db_url) as b:
        await asyncio.gather(_feed(a, mine), _feed(b, theirs))
        assert a.stats.applied + b.stats.applied >= 3
        jobs = await a.list_jobs()
        events = {job_id: await job_events_of(b, job_id) for job_id in LIFECYCLES}
        all_events = await b.list_events(limit=None)
    assert [(j.job_id, j.status) for j in jobs] == [
        (12, JobStatus.SUCCESS),
        (20, JobStatus.SUCCESS),
        (23, JobStatus.SUCCESS),
    ]
    for stored in jobs:
        assert_consistent(stored, events[stored.job_id])
    assert len(all_events) == sum(len(e) for e in events.values())
    assert len({(e.job_id, e.seq) for e in all_events}) == len(all_events)


@pytest.mark.parametrize("pace", ["lockstep", "free"])
async def test_two_watchers_of_one_queue_store_each_change_once(db_url: str, pace: str) -> None:
    """Both read every version; "lockstep": they race to store each one; "free": each at its own pace."""
    versions = [job(p) for paths in LIFECYCLES.values() for p in paths]
    async with Store("sqlite://") as reference:
        await _feed(reference, versions)
        expected = {j: shape(await job_events_of(reference, j)) for j in LIFECYCLES}
    async with Store(db_url) as a, Store(db_url) as b:
        if pace == "lockstep":
            for version in versions:
                await asyncio.gather(store_all(a, [version]), store_all(b, [version]))
        else:
            await asyncio.gather(_feed(a, versions), _feed(b, versions))
        got = {j: shape(await job_events_of(a, j)) for j in LIFECYCLES}
        jobs = await b.list_jobs()
        all_events = await a.list_events(limit=None)
        # each change stored once, by one of them
        assert a.stats.applied + b.stats.applied == 22
        assert a.stats.skipped + b.stats.skipped == 2 * len(versions) - 22
        assert a.stats.events + b.stats.events == sum(len(e) for e in expected.values()) == len(all_events)
    assert got == expected
    assert {j.job_id: j.revision for j in jobs} == {20: 8, 12: 4, 23: 10}
    assert all(j.status is JobStatus.SUCCESS for j in jobs)
    assert len({(e.job_id, e.seq) for e in all_events}) == len(all_events)


# -- 8. the events() iterator --------------------------------------------------------------------------


async def _collect(events: AsyncIterator[StoredEvent], count: int) -> list[StoredEvent]:
    got: list[StoredEvent] = []
    async for event in events:
        got.append(event)
        if len(got) == count:
            break
    return got


async def test_events_without_follow_returns_what_is_stored(db_url: str) -> None:
    async with Store(db_url) as store:
        async with contextlib.aclosing(store.events(follow=False)) as events:
            assert [e async for e in events] == []
        await store_all(store, [job(p) for p in LIFE20])
        stored = await store.list_events(limit=None)
        async with contextlib.aclosing(store.events(follow=False)) as events:
            assert [e async for e in events] == stored
        async with contextlib.aclosing(store.events(since=stored[3].id, follow=False)) as events:
            assert [e async for e in events] == stored[4:]
        async with contextlib.aclosing(store.events(since=stored[-1].id, follow=False)) as events:
            assert [e async for e in events] == []
        async with contextlib.aclosing(store.events(job_id=12, follow=False)) as events:
            assert [e async for e in events] == []
        async with contextlib.aclosing(store.events(backend="other", follow=False)) as events:
            assert [e async for e in events] == []
    assert shape(stored) == JOB20_EVENTS


async def test_events_since_a_datetime(db_url: str) -> None:
    versions = [job(p) for p in LIFE20]
    async with Store(db_url) as store:
        await store_all(store, versions[:4])
        first = await store.list_events(limit=None)
        cut = datetime.now(UTC)
        await asyncio.sleep(0.01)
        await store_all(store, versions[4:6])
        second = await store.list_events(since=first[-1].id, limit=None)
        assert len(first) == 4 and len(second) == 3
        assert all(e.stored_at < cut for e in first) and all(e.stored_at >= cut for e in second)

        async with contextlib.aclosing(store.events(since=cut, follow=False)) as events:
            assert [e async for e in events] == second
        async with contextlib.aclosing(store.events(since=datetime.now(UTC), follow=False)) as events:
            assert [e async for e in events] == []

        # following from a datetime: what is there, then what comes
        async with contextlib.aclosing(store.events(since=cut, follow=True)) as events:
            task = asyncio.create_task(_collect(events, len(second) + 5))
            await store_all(store, versions[6:])
            got = await asyncio.wait_for(task, WAIT)
    assert got[: len(second)] == second
    assert shape(got[len(second) :]) == JOB20_EVENTS[-5:]


async def test_follow_wakes_up_for_events_of_the_same_store(db_url: str) -> None:
    versions = [job(p) for p in LIFE20]
    # a poll interval longer than the test: only the writer's wakeup can deliver in time
    async with Store(db_url, poll_interval=60) as store:
        await store_all(store, versions[:4])
        stored = await store.list_events(limit=None)
        async with contextlib.aclosing(store.events(since=stored[1].id)) as events:
            task = asyncio.create_task(_collect(events, len(JOB20_EVENTS) - 2))
            await asyncio.sleep(0.1)  # let it catch up and wait
            for version in versions[4:]:
                await store_all(store, [version])
                await asyncio.sleep(0.01)
            got = await asyncio.wait_for(task, WAIT)
    assert shape(got) == JOB20_EVENTS[2:]
    assert got[:2] == stored[2:]
    assert [e.id for e in got] == sorted(e.id for e in got)


async def test_follow_sees_events_written_by_another_store(db_url: str) -> None:
    versions = [job(p) for p in LIFE20]
    sqlite = db_url.startswith("sqlite")
    # PostgreSQL: no polling to speak of (NOTIFY or a 30 s timeout); SQLite: polling is the way
    poll = 0.1 if sqlite else 60
    async with Store(db_url) as writer, Store(db_url, poll_interval=poll) as reader:
        await store_all(writer, versions[:1])
        async with contextlib.aclosing(reader.events()) as events:
            task = asyncio.create_task(_collect(events, len(JOB20_EVENTS)))
            await asyncio.sleep(0.2)
            for version in versions[1:]:
                await store_all(writer, [version])
                await asyncio.sleep(0.01)
            got = await asyncio.wait_for(task, WAIT)
        assert reader.stats.batches == 0  # it never wrote
    assert shape(got) == JOB20_EVENTS


async def test_notify_wakes_a_postgresql_follower_quickly(pg_url: str) -> None:
    """The NOTIFY path alone (no rows when the follower starts, one write later)."""
    url = pg_url
    async with Store(url) as writer, Store(url) as reader, contextlib.aclosing(reader.events()) as events:
        task = asyncio.create_task(_collect(events, 2))
        await asyncio.sleep(0.3)  # the follower is listening and waiting on its 30 s timeout
        assert not task.done()
        await store_all(writer, [job(LIFE20[0])])
        got = await asyncio.wait_for(task, 10)  # well under that timeout
    assert shape(got) == JOB20_EVENTS[:2]


# -- 9. prune ------------------------------------------------------------------------------------------


async def _age(store: Store, job_id: int, *, ended: datetime | None, updated: datetime | None) -> None:
    values: dict[str, Any] = {}
    if ended is not None:
        values["ended_at"] = ended
    if updated is not None:
        values["updated_at"] = updated
    async with store.engine.begin() as conn:
        if values:
            await conn.execute(update(Job.__table__).where(Job.__table__.c.job_id == job_id).values(**values))
        if updated is not None:
            events = JobEventRow.__table__
            await conn.execute(update(events).where(events.c.job_id == job_id).values(stored_at=updated))


async def test_prune_deletes_old_ended_jobs_and_their_events(db_url: str) -> None:
    now = datetime.now(UTC)
    old = now - timedelta(days=10)
    async with Store(db_url) as store:
        await store_all(store, [job(p) for p in LIFE20])  # success: will be old
        await store_all(store, [job(p) for p in LIFECYCLES[12]])  # success: ended recently
        await store_all(store, [job(p) for p in LIFECYCLES[23][:7]])  # running, old
        await store_all(store, [job(QUEUE_FIXTURES / "job-21.op_instance_shutdown.queued.json")])
        await _age(store, 20, ended=old, updated=old)
        await _age(store, 12, ended=now - timedelta(hours=2), updated=None)
        await _age(store, 23, ended=None, updated=old)
        await _age(store, 21, ended=None, updated=old)
        kept_events = {j: await job_events_of(store, j) for j in (12, 23, 21)}
        assert len(await job_events_of(store, 20)) == len(JOB20_EVENTS)

        result = await store.prune(timedelta(days=1))

        assert result == PruneResult(events=len(JOB20_EVENTS), jobs=1)
        assert await store.get_job(BACKEND, 20) is None
        assert await job_events_of(store, 20) == []
        assert [(j.job_id, j.status) for j in await store.list_jobs()] == [
            (12, JobStatus.SUCCESS),
            (21, JobStatus.QUEUED),
            (23, JobStatus.WAITING),
        ]
        assert {j: await job_events_of(store, j) for j in (12, 23, 21)} == kept_events
        assert await store.prune(timedelta(days=1)) == PruneResult(events=0, jobs=0)

        # the pruned job's files, read again, start it afresh (seq from 1)
        await store_all(store, [job(LIFE20[-1])])
        again = await job_events_of(store, 20)
        assert [e.seq for e in again] == list(range(1, len(again) + 1)) and again

        # a zero retention removes every ended job (12 and 20 now), keeps the others
        async with store.engine.begin() as conn:
            await conn.execute(update(Job.__table__).values(updated_at=now - timedelta(minutes=1)))
            await conn.execute(update(Job.__table__).where(Job.__table__.c.job_id == 20).values(ended_at=old))
        result = await store.prune(timedelta(0))
        assert result.jobs == 2
        assert [j.job_id for j in await store.list_jobs()] == [21, 23]
        with pytest.raises(ValueError, match="negative"):
            await store.prune(timedelta(seconds=-1))


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
        await asyncio.sleep(1.5)  # several 0.2 s busy timeouts

        async def retried() -> bool:
            return store.stats.retries > 0

        await wait_until(retried)
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
            await wait_until(lambda: admin.fetchval(f"SELECT count(*) > 0 {waiting_for_lock}"))
            killed = await admin.fetchval(f"SELECT count(pg_terminate_backend(pid)) {waiting_for_lock}")
            assert killed == 1

            async def retried() -> bool:
                return store.stats.retries > 0

            await wait_until(retried)
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
