"""Actions whose answer is lost (issue 27, item 1: "the same for every other write"), on both
databases: each action's writes carry a reason of their own, the job found by it after a lost
answer is recorded and followed, and none found is an ``OutcomeUnknownError``, never a failure."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from synnefo_ganeti import ControlPlane, OutcomeUnknownError, RapiClient
from synnefo_ganeti.config import Settings
from synnefo_ganeti.store import InstanceStatus, Store
from synnefo_ganeti.testing import FakeGaneti
from synnefo_ganeti.watch import QueueWatcher
from tests.unit.test_cloud_actions import QUICK, get, settled, started


@asynccontextmanager
async def plane(tmp_path: Path, db_url: str) -> AsyncIterator[tuple[FakeGaneti, ControlPlane]]:
    """A fake Ganeti whose queue the watcher stores, and a ControlPlane whose RAPI requests give
    up after 0.5 s."""
    queue = tmp_path / "queue"
    async with FakeGaneti(tls=False, queue_dir=queue, op_times=QUICK) as fake:
        settings = Settings(
            database={"url": db_url},
            backends=[
                {"name": "f1", "url": fake.url, "username": fake.username, "password": fake.password,
                 "timeout": 0.5}
            ],
        )  # fmt: skip
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            watcher = QueueWatcher(queue, store, "f1")
            task = asyncio.create_task(watcher.run())
            await watcher.ready.wait()
            try:
                yield fake, cp
            finally:
                watcher.stop()
                await task


async def test_a_stop_whose_answer_is_lost_is_found_by_its_reason_and_followed(tmp_path, db_url) -> None:
    async with plane(tmp_path, db_url) as (fake, cp):
        await started(cp, "vm1.fake.test")
        # ganeti-rapi queues the job at once but answers after the client gave up
        fake.slow_submit(3.0, job_after=0.0, method="PUT", path="/2/instances/*/shutdown", times=1)
        job_id = await cp.shutdown_instance("vm1.fake.test", backend="f1")
        async with RapiClient(fake.url, username=fake.username, password=fake.password) as rapi:
            job = await rapi.get_job(job_id)
        assert [r.split(":")[1] for r in job.request_ids] == ["shutdown"]
        done = await settled(cp, "vm1.fake.test", InstanceStatus.STOPPED)
        assert done.last_error is None
        jobs = await cp.store.instance_jobs("f1", "vm1.fake.test")
        assert jobs[-1]["job_id"] == job_id and jobs[-1]["result"] == "success"


async def test_a_delete_whose_answer_is_lost_and_no_job_yet_is_unknown_not_failed(tmp_path, db_url) -> None:
    async with plane(tmp_path, db_url) as (fake, cp):
        await started(cp, "vm2.fake.test")
        fake.slow_submit(3.0, job_after=2.0, method="DELETE", path="/2/instances/*", times=1)
        with pytest.raises(OutcomeUnknownError) as caught:
            await cp.delete_instance("vm2.fake.test", backend="f1")
        assert caught.value.reason.startswith("synnefo-ganeti:remove:")
        instance = await get(cp, "vm2.fake.test")
        # not failed, not DESTROYED: still what the store knew, the reservation given back, and
        # last_error saying the outcome is unknown (the reconciler settles what Ganeti did)
        assert instance.status is InstanceStatus.STARTED and instance.task is None
        assert instance.last_error is not None and "may still run" in instance.last_error["message"]
