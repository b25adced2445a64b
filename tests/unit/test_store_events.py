"""The store's events (reading, following, NOTIFY) and pruning, on SQLite and on PostgreSQL
(helpers in ``test_store.py``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from sqlalchemy import update

from synnefo_ganeti.jobs import JobStatus
from synnefo_ganeti.store import PruneResult, Store, StoredEvent
from synnefo_ganeti.store.jobs._rows import Job, JobEventRow
from tests.helpers import QUEUE_FIXTURES, clock_ticks, eventually
from tests.unit.test_store import (
    BACKEND,
    JOB20_EVENTS,
    LIFE20,
    LIFECYCLES,
    WAIT,
    job,
    job_events_of,
    shape,
    store_all,
)

# -- 8. the events() iterator --------------------------------------------------------------------------


async def _collect(
    events: AsyncIterator[StoredEvent], count: int, *, into: list[StoredEvent] | None = None
) -> list[StoredEvent]:
    """The first ``count`` events, appended to ``into`` (a list the test watches) as they come."""
    got: list[StoredEvent] = [] if into is None else into
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
        await clock_ticks()
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
            got: list[StoredEvent] = []
            task = asyncio.create_task(_collect(events, len(JOB20_EVENTS) - 2, into=got))
            await eventually(lambda: len(got) >= 2, what="the follower to catch up")  # then it waits
            for version in versions[4:]:
                await store_all(store, [version])
            await asyncio.wait_for(task, WAIT)
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
        first = len(await writer.list_events(limit=None))
        async with contextlib.aclosing(reader.events()) as events:
            got: list[StoredEvent] = []
            task = asyncio.create_task(_collect(events, len(JOB20_EVENTS), into=got))
            await eventually(lambda: len(got) >= first, what="the follower to catch up")  # then it waits
            for version in versions[1:]:
                await store_all(writer, [version])
            await asyncio.wait_for(task, WAIT)
        assert reader.stats.batches == 0  # it never wrote
    assert shape(got) == JOB20_EVENTS


async def test_notify_wakes_a_postgresql_follower_quickly(pg_url: str) -> None:
    """The NOTIFY path alone (no rows when the follower starts, one write later)."""
    url = pg_url
    async with Store(url) as writer, Store(url) as reader, contextlib.aclosing(reader.events()) as events:
        task = asyncio.create_task(_collect(events, 2))
        admin = await asyncpg.connect(url, timeout=5)
        try:  # the follower is listening (then waits on its 30 s timeout)
            await eventually(
                lambda: admin.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND query LIKE 'LISTEN %'"
                ),
                what="the follower's LISTEN",
            )
        finally:
            await admin.close()
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
