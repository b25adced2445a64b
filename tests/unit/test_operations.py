"""The cloud's instance operations through the facade (control/_operations.py), on a fake Ganeti
whose queue the watcher stores, both databases: each operation's job, the stored instance after
it, a conflict while another action runs, ``last_error`` when the job fails."""

from __future__ import annotations

import asyncio
import functools
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

from synnefo_ganeti import ConflictError, ControlPlane, NotFoundError, ValidationError
from synnefo_ganeti.store import InstanceStatus, StoredInstance
from tests import helpers
from tests.helpers import eventually
from tests.unit.test_cloud_actions import plane as cloud_plane

QUICK = {op: 0.01 for op in (
    "OP_INSTANCE_CREATE", "OP_INSTANCE_REMOVE", "OP_INSTANCE_SHUTDOWN", "OP_INSTANCE_STARTUP",
    "OP_INSTANCE_REBOOT", "OP_INSTANCE_SET_PARAMS", "OP_INSTANCE_GROW_DISK", "OP_INSTANCE_RENAME",
    "OP_INSTANCE_REINSTALL", "OP_INSTANCE_MIGRATE", "OP_INSTANCE_FAILOVER", "OP_TAGS_SET", "OP_TAGS_DEL",
)}  # fmt: skip
OWNED = "synnefo-ganeti:owned"
# (the fake's reinstall checks an OS by its name without a variant: no variants here)
OSES = ("noop", "debootstrap")

spec = functools.partial(helpers.spec, pnode="node1.fake.test", vcpus=1)


def file_spec(name: str, **kwargs: Any) -> Any:
    return spec(name, disk_template="file", disks=[{"size": 1024}], **kwargs)


def plane(
    tmp_path: Path, db_url: str, *, version: str = "3.0", **op_times: float
) -> AbstractAsyncContextManager[Any]:
    """test_cloud_actions' world (a fake writing its queue, the watcher, a ControlPlane) with this
    module's quick ops and OSes; the fake answers as Ganeti ``version``."""
    options = {"oses": OSES, "version": version}
    return cloud_plane(tmp_path, db_url, quick=QUICK, fake_options=options, **op_times)


#: the NIC and disk operations send what each Ganeti takes (3.1 refuses hotplug_if_possible)
VERSIONS = pytest.mark.parametrize("version", ["2.16", "3.0", "3.1"])


async def settled(cp: ControlPlane, instance_id: str, status: InstanceStatus | None = None) -> StoredInstance:
    """The instance once no task is in progress (and it is ``status``, if given)."""

    async def reached() -> StoredInstance | None:
        instance = await cp.get_instance(instance_id)
        ok = instance is not None and instance.task is None
        return instance if ok and (status is None or instance.status is status) else None

    found: StoredInstance = await eventually(reached, what=f"{instance_id} settled")
    return found


async def started(cp: ControlPlane, spec_: Any) -> StoredInstance:
    instance, _ = await cp.create_instance(spec_, backend="f1")
    return await settled(cp, instance.id, InstanceStatus.STARTED)


async def stopped(cp: ControlPlane, instance: StoredInstance) -> StoredInstance:
    await cp.shutdown_instance(instance.id)
    return await settled(cp, instance.id, InstanceStatus.STOPPED)


async def last_job(cp: ControlPlane, instance: StoredInstance) -> dict[str, Any]:
    current = await cp.get_instance(instance.id)
    assert current is not None
    jobs = await cp.store.instance_jobs(current.backend, current.name)
    return jobs[-1]


async def test_resize_changes_memory_and_vcpus(tmp_path: Path, db_url: str) -> None:
    async with plane(tmp_path, db_url) as (fake, cp):
        vm = await started(cp, spec("vm1.fake.test"))
        job_id = await cp.resize_instance(vm.id, memory=512, vcpus=2)
        assert (await cp.get_instance(vm.id)).task in ("resize", None)  # type: ignore[union-attr]
        done = await settled(cp, vm.id, InstanceStatus.STARTED)
        assert (done.memory, done.vcpus, done.last_error) == (512, 2, None)
        assert done.beparams is not None and done.beparams["maxmem"] == 512
        assert fake.cluster.instances["vm1.fake.test"].beparams["maxmem"] == 512
        job = await last_job(cp, vm)
        assert (job["job_id"], job["action"], job["result"]) == (job_id, "resize", "success")
        with pytest.raises(ValidationError) as bad:
            await cp.resize_instance(vm.id, memory=-1)
        assert bad.value.field == "memory"
        with pytest.raises(ValidationError):
            await cp.resize_instance(vm.id)


async def test_grow_disk_grows_the_stored_disk(tmp_path: Path, db_url: str) -> None:
    async with plane(tmp_path, db_url) as (fake, cp):
        vm = await started(cp, file_spec("vm1.fake.test"))
        job_id = await cp.grow_disk(vm.id, disk=0, amount=512)
        done = await settled(cp, vm.id, InstanceStatus.STARTED)
        assert done.disks is not None and done.disks[0]["size"] == 1536
        assert fake.cluster.instances["vm1.fake.test"].disks[0]["size"] == 1536
        assert (await last_job(cp, vm))["job_id"] == job_id
        for kwargs, field in (({"disk": 1, "amount": 1}, "disk"), ({"disk": 0, "amount": 0}, "amount")):
            with pytest.raises(ValidationError) as bad:
                await cp.grow_disk(vm.id, **kwargs)
            assert bad.value.field == field


@VERSIONS
async def test_attach_and_detach_a_nic(tmp_path: Path, db_url: str, version: str) -> None:
    async with plane(tmp_path, db_url, version=version) as (fake, cp):
        vm = await started(cp, spec("vm1.fake.test"))
        await cp.attach_nic(vm.id, link="br1", mode="bridged")
        attached = await settled(cp, vm.id, InstanceStatus.STARTED)
        assert attached.nics is not None and len(attached.nics) == 2 and attached.nics[1]["link"] == "br1"
        ganeti_nics = fake.cluster.instances["vm1.fake.test"].nics
        assert [nic["link"] for nic in ganeti_nics][1] == "br1"
        await cp.detach_nic(vm.id, index=1)
        detached = await settled(cp, vm.id, InstanceStatus.STARTED)
        assert detached.nics is not None and len(detached.nics) == 1
        assert len(fake.cluster.instances["vm1.fake.test"].nics) == 1
        with pytest.raises(ValidationError, match="has 1 NICs"):
            await cp.detach_nic(vm.id, index=1)
        with pytest.raises(ValidationError) as bad:
            await cp.attach_nic(vm.id, ip="pool")
        assert bad.value.field == "ip"


@VERSIONS
async def test_attach_a_disk_and_detach_it_once_stopped(tmp_path: Path, db_url: str, version: str) -> None:
    async with plane(tmp_path, db_url, version=version) as (fake, cp):
        vm = await started(cp, file_spec("vm1.fake.test"))
        await cp.attach_disk(vm.id, size=512)
        attached = await settled(cp, vm.id, InstanceStatus.STARTED)
        assert [disk["size"] for disk in attached.disks or []] == [1024, 512]
        assert [d["size"] for d in fake.cluster.instances["vm1.fake.test"].disks] == [1024, 512]
        # Ganeti removes a disk of a running instance only with hotplug (not the fake's hypervisor)
        job_id = await cp.detach_disk(vm.id, index=1)
        failed = await settled(cp, vm.id, InstanceStatus.STARTED)
        assert failed.last_error is not None
        assert (failed.last_error["action"], failed.last_error["job_id"]) == ("detach_disk", job_id)
        assert "running instance" in failed.last_error["message"]
        assert [disk["size"] for disk in failed.disks or []] == [1024, 512]  # unchanged
        await stopped(cp, vm)
        await cp.detach_disk(vm.id, index=1)
        detached = await settled(cp, vm.id, InstanceStatus.STOPPED)
        assert [disk["size"] for disk in detached.disks or []] == [1024] and detached.last_error is None
        assert [d["size"] for d in fake.cluster.instances["vm1.fake.test"].disks] == [1024]


async def test_rename_follows_the_job(tmp_path: Path, db_url: str) -> None:
    async with plane(tmp_path, db_url, OP_INSTANCE_RENAME=1.0) as (fake, cp):
        vm = await started(cp, spec("vm1.fake.test"))
        other = await started(cp, spec("vm2.fake.test"))
        with pytest.raises(ConflictError, match="stop it first"):
            await cp.rename_instance(vm.id, "vm3.fake.test")
        await stopped(cp, vm)
        client = await cp.client("f1")
        jobs_before = len(await client.list_jobs())
        with pytest.raises(ConflictError, match=f"id {other.id}"):
            await cp.rename_instance(vm.id, "vm2.fake.test")  # another live instance's name
        with pytest.raises(ValidationError) as bad:
            await cp.rename_instance(vm.id, "bad name!")
        assert bad.value.field == "name"
        assert len(await client.list_jobs()) == jobs_before  # nothing was sent
        job_id = await cp.rename_instance(vm.id, "vm3.fake.test")
        with pytest.raises(ConflictError, match="'rename' is in progress"):
            await cp.startup_instance(vm.id)
        renamed = await settled(cp, vm.id, InstanceStatus.STOPPED)
        assert (renamed.name, renamed.id, renamed.last_error) == ("vm3.fake.test", vm.id, None)
        assert "vm3.fake.test" in fake.cluster.instances and "vm1.fake.test" not in fake.cluster.instances
        assert await cp.get_instance("vm1.fake.test", backend="f1") is None
        jobs = await cp.store.instance_jobs("f1", "vm3.fake.test")
        assert (jobs[-1]["job_id"], jobs[-1]["action"], jobs[-1]["result"]) == (job_id, "rename", "success")
        # the new name is taken, the old one free again
        with pytest.raises(ConflictError, match=r"vm3\.fake\.test"):
            await cp.request_instance(spec("vm3.fake.test"))
        await started(cp, spec("vm1.fake.test"))


async def test_a_rename_whose_name_was_taken_meanwhile_keeps_the_old_name(
    tmp_path: Path, db_url: str
) -> None:
    """The name is checked at submit, not held: a row that took it while the rename ran (here
    written straight into the store) keeps it, and the renamed row keeps its old name, with why."""
    async with plane(tmp_path, db_url, OP_INSTANCE_RENAME=1.0) as (_fake, cp):
        vm = await stopped(cp, await started(cp, spec("vm1.fake.test")))
        job_id = await cp.rename_instance(vm.id, "vm3.fake.test")
        other = await cp.store.add_instance("f1", "vm3.fake.test", status=InstanceStatus.STOPPED)
        kept = await settled(cp, vm.id, InstanceStatus.STOPPED)
        assert kept.name == "vm1.fake.test" and kept.last_error is not None
        assert (kept.last_error["action"], kept.last_error["job_id"]) == ("rename", job_id)
        assert other.id in kept.last_error["message"]


async def test_a_rename_in_progress_holds_its_new_name(tmp_path: Path, db_url: str) -> None:
    """While the rename's job runs (held queued here by a PAUSE filter rule) its new name is taken:
    a request, a create and another rename of that name are refused at once, naming the rename;
    at its end the name is the renamed instance's and the old one is free."""
    async with plane(tmp_path, db_url) as (_fake, cp):
        vm = await stopped(cp, await started(cp, spec("vm1.fake.test")))
        other = await stopped(cp, await started(cp, spec("vm2.fake.test")))
        client = await cp.client("f1")
        hold = await client.add_filter(
            priority=1, predicates=[["opcode", ["=", "OP_ID", "OP_INSTANCE_RENAME"]]], action="PAUSE"
        )
        job_id = await cp.rename_instance(vm.id, "vm3.fake.test")
        taken = rf"rename in progress: instance {vm.id} \(vm1\.fake\.test of backend f1\) is being renamed to it \(job {job_id}\)"
        for call in (
            lambda: cp.request_instance(spec("vm3.fake.test")),
            lambda: cp.create_instance(spec("vm3.fake.test"), backend="f1"),
            lambda: cp.rename_instance(other.id, "vm3.fake.test"),
        ):
            with pytest.raises(ConflictError, match=taken):
                await call()
        # several requests written at once (the writer's set-based path when they meet): the
        # held name is refused, the others accepted
        results = await asyncio.gather(
            *(
                cp.request_instance(spec(name))
                for name in ("vm4.fake.test", "vm3.fake.test", "vm5.fake.test")
            ),
            return_exceptions=True,
        )
        assert isinstance(results[1], ConflictError) and "rename in progress" in str(results[1])
        assert all(isinstance(result, str) for result in (results[0], results[2])), results
        assert (await client.get_job(job_id)).status.value == "queued"  # the rename did not run yet
        await client.delete_filter(hold)
        renamed = await settled(cp, vm.id, InstanceStatus.STOPPED)
        assert (renamed.name, renamed.last_error) == ("vm3.fake.test", None)
        with pytest.raises(ConflictError, match=f"taken: instance {vm.id} of backend f1 is STOPPED"):
            await cp.request_instance(spec("vm3.fake.test"))  # now a live instance's name
        assert await cp.request_instance(spec("vm1.fake.test"))  # the old name is free


async def test_reinstall_with_another_os(tmp_path: Path, db_url: str) -> None:
    async with plane(tmp_path, db_url) as (fake, cp):
        diskless = await started(cp, spec("vm2.fake.test"))
        with pytest.raises(ValidationError, match="has no disks") as refused:
            await cp.reinstall_instance(diskless.id)
        assert refused.value.field == "disks"
        vm = await started(cp, file_spec("vm1.fake.test"))
        await cp.reinstall_instance(vm.id, os="debootstrap")
        done = await settled(cp, vm.id, InstanceStatus.STARTED)
        assert (done.os, done.last_error) == ("debootstrap", None)
        assert fake.cluster.instances["vm1.fake.test"].os == "debootstrap"
        await cp.reinstall_instance(vm.id, start=False)  # the OS it has, left stopped
        again = await settled(cp, vm.id, InstanceStatus.STOPPED)
        assert again.os == "debootstrap"
        with pytest.raises(ValidationError, match="does not offer it") as bad:
            await cp.reinstall_instance(vm.id, os="windows")
        assert bad.value.field == "os"


async def test_migrate_and_failover_move_the_stored_node(tmp_path: Path, db_url: str) -> None:
    async with plane(tmp_path, db_url) as (fake, cp):
        vm = await started(cp, spec("vm1.fake.test"))
        assert vm.pnode in (None, "node1.fake.test")
        await cp.migrate_instance(vm.id, target_node="node2.fake.test")
        migrated = await settled(cp, vm.id, InstanceStatus.STARTED)
        assert (
            migrated.pnode == "node2.fake.test"
            and fake.cluster.instances["vm1.fake.test"].pnode == "node2.fake.test"
        )
        await cp.failover_instance(vm.id, target_node="node1.fake.test")
        failed_over = await settled(cp, vm.id, InstanceStatus.STARTED)
        assert failed_over.pnode == "node1.fake.test"
        # a move Ganeti refuses: last_error, the node unchanged
        job_id = await cp.migrate_instance(vm.id, target_node="node9.fake.test")
        refused = await settled(cp, vm.id, InstanceStatus.STARTED)
        assert refused.last_error is not None and refused.last_error["job_id"] == job_id
        assert refused.last_error["action"] == "migrate" and refused.pnode == "node1.fake.test"


async def test_tags_only_ours_are_stored(tmp_path: Path, db_url: str) -> None:
    async with plane(tmp_path, db_url) as (fake, cp):
        vm = await started(cp, spec("vm1.fake.test"))
        await cp.add_instance_tags(vm.id, ["team:a", "synnefo-ganeti:tier-gold"])
        tagged = await settled(cp, vm.id)
        assert tagged.tags == [OWNED, "synnefo-ganeti:tier-gold"]
        assert {"team:a", "synnefo-ganeti:tier-gold", OWNED} <= set(
            fake.cluster.instances["vm1.fake.test"].tags
        )
        await cp.remove_instance_tags(vm.id, ["synnefo-ganeti:tier-gold", "team:a"])
        untagged = await settled(cp, vm.id)
        assert untagged.tags == [OWNED] and set(fake.cluster.instances["vm1.fake.test"].tags) == {OWNED}
        with pytest.raises(ValidationError, match="marks the instance as ours"):
            await cp.remove_instance_tags(vm.id, [OWNED])
        with pytest.raises(ValidationError):
            await cp.add_instance_tags(vm.id, "team:a")
        with pytest.raises(ValidationError, match="tier=gold"):
            await cp.add_instance_tags(vm.id, ["tier=gold"])
        # a tag Ganeti does not have: the job fails, last_error says so
        await cp.remove_instance_tags(vm.id, ["synnefo-ganeti:none"])
        failed = await settled(cp, vm.id)
        assert failed.last_error is not None and failed.last_error["action"] == "remove_tags"


async def test_console_of_a_running_instance(tmp_path: Path, db_url: str) -> None:
    async with plane(tmp_path, db_url) as (_fake, cp):
        vm = await started(cp, spec("vm1.fake.test"))
        client = await cp.client("f1")
        jobs_before = len(await client.list_jobs())
        console = await cp.console_instance(vm.id)
        assert console.instance == "vm1.fake.test" and console.kind in ("msg", "ssh", "spice", "vnc")
        assert len(await client.list_jobs()) == jobs_before  # no job
        await stopped(cp, vm)
        with pytest.raises(ConflictError, match="start it first"):
            await cp.console_instance(vm.id)
        with pytest.raises(NotFoundError):
            await cp.console_instance("vm9.fake.test", backend="f1")


async def test_every_operation_conflicts_while_another_action_runs(tmp_path: Path, db_url: str) -> None:
    # the resize runs until the test ends (the fake cancels it then): every call below meets it in
    # progress however slowly they run (a 1 s resize ended under CI's load before the last call)
    async with plane(tmp_path, db_url, OP_INSTANCE_SET_PARAMS=3600.0) as (_fake, cp):
        vm = await started(cp, file_spec("vm1.fake.test"))
        resize = await cp.resize_instance(vm.id, memory=512)
        client = await cp.client("f1")
        jobs_before = len(await client.list_jobs())
        calls = [
            lambda: cp.resize_instance(vm.id, vcpus=2),
            lambda: cp.grow_disk(vm.id, amount=1),
            lambda: cp.attach_nic(vm.id, link="br1"),
            lambda: cp.detach_nic(vm.id, index=0),
            lambda: cp.attach_disk(vm.id, size=1),
            lambda: cp.detach_disk(vm.id, index=0),
            lambda: cp.reinstall_instance(vm.id),
            lambda: cp.migrate_instance(vm.id, target_node="node2.fake.test"),
            lambda: cp.failover_instance(vm.id),
            lambda: cp.add_instance_tags(vm.id, ["synnefo-ganeti:x"]),
            lambda: cp.remove_instance_tags(vm.id, ["synnefo-ganeti:x"]),
        ]
        for call in calls:
            with pytest.raises(ConflictError, match=rf"busy: 'resize' is in progress \(job {resize}\)"):
                await call()
        assert len(await client.list_jobs()) == jobs_before  # nothing was sent to Ganeti
        still = await cp.get_instance(vm.id)
        assert still is not None and (still.task, still.task_job_id) == ("resize", resize)
        assert (await client.get_job(resize)).status.value in ("queued", "waiting", "running")
