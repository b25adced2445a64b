"""The cloud's instance operations (control/_operations.py) against the real Ganeti testbed.

A dispatcher follows the jobs through RAPI (as for a backend without a local watcher) and its
observer stores Ganeti's values; the facade submits each operation. On any testbed (marker
``ganeti``): console, resize, grow a disk (``file`` template), attach and detach a NIC, rename,
reinstall (the testbed's one OS, ``noop``), tags. On the 3-node one (marker ``ganeti3``;
``sharedfile`` and ``diskless`` move there, ../shared/ganeti/multi/NOTES.md): migrate and failover,
the stored ``pnode`` following. Instance names start ``dop-``; they are removed even when a step fails.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from synnefo_ganeti import ControlPlane, NotFoundError, RapiClient
from synnefo_ganeti.config import Settings
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.store import InstanceStatus, Store, StoredInstance
from tests.helpers import eventually
from tests.integration._testbed import BACKEND, client, spec
from tests.unit.test_dispatcher import running

pytestmark = [pytest.mark.timeout(600)]

DEADLINE = 120.0  # seconds for a job's end to be stored (the testbed runs a few jobs a second)


def dop(tag: str) -> str:
    return f"dop-{tag}-{uuid.uuid4().hex[:6]}.ganeti.test"


def settings(testbed: Any, db_url: str) -> Settings:
    backend = {
        "name": BACKEND, "url": testbed.url, "username": testbed.username, "password": testbed.password,
        "ca_file": testbed.ca_file,
    }  # fmt: skip
    options = {"status_port": None, "poll_interval": 0.1, "health_interval": 1.0, "stats_interval": 2.0}
    return Settings(database={"url": db_url}, backends=[backend], dispatcher=options)


@contextlib.asynccontextmanager
async def operating(testbed: Any, db_url: str, names: list[str]) -> AsyncIterator[ControlPlane]:
    """A store, a dispatcher following the jobs, a control plane; ``names`` removed from Ganeti at the end."""
    sets = settings(testbed, db_url)
    async with client(testbed) as rapi:
        try:
            async with (
                Store(db_url) as store,
                running(Dispatcher(sets, store=store, status_server=False)),
                ControlPlane(sets, store=store) as cp,
            ):
                yield cp
        finally:
            await remove(rapi, names)


async def remove(rapi: RapiClient, names: list[str]) -> None:
    problems = []
    for instance in names:
        try:
            await rapi.get_instance(instance)
        except NotFoundError:
            continue
        except Exception as exc:  # report at the end, try the others
            problems.append(f"{instance}: {exc!r}")
            continue
        try:
            await rapi.wait_for_job(await rapi.delete_instance(instance), timeout=DEADLINE)
        except Exception as exc:
            problems.append(f"{instance}: {exc!r}")
    assert not problems, f"instances left on the testbed: {problems}"


async def until(
    cp: ControlPlane, instance_id: str, what: str, check: Callable[[StoredInstance], bool]
) -> StoredInstance:
    """The instance once no task is in progress and ``check`` holds (an ERROR or a last_error fails)."""

    async def reached() -> StoredInstance | None:
        instance = await cp.get_instance(instance_id)
        assert instance is not None and instance.status is not InstanceStatus.ERROR, instance
        if instance.task is not None:
            return None
        assert instance.last_error is None, instance.last_error
        return instance if check(instance) else None

    found: StoredInstance = await eventually(reached, timeout=DEADLINE, interval=0.2, what=what)
    return found


def is_(status: InstanceStatus) -> Callable[[StoredInstance], bool]:
    return lambda instance: instance.status is status


@pytest.mark.ganeti
async def test_operations_on_the_testbed(testbed, db_url) -> None:
    diskless, filed, renamed = dop("ops"), dop("disk"), dop("new")
    async with operating(testbed, db_url, [diskless, filed, renamed]) as cp:
        rapi = await cp.client(BACKEND)
        one, _ = await cp.create_instance(spec(testbed, diskless), backend=BACKEND)
        two, _ = await cp.create_instance(
            spec(testbed, filed, disk_template="file", disks=[{"size": 1024}]), backend=BACKEND
        )
        await until(cp, one.id, "the diskless instance STARTED", is_(InstanceStatus.STARTED))
        await until(cp, two.id, "the file instance STARTED", is_(InstanceStatus.STARTED))

        # console: Ganeti's answer, no job
        console = await cp.console_instance(one.id)
        assert console.instance == diskless and console.kind in ("msg", "ssh", "spice", "vnc")

        # resize: memory and vCPUs, stored and in Ganeti
        await cp.resize_instance(one.id, memory=192, vcpus=2)
        resized = await until(cp, one.id, "the resize stored", lambda i: i.memory == 192)
        assert resized.vcpus == 2
        assert (await rapi.get_instance(diskless)).beparams["maxmem"] == 192

        # grow the file instance's disk
        await cp.grow_disk(two.id, disk=0, amount=512)
        grown = await until(
            cp, two.id, "the grown disk stored", lambda i: (i.disks or [{}])[0].get("size") == 1536
        )
        assert (await rapi.get_instance(filed)).disk_sizes == [1536] and grown.disks[0]["uuid"]  # type: ignore[index]

        # attach a NIC (the cluster's default mode and link), then detach it
        await cp.attach_nic(one.id)
        attached = await until(
            cp,
            one.id,
            "the new NIC's MAC stored",
            lambda i: len(i.nics or []) == 2 and bool(i.nics[1].get("mac")),  # type: ignore[index]
        )
        assert attached.nics[1]["mac"] == (await rapi.get_instance(diskless)).nic_macs[1]  # type: ignore[index]
        await cp.detach_nic(one.id, index=1)
        await until(cp, one.id, "the NIC detached", lambda i: len(i.nics or []) == 1)
        assert len((await rapi.get_instance(diskless)).nic_macs) == 1

        # tags: only ours stored
        await cp.add_instance_tags(one.id, ["dop-team", "synnefo-ganeti:dop"])
        tagged = await until(cp, one.id, "the tags stored", lambda i: "synnefo-ganeti:dop" in (i.tags or []))
        assert (
            "dop-team" not in (tagged.tags or []) and "dop-team" in (await rapi.get_instance(diskless)).tags
        )
        await cp.remove_instance_tags(one.id, ["dop-team", "synnefo-ganeti:dop"])
        await until(cp, one.id, "the tags removed", lambda i: "synnefo-ganeti:dop" not in (i.tags or []))

        # reinstall the file instance (Ganeti reinstalls onto disks; the testbed's one OS), started again
        await cp.reinstall_instance(two.id, os="noop")
        reinstalled = await until(cp, two.id, "the reinstall's end", is_(InstanceStatus.STARTED))
        assert reinstalled.os == "noop"
        jobs = await cp.store.instance_jobs(BACKEND, filed)
        assert (jobs[-1]["action"], jobs[-1]["result"]) == ("reinstall", "success")

        # attach a disk to the running file instance; detach it once stopped (Ganeti removes a
        # running instance's disk only with hotplug: instance_set_params.py, DDM_REMOVE)
        await cp.attach_disk(two.id, size=1024)  # the testbed's policy: disks of 1 GiB or more
        with_disk = await until(
            cp,
            two.id,
            "the new disk and its uuid (the observer's, after the end) stored",
            lambda i: (
                [(d.get("size"), bool(d.get("uuid"))) for d in i.disks or []] == [(1536, True), (1024, True)]
            ),
        )
        assert [d["uuid"] for d in with_disk.disks or []] == (await rapi.get_instance(filed)).disk_uuids
        await cp.shutdown_instance(two.id)
        await until(cp, two.id, "the file instance STOPPED", is_(InstanceStatus.STOPPED))
        await cp.detach_disk(two.id, index=1)
        await until(cp, two.id, "the disk detached", lambda i: len(i.disks or []) == 1)
        assert (await rapi.get_instance(filed)).disk_sizes == [1536]

        # rename: stopped first (Ganeti renames stopped instances only); the id stays
        await cp.shutdown_instance(one.id)
        await until(cp, one.id, "STOPPED", is_(InstanceStatus.STOPPED))
        await cp.rename_instance(one.id, renamed)
        after = await until(cp, one.id, "the new name stored", lambda i: i.name == renamed)
        assert after.id == one.id and (await rapi.get_instance(renamed)).name == renamed
        with pytest.raises(NotFoundError):
            await rapi.get_instance(diskless)


@pytest.mark.ganeti3
async def test_migrate_and_failover_on_the_three_nodes(testbed3, db_url) -> None:
    testbed = testbed3.bed
    first, second, third = testbed3.nodes
    instance = dop("move")
    async with operating(testbed, db_url, [instance]) as cp:
        rapi = await cp.client(BACKEND)
        created, _ = await cp.create_instance(spec(testbed, instance, pnode=first), backend=BACKEND)
        await until(cp, created.id, "STARTED", is_(InstanceStatus.STARTED))
        await cp.migrate_instance(created.id, target_node=second)
        await until(cp, created.id, f"migrated to {second}", lambda i: i.pnode == second)
        assert (await rapi.get_instance(instance)).pnode == second
        await cp.failover_instance(created.id, target_node=third)
        failed_over = await until(cp, created.id, f"failed over to {third}", lambda i: i.pnode == third)
        assert (
            failed_over.status is InstanceStatus.STARTED
            and (await rapi.get_instance(instance)).pnode == third
        )
        # without a target, the cluster's allocator picks the node; the observer stores it
        await cp.migrate_instance(created.id)
        moved = await until(
            cp, created.id, "migrated where hail chose", lambda i: i.pnode not in (None, third)
        )
        assert moved.pnode == (await rapi.get_instance(instance)).pnode
