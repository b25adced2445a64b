"""The master dies mid-create (issue 27, item 6), on both databases.

On the real 3-node lab (``tests/fixtures/ganeti-3.0-masterfail/``) the jobs a dead master had
queued run again on the new master, and the ones it had started stay "running" there until its
luxid ends them ``error`` with the result "detected death of job N" (Ganeti's
``JQScheduler.checkForDeath``, within 307 s). Such a create made its instance or not: the request
is not failed for it. Ganeti is asked: an instance carrying the request's tag settles it; none,
and the create is sent again (an attempt counted).
"""

from __future__ import annotations

from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.jobs import JobStatus
from synnefo_ganeti.store import InstanceStatus, RequestStatus, is_job_death_error
from tests.helpers import eventually, spec
from tests.unit.test_dispatcher import QUICK, creates, finished, running
from tests.unit.test_dispatcher_crash import one_backend

SLOW = QUICK | {"OP_INSTANCE_CREATE": 1.0}


def test_only_a_lost_job_process_is_a_job_death() -> None:
    assert is_job_death_error("detected death of job 309")
    assert is_job_death_error("Unclean master daemon shutdown")  # Ganeti 2.x's masterd
    assert not is_job_death_error("OpExecError: detected death of job 309 and more")
    assert not is_job_death_error("job 12 failed to start: ...")
    assert not is_job_death_error(None)


async def _create_job(f1, name: str) -> int:
    async def running_job() -> int | None:
        for job in f1.cluster.jobs.values():
            if job.status is JobStatus.RUNNING and name in str(job.ops[0].luxid.get("instance_name")):
                return job.id
        return None

    return await eventually(running_job, timeout=10, interval=0.01, what=f"{name}'s create running")


async def test_a_create_whose_job_died_with_the_master_before_its_instance_is_sent_again(db_url: str) -> None:
    async with one_backend(db_url, op_times=SLOW) as (f1, settings, store, cp, _client):
        request_id = await cp.request_instance(spec("vm-md1.example"))
        async with running(Dispatcher(settings, store=store, status_server=False)) as d:
            job_id = await _create_job(f1, "vm-md1.example")
            assert "vm-md1.example" not in f1.cluster.instances
            assert await f1.kill_job(job_id)  # the master died; the new one ends the job
            f1.master_failover("node2.fake.test")
            done = await finished(cp, request_id)
        assert done.status is RequestStatus.SUCCEEDED, done.to_json()
        assert done.job_id != job_id and done.attempts == 2
        assert [e["job_id"] for e in done.attempt_errors] == [job_id]
        assert done.attempt_errors[0]["error"] == f"detected death of job {job_id}"
        assert d.stats.resubmitted == 1
        assert creates(f1, name="vm-md1.example") == 2 and list(f1.cluster.instances) == ["vm-md1.example"]
        instance = await store.get_instance("f1", "vm-md1.example")
        assert instance is not None and instance.status is InstanceStatus.STARTED


async def test_a_create_whose_job_died_after_making_its_instance_succeeds_without_a_second(
    db_url: str,
) -> None:
    async with one_backend(db_url, op_times=SLOW) as (f1, settings, store, cp, _client):
        request_id = await cp.request_instance(spec("vm-md2.example"))
        async with running(Dispatcher(settings, store=store, status_server=False)) as d:
            job_id = await _create_job(f1, "vm-md2.example")

            async def made() -> bool:
                return "vm-md2.example" in f1.cluster.instances

            await eventually(made, timeout=10, interval=0.01, what="the instance in Ganeti's configuration")
            assert await f1.kill_job(job_id)
            done = await finished(cp, request_id)
        assert done.status is RequestStatus.SUCCEEDED, done.to_json()
        assert [e["job_id"] for e in done.attempt_errors] == [job_id]
        assert d.stats.recovered == 1 and d.stats.resubmitted == 0
        assert creates(f1, name="vm-md2.example") == 1
        instance = await store.get_instance("f1", "vm-md2.example")
        assert instance is not None and instance.status in (InstanceStatus.STARTED, InstanceStatus.STOPPED)
