"""Networks and IP pools through the facade (issue 16 part 2): create, list, delete; a NIC with
``ip="pool"`` takes its address from Ganeti's pool, stored on the instance and freed with it.
On a fake Ganeti whose queue the watcher stores, both databases."""

from __future__ import annotations

import asyncio
import functools
import ipaddress
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from synnefo_ganeti import ConflictError, ControlPlane, NotFoundError, ValidationError
from synnefo_ganeti.config import Settings
from synnefo_ganeti.dispatch._observe import Observer
from synnefo_ganeti.errors import ConfigError, JobFailedError
from synnefo_ganeti.store import InstanceStatus, Store, StoredInstance
from synnefo_ganeti.store.networks._networks import NetworkState
from synnefo_ganeti.testing import FakeGaneti
from synnefo_ganeti.watch import QueueWatcher
from tests import helpers
from tests.helpers import eventually
from tests.unit.test_cloud_actions import settled

QUICK = {"OP_INSTANCE_CREATE": 0.02, "OP_INSTANCE_REMOVE": 0.01, "OP_NETWORK_ADD": 0.01,
         "OP_NETWORK_CONNECT": 0.01, "OP_NETWORK_DISCONNECT": 0.01, "OP_NETWORK_REMOVE": 0.01,
         "OP_NETWORK_SET_PARAMS": 0.01}  # fmt: skip
OWNED = "synnefo-ganeti:owned"
NET = "cnet-blue"


spec = functools.partial(helpers.spec, pnode="node1.fake.test")


def settings_for(fakes: dict[str, FakeGaneti], db_url: str) -> Settings:
    return Settings(
        database={"url": db_url},
        backends=[
            {"name": name, "url": fake.url, "username": fake.username, "password": fake.password}
            for name, fake in fakes.items()
        ],
    )


@asynccontextmanager
async def plane(
    tmp_path: Path, db_url: str, *, backends: int = 1
) -> AsyncIterator[tuple[list[FakeGaneti], ControlPlane]]:
    """``backends`` fakes (f1, f2, ...) writing their queues, watchers storing them, a ControlPlane;
    and the dispatcher's observer, which stores what Ganeti made once a create ended."""
    fakes = [FakeGaneti(tls=False, queue_dir=tmp_path / f"queue{i}", op_times=QUICK) for i in range(backends)]
    for fake in fakes:
        await fake.__aenter__()
    tasks: list[asyncio.Task[None]] = []
    watchers: list[QueueWatcher] = []
    try:
        named = {f"f{i + 1}": fake for i, fake in enumerate(fakes)}
        async with Store(db_url) as store, ControlPlane(settings_for(named, db_url), store=store) as cp:
            observer = Observer(store, cp.client)
            store.on_commit.append(observer.on_commit)
            tasks.append(asyncio.create_task(observer.run()))
            for i, name in enumerate(named):
                watcher = QueueWatcher(tmp_path / f"queue{i}", store, name)
                watchers.append(watcher)
                tasks.append(asyncio.create_task(watcher.run()))
                await watcher.ready.wait()
            try:
                yield fakes, cp
            finally:
                for watcher in watchers:
                    watcher.stop()
                tasks[0].cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for fake in reversed(fakes):
            await fake.__aexit__(None, None, None)


async def observed(cp: ControlPlane, name: str) -> StoredInstance:
    """The instance once it is STARTED and holds what Ganeti made (its NICs' addresses)."""

    async def reached() -> StoredInstance | None:
        instance = await cp.get_instance(name, backend="f1")
        ok = instance is not None and instance.status is InstanceStatus.STARTED and instance.pnode is not None
        return instance if ok else None

    found: StoredInstance = await eventually(reached, what=f"{name} to be STARTED with Ganeti's values")
    return found


async def test_create_list_and_delete_a_network_on_two_backends(tmp_path: Path, db_url: str) -> None:
    async with plane(tmp_path, db_url, backends=2) as (fakes, cp):
        network = await cp.create_network(
            NET, subnet="10.7.0.0/24", gateway="10.7.0.1", mac_prefix="AA:00:07"
        )
        assert network.name == NET and network.status is NetworkState.ACTIVE
        assert (network.subnet, network.gateway, network.mac_prefix) == (
            "10.7.0.0/24",
            "10.7.0.1",
            "aa:00:07",
        )
        assert sorted(network.backends) == ["f1", "f2"]
        for backend in ("f1", "f2"):
            on = network.backends[backend]
            assert on.state is NetworkState.ACTIVE and on.groups == ["default"] and on.error is None
            assert on.link == "gntbr0"  # the cluster's default NIC link
            assert on.job_id is not None
        assert [n.name for n in await cp.list_networks()] == [NET]
        for fake in fakes:
            client = helpers.fake_client(fake)
            async with client:
                got = await client.get_network(NET)
            assert got.network == "10.7.0.0/24" and got.gateway == "10.7.0.1" and got.mac_prefix == "aa:00:07"
            assert got.group_list == [["default", "bridged", "gntbr0", ""]]
            assert OWNED in got.tags

        await cp.delete_network(NET)
        assert await cp.list_networks() == []
        assert await cp.get_network(NET) is None
        for fake in fakes:
            assert NET not in fake.cluster.model.networks
        # the name is free again
        again = await cp.create_network(NET, subnet="10.8.0.0/24", backends=["f2"], mode="routed", link="100")
        assert list(again.backends) == ["f2"] and again.backends["f2"].link == "100"
        assert fakes[1].cluster.model.groups["default"].networks[NET][:2] == ["routed", "100"]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"subnet": "10.0.0.1/24"}, "subnet"),  # host bits set
        ({"subnet": "10.0.0.0/8"}, "subnet"),  # larger than /16
        ({"subnet": "10.0.0.0/31"}, "subnet"),
        ({"subnet": "fd00::/64"}, "subnet"),
        ({"subnet": "nonsense"}, "subnet"),
        ({"subnet": "10.0.0.0/24", "gateway": "10.0.1.1"}, "gateway"),
        ({"subnet": "10.0.0.0/24", "gateway": "10.0.0.255"}, "gateway"),
        ({"subnet": "10.0.0.0/24", "gateway": "ten"}, "gateway"),
        ({"subnet": "10.0.0.0/24", "mac_prefix": "aa:00"}, "mac_prefix"),
        ({"subnet": "10.0.0.0/24", "mac_prefix": "zz:00:01"}, "mac_prefix"),
        ({"subnet": "10.0.0.0/24", "mode": "tunnel"}, "mode"),
        ({"subnet": "10.0.0.0/24", "groups": "default"}, "groups"),
        ({"subnet": "10.0.0.0/24", "groups": {"nowhere": ["default"]}}, "groups"),
    ],
)
async def test_bad_values_are_refused_naming_the_field_before_anything_is_written_or_sent(
    tmp_path: Path, sqlite_url: str, kwargs: dict[str, object], field: str
) -> None:
    async with plane(tmp_path, sqlite_url) as ([fake], cp):
        with pytest.raises(ValidationError) as caught:
            await cp.create_network(NET, **kwargs)  # type: ignore[arg-type]
        assert caught.value.field == field
        assert await cp.list_networks() == []
        assert fake.cluster.jobs == {}


async def test_a_bad_name_and_an_unknown_backend_are_refused(tmp_path: Path, sqlite_url: str) -> None:
    async with plane(tmp_path, sqlite_url) as ([fake], cp):
        with pytest.raises(ValidationError) as caught:
            await cp.create_network("bad name!", subnet="10.0.0.0/24")
        assert caught.value.field == "name"
        with pytest.raises(ConfigError):
            await cp.create_network(NET, subnet="10.0.0.0/24", backends=["nowhere"])
        assert await cp.list_networks() == [] and fake.cluster.jobs == {}


async def test_a_name_taken_in_the_database_or_in_ganeti_is_a_conflict(tmp_path: Path, db_url: str) -> None:
    async with plane(tmp_path, db_url) as ([fake], cp):
        await cp.create_network(NET, subnet="10.7.0.0/24")
        jobs = len(fake.cluster.jobs)
        with pytest.raises(ConflictError, match="taken"):
            await cp.create_network(NET, subnet="10.9.0.0/24")
        assert len(fake.cluster.jobs) == jobs
        # made in Ganeti outside the control plane
        async with helpers.fake_client(fake) as client:
            await client.wait_for_job(await client.create_network("cnet-theirs", "10.10.0.0/24"))
        with pytest.raises(ConflictError, match="in Ganeti"):
            await cp.create_network("cnet-theirs", subnet="10.10.0.0/24")
        assert [n.name for n in await cp.list_networks()] == [NET]


async def test_a_failed_connect_leaves_the_backend_in_error_and_raises(
    tmp_path: Path, sqlite_url: str
) -> None:
    async with plane(tmp_path, sqlite_url) as (_fakes, cp):
        with pytest.raises(JobFailedError, match="nogroup"):
            await cp.create_network(NET, subnet="10.7.0.0/24", groups=["nogroup"])
        network = await cp.get_network(NET)
        assert network is not None and network.status is NetworkState.ERROR
        on = network.backends["f1"]
        assert on.state is NetworkState.ERROR and on.groups == [] and "nogroup" in (on.error or "")
        # it can be deleted all the same (the add succeeded: Ganeti has it, connected nowhere)
        await cp.delete_network(NET)
        assert await cp.list_networks() == []


async def test_an_instance_takes_a_pool_address_stored_and_freed_with_it(tmp_path: Path, db_url: str) -> None:
    async with plane(tmp_path, db_url) as ([fake], cp):
        await cp.create_network(NET, subnet="10.7.0.0/29", gateway="10.7.0.1")
        pool = fake.cluster.model.networks[NET].pool
        vms = ["vm-pool1.example.org", "vm-pool2.example.org"]
        for name in vms:
            await cp.create_instance(spec(name, nics=[{"network": NET, "ip": "pool"}]), backend="f1")
        addresses = []
        for name in vms:
            instance = await observed(cp, name)
            assert instance.nics is not None and len(instance.nics) == 1
            nic = instance.nics[0]
            assert nic["network"] == NET and nic["mode"] == "bridged" and nic["link"] == "gntbr0"
            assert ipaddress.IPv4Address(nic["ip"]) in ipaddress.IPv4Network("10.7.0.0/29")
            assert pool.is_reserved(nic["ip"])
            addresses.append(nic["ip"])
        assert sorted(addresses) == ["10.7.0.2", "10.7.0.3"]  # the first free ones: .0 .1 (gateway) are taken

        with pytest.raises(ConflictError, match="vm-pool1"):
            await cp.delete_network(NET)
        await cp.delete_instance(vms[0], backend="f1")
        await settled(cp, vms[0], InstanceStatus.DESTROYED)
        assert not pool.is_reserved(addresses[0]) and pool.is_reserved(addresses[1])

        await cp.delete_instance(vms[1], backend="f1")
        await settled(cp, vms[1], InstanceStatus.DESTROYED)
        assert not pool.is_reserved(addresses[1])
        await cp.delete_network(NET)
        assert NET not in fake.cluster.model.networks


async def test_delete_is_refused_while_ganeti_has_an_instance_on_the_network(
    tmp_path: Path, sqlite_url: str
) -> None:
    async with plane(tmp_path, sqlite_url) as ([fake], cp):
        await cp.create_network(NET, subnet="10.7.0.0/24")
        async with helpers.fake_client(fake) as client:  # an instance the control plane does not know
            job = await client.create_instance(
                spec("theirs.example.org", nics=[{"network": NET, "ip": "pool"}])
            )
            await client.wait_for_job(job)
        jobs = len(fake.cluster.jobs)
        with pytest.raises(ConflictError, match=r"theirs\.example\.org"):
            await cp.delete_network(NET)
        assert len(fake.cluster.jobs) == jobs
        network = await cp.get_network(NET)
        assert network is not None and network.status is NetworkState.ACTIVE


async def test_delete_of_an_unknown_network_is_not_found(tmp_path: Path, sqlite_url: str) -> None:
    async with plane(tmp_path, sqlite_url) as (_fakes, cp):
        with pytest.raises(NotFoundError, match="cnet-none"):
            await cp.delete_network("cnet-none")
