"""Durable requests and the dispatcher against the real Ganeti testbed (scripts/ganeti-testbed up).

Requests written through ``ControlPlane.request_instance`` are placed, submitted and followed
to their end by a :class:`Dispatcher`: with the queue watched on this machine, and with the jobs
followed through RAPI ``/wait`` (a dispatcher off the master node). Then the crash promise on the
real cluster: a request a dead dispatcher had sent is found in Ganeti by its request id and
recorded, not sent again. SQLite and PostgreSQL. Skipped where no cluster runs; fails in CI.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from synnefo_ganeti import ControlPlane
from synnefo_ganeti.config import Settings
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.reconcile._observe import expectation
from synnefo_ganeti.store import InstanceStatus, RequestStatus, Store, request_tag
from tests.helpers import eventually
from tests.integration._testbed import BACKEND, QUEUE_DIR, client, name, spec
from tests.integration.test_control_real import remove_everywhere

pytestmark = [pytest.mark.ganeti, pytest.mark.timeout(240)]

OWNED_TAG = "synnefo-ganeti:owned"


def settings(testbed, db_url: str, *, watched: bool) -> Settings:
    backend = {
        "name": BACKEND,
        "url": testbed.url,
        "username": testbed.username,
        "password": testbed.password,
        "ca_file": testbed.ca_file,
    }
    if watched:
        backend["queue_dir"] = str(QUEUE_DIR)
    return Settings(
        database={"url": db_url},
        backends=[backend],
        dispatcher={"status_port": None, "health_interval": 2.0, "poll_interval": 0.2},
        reconcile={"interval": 3600},
    )


@contextlib.asynccontextmanager
async def dispatching(config: Settings, store: Store | None) -> AsyncIterator[Dispatcher]:
    dispatcher = Dispatcher(config, store=store, status_server=False)
    task = asyncio.create_task(dispatcher.run())
    ready = asyncio.create_task(dispatcher.ready.wait())
    await asyncio.wait({task, ready}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()
    assert dispatcher.ready.is_set(), "the dispatcher did not start within 30 s"
    try:
        yield dispatcher
    finally:
        dispatcher.stop()
        await asyncio.wait_for(task, 60)


@pytest.mark.parametrize("watched", [True, False], ids=["queue-watched", "rapi-wait"])
async def test_durable_requests_end_as_instances(testbed, db_url, watched) -> None:
    config = settings(testbed, db_url, watched=watched)
    names = [name("req") for _ in range(3)]
    async with Store(db_url) as store, client(testbed) as rapi:
        try:
            async with ControlPlane(config, store=store) as cp, dispatching(config, store) as dispatcher:
                ids = [await cp.request_instance(spec(testbed, instance)) for instance in names]
                dispatcher.wake()
                done = [await cp.wait_request(request_id, timeout=180) for request_id in ids]
                for request, instance in zip(done, names, strict=True):
                    assert request.status is RequestStatus.SUCCEEDED, request.to_json()
                    assert request.backend == BACKEND and request.job_id is not None
                    stored = await store.get_instance(BACKEND, instance)
                    assert stored is not None and stored.status is InstanceStatus.STARTED
                    # Ganeti itself says which request made it, and that it is ours
                    real = await rapi.get_instance(instance)
                    assert request_tag(request.id) in real.tags and OWNED_TAG in real.tags
                    job = await rapi.get_job(request.job_id)
                    assert job.status.value == "success"
                    assert f"synnefo-ganeti:{request.id}" in job.request_ids
                assert dispatcher.stats.submitted == 3 and dispatcher.stats.failed == 0
                # the job ends came through the watcher or the /wait tracker, not the reconciler
                assert dispatcher.stats.reconcile_passes == 0
                job_ids = {request.job_id for request in done}
                stored_jobs = {job.job_id: job for job in await store.list_jobs(backend=BACKEND)}
                assert all(stored_jobs[job_id].status.value == "success" for job_id in job_ids)
        finally:
            await remove_everywhere(rapi, names, testbed)


async def test_a_create_sent_before_a_crash_is_found_not_sent_again(testbed, db_url) -> None:
    config = settings(testbed, db_url, watched=True)
    instance = name("crash")
    async with Store(db_url) as store, client(testbed) as rapi:
        try:
            async with ControlPlane(config, store=store) as cp:
                request_id = await cp.request_instance(spec(testbed, instance))
            # a dispatcher claimed and placed it, sent the create, and died before recording the job
            [claimed] = await store.claim_requests("dead-dispatcher:1:deadbeef", 1)
            tags = [OWNED_TAG, request_tag(request_id)]
            await store.place_request(
                request_id, "dead-dispatcher:1:deadbeef", BACKEND, expectation(spec(testbed, instance), tags)
            )
            sent = spec(testbed, instance).model_copy(update={"tags": tags})
            job_id = await rapi.create_instance(sent, request_id=request_id)
            async with ControlPlane(config, store=store) as cp, dispatching(config, store) as dispatcher:
                request = await cp.wait_request(request_id, timeout=180)
                assert request.status is RequestStatus.SUCCEEDED, request.to_json()
                assert request.job_id == job_id and request.attempts == 1
                assert dispatcher.stats.recovered == 1 and dispatcher.stats.submitted == 0
            carrying = [
                job for job in await rapi.list_jobs() if f"synnefo-ganeti:{request_id}" in job.request_ids
            ]
            assert [job.id for job in carrying] == [job_id], "the create was sent twice"
            assert claimed.id == request_id
        finally:
            await remove_everywhere(rapi, [instance], testbed)


async def test_two_dispatchers_share_the_real_queue_folder(testbed, pg_url) -> None:
    """Two dispatchers on one PostgreSQL and the real cluster's queue folder (issue 31): the
    holder of the follow lease reads every job file; the other's watch is paused (no inotify
    instance) and it learns the ends of the creates it submitted from the jobs the holder stored."""
    config = settings(testbed, pg_url, watched=True)
    names = [name("two") for _ in range(4)]
    async with Store(pg_url) as store, client(testbed) as rapi:
        try:
            async with (
                ControlPlane(config, store=store) as cp,
                dispatching(config, store) as one,
                dispatching(config, None) as two,  # a store of its own, as in another process
            ):

                def settled() -> bool:
                    leases = [d.leases for d in (one, two) if d.leases is not None]
                    return sum(len(lease.held) for lease in leases) == 1 and all(
                        lease.claimers() == 2 for lease in leases
                    )

                await eventually(settled, what="one dispatcher holding the backend's lease", timeout=60)
                one_holds = one.leases is not None and one.leases.holds(BACKEND)
                holder, other = (one, two) if one_holds else (two, one)
                ids = [await cp.request_instance(spec(testbed, instance)) for instance in names]
                for d in (one, two):
                    d.wake()
                done = [await cp.wait_request(request_id, timeout=180) for request_id in ids]
                assert [r.status for r in done] == [RequestStatus.SUCCEEDED] * len(names), [
                    r.to_json() for r in done
                ]
                assert holder.stats.submitted + other.stats.submitted == len(names)
                assert other.stats.submitted > 0  # each claims its share of the pending requests
                # the other's last end read: at most a second after the holder stored it
                await eventually(lambda: not other._jobs, what="every end learned by the other", timeout=30)
                assert other.stats.ends_read == other.stats.submitted
                other_watch = other._backends[BACKEND].watcher
                holder_watch = holder._backends[BACKEND].watcher
                assert other_watch is not None and holder_watch is not None
                assert other_watch.paused and not holder_watch.paused
                assert holder_watch.stats.versions > 0
                for instance in names:
                    assert (await rapi.get_instance(instance)).name == instance
        finally:
            await remove_everywhere(rapi, names, testbed)
