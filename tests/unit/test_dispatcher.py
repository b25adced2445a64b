"""The dispatcher end to end on fake Ganeti backends and both databases: placement, refusals,
job ends through the watcher or RAPI /wait, health, reload and stop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from synnefo_ganeti import ConfigError, ControlPlane, RapiClient, RetryPolicy
from synnefo_ganeti.config import Settings
from synnefo_ganeti.dispatch import Dispatcher, JobTracker
from synnefo_ganeti.store import InstanceStatus, Request, RequestStatus, Store
from synnefo_ganeti.testing import FakeGaneti
from tests.helpers import eventually, spec

QUICK = {"OP_INSTANCE_CREATE": 0.02, "OP_INSTANCE_REMOVE": 0.01, "OP_INSTANCE_SHUTDOWN": 0.01,
         "OP_INSTANCE_STARTUP": 0.01, "OP_INSTANCE_REBOOT": 0.01, "OP_INSTANCE_SET_PARAMS": 0.01}  # fmt: skip


def sqlite_url(tmp_path: Path) -> str:
    """For tests of what does not depend on the database (the rest run on both)."""
    return f"sqlite:///{tmp_path / 'store.db'}"


def backend(name: str, fake: FakeGaneti, **extra: Any) -> dict[str, Any]:
    return {"name": name, "url": fake.url, "username": fake.username, "password": fake.password, **extra}


def settings_for(db_url: str, backends: list[dict[str, Any]], **dispatcher: Any) -> Settings:
    options: dict[str, Any] = {"status_port": None, "poll_interval": 0.05, "health_interval": 0.2,
                               "stats_interval": 0.5, "shutdown_timeout": 5.0} | dispatcher  # fmt: skip
    return Settings(database={"url": db_url}, backends=backends, dispatcher=options)


@asynccontextmanager
async def running(dispatcher: Dispatcher) -> AsyncIterator[Dispatcher]:
    """``dispatcher`` running until the block ends; then stopped, and ``run()`` must return cleanly."""
    task = asyncio.create_task(dispatcher.run(), name="test dispatcher")
    ready = asyncio.create_task(dispatcher.ready.wait())
    await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        ready.cancel()
        task.result()  # raises what run() raised
        raise AssertionError("the dispatcher returned before it was ready")
    try:
        yield dispatcher
    finally:
        dispatcher.stop()
        await task


@asynccontextmanager
async def fakes(count: int, **options: Any) -> AsyncIterator[list[FakeGaneti]]:
    async with AsyncExitStack() as stack:
        made = []
        for _ in range(count):
            options.setdefault("op_times", QUICK)
            made.append(await stack.enter_async_context(FakeGaneti(tls=False, **options)))
        yield made


async def finished(cp: ControlPlane, request_id: str, timeout: float = 20.0) -> Request:
    return await cp.wait_request(request_id, timeout=timeout)


def creates(*fakes_: FakeGaneti, name: str | None = None) -> int:
    """Create jobs the fakes received (for ``name``, or all)."""
    count = 0
    for fake in fakes_:
        for job in fake.cluster.jobs.values():
            for op in job.ops:
                if op.op_id == "OP_INSTANCE_CREATE" and (name is None or op.luxid["instance_name"] == name):
                    count += 1
    return count


# -- placement and the happy path -------------------------------------------------------------------


async def test_requests_succeed_and_spread_by_capacity(db_url: str) -> None:
    # creates long enough (0.3 s) that a node's lock, not the machine's load, sets each backend's pace:
    # with 0.02 s creates the time the dispatcher learned was noise under CI's load (13 small, 11 big once)
    slow = QUICK | {"OP_INSTANCE_CREATE": 0.3}
    async with fakes(1, nodes=1, op_times=slow) as (small,), fakes(1, nodes=3, op_times=slow) as (big,):
        settings = settings_for(db_url, [backend("small", small), backend("big", big)])
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            async with running(Dispatcher(settings, store=store, status_server=False)) as d:
                ids = [await cp.request_instance(spec(f"vm{i}.example")) for i in range(24)]
                done = [await finished(cp, rid) for rid in ids]
            assert all(r.status is RequestStatus.SUCCEEDED for r in done), [r.error for r in done]
            placed = {"small": 0, "big": 0}
            for request in done:
                assert request.backend is not None and request.job_id is not None and request.error is None
                placed[request.backend] += 1
                instance = await store.get_instance(request.backend, request.instance)
                assert instance is not None and instance.status is InstanceStatus.STARTED
                assert instance.create_job_id == request.job_id
            assert 0 < placed["small"] < placed["big"], placed
            assert len(small.cluster.instances) + len(big.cluster.instances) == 24
            assert d.stats.submitted == 24 and d.stats.failed == 0 and d.stats.resubmitted == 0


async def test_pinned_request_lands_on_its_backend(tmp_path: Path) -> None:
    db_url = sqlite_url(tmp_path)
    async with fakes(2) as (f1, f2):
        settings = settings_for(db_url, [backend("f1", f1), backend("f2", f2)])
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            async with running(Dispatcher(settings, store=store, status_server=False)):
                ids = [await cp.request_instance(spec(f"pin{i}.example"), backend="f2") for i in range(4)]
                done = [await finished(cp, rid) for rid in ids]
            assert [(r.status, r.backend, r.want_backend) for r in done] == [
                (RequestStatus.SUCCEEDED, "f2", "f2")
            ] * 4
            assert sorted(f2.cluster.instances) == [f"pin{i}.example" for i in range(4)]
            assert not f1.cluster.instances


async def test_request_for_an_unknown_backend_is_rejected_at_once(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    settings = Settings(
        database={"url": url},
        backends=[{"name": "f1", "url": "http://127.0.0.1:1", "username": "u", "password": "p"}],
    )
    async with Store(url) as store, ControlPlane(settings, store=store) as cp:
        with pytest.raises(ConfigError, match="nowhere"):
            await cp.request_instance(spec("vm.example"), backend="nowhere")
        assert await store.list_requests() == []


async def test_a_spec_no_backend_can_take_fails_after_the_placement_timeout(tmp_path: Path) -> None:
    db_url = sqlite_url(tmp_path)
    async with fakes(2, nodes=1) as (f1, f2):
        settings = settings_for(db_url, [backend("f1", f1), backend("f2", f2)], placement_timeout=0.5)
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            async with running(Dispatcher(settings, store=store, status_server=False)) as d:
                # written as by an older version: request_instance refuses it now (test_validation.py)
                huge = spec("huge.example", beparams={"memory": 64 * 1024})
                request, _ = await store.add_request(huge.model_dump(mode="json"), name=huge.name)
                request = await finished(cp, request.id)
            assert request.status is RequestStatus.FAILED and request.backend is None
            assert request.error is not None
            assert "not placed within 0.5 s" in request.error
            # the reasons, per backend
            assert "f1:" in request.error and "f2:" in request.error and "memory" in request.error
            assert d.stats.placement_retries >= 1 and d.stats.failed == 1 and d.stats.submitted == 0
            assert creates(f1, f2) == 0
            assert await store.get_instance("f1", "huge.example") is None


# -- Ganeti refuses -----------------------------------------------------------------------------------


async def test_a_create_ganeti_refuses_fails_the_request(tmp_path: Path) -> None:
    db_url = sqlite_url(tmp_path)
    async with fakes(1) as (f1,):
        settings = settings_for(db_url, [backend("f1", f1)])
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            async with running(Dispatcher(settings, store=store, status_server=False)) as d:
                # the fake's RAPI checks a create's parameter types at submit time, as Ganeti: 400
                rid = await cp.request_instance(spec("bad.example", extra={"conflicts_check": "maybe"}))
                request = await finished(cp, rid)
            assert request.status is RequestStatus.FAILED and request.backend == "f1"
            assert request.job_id is None and request.attempts == 1
            assert request.error is not None
            assert "f1 refused the create" in request.error and "conflicts_check" in request.error
            instance = await store.get_instance("f1", "bad.example")
            assert instance is not None and instance.status is InstanceStatus.ERROR
            assert instance.create_job_id is None
            assert not f1.cluster.jobs and d.stats.failed == 1 and d.stats.submitted == 0


async def test_a_create_job_failing_in_ganeti_fails_the_request_with_its_message(tmp_path: Path) -> None:
    db_url = sqlite_url(tmp_path)
    async with fakes(1) as (f1,):
        settings = settings_for(db_url, [backend("f1", f1)])
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            async with running(Dispatcher(settings, store=store, status_server=False)) as d:
                # an OS the backend lacks is refused at once (test_validation.py): it goes away after
                # the catalogs were read; a job failing for a reason of its backend goes elsewhere: none
                await eventually(lambda: d.allocator.view("f1").catalog is not None, what="f1's catalog")
                await cp.request_instance(spec("warm.example"))
                f1.cluster.oses.clear()
                rid = await cp.request_instance(spec("noos.example"))
                request = await finished(cp, rid)
            assert request.status is RequestStatus.FAILED and request.attempts == 1
            jobs = f1.cluster.jobs.values()
            (job,) = [j for j in jobs if j.ops[0].luxid["instance_name"] == "noos.example"]
            # Ganeti's error of the op, as it stands in the job: [kind, [message]]
            kind, (message,) = job.ops[0].result
            assert request.error is not None and f"{kind}: {message}" in request.error and "noop" in message
            assert request.error.endswith("no other backend takes it")
            # the one server of the request: ERROR, its row gone with the attempt that made nothing
            # (never an ERROR row per attempt), its request telling it
            assert await store.get_instance("f1", "noos.example") is None
            assert request.instance_id is not None
            instance = await cp.get_instance(request.instance_id)
            assert instance is not None and instance.status is InstanceStatus.ERROR
            assert instance.request_id == rid and instance.last_error is not None
            assert "noos.example" not in f1.cluster.instances


async def test_a_backend_answering_503_is_passed_over(tmp_path: Path) -> None:
    db_url = sqlite_url(tmp_path)
    async with fakes(1, nodes=4) as (busy,), fakes(1, nodes=1) as (other,):
        # 4 nodes: the allocator prefers "busy"; its RAPI answers every create with 503
        fault = busy.inject_fault("503", method="POST", path="/2/instances")
        settings = settings_for(db_url, [backend("busy", busy), backend("other", other)])
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            async with running(Dispatcher(settings, store=store, status_server=False)) as d:
                ids = [await cp.request_instance(spec(f"r{i}.example")) for i in range(6)]
                done = [await finished(cp, rid) for rid in ids]
            assert fault.hits >= 1  # it was tried
            assert [(r.status, r.backend) for r in done] == [(RequestStatus.SUCCEEDED, "other")] * 6
            assert max(r.attempts for r in done) >= 2  # placed on "busy" first, then again
            # no duplicate anywhere: each name once, on "other" only
            assert not busy.cluster.instances and not busy.cluster.jobs
            assert sorted(other.cluster.instances) == sorted(r.instance for r in done)
            assert creates(busy, other) == 6 and d.stats.submitted == 6
            for request in done:
                assert await store.get_instance("busy", request.instance) is None


# -- following job ends: the queue watcher or RAPI /wait ---------------------------------------------


async def test_a_backend_without_a_local_queue_is_followed_through_rapi_wait(tmp_path: Path) -> None:
    db_url = sqlite_url(tmp_path)
    async with fakes(1) as (f1,):
        settings = settings_for(db_url, [backend("f1", f1)])
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            async with running(Dispatcher(settings, store=store, status_server=False)) as d:
                entry = d._backends["f1"]
                assert entry.watcher is None and entry.tracker is not None
                rid = await cp.request_instance(spec("tracked.example"))
                request = await finished(cp, rid)
                assert entry.tracker.ended == 1 and len(entry.tracker) == 0
            assert request.status is RequestStatus.SUCCEEDED
            instance = await store.get_instance("f1", "tracked.example")
            assert instance is not None and instance.status is InstanceStatus.STARTED
            stored = await store.get_job("f1", request.job_id or -1)
            assert stored is not None and stored.status.value == "success"


async def test_a_backend_with_a_local_queue_is_followed_by_the_watcher(tmp_path: Path) -> None:
    db_url = sqlite_url(tmp_path)
    async with fakes(1, queue_dir=tmp_path / "queue") as (f1,):
        settings = settings_for(db_url, [backend("f1", f1, queue_dir=str(tmp_path / "queue"))])
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            async with running(Dispatcher(settings, store=store, status_server=False)) as d:
                entry = d._backends["f1"]
                assert entry.tracker is None and entry.watcher is not None
                rid = await cp.request_instance(spec("watched.example"))
                request = await finished(cp, rid)
            assert request.status is RequestStatus.SUCCEEDED
            instance = await store.get_instance("f1", "watched.example")
            assert instance is not None and instance.status is InstanceStatus.STARTED


class RecordingClient:
    """A real RapiClient whose ``wait_for_job`` calls are written down, in order."""

    def __init__(self, client: RapiClient) -> None:
        self.client = client
        self.waited: list[int] = []

    async def wait_for_job(self, job_id: int, *, timeout: float | None = None) -> Any:
        self.waited.append(job_id)
        return await self.client.wait_for_job(job_id, timeout=timeout)


async def test_job_tracker_follows_oldest_first_once_each_and_drops_unknown_jobs(tmp_path: Path) -> None:
    async with (
        fakes(1) as (fake,),
        Store(sqlite_url(tmp_path)) as store,
        RapiClient(fake.url, username=fake.username, password=fake.password) as client,
    ):
        jobs = [fake.cluster.submit([("OP_TEST_DELAY", {"duration": 0})], client=("gnt-debug", "delay"))
                for _ in range(3)]  # fmt: skip
        recording = RecordingClient(client)
        tracker = JobTracker("f1", recording, store, concurrency=1, retry_delay=0.01)  # type: ignore[arg-type]
        unknown = max(jobs) + 1000
        for job_id in (jobs[1], jobs[2], jobs[0], jobs[1], unknown, jobs[2]):
            tracker.track(job_id)
        assert len(tracker) == 4  # the repeated ones are followed once
        assert "4 jobs" in repr(tracker)
        task = asyncio.create_task(tracker.run())
        try:
            await eventually(lambda: len(tracker) == 0 and tracker.ended == 3, what="every job followed")
            await store.flush()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        # oldest first: a smaller id than the head goes in front; the unknown one is dropped, not retried
        assert recording.waited == [jobs[0], jobs[1], jobs[2], unknown]
        for job_id in jobs:
            stored = await store.get_job("f1", job_id)
            assert stored is not None and stored.status.value == "success"
        assert await store.get_job("f1", unknown) is None


async def test_job_tracker_follows_again_after_a_transient_error(tmp_path: Path) -> None:
    async with (
        fakes(1) as (fake,),
        Store(sqlite_url(tmp_path)) as store,
        RapiClient(
            fake.url, username=fake.username, password=fake.password, retry=RetryPolicy(attempts=1)
        ) as client,
    ):
        job_id = fake.cluster.submit([("OP_TEST_DELAY", {"duration": 0})], client=("gnt-debug", "delay"))
        fault = fake.inject_fault("502", path="/2/jobs/*/wait", times=2)
        recording = RecordingClient(client)
        tracker = JobTracker("f1", recording, store, concurrency=2, retry_delay=0.01)  # type: ignore[arg-type]
        tracker.track(job_id)
        task = asyncio.create_task(tracker.run())
        try:
            await eventually(lambda: tracker.ended == 1, what="the job followed")
            await store.flush()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert fault.hits == 2 and recording.waited == [job_id] * 3
        stored = await store.get_job("f1", job_id)
        assert stored is not None and stored.status.value == "success"


# -- stop --------------------------------------------------------------------------------------------


async def test_stop_records_creates_in_flight_and_gives_back_unplaced_claims(db_url: str) -> None:
    async with fakes(1, latency=0.15) as (f1,):
        settings = settings_for(db_url, [backend("f1", f1)], submit_concurrency=2, placement_timeout=600)
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            # written as by an older version: request_instance refuses it now (test_validation.py)
            too_big = spec("huge.example", beparams={"memory": 64 * 1024})
            huge = (await store.add_request(too_big.model_dump(mode="json"), name=too_big.name))[0].id
            ids = [await cp.request_instance(spec(f"s{i}.example")) for i in range(8)]
            d = Dispatcher(settings, store=store, status_server=False)
            async with running(d):
                # creates are on their way (each RAPI answer takes 0.15 s) when the stop comes
                await eventually(
                    lambda: d.stats.claimed >= 3 and len(d._inflight) >= 2, what="creates in flight"
                )
            assert d.stats.submitted >= 1
            requests = {r.id: r for r in await store.list_requests()}
            recorded = [r for r in requests.values() if r.job_id is not None]
            # everything sent was recorded; nothing was left placed and unrecorded; the rest is free again
            assert len(recorded) == d.stats.submitted == creates(f1)
            assert all(r.status in (RequestStatus.SUBMITTED, RequestStatus.SUCCEEDED) for r in recorded)
            for request in requests.values():
                if request.job_id is None:
                    assert (request.status, request.backend, request.claimed_by) == (
                        RequestStatus.PENDING, None, None
                    ), request  # fmt: skip
            assert requests[huge].claimed_by is None and requests[huge].status is RequestStatus.PENDING
            assert store.pending == 0  # the writer was flushed
            for request in recorded:
                instance = await store.get_instance("f1", request.instance)
                assert instance is not None and instance.create_job_id == request.job_id

            # the next dispatcher finishes the rest, sending nothing twice
            async with running(Dispatcher(settings, store=store, status_server=False)):
                done = [await finished(cp, rid) for rid in ids]
                await cp.cancel_request(huge)
            assert all(r.status is RequestStatus.SUCCEEDED for r in done)
            assert creates(f1) == 8 and len(f1.cluster.instances) == 8
