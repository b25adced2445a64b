"""The store's jobs: applying Ganeti 3.0 job-file versions, on SQLite and on PostgreSQL.

Replays, idempotency, versions out of order, lock retries, coalescing, and two stores
writing one database (helpers in ``test_store.py``).
"""

from __future__ import annotations

import asyncio
import copy
from collections import Counter
from collections.abc import Sequence

import pytest

from synnefo_ganeti.jobs import EventKind, JobFile, JobStatus
from synnefo_ganeti.store import JobVersion, Store
from tests.unit.test_store import (
    BACKEND,
    JOB,
    JOB20_EVENTS,
    LIFE20,
    LIFECYCLES,
    LOG,
    OP,
    assert_consistent,
    job,
    job_events_of,
    one_job,
    raw,
    shape,
    store_all,
    ts,
)

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


async def test_a_jobs_ops_are_stored_once_in_its_summary_and_old_rows_still_read(db_url: str) -> None:
    """A version's ops are written once, in ``summary`` (issue 31: they were also in ``ops``); a
    row written before that, with ``ops`` filled, reads the same."""
    from sqlalchemy import select, update

    from synnefo_ganeti.store.jobs._jobs import jobs_t

    async with Store(db_url) as store:
        await store_all(store, [job(p) for p in LIFE20])
        stored = await one_job(store)
        assert await store.call_read(lambda conn: conn.execute(select(jobs_t.c.ops)).scalar_one()) == []
        legacy = [
            {
                "index": op.index,
                "op_id": op.op_id,
                "status": op.status.value,
                "instance": op.instance,
                "start_time": op.start_time.timestamp() if op.start_time else None,
                "exec_time": op.exec_time.timestamp() if op.exec_time else None,
                "end_time": op.end_time.timestamp() if op.end_time else None,
                "error": op.error,
            }
            for op in stored.ops
        ]
        await store.call(lambda conn: conn.execute(update(jobs_t).values(ops=legacy)))
        assert (await one_job(store)).ops == stored.ops
