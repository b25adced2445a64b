"""Network drifts (reconcile/_networks.py): the pure plan on hand-made snapshots, then each fix on
a fake Ganeti with a real store (both databases)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from synnefo_ganeti.rapi import Network, RapiClient
from synnefo_ganeti.reconcile._networks import (
    NetworkDriftKind,
    NetworkSnapshot,
    check_networks,
    plan_networks,
)
from synnefo_ganeti.store import InstanceStatus, Store, StoredInstance
from synnefo_ganeti.store.networks._networks import (
    NetworkOnBackend,
    NetworkState,
    NetworkStore,
    StoredNetwork,
)
from synnefo_ganeti.testing import FakeGaneti
from tests import helpers

K = NetworkDriftKind
OWNED = "synnefo-ganeti:owned"
NOW = datetime.now(UTC)


def owns(_name: str, tags: list[str]) -> bool:
    return OWNED in tags


def stored(
    name: str = "cnet-a",
    *,
    state: NetworkState = NetworkState.ACTIVE,
    groups: list[str] | None = None,
    age: float = 3600.0,
    status: NetworkState | None = None,
    **kwargs: Any,
) -> StoredNetwork:
    on = NetworkOnBackend(
        backend="b1", state=state, groups=groups if groups is not None else ["default"],
        want_groups=groups if groups is not None else ["default"], link="br0", job_id=7, error=None,
        updated_at=NOW - timedelta(seconds=age),
    )  # fmt: skip
    values: dict[str, Any] = {"subnet": "10.0.0.0/29", "gateway": "10.0.0.1", "mac_prefix": None} | kwargs
    return StoredNetwork(
        id="id-" + name, name=name, mode="bridged", link=None, groups=None, tags=[OWNED],
        status=status or state, created_at=NOW, updated_at=NOW, backends={"b1": on}, **values,
    )  # fmt: skip


def ganeti(name: str = "cnet-a", *, map: str = "XX.....X", external: str = "10.0.0.0, 10.0.0.1, 10.0.0.7",
           groups: list[str] | None = None, instances: list[str] | None = None, **kwargs: Any) -> Network:  # fmt: skip
    values = {"network": "10.0.0.0/29", "gateway": "10.0.0.1", "mac_prefix": None} | kwargs
    return Network(
        name=name, map=map, external_reservations=external, tags=[OWNED], inst_list=instances or [],
        group_list=[[g, "bridged", "br0", ""] for g in (groups if groups is not None else ["default"])], **values,
    )  # fmt: skip


def vm(name: str, *nics: dict[str, Any]) -> StoredInstance:
    return StoredInstance(
        id="id-" + name, backend="b1", name=name, status=InstanceStatus.STARTED, owned=True, os="noop",
        disk_template="diskless", beparams=None, nics=list(nics), disks=None, tags=None, create_job_id=1,
        state_time=None, created_at=NOW, updated_at=NOW,
    )  # fmt: skip


def snap(
    stored_: list[StoredNetwork], ganeti_: list[Network], instances: Sequence[StoredInstance] = ()
) -> NetworkSnapshot:
    nets = {n.name: n for n in ganeti_}
    owned = frozenset(n.name for n in ganeti_ if owns(n.name, n.tags))
    # taken "now" as the rows' ages count it (NOW), not when the test runs
    return NetworkSnapshot("b1", {s.name: s for s in stored_}, list(instances), nets, owned, NOW.timestamp())


def kinds(drifts: list[Any]) -> list[tuple[str, str]]:
    return [(d.kind.value, d.network) for d in drifts]


def test_in_sync_is_no_drift() -> None:
    a = vm("vm1", {"network": "cnet-a", "ip": "10.0.0.2"})
    assert plan_networks(snap([stored()], [ganeti(map="XXX....X")], [a])) == []


def test_stale_orphan_and_pending() -> None:
    drifts = plan_networks(
        snap(
            [stored("cnet-a"), stored("cnet-p", state=NetworkState.PENDING), stored("cnet-new", state=NetworkState.PENDING, age=1)],
            [ganeti("cnet-o"), ganeti("cnet-p"), Network(name="not-ours", network="10.9.0.0/24")],
        )
    )  # fmt: skip
    assert kinds(drifts) == [
        ("network_orphan", "cnet-o"),
        ("network_stale", "cnet-a"),
        ("network_pending", "cnet-p"),
    ]
    assert drifts[2].values == {"do": "create"}


def test_a_delete_not_finished_is_pending_delete() -> None:
    drifts = plan_networks(snap([stored(state=NetworkState.ERROR, status=NetworkState.DELETING)], [ganeti()]))
    assert kinds(drifts) == [("network_pending", "cnet-a")] and drifts[0].values == {"do": "delete"}


def test_out_of_sync_and_not_connected() -> None:
    drifts = plan_networks(
        snap(
            [stored(groups=["default", "g2"], mac_prefix="aa:00:01")],
            [ganeti(gateway="10.0.0.6", map="X.....XX", external="10.0.0.0, 10.0.0.6, 10.0.0.7")],
        )
    )
    assert kinds(drifts) == [("network_out_of_sync", "cnet-a"), ("network_not_connected", "cnet-a")]
    assert drifts[0].values == {"gateway": "10.0.0.1", "mac_prefix": "aa:00:01"}
    assert "gateway" in drifts[0].detail and "MAC prefix" in drifts[0].detail
    assert drifts[1].groups == ["g2"]
    other_subnet = plan_networks(snap([stored()], [ganeti(network="10.0.1.0/29")]))
    assert kinds(other_subnet) == [("network_out_of_sync", "cnet-a")] and other_subnet[0].values == {}


def test_address_drift_both_ways() -> None:
    # .2 reserved for an instance in Ganeti, no stored instance has it; vm1's .3 is free in Ganeti
    a = vm("vm1", {"network": "cnet-a", "ip": "10.0.0.3"}, {"network": None, "ip": None})
    drifts = plan_networks(snap([stored()], [ganeti(map="XXX....X", instances=["lost"])], [a]))
    assert [(d.kind.value, d.address) for d in drifts] == [("address_unused", "10.0.0.2"), ("address_unreserved", "10.0.0.3")]  # fmt: skip
    assert "lost" in drifts[0].detail and "vm1" in drifts[1].detail


def test_address_drift_waits_for_a_pool_address_not_known_yet() -> None:
    building = vm("vm1", {"network": "cnet-a", "ip": "pool"})
    assert plan_networks(snap([stored()], [ganeti(map="XXX....X")], [building])) == []


# -- the fixes, on a fake ----------------------------------------------------------------------------

QUICK = {name: 0.01 for name in ("OP_NETWORK_ADD", "OP_NETWORK_CONNECT", "OP_NETWORK_DISCONNECT",
                                 "OP_NETWORK_REMOVE", "OP_NETWORK_SET_PARAMS", "OP_INSTANCE_CREATE")}  # fmt: skip


@asynccontextmanager
async def world(db_url: str) -> AsyncIterator[tuple[FakeGaneti, RapiClient, Store]]:
    async with (
        FakeGaneti(tls=False, op_times=QUICK) as fake,
        helpers.fake_client(fake) as client,
        Store(db_url) as store,
    ):
        yield fake, client, store


async def _stored_network(store: Store, name: str, **kwargs: Any) -> StoredNetwork:
    values: dict[str, Any] = {"subnet": "10.0.0.0/29", "gateway": "10.0.0.1", "mac_prefix": None, "mode": "bridged",
                              "link": None, "groups": None, "tags": [OWNED], "backends": ["b1"]} | kwargs  # fmt: skip
    return await NetworkStore(store).add(name, **values)


async def test_each_fix_on_a_fake(db_url: str) -> None:
    async with world(db_url) as (fake, client, store):
        networks = NetworkStore(store)
        await _stored_network(store, "cnet-stale")
        await networks.set_backend("cnet-stale", "b1", state=NetworkState.ACTIVE, groups=["default"],
                                   want_groups=["default"])  # fmt: skip
        await _stored_network(store, "cnet-pending")  # a create cut short: pending, nothing in Ganeti
        await client.wait_for_job(await client.create_network("cnet-orphan", "10.1.0.0/29", tags=[OWNED]))
        await client.wait_for_job(await client.connect_network("cnet-orphan", "default", "bridged", "br0"))
        drifts = await check_networks(store, client, "b1", owns=owns, grace=0)
        assert kinds(drifts) == [("network_orphan", "cnet-orphan"), ("network_pending", "cnet-pending"),
                                 ("network_stale", "cnet-stale")]  # fmt: skip
        assert (
            not any(d.fixed for d in drifts) and "cnet-stale" not in fake.cluster.model.networks
        )  # report only

        fixed = await check_networks(
            store, client, "b1", owns=owns, grace=0, fixes=list(K), delete_orphans=True
        )
        assert [(d.network, d.fixed, d.error) for d in fixed] == [
            ("cnet-orphan", True, None), ("cnet-pending", True, None), ("cnet-stale", True, None)
        ]  # fmt: skip
        assert sorted(fake.cluster.model.networks) == ["cnet-pending", "cnet-stale"]
        for name in ("cnet-pending", "cnet-stale"):
            network = await networks.require(name)
            assert network.status is NetworkState.ACTIVE and network.backends["b1"].groups == ["default"]
        assert await check_networks(store, client, "b1", owns=owns, grace=0) == []

        # out of sync, not connected, an address reserved in Ganeti's pool for nobody we know
        job = await client.create_instance(helpers.spec("theirs", pnode="node1.fake.test",
                                                        nics=[{"network": "cnet-stale", "ip": "pool"}]))  # fmt: skip
        await client.wait_for_job(job)
        await client.wait_for_job(await client.modify_network("cnet-stale", gateway="10.0.0.6"))
        await client.wait_for_job(await client.disconnect_network("cnet-pending", "default"))
        drifts = await check_networks(store, client, "b1", owns=owns, grace=0, fixes=list(K))
        assert [(d.kind.value, d.network, d.fixed) for d in drifts] == [
            ("network_not_connected", "cnet-pending", True),
            ("network_out_of_sync", "cnet-stale", True),
            ("address_unused", "cnet-stale", False),  # no fix through RAPI: the instance holds it
        ]  # fmt: skip
        assert fake.cluster.model.networks["cnet-stale"].gateway == "10.0.0.1"
        assert "cnet-pending" in fake.cluster.model.groups["default"].networks


async def test_an_address_a_stored_instance_has_is_reserved_in_ganeti_by_the_fix(db_url: str) -> None:
    async with world(db_url) as (fake, client, store):
        await _stored_network(store, "cnet-a")
        await NetworkStore(store).set_backend("cnet-a", "b1", state=NetworkState.ACTIVE, groups=["default"],
                                              want_groups=["default"])  # fmt: skip
        await client.wait_for_job(await client.create_network("cnet-a", "10.0.0.0/29", gateway="10.0.0.1"))
        await client.wait_for_job(await client.connect_network("cnet-a", "default", "bridged", "br0"))
        await store.add_instance("b1", "vm1", status=InstanceStatus.STARTED, owned=True,
                                 nics=[{"network": "cnet-a", "ip": "10.0.0.5"}])  # fmt: skip
        drifts = await check_networks(store, client, "b1", owns=owns, grace=0, fixes=[K.ADDRESS_UNRESERVED])
        assert [(d.kind.value, d.address, d.fixed) for d in drifts] == [
            ("address_unreserved", "10.0.0.5", True)
        ]
        assert "10.0.0.5" in fake.cluster.model.networks["cnet-a"].pool.external()
        assert await check_networks(store, client, "b1", owns=owns, grace=0) == []


@pytest.mark.parametrize("kind", [K.ADDRESS_UNUSED, K.ORPHAN])
async def test_kinds_without_a_plain_fix_are_never_acted_on(db_url: str, kind: K) -> None:
    async with world(db_url) as (fake, client, store):
        await client.wait_for_job(await client.create_network("cnet-orphan", "10.1.0.0/29", tags=[OWNED]))
        drifts = await check_networks(store, client, "b1", owns=owns, fixes=[kind])
        assert kinds(drifts) == [("network_orphan", "cnet-orphan")] and not drifts[0].fixed
        assert "cnet-orphan" in fake.cluster.model.networks
