"""The queue watcher and the store against the real Ganeti testbed (scripts/ganeti-testbed up).

A QueueWatcher follows the testbed's queue (SYNNEFO_GANETI_TEST_QUEUE) into a fresh store (SQLite and PostgreSQL)
while jobs are submitted through RAPI; what the store holds is compared with what RAPI
says of the same jobs. Skipped with a reason where no cluster runs; in CI these tests
must run (the ``testbed`` fixture fails instead of skipping).
"""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest

from synnefo_ganeti import Job, JobStatus, NotFoundError, RapiClient
from synnefo_ganeti.store import Store, StoredEvent, StoredJob
from synnefo_ganeti.watch import QueueWatcher
from tests.helpers import eventually
from tests.integration._testbed import BACKEND, DEADLINE, client, name, ns, spec, watching

pytestmark = [pytest.mark.ganeti, pytest.mark.timeout(180)]


async def stored_final(
    store: Store, watcher: QueueWatcher, task: asyncio.Task[None], job_id: int
) -> StoredJob:
    """The job once the store holds it with a final status (polled; DEADLINE seconds at most)."""
    stored: StoredJob | None = None

    async def final() -> StoredJob | None:
        nonlocal stored
        if task.done():
            task.result()  # the watcher's error, if it had one
            pytest.fail(f"the watcher stopped by itself while waiting for job {job_id}")
        stored = await store.get_job(BACKEND, job_id)
        return stored if stored is not None and stored.is_final else None

    try:
        found: StoredJob = await eventually(final, timeout=DEADLINE, interval=0.1, what=f"job {job_id} final")
    except AssertionError:
        pytest.fail(
            f"job {job_id} not final in the store after {DEADLINE:.0f} s: stored "
            f"{stored.status if stored else None}; watcher {watcher.stats}; writer {store.stats}"
        )
    return found


async def events_of(store: Store, job_id: int) -> list[StoredEvent]:
    return await store.list_events(backend=BACKEND, job_id=job_id, limit=None)


def log_text(message: object) -> str:
    return message if isinstance(message, str) else json.dumps(message)


async def compare(store: Store, stored: StoredJob, rapi: RapiClient) -> tuple[Job, list[StoredEvent]]:
    """The stored job agrees with RAPI's answer for it; its events are consistent with it."""
    job = await rapi.get_job(stored.job_id)
    assert job.is_final
    assert stored.status is job.status, (stored, job)
    assert [op.op_id for op in stored.ops] == [op["OP_ID"] for op in job.ops]
    assert [op.status for op in stored.ops] == job.opstatus
    failure = job.failure
    if failure is None:
        assert all(op.error is None for op in stored.ops)
    else:
        error = stored.ops[failure.op_index].error
        assert error is not None and error.startswith(failure.type) and failure.message in error, error

    events = await events_of(store, stored.job_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert stored.event_count == len(events)
    assert all(e.job_id == stored.job_id and e.backend == BACKEND for e in events)
    job_statuses = [e.status for e in events if e.kind == "job_status"]
    assert job_statuses and job_statuses[-1] is job.status, job_statuses
    assert all(a is not b for a, b in itertools.pairwise(job_statuses)), job_statuses
    assert events[-1].kind == "job_status"  # nothing after the final status
    for index, op_id in enumerate(op["OP_ID"] for op in job.ops):
        op_statuses = [e.status for e in events if e.kind == "op_status" and e.op_index == index]
        assert op_statuses and op_statuses[-1] is job.opstatus[index], (op_id, op_statuses)
        assert all(e.op_id == op_id for e in events if e.op_index == index)

    logs = [e for e in events if e.kind == "log"]
    serials = [e.log_serial for e in logs]
    assert all(isinstance(s, int) for s in serials)
    assert serials == sorted(set(serials)), serials  # strictly increasing
    by_serial = {e.log_serial: e for e in logs}
    for entry in job.log:
        assert entry.serial in by_serial, (entry, serials)
        got = by_serial[entry.serial]
        assert got.log_message == log_text(entry.message)
        assert got.event_time is not None
        assert abs(got.event_time.timestamp() - entry.timestamp.as_float) < 0.001
    return job, events


async def remove_leftovers(rapi: RapiClient, names: list[str]) -> None:
    """Remove the instances a failed test left behind (the test removes them itself otherwise)."""
    for instance in names:
        try:
            await rapi.get_instance(instance)
        except NotFoundError:
            continue
        await rapi.wait_for_job(await rapi.delete_instance(instance), timeout=120)


async def archive(testbed, job_id: int) -> None:
    process = await asyncio.create_subprocess_exec(
        *ns(testbed, "gnt-job", "archive", str(job_id)), stdout=asyncio.subprocess.PIPE
    )
    out, _ = await process.communicate()
    assert process.returncode == 0, out


async def test_watcher_follows_an_instance_lifecycle(testbed, db_url) -> None:
    instance = name("wlife")
    async with Store(db_url) as store, client(testbed) as rapi:
        try:
            async with watching(store) as (watcher, task):
                # create: every step of it, seen as it happens
                create_id = await rapi.create_instance(spec(testbed, instance))
                created = await stored_final(store, watcher, task, create_id)
                assert created.status is JobStatus.SUCCESS, created.ops
                assert created.instance == instance and created.ops[0].op_id == "OP_INSTANCE_CREATE"
                job, events = await compare(store, created, rapi)
                assert job.log, "Ganeti logs a create's steps"
                statuses = [e.status for e in events if e.kind == "job_status"]
                assert JobStatus.RUNNING in statuses, statuses  # the watcher saw it at work
                op_events = [e for e in events if e.kind == "op_status"]
                assert {e.op_id for e in op_events} == {"OP_INSTANCE_CREATE"}
                assert {e.instance for e in events} == {instance}
                assert JobStatus.RUNNING in [e.status for e in op_events]
                assert any(e.kind == "log" and e.status is JobStatus.RUNNING for e in events)
                times = [e.event_time for e in events if e.kind != "log" and e.event_time is not None]
                assert times == sorted(times)

                # a failing create: the name is taken
                duplicate_id = await rapi.create_instance(spec(testbed, instance))
                duplicate = await stored_final(store, watcher, task, duplicate_id)
                assert duplicate.status is JobStatus.ERROR
                job, _ = await compare(store, duplicate, rapi)
                assert job.failure is not None and job.failure.ecode == "already_exists"

                ids = {}
                for what, submit in (
                    ("shutdown", rapi.shutdown_instance),
                    ("startup", rapi.startup_instance),
                    ("remove", rapi.delete_instance),
                ):
                    ids[what] = await submit(instance)
                    done = await stored_final(store, watcher, task, ids[what])
                    assert done.status is JobStatus.SUCCESS, (what, done.ops)
                    assert done.instance == instance
                    await compare(store, done, rapi)
                with pytest.raises(NotFoundError):
                    await rapi.get_instance(instance)

                # archive: the stored job keeps its final state, and is marked archived
                shutdown = await store.get_job(BACKEND, ids["shutdown"])
                assert shutdown is not None and not shutdown.archived
                await archive(testbed, ids["shutdown"])

                async def is_archived() -> bool:
                    job = await store.get_job(BACKEND, ids["shutdown"])
                    return job is not None and job.archived

                await eventually(
                    is_archived,
                    timeout=DEADLINE,
                    interval=0.1,
                    what=f"job {ids['shutdown']} stored as archived",
                )
                after = await store.get_job(BACKEND, ids["shutdown"])
                assert after is not None
                assert (after.status, after.ops, after.event_count, after.revision) == (
                    shutdown.status,
                    shutdown.ops,
                    shutdown.event_count,
                    shutdown.revision,
                )
                assert (await rapi.get_job(ids["shutdown"])).status is JobStatus.SUCCESS
                assert len(await events_of(store, ids["shutdown"])) == shutdown.event_count
            assert watcher.stats.bad_files == 0
        finally:
            await remove_leftovers(rapi, [instance])


async def test_watcher_catches_up_after_a_restart(testbed, db_url) -> None:
    async with client(testbed) as rapi:
        async with Store(db_url) as store, watching(store) as (watcher, task):
            first_id = await rapi.create_instance(spec(testbed, name("wdry")), dry_run=True)
            first = await stored_final(store, watcher, task, first_id)
            assert first.status is JobStatus.SUCCESS and not first.archived

        # while no watcher runs: a job starts and ends, and the first one is archived
        missed_id = await rapi.create_instance(spec(testbed, name("wdry")), dry_run=True)
        missed_job = await rapi.wait_for_job(missed_id, timeout=DEADLINE)
        assert missed_job.status is JobStatus.SUCCESS
        await archive(testbed, first_id)

        async with Store(db_url) as store:
            assert await store.get_job(BACKEND, missed_id) is None
            async with watching(store) as (watcher, task):
                missed = await stored_final(store, watcher, task, missed_id)
                assert missed.status is JobStatus.SUCCESS and not missed.archived
                _, events = await compare(store, missed, rapi)
                # only its final version was there to read
                assert [e.status for e in events if e.kind == "job_status"] == [JobStatus.SUCCESS]
                assert [e.status for e in events if e.kind == "op_status"] == [JobStatus.SUCCESS]

                async def first_archived() -> bool:
                    job = await store.get_job(BACKEND, first_id)
                    return job is not None and job.archived

                await eventually(
                    first_archived, timeout=DEADLINE, interval=0.1, what=f"job {first_id} stored as archived"
                )
                again = await store.get_job(BACKEND, first_id)
                assert again is not None
                assert (again.status, again.event_count) == (first.status, first.event_count)
            assert watcher.stats.scans >= 1 and watcher.stats.bad_files == 0
