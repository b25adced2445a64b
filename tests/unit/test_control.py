"""The facade end to end: ControlPlane on a fake Ganeti, the watcher storing its queue, state following."""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from synnefo_ganeti import ConfigError, ControlPlane, InstanceSpec, StoreError
from synnefo_ganeti.config import Settings
from synnefo_ganeti.errors import AuthenticationError
from synnefo_ganeti.store import InstanceStatus, Store
from synnefo_ganeti.testing import FakeGaneti
from synnefo_ganeti.watch import QueueWatcher

QUICK = {"OP_INSTANCE_CREATE": 0.02, "OP_INSTANCE_REMOVE": 0.01, "OP_INSTANCE_SHUTDOWN": 0.01,
         "OP_INSTANCE_STARTUP": 0.01, "OP_INSTANCE_REBOOT": 0.01, "OP_INSTANCE_SET_PARAMS": 0.01}  # fmt: skip


def settings_for(fake: FakeGaneti, db_url: str, **backend: object) -> Settings:
    return Settings(
        database={"url": db_url},
        backends=[
            {"name": "f1", "url": fake.url, "username": fake.username, "password": fake.password, **backend}
        ],
    )


@asynccontextmanager
async def plane(tmp_path: Path, db_url: str, **backend: object):
    """A fake Ganeti writing its queue, the watcher storing it, and a ControlPlane on top."""
    queue = tmp_path / "queue"
    async with FakeGaneti(tls=False, queue_dir=queue, op_times=QUICK) as fake:
        settings = settings_for(fake, db_url, **backend)
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            watcher = QueueWatcher(queue, store, "f1")
            task = asyncio.create_task(watcher.run())
            await watcher.ready.wait()
            try:
                yield fake, cp
            finally:
                watcher.stop()
                await task


async def until(cp: ControlPlane, name: str, status: InstanceStatus, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while True:
        instance = await cp.get_instance(name, backend="f1")
        if instance is not None and instance.status is status:
            return instance
        assert time.monotonic() < deadline, f"{name} is {instance and instance.status}, not {status}"
        await asyncio.sleep(0.05)


def spec(name: str, **kwargs: object) -> InstanceSpec:
    values: dict[str, object] = {
        "name": name, "disk_template": "diskless", "os": "noop", "pnode": "node1.fake.test",
        "beparams": {"memory": 256, "vcpus": 2},
    }  # fmt: skip
    values.update(kwargs)
    return InstanceSpec(**values)  # type: ignore[arg-type]


async def test_create_and_manage_an_instance(tmp_path, db_url) -> None:
    async with plane(tmp_path, db_url) as (fake, cp):
        instance, job_id = await cp.create_instance(spec("vm1.fake.test", tags=["team:a"]), backend="f1")
        assert instance.status is InstanceStatus.BUILD and instance.create_job_id == job_id
        assert instance.beparams == {"maxmem": 256, "minmem": 256, "vcpus": 2}
        assert instance.tags == ["synnefo-ganeti:owned", "team:a"]
        assert instance.nics == [{}] and instance.disks == []
        await until(cp, "vm1.fake.test", InstanceStatus.STARTED)
        # the create went to Ganeti with the ownership tag
        assert set(fake.cluster.instances["vm1.fake.test"].tags) == {"team:a", "synnefo-ganeti:owned"}

        await cp.shutdown_instance("vm1.fake.test", backend="f1")
        await until(cp, "vm1.fake.test", InstanceStatus.STOPPED)
        await cp.startup_instance("vm1.fake.test", backend="f1")
        await until(cp, "vm1.fake.test", InstanceStatus.STARTED)
        reboot = await cp.reboot_instance("vm1.fake.test", backend="f1")
        await cp.modify_instance("vm1.fake.test", backend="f1", beparams={"memory": 512})
        deadline = time.monotonic() + 15
        while (current := await cp.get_instance("vm1.fake.test", backend="f1")) is not None and (
            current.beparams or {}
        ).get("maxmem") != 512:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        assert current is not None and current.beparams == {"maxmem": 512, "minmem": 512, "vcpus": 2}
        await cp.delete_instance("vm1.fake.test", backend="f1")
        gone = await until(cp, "vm1.fake.test", InstanceStatus.DESTROYED)
        assert "vm1.fake.test" not in fake.cluster.instances
        jobs = await cp.store.instance_jobs("f1", "vm1.fake.test")
        assert [j["action"] for j in jobs] == ["create", "shutdown", "startup", "reboot", "modify", "remove"]
        assert reboot in [j["job_id"] for j in jobs] and all(j["result"] == "success" for j in jobs)
        assert gone.create_job_id == job_id


async def test_stopped_create_and_failed_create(tmp_path, db_url) -> None:
    async with plane(tmp_path, db_url) as (fake, cp):
        await cp.create_instance(spec("vm2.fake.test", start=False), backend="f1")
        await until(cp, "vm2.fake.test", InstanceStatus.STOPPED)
        # Ganeti accepts the job, which then fails: the instance ends in ERROR
        await cp.create_instance(spec("vm3.fake.test", os="no-such-os"), backend="f1")
        await until(cp, "vm3.fake.test", InstanceStatus.ERROR)
        # Ganeti refuses the request at once: ERROR without a job
        fake.inject_fault("401", method="POST", path="/2/instances", times=1)
        with pytest.raises(AuthenticationError):
            await cp.create_instance(spec("vm4.fake.test"), backend="f1")
        refused = await cp.get_instance("vm4.fake.test", backend="f1")
        assert (
            refused is not None and refused.status is InstanceStatus.ERROR and refused.create_job_id is None
        )


async def test_refusals(tmp_path, db_url) -> None:
    async with plane(tmp_path, db_url, drained=True) as (fake, cp):
        with pytest.raises(ConfigError, match="drained"):
            await cp.create_instance(spec("vm5.fake.test"), backend="f1")
        with pytest.raises(ConfigError, match="unknown backend 'nope'"):
            await cp.create_instance(spec("vm5.fake.test"), backend="nope")
        with pytest.raises(StoreError, match="not in the database"):
            await cp.startup_instance("stranger.fake.test", backend="f1")
        assert fake.cluster.instances == {}
    assert "f1" in repr(cp) and "password" not in repr(cp)


async def test_the_facade_opens_its_own_store(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'own.db'}"
    async with FakeGaneti(tls=False, op_times=QUICK) as fake:
        async with ControlPlane(settings_for(fake, url)) as cp:
            instance, job_id = await cp.create_instance(spec("vm6.fake.test"), backend="f1")
            assert job_id > 0 and instance.status is InstanceStatus.BUILD
            assert [i.name for i in await cp.list_instances()] == ["vm6.fake.test"]
        with pytest.raises(RuntimeError, match="not open"):
            cp.store  # noqa: B018
