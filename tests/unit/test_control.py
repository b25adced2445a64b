"""The facade end to end: ControlPlane on a fake Ganeti, the watcher storing its queue, state following."""

from __future__ import annotations

import asyncio
import functools
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from synnefo_ganeti import ConfigError, ConflictError, ControlPlane, NotFoundError, ValidationError
from synnefo_ganeti.config import Settings
from synnefo_ganeti.errors import AuthenticationError
from synnefo_ganeti.store import InstanceStatus, Store, StoredInstance
from synnefo_ganeti.testing import FakeGaneti
from synnefo_ganeti.watch import QueueWatcher
from tests import helpers
from tests.helpers import eventually

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


async def until(cp: ControlPlane, name: str, status: InstanceStatus) -> StoredInstance:
    async def reached() -> StoredInstance | None:
        instance = await cp.get_instance(name, backend="f1")
        return instance if instance is not None and instance.status is status else None

    found: StoredInstance = await eventually(reached, what=f"{name} to be {status.value}")
    return found


spec = functools.partial(helpers.spec, pnode="node1.fake.test", vcpus=2)


async def test_create_and_manage_an_instance(tmp_path, db_url) -> None:
    async with plane(tmp_path, db_url) as (fake, cp):
        instance, job_id = await cp.create_instance(spec("vm1.fake.test", tags=["team:a"]), backend="f1")
        assert instance.status is InstanceStatus.BUILD and instance.create_job_id == job_id
        assert instance.beparams == {"maxmem": 256, "minmem": 256, "vcpus": 2}
        assert instance.tags == ["synnefo-ganeti:owned"]  # only tags under [ownership] tag_namespace
        assert instance.nics == [{}] and instance.disks == []
        await until(cp, "vm1.fake.test", InstanceStatus.STARTED)
        # the create went to Ganeti with the ownership tag
        assert set(fake.cluster.instances["vm1.fake.test"].tags) == {"team:a", "synnefo-ganeti:owned"}

        await cp.shutdown_instance("vm1.fake.test", backend="f1")
        await until(cp, "vm1.fake.test", InstanceStatus.STOPPED)
        await cp.startup_instance("vm1.fake.test", backend="f1")
        await until(cp, "vm1.fake.test", InstanceStatus.STARTED)
        reboot = await cp.reboot_instance("vm1.fake.test", backend="f1")

        async def rebooted() -> StoredInstance | None:  # one action at a time: the reboot ends first
            current = await cp.get_instance("vm1.fake.test", backend="f1")
            return current if current is not None and current.task is None else None

        await eventually(rebooted, what="the reboot's end applied")
        await cp.modify_instance("vm1.fake.test", backend="f1", beparams={"memory": 512})

        async def modified() -> StoredInstance | None:
            current = await cp.get_instance("vm1.fake.test", backend="f1")
            return current if current is not None and (current.beparams or {}).get("maxmem") == 512 else None

        current = await eventually(modified, what="the new memory stored")
        assert current.beparams == {"maxmem": 512, "minmem": 512, "vcpus": 2}
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
        # an OS the backend does not offer is refused at once, nothing written (control/_validate.py)
        with pytest.raises(ValidationError, match="no-such-os"):
            await cp.create_instance(spec("vm3.fake.test", os="no-such-os"), backend="f1")
        assert await cp.get_instance("vm3.fake.test", backend="f1") is None
        # Ganeti accepts the job, which then fails (the OS went away after the catalog was read)
        fake.cluster.oses.clear()
        await cp.create_instance(spec("vm3.fake.test"), backend="f1")
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
        with pytest.raises(NotFoundError, match="not in the database"):
            await cp.startup_instance("stranger.fake.test", backend="f1")
        with pytest.raises(NotFoundError, match="not in the database"):
            await cp.get_request("no-such-request")
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


async def test_errors_are_typed_and_the_store_is_held(tmp_path, db_url) -> None:
    from synnefo_ganeti._backends import BackendResources

    async with plane(tmp_path, db_url) as (fake, cp):
        assert not isinstance(cp, BackendResources)
        assert cp.settings.backends[0].name == "f1" and (await cp.client("f1")) is (await cp.client("f1"))
        instance, _ = await cp.create_instance(spec("vm7.fake.test"), backend="f1")
        with pytest.raises(ConflictError, match="already in the database"):
            await cp.create_instance(spec("vm7.fake.test"), backend="f1")
        request_id = await cp.request_instance(spec("vm8.fake.test"))
        with pytest.raises(ConflictError):
            await cp.request_instance(spec("vm9.fake.test"), request_id=request_id)
        with pytest.raises(NotFoundError):
            await cp.reboot_instance("stranger.fake.test", backend="f1", reboot_type="hard")
        assert instance.name == "vm7.fake.test"
        assert [op.op_id for job in fake.cluster.jobs.values() for op in job.ops] == ["OP_INSTANCE_CREATE"]
