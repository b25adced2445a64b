"""Placements and submit records without the writers' exclusive lock (issue 31 item 1).

A dispatcher's two hot writes take the writers' advisory lock shared, as the batches of job
versions do, and lock by key only what they must not miss of another's writes: the names they
place (``name:``), an earlier life's unapplied jobs they drop (``jobs:BACKEND``), and the job
whose submission they record (``job:BACKEND:JOB``, which the batch storing that job's end takes
too). Proven on PostgreSQL: they go on while the holder's batch of other jobs is open; a submit
record and its job's end, held back together and then let go, or run at once by two stores
many times over, always meet (the end applied once, the request settled); and the writes that
read and then decide (here an unplace) still wait for them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from synnefo_ganeti.store import InstanceStatus, RequestStatus, Store
from tests.helpers import eventually
from tests.unit.test_requests import CREATE_OK, job

#: the writers' advisory lock ("sgwr"), as store/db/_engine.py takes it
WRITE_LOCK_KEY = int.from_bytes(b"sgwr", "big")
INSTANCE: dict[str, Any] = {"os": "noop", "disk_template": "diskless", "tags": [], "nics": [], "disks": []}


def asyncpg_url(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://")


async def placed(store: Store, name: str, dispatcher: str = "d1") -> str:
    spec = {"name": name, "os": "noop", "disk_template": "diskless", "beparams": {"memory": 128}}
    request, _ = await store.add_request(
        spec, name=name, backend=None, request_id=None, unique_names="global"
    )
    assert [r.id for r in await store.claim_requests(dispatcher, 10)] == [request.id]
    await store.place_request(request.id, dispatcher, "b1", dict(INSTANCE), unique_names="global")
    return request.id


async def lock_keys(conn: asyncpg.Connection, *keys: str, shared_write_lock: bool = False) -> None:
    if shared_write_lock:
        await conn.execute(
            "SELECT pg_advisory_xact_lock_shared(hashtext(current_database()), $1)", WRITE_LOCK_KEY
        )
    for key in sorted(keys):
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext(current_database()), hashtext($1))", key)


async def waiting_for_locks(conn: asyncpg.Connection, count: int) -> None:
    """Until ``count`` transactions wait for an advisory lock of this database."""
    query = (
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    )

    async def enough() -> bool:
        return bool(await conn.fetchval(query) >= count)

    await eventually(enough, what=f"{count} transactions waiting for an advisory lock")


async def test_placements_and_submit_records_go_on_beside_a_batch_of_other_jobs(pg_url: str) -> None:
    async with Store(pg_url) as store:
        backend_id = await store.ensure_backend("b1")
        holder = await asyncpg.connect(asyncpg_url(pg_url))
        watcher = await asyncpg.connect(asyncpg_url(pg_url))
        try:
            batch = holder.transaction()
            await batch.start()
            # what the follow lease's holder holds while it stores job 40's versions
            await lock_keys(holder, f"jobs:{backend_id}", f"job:{backend_id}:40", shared_write_lock=True)
            async with asyncio.timeout(30):  # (it used to wait for the batch: the exclusive lock)
                request_id = await placed(store, "beside.example.com")
                recorded = await store.submitted_request(request_id, 41, start=True)
            assert recorded.status is RequestStatus.SUBMITTED and recorded.job_id == 41
            instance = await store.get_instance("b1", "beside.example.com")
            assert instance is not None and instance.create_job_id == 41

            # a write that reads and then decides still waits for the shared holders
            other = await placed(store, "waits.example.com")
            unplace = asyncio.create_task(store.unplace_request(other, "d1", error=None))
            await waiting_for_locks(watcher, 1)
            assert not unplace.done()
            await batch.commit()
            assert (await unplace).backend is None
        finally:
            await holder.close()
            await watcher.close()


async def test_a_submit_record_and_its_jobs_end_let_go_together_meet(pg_url: str) -> None:
    """Both wait on the job's key; whichever commits second sees the other's rows."""
    async with Store(pg_url) as submitter, Store(pg_url) as follower:
        backend_id = await submitter.ensure_backend("b1")
        request_id = await placed(submitter, "meet.example.com")
        holder = await asyncpg.connect(asyncpg_url(pg_url))
        watcher = await asyncpg.connect(asyncpg_url(pg_url))
        try:
            held = holder.transaction()
            await held.start()
            await lock_keys(holder, f"job:{backend_id}:52")

            async def end() -> None:
                await follower.record("b1", job(CREATE_OK, job_id=52))
                await follower.flush()

            record = asyncio.create_task(submitter.submitted_request(request_id, 52, start=True))
            stored = asyncio.create_task(end())
            await waiting_for_locks(watcher, 2)
            await held.commit()
            await asyncio.gather(record, stored)
        finally:
            await holder.close()
            await watcher.close()
        request = await submitter.get_request(request_id)
        assert request is not None and request.status is RequestStatus.SUCCEEDED
        instance = await submitter.get_instance("b1", "meet.example.com")
        assert instance is not None and instance.status is InstanceStatus.STARTED
        assert instance.task is None


async def test_submit_records_and_ends_at_once_from_two_stores_always_meet(pg_url: str) -> None:
    async with Store(pg_url) as submitter, Store(pg_url) as follower:
        names = [f"race{i:02d}.example.com" for i in range(40)]
        request_ids = [await placed(submitter, name) for name in names]
        job_ids = [200 + i for i in range(len(names))]

        async def end(job_id: int) -> None:
            await follower.record("b1", job(CREATE_OK, job_id=job_id))

        # a pair at a time (each store's writer would put many in one transaction): the record
        # and the end, each in a transaction of its own, begun together
        for request_id, job_id in zip(request_ids, job_ids, strict=True):
            await asyncio.gather(submitter.submitted_request(request_id, job_id, start=True), end(job_id))
            await follower.flush()
        requests = [await submitter.get_request(r) for r in request_ids]
        assert [r.status if r else None for r in requests] == [RequestStatus.SUCCEEDED] * len(names)
        for name in names:
            instance = await submitter.get_instance("b1", name)
            assert instance is not None and instance.status is InstanceStatus.STARTED, name


async def test_a_writer_transaction_ended_by_a_deadlock_is_written_again(pg_url: str) -> None:
    """Two transactions taking two keys in two orders: PostgreSQL ends one (``deadlock
    detected``); when it is the writer's, the writer runs it again at once, and its caller gets
    its result, not an error."""
    from sqlalchemy import Connection, text

    async with Store(pg_url) as store:
        other = await asyncpg.connect(asyncpg_url(pg_url))
        watcher = await asyncpg.connect(asyncpg_url(pg_url))
        lock = "SELECT pg_advisory_xact_lock(hashtext(current_database()), hashtext('{}'))"
        try:
            # the writer's transaction checks for the cycle first (1 s, the default), so it is the one ended
            await other.execute("SET deadlock_timeout = '60s'")
            held = other.transaction()
            await held.start()
            await other.execute(lock.format("name:first"))
            runs: list[int] = []

            def both(conn: Connection) -> int:
                runs.append(1)
                conn.execute(text(lock.format("name:second")))
                conn.execute(text(lock.format("name:first")))
                return len(runs)

            retries = store.stats.retries
            call = asyncio.create_task(store.call(both, exclusive=False))
            await waiting_for_locks(watcher, 1)
            await other.execute(lock.format("name:second"))  # the cycle; the writer's is ended
            await held.commit()
            assert await call == 2  # written the second time
            assert store.stats.retries == retries + 1
        finally:
            await other.close()
            await watcher.close()
