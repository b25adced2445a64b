"""``benchmarks/_history.py``: the past an established store holds before a burst, its jobs included
(with ``jobs`` empty when a dispatcher first checked a job event's foreign key, PostgreSQL kept a
plan that read the whole table for each event of the burst)."""

from __future__ import annotations

from benchmarks._history import queue_serial, seed
from sqlalchemy import text

from synnefo_ganeti.store import Store


async def test_the_past_holds_requests_instances_and_the_create_jobs_that_made_them(db_url: str) -> None:
    async with Store(db_url) as store:
        await seed(store, "burst", 30)
        async with store.engine.connect() as conn:

            async def one(sql: str) -> object:
                return (await conn.execute(text(sql))).scalar_one()

            assert await one("SELECT count(*) FROM requests WHERE status = 'succeeded'") == 30
            assert await one("SELECT count(*) FROM instances WHERE status = 'DESTROYED'") == 30
            assert await one("SELECT count(*) FROM jobs WHERE status = 'success' AND archived") == 30
            assert await one("SELECT count(*) FROM job_events") == 300  # a create's ten events each
            assert await one("SELECT max(job_id) FROM jobs") == queue_serial(30) == 30
            # each request names its job, and its instance's create job is recorded and applied
            joined = """SELECT count(*) FROM requests r JOIN jobs j ON j.job_id = r.job_id
                        JOIN instances i ON i.request_id = r.id
                        JOIN instance_jobs ij ON ij.instance_id = i.id AND ij.job_id = j.job_id
                        WHERE ij.action = 'create' AND ij.result = 'success' AND ij.applied_at IS NOT NULL"""
            assert await one(joined) == 30
            kinds = (await conn.execute(text("SELECT kind, count(*) FROM job_events GROUP BY kind"))).all()
            assert dict(kinds) == {"op_status": 90, "job_status": 90, "log": 120}
        # the store reads the past jobs as it reads its own
        job = await store.get_job("burst", 7)
        assert job is not None and job.is_final and job.instance == "past-000006.fake.test" and job.archived
