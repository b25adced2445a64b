"""The dispatcher's core promise, on both databases: a create is never lost and never sent twice,
whether its dispatcher died before or after Ganeti got it; several live dispatchers share the work;
cancel before and after submission."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from synnefo_ganeti import ControlPlane, GanetiError, InstanceSpec, RapiClient
from synnefo_ganeti.config import Settings
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.jobs import JobStatus
from synnefo_ganeti.reconcile._observe import expectation
from synnefo_ganeti.store import InstanceStatus, Request, RequestStatus, Store, request_tag
from synnefo_ganeti.store.requests import _claims, _requests
from synnefo_ganeti.store.requests._requests import new_request_id
from synnefo_ganeti.testing import FakeGaneti
from tests.helpers import eventually, spec
from tests.unit.test_dispatcher import (
    backend,
    creates,
    fakes,
    finished,
    running,
    settings_for,
    sqlite_url,
)

DEAD = "dead-dispatcher-id"


async def placed_by_a_dead_dispatcher(
    store: Store, settings: Settings, name: str, where: str
) -> tuple[Request, InstanceSpec]:
    """A request the way a dispatcher that died after ``place_request`` left it; and the spec it
    would have sent (with the ownership and request tags)."""
    request, _ = await store.add_request(spec(name).model_dump(mode="json"), name=name)
    claimed = await store.claim_requests(DEAD, 10)
    assert [r.id for r in claimed] == [request.id]
    tags = [*settings.ownership.tags_for_new(), request_tag(request.id)]
    placed = await store.place_request(request.id, DEAD, where, expectation(spec(name), tags))
    assert placed.placed and placed.claimed_by == DEAD and placed.attempts == 1
    return placed, spec(name, tags=tags)


@asynccontextmanager
async def one_backend(
    db_url: str, **options: Any
) -> AsyncIterator[tuple[FakeGaneti, Settings, Store, ControlPlane, RapiClient]]:
    async with fakes(1, **options) as (f1,):
        settings = settings_for(db_url, [backend("f1", f1)])
        async with (
            Store(db_url) as store,
            ControlPlane(settings, store=store) as cp,
            RapiClient(f1.url, username=f1.username, password=f1.password) as client,
        ):
            yield f1, settings, store, cp, client


async def test_a_create_that_reached_ganeti_before_the_crash_is_recorded_not_sent_again(db_url: str) -> None:
    async with one_backend(db_url) as (f1, settings, store, cp, client):
        request, sent = await placed_by_a_dead_dispatcher(store, settings, "vm-a.example", "f1")
        job_id = await client.create_instance(sent, request_id=request.id)  # ... then it died
        async with running(Dispatcher(settings, store=store, status_server=False)) as d:
            done = await finished(cp, request.id)
        assert done.status is RequestStatus.SUCCEEDED and done.job_id == job_id and done.attempts == 1
        assert d.stats.recovered == 1 and d.stats.submitted == 0 and d.stats.resubmitted == 0
        assert creates(f1, name="vm-a.example") == 1 and list(f1.cluster.instances) == ["vm-a.example"]
        instance = await store.get_instance("f1", "vm-a.example")
        assert instance is not None and instance.status is InstanceStatus.STARTED
        assert instance.create_job_id == job_id


async def test_a_create_that_never_reached_ganeti_is_sent_once(db_url: str) -> None:
    async with one_backend(db_url) as (f1, settings, store, cp, _):
        request, _ = await placed_by_a_dead_dispatcher(store, settings, "vm-b.example", "f1")
        async with running(Dispatcher(settings, store=store, status_server=False)) as d:
            done = await finished(cp, request.id)
        assert done.status is RequestStatus.SUCCEEDED and done.attempts == 2
        assert d.stats.resubmitted == 1 and d.stats.submitted == 1 and d.stats.recovered == 0
        assert creates(f1, name="vm-b.example") == 1
        assert set(f1.cluster.instances["vm-b.example"].tags) == {
            "synnefo-ganeti:owned",
            request_tag(request.id),
        }
        assert [job.id for job in f1.cluster.jobs.values()] == [done.job_id]


async def test_a_create_whose_job_was_archived_is_settled_by_the_instance_tag(db_url: str) -> None:
    async with one_backend(db_url) as (f1, settings, store, cp, client):
        request, sent = await placed_by_a_dead_dispatcher(store, settings, "vm-c.example", "f1")
        job_id = await client.create_instance(sent, request_id=request.id)
        assert (await client.wait_for_job(job_id)).status is JobStatus.SUCCESS
        assert f1.archive_jobs() == 1  # RAPI lists it no more
        async with running(Dispatcher(settings, store=store, status_server=False)) as d:
            done = await finished(cp, request.id)
        assert done.status is RequestStatus.SUCCEEDED and done.error is None
        assert d.stats.recovered == 1 and d.stats.submitted == 0 and d.stats.resubmitted == 0
        assert creates(f1) == 1 and list(f1.cluster.instances) == ["vm-c.example"]
        instance = await store.get_instance("f1", "vm-c.example")
        assert instance is not None and instance.status is InstanceStatus.STARTED


async def test_an_instance_of_the_name_without_the_request_tag_fails_the_request(db_url: str) -> None:
    async with one_backend(db_url) as (f1, settings, store, cp, client):
        request, _ = await placed_by_a_dead_dispatcher(store, settings, "vm-d.example", "f1")
        theirs = await client.create_instance(spec("vm-d.example"))  # someone else's, same name
        await client.wait_for_job(theirs)
        f1.archive_jobs()
        async with running(Dispatcher(settings, store=store, status_server=False)) as d:
            done = await finished(cp, request.id)
        assert done.status is RequestStatus.FAILED and done.error is not None
        assert "not this request's" in done.error and request_tag(request.id) in done.error
        assert creates(f1) == 1 and d.stats.submitted == 0


@pytest.mark.slow
@pytest.mark.timeout(300)  # ~9 s on a quiet machine; over 40 s on CI's two loaded cores
async def test_two_live_dispatchers_submit_each_request_exactly_once(pg_url: str) -> None:
    db_url = pg_url
    async with fakes(2) as (f1, f2):
        settings = settings_for(
            db_url, [backend("f1", f1), backend("f2", f2)], claim_batch=3, submit_concurrency=4
        )
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            ids = [await cp.request_instance(spec(f"m{i:02d}.example")) for i in range(60)]
            d1 = Dispatcher(settings, dispatcher_id="one", status_server=False)  # each its own store
            d2 = Dispatcher(settings, dispatcher_id="two", status_server=False)
            async with running(d1), running(d2):
                done = await asyncio.gather(*(finished(cp, rid, timeout=240) for rid in ids))
            assert all(r.status is RequestStatus.SUCCEEDED for r in done), [r.error for r in done if r.error]
            assert d1.stats.submitted + d2.stats.submitted == 60
            assert d1.stats.submitted > 0 and d2.stats.submitted > 0
            assert d1.stats.recovered + d2.stats.recovered + d1.stats.resubmitted + d2.stats.resubmitted == 0
            assert creates(f1, f2) == 60
            names = [*f1.cluster.instances, *f2.cluster.instances]
            assert sorted(names) == sorted(f"m{i:02d}.example" for i in range(60))


@pytest.mark.slow
async def test_a_live_dispatcher_takes_over_the_requests_of_a_dead_one(pg_url: str) -> None:
    async with one_backend(pg_url) as (f1, settings, store, cp, client):
        async with running(Dispatcher(settings, store=store, status_server=False)) as d:
            # written and claimed in one transaction: the live dispatcher never sees it free
            name = "vm-e.example"

            def add_and_claim(conn: Any) -> Request:
                _requests.add(
                    conn,
                    request_id=new_request_id(),
                    name=name,
                    spec=spec(name).model_dump(mode="json"),
                    want_backend=None,
                )
                (claimed,) = _claims.claim(conn, DEAD, 1, skip_locked=True)
                return claimed

            request = await store.call(add_and_claim)
            tags = [*settings.ownership.tags_for_new(), request_tag(request.id)]
            await store.place_request(request.id, DEAD, "f1", expectation(spec(name), tags))
            job_id = await client.create_instance(spec(name, tags=tags), request_id=request.id)
            # ... and the other dispatcher died: this one finds out within its take-over period
            done = await finished(cp, request.id, timeout=15)
        assert done.status is RequestStatus.SUCCEEDED and done.job_id == job_id
        assert d.stats.recovered == 1 and d.stats.submitted == 0 and creates(f1) == 1


# -- cancel ------------------------------------------------------------------------------------------


async def test_cancel_a_pending_request(db_url: str) -> None:
    async with one_backend(db_url) as (f1, settings, store, cp, _):
        rid = await cp.request_instance(spec("never.example"))
        canceled = await cp.cancel_request(rid)
        assert (
            canceled.status is RequestStatus.CANCELED and canceled.error == "canceled before it was submitted"
        )
        async with running(Dispatcher(settings, store=store, status_server=False)) as d:
            other = await finished(cp, await cp.request_instance(spec("other.example")))
        assert other.status is RequestStatus.SUCCEEDED
        assert d.stats.claimed == 1 and creates(f1) == 1 and "never.example" not in f1.cluster.instances
        assert (await cp.get_request(rid)).status is RequestStatus.CANCELED


SLOW = {"OP_INSTANCE_CREATE": 1.0, "OP_INSTANCE_REMOVE": 0.01}


async def submitted(cp: ControlPlane, request_id: str) -> Request:
    async def check() -> bool:
        return (await cp.get_request(request_id)).status is not RequestStatus.PENDING

    await eventually(check, what=f"request {request_id} submitted")
    request = await cp.get_request(request_id)
    assert request.status is RequestStatus.SUBMITTED and request.job_id is not None
    return request


async def cancel_a_queued_create(
    cp: ControlPlane, store: Store, fake: FakeGaneti, settings: Settings
) -> tuple[Request, Request]:
    """Two requests on a backend running one job at a time; the second, queued, canceled.
    Returns (the request as cancel_request returned it, as it stands once its job's end is stored)."""
    # the first create's disks wait for the test's word: the second stays queued however slowly the
    # test runs (a 1 s create ended under CI's load before the second was seen queued)
    gate = asyncio.Event()
    work = fake.cluster.work

    async def gated(job: Any, op: Any, messages: list[str], seconds: float) -> None:
        if op.op_id == "OP_INSTANCE_CREATE" and op.luxid.get("instance_name") == "first.example":
            await gate.wait()
        await work(job, op, messages, seconds)

    fake.cluster.work = gated  # type: ignore[method-assign]
    async with running(Dispatcher(settings, store=store, status_server=False)):
        first = await submitted(cp, await cp.request_instance(spec("first.example")))
        second = await submitted(cp, await cp.request_instance(spec("second.example")))
        assert second.job_id is not None and fake.cluster.jobs[second.job_id].status is JobStatus.QUEUED
        canceled = await cp.cancel_request(second.id)
        gate.set()
        assert (await finished(cp, first.id)).status is RequestStatus.SUCCEEDED

        async def settled() -> bool:
            stored = await store.get_job("f1", second.job_id or -1)
            return stored is not None and stored.status is JobStatus.CANCELED

        await eventually(settled, what="the canceled create's end stored")
    return canceled, await cp.get_request(second.id)


async def test_cancel_a_submitted_request_whose_job_is_queued(db_url: str) -> None:
    # one job at a time, each create 1 s: the second create waits in Ganeti's queue
    async with one_backend(db_url, max_running_jobs=1, op_times=SLOW) as (f1, settings, store, cp, _):
        canceled, later = await cancel_a_queued_create(cp, store, f1, settings)
        assert (
            canceled.status is RequestStatus.CANCELED and canceled.error == f"job {canceled.job_id} canceled"
        )
        assert later.status is RequestStatus.CANCELED  # the job's end stored since changes nothing
        assert canceled.job_id is not None and f1.cluster.jobs[canceled.job_id].status is JobStatus.CANCELED
        assert "second.example" not in f1.cluster.instances and creates(f1) == 2


async def test_a_canceled_queued_create_leaves_its_instance_destroyed(tmp_path: Path) -> None:
    async with one_backend(sqlite_url(tmp_path), max_running_jobs=1, op_times=SLOW) as (
        f1,
        settings,
        store,
        cp,
        _,
    ):
        await cancel_a_queued_create(cp, store, f1, settings)
        instance = await store.get_instance("f1", "second.example")
        assert instance is not None and instance.status is InstanceStatus.DESTROYED, instance


async def test_cancel_a_request_whose_job_runs_is_refused(db_url: str) -> None:
    async with one_backend(db_url, op_times=SLOW) as (f1, settings, store, cp, _):
        async with running(Dispatcher(settings, store=store, status_server=False)):
            request = await submitted(cp, await cp.request_instance(spec("running.example")))
            job_id = request.job_id
            assert job_id is not None
            await eventually(lambda: f1.cluster.jobs[job_id].status is JobStatus.RUNNING)
            with pytest.raises(GanetiError, match=r"could not be canceled .* it is running already"):
                await cp.cancel_request(request.id)
            done = await finished(cp, request.id)
        assert done.status is RequestStatus.SUCCEEDED and "running.example" in f1.cluster.instances


async def test_a_cancel_asked_while_the_create_is_sent_cancels_its_queued_job(db_url: str) -> None:
    # the first create runs long enough that the second is surely still queued when its cancel
    # is handled (0.5 s of latency after the placement; with 1 s a loaded machine lost the race)
    slower = {**SLOW, "OP_INSTANCE_CREATE": 4.0}
    async with one_backend(db_url, max_running_jobs=1, op_times=slower) as (f1, settings, store, cp, _):
        async with running(Dispatcher(settings, store=store, status_server=False)):
            first = await submitted(cp, await cp.request_instance(spec("first.example")))
            f1.latency = 0.5  # the create of the next one is on its way for 0.5 s
            rid = await cp.request_instance(spec("late.example"))

            async def placed() -> bool:
                return (await cp.get_request(rid)).placed

            await eventually(placed, what="the request placed")
            asked = await cp.cancel_request(rid)  # the dispatcher holds it: it is asked to cancel
            assert asked.status is RequestStatus.PENDING and asked.cancel_requested
            f1.latency = 0.0
            done = await finished(cp, rid)
            assert (await finished(cp, first.id)).status is RequestStatus.SUCCEEDED
        assert done.status is RequestStatus.CANCELED and done.job_id is not None
        assert f1.cluster.jobs[done.job_id].status is JobStatus.CANCELED
        assert "late.example" not in f1.cluster.instances


async def test_a_cancel_of_a_placed_request_of_a_dead_dispatcher_asks_ganeti_first(db_url: str) -> None:
    async with one_backend(db_url) as (f1, settings, store, cp, client):
        request, sent = await placed_by_a_dead_dispatcher(store, settings, "vm-f.example", "f1")
        assert "vm-f.example" not in f1.cluster.instances
        job_id = await client.create_instance(sent, request_id=request.id)
        assert (await client.wait_for_job(job_id)).status is JobStatus.SUCCESS
        assert "vm-f.example" in f1.cluster.instances  # the VM exists
        asked = await cp.cancel_request(request.id)  # too late, though nobody knows it yet
        assert asked.status is RequestStatus.PENDING and asked.cancel_requested
        async with running(Dispatcher(settings, store=store, status_server=False)):
            done = await finished(cp, request.id)
        instance = await store.get_instance("f1", "vm-f.example")
        # the database must say what Ganeti has: the instance, made by this request's job
        assert instance is not None and instance.status is InstanceStatus.STARTED, instance
        assert done.job_id == job_id and done.status is RequestStatus.SUCCEEDED, done


async def test_deleting_a_build_instance_whose_create_is_queued_cancels_the_create(db_url: str) -> None:
    # the first create holds the only job slot long enough for the second to be canceled while
    # queued, even on a loaded machine (with 1 s it once started before the cancel came, in CI)
    queue_holds = {**SLOW, "OP_INSTANCE_CREATE": 10.0}
    async with one_backend(db_url, max_running_jobs=1, op_times=queue_holds) as (f1, settings, store, cp, _):
        async with running(Dispatcher(settings, store=store, status_server=False)):
            await submitted(cp, await cp.request_instance(spec("first.example")))
            queued = await submitted(cp, await cp.request_instance(spec("doomed.example")))
            job_id = await cp.delete_instance("doomed.example", backend="f1")
            assert job_id == queued.job_id
            instance = await store.get_instance("f1", "doomed.example")
            assert instance is not None and instance.status is InstanceStatus.DESTROYED
            done = await finished(cp, queued.id)
        assert done.status is RequestStatus.CANCELED
        assert f1.cluster.jobs[job_id].status is JobStatus.CANCELED
        # the canceled create's end, stored since, leaves it so: it never existed
        instance = await store.get_instance("f1", "doomed.example")
        assert instance is not None and instance.status is InstanceStatus.DESTROYED, instance
        assert "doomed.example" not in f1.cluster.instances
        assert [op.op_id for job in f1.cluster.jobs.values() for op in job.ops].count(
            "OP_INSTANCE_REMOVE"
        ) == 0
