"""Durable create requests through the facade (:class:`ControlPlane`), on SQLite and on
PostgreSQL: a fake Ganeti writes its queue, the watcher stores it, the dispatcher's steps
are driven by hand (the store-level steps are in ``test_requests.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from synnefo_ganeti import ConfigError, ControlPlane, InstanceSpec
from synnefo_ganeti.errors import GanetiError, NotFoundError, RequestTimeoutError
from synnefo_ganeti.jobs import JobStatus
from synnefo_ganeti.reconcile._observe import expectation
from synnefo_ganeti.store import (
    InstanceStatus,
    RequestStatus,
    Store,
)
from synnefo_ganeti.testing import FakeGaneti
from synnefo_ganeti.watch import QueueWatcher
from tests.helpers import eventually
from tests.unit.test_control import QUICK, settings_for
from tests.unit.test_requests import WAIT

# -- the facade ----------------------------------------------------------------------------------


def instance_spec(name: str, **kwargs: object) -> InstanceSpec:
    values: dict[str, object] = {
        "name": name, "disk_template": "diskless", "os": "noop", "pnode": "node1.fake.test",
        "beparams": {"memory": 256, "vcpus": 1},
    }  # fmt: skip
    values.update(kwargs)
    return InstanceSpec(**values)


@asynccontextmanager
async def plane(tmp_path: Path, db_url: str, **fake: Any) -> AsyncIterator[tuple[FakeGaneti, ControlPlane]]:
    """A fake Ganeti writing its queue, the watcher storing it, and a ControlPlane on top."""
    queue = tmp_path / "queue"
    async with (
        FakeGaneti(tls=False, queue_dir=queue, **{"op_times": QUICK, **fake}) as ganeti,
        Store(db_url) as store,
        ControlPlane(settings_for(ganeti, db_url), store=store) as cp,
    ):
        watcher = QueueWatcher(queue, store, "f1")
        task = asyncio.create_task(watcher.run())
        await watcher.ready.wait()
        try:
            yield ganeti, cp
        finally:
            watcher.stop()
            await task


async def dispatch_by_hand(cp: ControlPlane, request_id: str) -> int:
    """What the dispatcher does with a request: claim, place on f1, submit, record."""
    request = await cp.get_request(request_id)
    spec = InstanceSpec.model_validate(request.spec)
    assert [r.id for r in await cp.store.claim_requests("d1", limit=1)] == [request_id]
    await cp.store.place_request(request_id, "d1", "f1", expectation(spec, list(spec.tags)))
    job_id = await (await cp.client("f1")).create_instance(spec, request_id=request_id)
    await cp.store.submitted_request(request_id, job_id, start=spec.start)
    return job_id


async def stored_final(cp: ControlPlane, job_id: int) -> bool:
    stored = await cp.store.get_job("f1", job_id)
    return stored is not None and stored.status.is_final and job_id not in await cp.store.unapplied_jobs("f1")


async def test_request_instance_and_wait_request(tmp_path, db_url) -> None:
    async with plane(tmp_path, db_url) as (fake, cp):
        with pytest.raises(ConfigError, match="unknown backend 'nope'"):
            await cp.request_instance(instance_spec("vm1.fake.test"), backend="nope")
        assert await cp.list_requests() == []
        rid = await cp.request_instance(instance_spec("vm1.fake.test"), backend="f1")
        assert await cp.request_instance(instance_spec("vm1.fake.test"), backend="f1", request_id=rid) == rid
        request = await cp.get_request(rid)
        assert request.want_backend == "f1" and request.spec["beparams"] == {"memory": 256, "vcpus": 1}
        with pytest.raises(RequestTimeoutError, match=f"request {rid} has not ended") as timed_out:
            await cp.wait_request(rid, timeout=0.05)
        assert (timed_out.value.request_id, timed_out.value.status) == (rid, "pending")
        with pytest.raises(NotFoundError, match="not in the database"):
            await cp.get_request("no-such-request")

        waiter = asyncio.create_task(cp.wait_request(rid, timeout=WAIT))
        done, _ = await asyncio.wait([waiter], timeout=0.05)
        assert not done  # pending: nothing to return yet
        job_id = await dispatch_by_hand(cp, rid)
        ended = await waiter  # the watcher stores the job's end, which settles the request
        assert (ended.status, ended.job_id, ended.backend) == (RequestStatus.SUCCEEDED, job_id, "f1")
        assert "vm1.fake.test" in fake.cluster.instances
        instance = await cp.get_instance("vm1.fake.test", backend="f1")
        assert instance is not None and instance.status is InstanceStatus.STARTED
        assert [r.id for r in await cp.list_requests(status=["succeeded"], backend="f1")] == [rid]
        # a request that ended is returned at once, and canceling it changes nothing
        assert await cp.wait_request(rid, timeout=0) == ended
        assert await cp.cancel_request(rid) == ended


async def test_cancel_requests_through_the_facade(tmp_path, db_url) -> None:
    slow = {**QUICK, "OP_INSTANCE_CREATE": 4.0}  # the first create runs, the next one queues
    async with plane(tmp_path, db_url, max_running_jobs=1, op_times=slow) as (fake, cp):
        pending = await cp.request_instance(instance_spec("vm0.fake.test"))
        assert (await cp.cancel_request(pending)).status is RequestStatus.CANCELED

        running = await cp.request_instance(instance_spec("vm1.fake.test"))
        queued = await cp.request_instance(instance_spec("vm2.fake.test"))
        running_job = await dispatch_by_hand(cp, running)
        queued_job = await dispatch_by_hand(cp, queued)
        assert fake.cluster.jobs[running_job].status is JobStatus.RUNNING
        assert fake.cluster.jobs[queued_job].status is JobStatus.QUEUED

        with pytest.raises(GanetiError, match=f"its job {running_job} on f1 could not be canceled"):
            await cp.cancel_request(running)
        assert (await cp.get_request(running)).status is RequestStatus.SUBMITTED

        canceled_request = await cp.cancel_request(queued)
        assert canceled_request.status is RequestStatus.CANCELED and canceled_request.job_id == queued_job
        assert fake.cluster.jobs[queued_job].status is JobStatus.CANCELED
        assert "vm2.fake.test" not in fake.cluster.instances
        # it goes on, and ends as its job does
        assert (await cp.wait_request(running, timeout=WAIT)).status is RequestStatus.SUCCEEDED
        await eventually(lambda: stored_final(cp, queued_job))
        assert (await cp.get_request(queued)).status is RequestStatus.CANCELED


async def test_delete_instance_of_a_build_instance(tmp_path, db_url) -> None:
    slow = {**QUICK, "OP_INSTANCE_CREATE": 4.0}  # the first create runs, the next one queues
    async with plane(tmp_path, db_url, max_running_jobs=1, op_times=slow) as (fake, cp):
        _, running_job = await cp.create_instance(instance_spec("vm1.fake.test"), backend="f1")
        rid = await cp.request_instance(instance_spec("vm2.fake.test"))
        queued_job = await dispatch_by_hand(cp, rid)
        assert fake.cluster.jobs[running_job].status is JobStatus.RUNNING
        assert fake.cluster.jobs[queued_job].status is JobStatus.QUEUED

        # a running create is not waited for: the delete is taken at once and follows the create
        assert await cp.delete_instance("vm1.fake.test", backend="f1", build_timeout=WAIT) is None
        building = await cp.get_instance("vm1.fake.test", backend="f1")
        assert building is not None and building.status is InstanceStatus.BUILD
        assert building.delete_requested_at is not None
        # a queued create is canceled: the instance never exists, its request is canceled
        assert await cp.delete_instance("vm2.fake.test", backend="f1") == queued_job
        assert fake.cluster.jobs[queued_job].status is JobStatus.CANCELED
        gone = await cp.get_instance("vm2.fake.test", backend="f1")
        assert gone is not None and gone.status is InstanceStatus.DESTROYED
        request = await cp.get_request(rid)
        assert (request.status, request.error) == (RequestStatus.CANCELED, f"job {queued_job} was canceled")
        # the watcher storing the canceled create brings back neither
        await eventually(lambda: stored_final(cp, queued_job))
        gone = await cp.get_instance("vm2.fake.test", backend="f1")
        assert gone is not None and gone.status is InstanceStatus.DESTROYED
        assert await cp.get_request(rid) == request
        assert [j["result"] for j in await cp.store.instance_jobs("f1", "vm2.fake.test")] == ["canceled"]

        # the create ends, and the remove follows it (this process follows what it deferred)
        async def destroyed() -> bool:
            found = await cp.get_instance("vm1.fake.test", backend="f1")
            return found is not None and found.status is InstanceStatus.DESTROYED

        await eventually(destroyed, timeout=WAIT)
        assert fake.cluster.jobs[running_job].status is JobStatus.SUCCESS
        removed = await cp.get_instance("vm1.fake.test", backend="f1")
        assert removed is not None and removed.delete_requested_at is None
        remove_job = next(
            j["job_id"]
            for j in await cp.store.instance_jobs("f1", "vm1.fake.test")
            if j["action"] == "remove"
        )
        assert remove_job not in (running_job, queued_job)
        assert "vm1.fake.test" not in fake.cluster.instances
        jobs = await cp.store.instance_jobs("f1", "vm1.fake.test")
        assert [(j["job_id"], j["action"], j["result"]) for j in jobs] == [
            (running_job, "create", "success"), (remove_job, "remove", "success"),
        ]  # fmt: skip
