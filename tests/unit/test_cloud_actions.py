"""Actions with outcomes (task, task_job_id, last_error; one action at a time) and deletes and
tags as Synnefo expects: on a fake Ganeti whose queue the watcher stores, both databases."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from synnefo_ganeti import ConflictError, ControlPlane, NotFoundError
from synnefo_ganeti.config import Settings
from synnefo_ganeti.errors import AuthenticationError
from synnefo_ganeti.jobs import JobStatus, JobSummary, OpSummary
from synnefo_ganeti.reconcile import Fix, Reconciler
from synnefo_ganeti.store import InstanceStatus, Store, StoredInstance
from synnefo_ganeti.store.instances._outcomes import instance_unknown, last_error_after
from synnefo_ganeti.testing import FakeGaneti
from synnefo_ganeti.watch import QueueWatcher
from tests import helpers
from tests.helpers import eventually

QUICK = {"OP_INSTANCE_CREATE": 0.02, "OP_INSTANCE_REMOVE": 0.01, "OP_INSTANCE_SHUTDOWN": 0.01,
         "OP_INSTANCE_STARTUP": 0.01, "OP_INSTANCE_REBOOT": 0.01, "OP_INSTANCE_SET_PARAMS": 0.01}  # fmt: skip
OWNED = "synnefo-ganeti:owned"

spec = functools.partial(helpers.spec, pnode="node1.fake.test", vcpus=2)


def settings_for(fake: FakeGaneti, db_url: str) -> Settings:
    return Settings(
        database={"url": db_url},
        backends=[{"name": "f1", "url": fake.url, "username": fake.username, "password": fake.password}],
    )


@asynccontextmanager
async def plane(
    tmp_path: Path,
    db_url: str,
    *,
    watch: bool = True,
    quick: dict[str, float] = QUICK,
    fake_options: dict[str, Any] | None = None,
    **op_times: float,
) -> AsyncIterator[tuple[FakeGaneti, ControlPlane]]:
    """A fake Ganeti writing its queue (ops ``quick`` unless ``op_times`` says otherwise; more of its
    options in ``fake_options``), the watcher storing it (unless not ``watch``), a ControlPlane."""
    queue = tmp_path / "queue"
    options = {"op_times": {**quick, **op_times}} | (fake_options or {})
    async with (
        FakeGaneti(tls=False, queue_dir=queue, **options) as fake,
        Store(db_url) as store,
        ControlPlane(settings_for(fake, db_url), store=store) as cp,
    ):
        if not watch:
            yield fake, cp
            return
        watcher = QueueWatcher(queue, store, "f1")
        task = asyncio.create_task(watcher.run())
        await watcher.ready.wait()
        try:
            yield fake, cp
        finally:
            watcher.stop()
            await task


async def settled(cp: ControlPlane, name: str, status: InstanceStatus) -> StoredInstance:
    """The instance once it is ``status`` with no task in progress."""

    async def reached() -> StoredInstance | None:
        instance = await cp.get_instance(name, backend="f1")
        ok = instance is not None and instance.status is status and instance.task is None
        return instance if ok else None

    found: StoredInstance = await eventually(reached, what=f"{name} to be {status.value} with no task")
    return found


async def get(cp: ControlPlane, name: str) -> StoredInstance:
    instance = await cp.get_instance(name, backend="f1")
    assert instance is not None
    return instance


async def started(cp: ControlPlane, name: str) -> StoredInstance:
    await cp.create_instance(spec(name), backend="f1")
    return await settled(cp, name, InstanceStatus.STARTED)


async def test_the_task_is_set_by_an_action_and_cleared_by_its_end(tmp_path, db_url) -> None:
    async with plane(tmp_path, db_url) as (_fake, cp):
        instance, create_job = await cp.create_instance(spec("vm1.fake.test"), backend="f1")
        assert (instance.task, instance.task_job_id, instance.last_error) == ("build", create_job, None)
        assert (await settled(cp, "vm1.fake.test", InstanceStatus.STARTED)).task_job_id is None
        for call, task, status in [
            (cp.shutdown_instance, "stop", InstanceStatus.STOPPED),
            (cp.startup_instance, "start", InstanceStatus.STARTED),
            (cp.reboot_instance, "reboot", InstanceStatus.STARTED),
        ]:
            job_id = await call("vm1.fake.test", backend="f1")
            current = await get(cp, "vm1.fake.test")
            # in progress until the end is applied (the quick job may have ended already)
            assert (current.task, current.task_job_id) in [(task, job_id), (None, None)]
            await settled(cp, "vm1.fake.test", status)
        modify = await cp.modify_instance("vm1.fake.test", backend="f1", beparams={"memory": 512})
        assert (await get(cp, "vm1.fake.test")).task in ("modify", None)
        done = await settled(cp, "vm1.fake.test", InstanceStatus.STARTED)
        assert done.last_error is None and done.beparams is not None and done.beparams["maxmem"] == 512
        jobs = await cp.store.instance_jobs("f1", "vm1.fake.test")
        assert jobs[-1]["job_id"] == modify and jobs[-1]["result"] == "success"


async def test_a_failed_job_sets_last_error_and_the_next_success_clears_it(tmp_path, db_url) -> None:
    async with plane(tmp_path, db_url) as (_fake, cp):
        await started(cp, "vm1.fake.test")
        await cp.shutdown_instance("vm1.fake.test", backend="f1")
        await settled(cp, "vm1.fake.test", InstanceStatus.STOPPED)
        # Ganeti accepts the reboot of a stopped instance, and the job fails
        reboot = await cp.reboot_instance("vm1.fake.test", backend="f1")

        async def failed() -> StoredInstance | None:
            instance = await get(cp, "vm1.fake.test")
            return instance if instance.last_error is not None and instance.task is None else None

        instance = await eventually(failed, what="the reboot's failure stored")
        assert instance.status is InstanceStatus.STOPPED  # a failed reboot leaves the state alone
        error: dict[str, Any] = instance.last_error or {}
        assert error["action"] == "reboot" and error["job_id"] == reboot
        assert "marked to be down" in error["message"] and error["at"]
        await cp.startup_instance("vm1.fake.test", backend="f1")
        assert (await settled(cp, "vm1.fake.test", InstanceStatus.STARTED)).last_error is None


async def test_a_refused_submit_sets_last_error_and_frees_the_instance(tmp_path, db_url) -> None:
    async with plane(tmp_path, db_url) as (fake, cp):
        await started(cp, "vm1.fake.test")
        fake.inject_fault("401", method="PUT", path="/2/instances/vm1.fake.test/shutdown", times=1)
        with pytest.raises(AuthenticationError):
            await cp.shutdown_instance("vm1.fake.test", backend="f1")
        refused = await get(cp, "vm1.fake.test")
        assert refused.task is None and refused.status is InstanceStatus.STARTED
        assert refused.last_error is not None
        assert (refused.last_error["action"], refused.last_error["job_id"]) == ("shutdown", None)
        # the instance is free again: the next action goes through, and its success clears the error
        await cp.shutdown_instance("vm1.fake.test", backend="f1")
        assert (await settled(cp, "vm1.fake.test", InstanceStatus.STOPPED)).last_error is None
        # a create Ganeti refused: ERROR, with why
        fake.inject_fault("401", method="POST", path="/2/instances", times=1)
        with pytest.raises(AuthenticationError):
            await cp.create_instance(spec("vm2.fake.test"), backend="f1")
        bad = await get(cp, "vm2.fake.test")
        assert bad.status is InstanceStatus.ERROR and bad.task is None
        assert bad.last_error is not None and bad.last_error["action"] == "create"


async def test_a_second_action_in_progress_conflicts_and_a_delete_follows_it(tmp_path, db_url) -> None:
    async with plane(tmp_path, db_url, OP_INSTANCE_SHUTDOWN=1.0, OP_INSTANCE_REMOVE=1.0) as (_fake, cp):
        await started(cp, "vm1.fake.test")
        stop = await cp.shutdown_instance("vm1.fake.test", backend="f1")
        client = await cp.client("f1")
        jobs_before = len(await client.list_jobs())
        for action in (cp.startup_instance, cp.reboot_instance, cp.shutdown_instance):
            with pytest.raises(ConflictError, match=rf"busy: 'stop' is in progress \(job {stop}\)"):
                await action("vm1.fake.test", backend="f1")
        with pytest.raises(ConflictError, match="busy"):
            await cp.modify_instance("vm1.fake.test", backend="f1", beparams={"memory": 512})
        assert len(await client.list_jobs()) == jobs_before  # nothing was sent to Ganeti
        # a delete is never refused as busy: taken at once, it follows the stop's end
        assert await cp.delete_instance("vm1.fake.test", backend="f1") is None
        waiting = await cp.get_instance("vm1.fake.test", backend="f1")
        assert waiting is not None and waiting.delete_requested_at is not None
        assert len(await client.list_jobs()) == jobs_before
        await settled(cp, "vm1.fake.test", InstanceStatus.DESTROYED)
        jobs = await cp.store.instance_jobs("f1", "vm1.fake.test")
        (first,) = [j["job_id"] for j in jobs if j["action"] == "remove"]
        gone = await cp.get_instance("vm1.fake.test", backend="f1")
        assert gone is not None and gone.delete_requested_at is None
        # deleted already: the same answer again; other actions find nothing
        assert await cp.delete_instance("vm1.fake.test", backend="f1") == first
        with pytest.raises(NotFoundError, match="DESTROYED"):
            await cp.startup_instance("vm1.fake.test", backend="f1")
        removes = [j for j in await cp.store.instance_jobs("f1", "vm1.fake.test") if j["action"] == "remove"]
        assert [j["job_id"] for j in removes] == [first]


async def test_an_action_on_a_building_instance_conflicts(tmp_path, db_url) -> None:
    async with plane(tmp_path, db_url, OP_INSTANCE_CREATE=1.0) as (_fake, cp):
        _, create = await cp.create_instance(spec("vm1.fake.test"), backend="f1")
        with pytest.raises(ConflictError, match=rf"'build' is in progress \(job {create}\)"):
            await cp.shutdown_instance("vm1.fake.test", backend="f1")
        await settled(cp, "vm1.fake.test", InstanceStatus.STARTED)
        await cp.shutdown_instance("vm1.fake.test", backend="f1")
        await settled(cp, "vm1.fake.test", InstanceStatus.STOPPED)


async def test_deleting_an_error_instance_ganeti_does_not_have_needs_no_job(tmp_path, db_url) -> None:
    async with plane(tmp_path, db_url) as (fake, cp):
        fake.inject_fault("401", method="POST", path="/2/instances", times=1)
        with pytest.raises(AuthenticationError):
            await cp.create_instance(spec("vm1.fake.test"), backend="f1")
        assert (await get(cp, "vm1.fake.test")).status is InstanceStatus.ERROR
        client = await cp.client("f1")
        jobs_before = len(await client.list_jobs())
        assert await cp.delete_instance("vm1.fake.test", backend="f1") is None
        gone = await get(cp, "vm1.fake.test")
        assert (gone.status, gone.task, gone.last_error) == (InstanceStatus.DESTROYED, None, None)
        assert len(await client.list_jobs()) == jobs_before
        assert await cp.store.instance_jobs("f1", "vm1.fake.test") == []
        # an ERROR instance Ganeti has (its create failed after making it) is removed with a job
        fake.inject_fault("401", method="POST", path="/2/instances", times=1)
        with pytest.raises(AuthenticationError):
            await cp.create_instance(spec("vm2.fake.test"), backend="f1")
        ours = cp.settings.ownership.tags_for_new()  # (made by our create: it carries our mark)
        await client.wait_for_job(await client.create_instance(spec("vm2.fake.test", tags=ours)))
        job_id = await cp.delete_instance("vm2.fake.test", backend="f1")
        assert isinstance(job_id, int)
        await settled(cp, "vm2.fake.test", InstanceStatus.DESTROYED)
        assert "vm2.fake.test" not in fake.cluster.instances


async def test_a_remove_failing_because_ganeti_has_no_such_instance_destroys_it(tmp_path, db_url) -> None:
    async with plane(tmp_path, db_url) as (_fake, cp):
        await started(cp, "vm1.fake.test")
        # removed behind the control plane's back
        client = await cp.client("f1")
        await client.wait_for_job(await client.delete_instance("vm1.fake.test"))
        job_id = await cp.delete_instance("vm1.fake.test", backend="f1")
        assert job_id is not None
        job = await client.wait_for_job(job_id)
        assert job.failure is not None and job.failure.ecode == "unknown_entity"
        gone = await settled(cp, "vm1.fake.test", InstanceStatus.DESTROYED)
        assert gone.last_error is None
        jobs = await cp.store.instance_jobs("f1", "vm1.fake.test")
        assert (jobs[-1]["job_id"], jobs[-1]["result"]) == (job_id, "error")


async def test_a_create_canceled_before_it_ran_ends_destroyed_whoever_sees_it(tmp_path, db_url) -> None:
    """The watcher (the job's end applied) and the reconciler (a building drift) agree: DESTROYED."""
    for watch in (True, False):
        async with plane(tmp_path / str(watch), db_url, watch=watch, OP_INSTANCE_CREATE=2.0) as (_fake, cp):
            name = f"vm-{watch}.fake.test".lower()
            # a first create holds node1's lock: the second waits, and is canceled before it runs
            await cp.create_instance(spec(f"first-{watch}.fake.test".lower()), backend="f1")
            _, job_id = await cp.create_instance(spec(name), backend="f1")
            client = await cp.client("f1")
            assert (await client.cancel_job(job_id)).success
            assert (await client.wait_for_job(job_id)).status.value == "canceled"
            if not watch:
                async with Reconciler(cp.settings, store=cp.store) as reconciler:
                    await reconciler.run_once(fixes=[Fix.BUILDING])
            gone = await settled(cp, name, InstanceStatus.DESTROYED)
            assert gone.last_error is None


async def test_only_tags_under_the_namespace_are_stored_and_compared(tmp_path, db_url) -> None:
    async with plane(tmp_path, db_url) as (fake, cp):
        instance, _ = await cp.create_instance(spec("vm1.fake.test", tags=["team:a"]), backend="f1")
        assert instance.tags == [OWNED]  # the user's tag went to Ganeti, but is not ours to keep
        await settled(cp, "vm1.fake.test", InstanceStatus.STARTED)
        assert set(fake.cluster.instances["vm1.fake.test"].tags) == {OWNED, "team:a"}
        # an operator tags it in Ganeti: no drift, nothing copied
        fake.cluster.instances["vm1.fake.test"].tags.append("ops:backup")
        async with Reconciler(cp.settings, store=cp.store) as reconciler:
            report = await reconciler.run_once(fixes=[Fix.TAGS])
            assert [d for d in report.backends[0].drifts if d.kind.value == "tags"] == []
            assert (await get(cp, "vm1.fake.test")).tags == [OWNED]
            # a tag under our namespace is ours: a drift, and the fix stores ours only
            fake.cluster.instances["vm1.fake.test"].tags.append("synnefo-ganeti:extra")
            report = await reconciler.run_once(fixes=[Fix.TAGS])
            tags = [d for d in report.backends[0].drifts if d.kind.value == "tags"]
            assert len(tags) == 1 and "synnefo-ganeti:extra" in tags[0].detail and tags[0].fixed
        assert (await get(cp, "vm1.fake.test")).tags == ["synnefo-ganeti:extra", OWNED]


def test_what_a_job_end_does_to_last_error() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)

    def ended(status: JobStatus, error: str | None = None) -> JobSummary:
        op = OpSummary(index=0, op_id="OP_INSTANCE_REMOVE", status=status, error=error)
        return JobSummary(job_id=7, ops=(op,))

    # Ganeti's message for an instance it does not have (cmdlib ExpandInstanceUuidAndName)
    gone = "OpPrereqError: Instance 'vm1.example.org' not known"
    assert instance_unknown(gone) and instance_unknown("OpPrereqError: ... (unknown_entity)")
    assert not instance_unknown("OpPrereqError: Node 'node9' not known")
    assert last_error_after("remove", ended(JobStatus.ERROR, gone), at) == {"last_error": None}
    assert last_error_after("startup", ended(JobStatus.SUCCESS), at) == {"last_error": None}
    assert last_error_after("create", ended(JobStatus.CANCELED), at) == {}
    failed = last_error_after("reboot", ended(JobStatus.ERROR, "OpPrereqError: down"), at)["last_error"]
    assert failed == {"action": "reboot", "job_id": 7, "message": "OpPrereqError: down", "at": at.isoformat()}
    canceled = last_error_after("shutdown", ended(JobStatus.CANCELED), at)["last_error"]
    assert canceled["message"] == "job 7 was canceled"
