"""The networks' rows (store/networks/_networks.py) on SQLite and PostgreSQL: a name taken, each backend's
state, the summed-up status, removal, and which stored instances use a network."""

from __future__ import annotations

from typing import Any

import pytest

from synnefo_ganeti import ConflictError, NotFoundError
from synnefo_ganeti.store import InstanceStatus, Store
from synnefo_ganeti.store.networks._networks import NetworkState, NetworkStore


def values(**kwargs: Any) -> dict[str, Any]:
    return {"subnet": "10.0.0.0/24", "gateway": "10.0.0.1", "mac_prefix": "aa:00:01", "mode": "bridged",
            "link": None, "groups": {"b1": ["default"]}, "tags": ["t"], "backends": ["b1", "b2"]} | kwargs  # fmt: skip


async def test_rows_states_and_removal(db_url: str) -> None:
    async with Store(db_url) as store:
        networks = NetworkStore(store)
        added = await networks.add("cnet-a", **values())
        assert added.status is NetworkState.PENDING and sorted(added.backends) == ["b1", "b2"]
        assert (added.subnet, added.gateway, added.mac_prefix, added.groups) == (
            "10.0.0.0/24",
            "10.0.0.1",
            "aa:00:01",
            {"b1": ["default"]},
        )
        assert len(added.id) == 36 and added.tags == ["t"]
        with pytest.raises(ConflictError, match="cnet-a"):
            await networks.add("cnet-a", **values(subnet="10.1.0.0/24"))

        await networks.set_backend("cnet-a", "b1", state=NetworkState.ACTIVE, groups=["default"], job_id=12)
        await networks.set_backend("cnet-a", "b2", state=NetworkState.ERROR, error="job 3 failed")
        got = await networks.require("cnet-a")
        assert got.status is NetworkState.ERROR
        on = got.on("b1")
        assert (
            on is not None
            and on.state is NetworkState.ACTIVE
            and on.groups == ["default"]
            and on.job_id == 12
        )
        await networks.set_backend("cnet-a", "b2", state=NetworkState.ACTIVE, error=None)
        assert (await networks.require("cnet-a")).status is NetworkState.ACTIVE
        await networks.set_status("cnet-a", NetworkState.DELETING)
        assert (await networks.require("cnet-a")).status is NetworkState.DELETING

        await networks.remove_backend("cnet-a", "b2")
        assert list((await networks.require("cnet-a")).backends) == ["b1"]
        await networks.set_backend("cnet-a", "b3", link="br9")  # a backend the network was not on: a row
        assert (await networks.require("cnet-a")).backends["b3"].link == "br9"
        await networks.add("cnet-b", **values(backends=[]))
        assert [n.name for n in await networks.all()] == ["cnet-a", "cnet-b"]
        await networks.remove("cnet-a")
        assert await networks.get("cnet-a") is None
        with pytest.raises(NotFoundError, match="cnet-a"):
            await networks.set_backend("cnet-a", "b1", state=NetworkState.ACTIVE)
        with pytest.raises(ValueError, match="nothing"):
            await networks.set_backend("cnet-b", "b1", nothing=1)
        await networks.add("cnet-a", **values())  # the name is free again


async def test_users_are_the_stored_instances_not_destroyed_with_a_nic_on_it(db_url: str) -> None:
    async with Store(db_url) as store:
        networks = NetworkStore(store)
        on_it = [{"network": "cnet-a", "ip": "10.0.0.2"}]
        await store.add_instance("b1", "vm1", status=InstanceStatus.STARTED, owned=True, nics=on_it)
        await store.add_instance("b2", "vm2", status=InstanceStatus.BUILD, owned=True, nics=[{}, *on_it])
        await store.add_instance("b1", "vm3", status=InstanceStatus.DESTROYED, owned=True, nics=on_it)
        await store.add_instance(
            "b1", "vm4", status=InstanceStatus.STARTED, owned=True, nics=[{"network": "x"}]
        )
        assert await networks.users("cnet-a") == [("b1", "vm1"), ("b2", "vm2")]
        assert await networks.users("cnet-none") == []
