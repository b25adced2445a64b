"""Issue 28, items 1 and 2 on fake Ganeti backends and both databases: one server from request to
delete (the instance's id given at once, the same through every attempt, attempts never separate
ERROR instances), and a delete that always wins (at any stage, at once, never refused as busy)."""

from __future__ import annotations

from pathlib import Path

import pytest

from synnefo_ganeti import ConflictError, ControlPlane, NotFoundError
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.jobs import JobStatus
from synnefo_ganeti.store import InstanceStatus, RequestStatus, Store
from tests.helpers import eventually, spec
from tests.unit.test_dispatcher import QUICK, backend, creates, fakes, finished, running, settings_for


async def _status(cp: ControlPlane, instance_id: str) -> InstanceStatus | None:
    found = await cp.get_instance(instance_id)
    return None if found is None else found.status


async def test_the_instance_id_is_given_at_once_and_stays_through_a_placement_again(db_url: str) -> None:
    async with fakes(2) as (f1, f2):
        settings = settings_for(db_url, [backend("f1", f1), backend("f2", f2)])
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            rid = await cp.request_instance(spec("one.example"), backend=None)
            request = await cp.get_request(rid)
            iid = request.instance_id
            assert iid is not None
            # before any dispatcher placed it: the one server, BUILD, on no backend yet
            early = await cp.get_instance(iid)
            assert early is not None and early.status is InstanceStatus.BUILD and early.backend is None
            assert (early.id, early.request_id, early.name) == (iid, rid, "one.example")
            async with running(Dispatcher(settings, store=store, status_server=False)) as d:
                await eventually(lambda: d.allocator.view("f1").catalog is not None, what="f1's catalog")
                await eventually(lambda: d.allocator.view("f2").catalog is not None, what="f2's catalog")
                # whichever backend it goes to first lacks the OS there after the catalogs were read:
                # its create fails for a reason of that backend, and it is placed on the other one
                f1.cluster.oses.clear()
                rid2 = await cp.request_instance(spec("two.example"), backend=None)
                done = await finished(cp, rid)
                second = await finished(cp, rid2)
            assert done.status is RequestStatus.SUCCEEDED and done.instance_id == iid
            built = await cp.get_instance(iid)
            assert built is not None and built.status is InstanceStatus.STARTED
            assert built.request_id == rid and built.backend == done.backend
            # the request that failed once on f1 (if it went there first) is one server all along
            assert second.status is RequestStatus.SUCCEEDED and second.instance_id is not None
            assert second.instance_id == (await cp.get_request(rid2)).instance_id
            server = await cp.get_instance(second.instance_id)
            assert server is not None and server.status is InstanceStatus.STARTED and server.backend == "f2"
            assert server.request_id == rid2
            # its attempts are its history, never instances of their own
            named = [i for i in await cp.list_instances() if i.name == "two.example"]
            assert [i.id for i in named] == [second.instance_id]
            assert all(i.status is not InstanceStatus.ERROR for i in await cp.list_instances())
            failed_first = creates(f1, name="two.example")
            assert len(second.attempt_errors) == failed_first
            assert second.attempts == failed_first + 1


async def test_a_delete_of_a_pending_request_cancels_it_for_good(db_url: str) -> None:
    async with fakes(1) as (f1,):
        settings = settings_for(db_url, [backend("f1", f1)])
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            rid = await cp.request_instance(spec("gone.example"))
            iid = (await cp.get_request(rid)).instance_id
            assert iid is not None
            # no dispatcher yet: taken at once, nothing is left to remove
            assert await cp.delete_instance(iid) is None
            request = await cp.get_request(rid)
            assert request.status is RequestStatus.CANCELED
            assert await _status(cp, iid) is InstanceStatus.DESTROYED
            # a dispatcher starting later never creates it
            probe = await cp.request_instance(spec("probe.example"))
            async with running(Dispatcher(settings, store=store, status_server=False)):
                assert (await finished(cp, probe)).status is RequestStatus.SUCCEEDED
            assert creates(f1, name="gone.example") == 0
            assert (await cp.get_request(rid)).status is RequestStatus.CANCELED


async def test_a_delete_of_a_queued_create_cancels_it_and_of_a_running_one_follows_it(db_url: str) -> None:
    slow = {**QUICK, "OP_INSTANCE_CREATE": 5.0}
    async with fakes(1, op_times=slow, max_running_jobs=1) as (f1,):
        settings = settings_for(db_url, [backend("f1", f1)])
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            async with running(Dispatcher(settings, store=store, status_server=False)):
                first = await cp.request_instance(spec("run.example"))
                await eventually(lambda: any(j.status is JobStatus.RUNNING for j in f1.cluster.jobs.values()))
                second = await cp.request_instance(spec("queue.example"))
                await eventually(
                    lambda: creates(f1, name="queue.example") == 1, what="the second create sent"
                )
                running_id = (await cp.get_request(first)).instance_id
                queued_id = (await cp.get_request(second)).instance_id
                assert running_id is not None and queued_id is not None
                await eventually(lambda: _has_create_job(cp, queued_id), what="the queued create recorded")
                # the running create: the delete is taken at once, and follows the create's end
                assert await cp.delete_instance(running_id) is None
                waiting = await cp.get_instance(running_id)
                assert waiting is not None and waiting.delete_requested_at is not None
                # the queued create: canceled in Ganeti, it never exists
                canceled = await cp.delete_instance(queued_id)
                assert canceled is not None
                assert f1.cluster.jobs[canceled].status is JobStatus.CANCELED
                assert await _status(cp, queued_id) is InstanceStatus.DESTROYED
                assert (await cp.get_request(second)).status is RequestStatus.CANCELED

                async def removed() -> bool:
                    return await _status(cp, running_id) is InstanceStatus.DESTROYED

                await eventually(removed, timeout=30.0, what="the running create's instance removed")
            assert "run.example" not in f1.cluster.instances and "queue.example" not in f1.cluster.instances
            assert (await cp.get_request(first)).status is RequestStatus.SUCCEEDED  # its create did succeed
            gone = await cp.get_instance(running_id)
            assert gone is not None and gone.delete_requested_at is None
            removes = [j for j in await store.instance_jobs("f1", "run.example") if j["action"] == "remove"]
            assert len(removes) == 1


async def _has_create_job(cp: ControlPlane, instance_id: str) -> bool:
    found = await cp.get_instance(instance_id)
    return found is not None and found.create_job_id is not None


async def test_a_delete_never_waits_for_the_create_it_follows(db_url: str, tmp_path: Path) -> None:
    """The delete of a running create returns at once (it used to wait the whole create out)."""
    slow = {**QUICK, "OP_INSTANCE_CREATE": 30.0}
    async with fakes(1, op_times=slow) as (f1,):
        settings = settings_for(db_url, [backend("f1", f1)])
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            instance, job_id = await cp.create_instance(spec("long.example"), backend="f1")
            await eventually(lambda: f1.cluster.jobs[job_id].status is JobStatus.RUNNING)
            # an event, not a timer: the call is done while the 30 s create still runs
            assert await cp.delete_instance(instance.id) is None
            assert f1.cluster.jobs[job_id].status is JobStatus.RUNNING
            marked = await cp.get_instance(instance.id)
            assert marked is not None and marked.delete_requested_at is not None
            assert marked.status is InstanceStatus.BUILD


async def test_actions_on_a_server_not_placed_yet_say_why(db_url: str) -> None:
    async with fakes(1) as (f1,):
        settings = settings_for(db_url, [backend("f1", f1)])
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            rid = await cp.request_instance(spec("later.example"))
            iid = (await cp.get_request(rid)).instance_id
            assert iid is not None
            with pytest.raises(ConflictError, match="not placed on a backend"):
                await cp.startup_instance(iid)
            assert await cp.delete_instance(iid) is None
            with pytest.raises(NotFoundError, match="DESTROYED"):
                await cp.shutdown_instance(iid)
            assert await cp.delete_instance(iid) is None  # a second delete: nothing left
