"""One network across backends, the pure parts (issue 28 item 3): each backend's range of the
subnet and what its pool holds reserved, placement by networks and free addresses, and the
``address_conflict`` plan across backends' snapshots. No servers, no database."""

from __future__ import annotations

import ipaddress
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synnefo_ganeti.allocate import (
    Allocator,
    BackendView,
    Catalog,
    NoCapacityError,
    address_shortage,
    backend_range,
    network_refusals,
    reserved_elsewhere,
)
from synnefo_ganeti.allocate._addresses import NetworkPool, nic_needs
from synnefo_ganeti.rapi import InstanceSpec, Network, Node
from synnefo_ganeti.reconcile import NetworkDriftKind
from synnefo_ganeti.reconcile._networks import NetworkSnapshot, plan_conflicts
from synnefo_ganeti.store import InstanceStatus, StoredInstance
from synnefo_ganeti.store.networks._networks import NetworkOnBackend, NetworkState, StoredNetwork
from synnefo_ganeti.testing._model import AddressPool
from tests import helpers


def on(*nics: dict[str, Any], name: str = "vm.example") -> InstanceSpec:
    return helpers.spec(name, nics=list(nics))


# -- ranges ------------------------------------------------------------------------------------


def test_each_backend_gets_a_contiguous_block_by_name() -> None:
    backends = ["sparta", "athens"]  # by name: athens first
    assert backend_range("10.88.0.0/24", backends, "athens") == (
        ipaddress.IPv4Address("10.88.0.1"),
        ipaddress.IPv4Address("10.88.0.127"),
    )
    assert backend_range("10.88.0.0/24", backends, "sparta") == (
        ipaddress.IPv4Address("10.88.0.128"),
        ipaddress.IPv4Address("10.88.0.254"),
    )
    # one backend: its pool is the whole subnet, nothing reserved
    assert backend_range("10.88.0.0/24", ["athens"], "athens") is None
    assert reserved_elsewhere("10.88.0.0/24", "10.88.0.1", ["athens"], "athens") == []
    # the gateway is left to Ganeti (it reserves it itself); the rest of the other block is listed
    sparta = reserved_elsewhere("10.88.0.0/24", "10.88.0.1", backends, "sparta")
    assert sparta == [f"10.88.0.{i}" for i in range(2, 128)]
    # more backends than addresses: a backend without a block has every host reserved
    assert backend_range("10.0.0.0/30", ["a", "b", "c"], "a") is None
    assert reserved_elsewhere("10.0.0.0/30", None, ["a", "b", "c"], "a") == ["10.0.0.1", "10.0.0.2"]


@settings(max_examples=60, deadline=None)
@given(
    prefix=st.integers(min_value=24, max_value=30),
    count=st.integers(min_value=1, max_value=5),
    gateway_at=st.integers(min_value=0, max_value=300),
    takes=st.lists(st.integers(min_value=0, max_value=4), max_size=80),
)
def test_pools_with_their_ranges_never_give_an_address_twice(
    prefix: int, count: int, gateway_at: int, takes: list[int]
) -> None:
    """Ganeti's pools (the fake's ``AddressPool``, as ``network.AddressPool``), one per backend,
    each with the others' ranges reserved as make_on_backend reserves them, hand out addresses
    in any order: never one twice, and each only inside its own backend's range."""
    subnet = f"10.9.0.0/{prefix}"
    net = ipaddress.IPv4Network(subnet)
    hosts = list(net.hosts())
    gateway = str(hosts[gateway_at % len(hosts)])
    names = [f"b{i}" for i in range(count)]
    pools: dict[str, AddressPool] = {}
    for name in names:
        pool = AddressPool(subnet)
        for address in (str(net.network_address), str(net.broadcast_address), gateway):
            pool.reserve(address, external=True)
        for address in reserved_elsewhere(subnet, gateway, names, name):
            pool.reserve(address, external=True)
        pools[name] = pool
    given_out: list[tuple[str, str]] = []
    for index in takes:
        name = names[index % count]
        if pools[name].free_count == 0:
            continue
        address = pools[name].generate_free()
        pools[name].reserve(address)
        given_out.append((name, address))
    assert len({a for _, a in given_out}) == len(given_out), given_out
    for name, address in given_out:
        own = backend_range(subnet, names, name)
        if own is not None:
            assert own[0] <= ipaddress.IPv4Address(address) <= own[1]
    # every host but the gateway is free in exactly one pool
    free = [sum(not pools[n].is_reserved(str(h)) for n in names) for h in hosts if str(h) != gateway]
    used = {a for _, a in given_out}
    assert all(
        f == (0 if str(h) in used else 1)
        for f, h in zip(free, [h for h in hosts if str(h) != gateway], strict=True)
    )


# -- what a spec asks, what a backend refuses ----------------------------------------------------


def pool(
    name: str, subnet: str = "10.7.0.0/29", *, free: str = "XX.....X", connected: bool = True
) -> NetworkPool:
    return NetworkPool(name, subnet, connected, free.count("."), free)


def test_nic_needs_follow_ganeti() -> None:
    needs = nic_needs(
        on(
            {"network": "blue", "ip": "pool"},
            {"network": "blue", "ip": "10.7.0.5"},
            {"network": "blue"},  # no ip: Ganeti gives this NIC no address (_ComputeNics)
            {"network": "red", "ip": "none"},
            {"mode": "bridged"},
        )
    )
    assert sorted(needs) == ["blue", "red"]
    assert (needs["blue"].pool, needs["blue"].fixed, needs["blue"].indexes) == (
        1,
        [(1, "10.7.0.5")],
        [0, 1, 2],
    )
    assert (needs["red"].pool, needs["red"].fixed) == (0, [])


def test_refusals_name_the_nic_field() -> None:
    pools = {"blue": pool("blue"), "dark": pool("dark", connected=False)}
    assert network_refusals(pools, on({"network": "blue", "ip": "pool"})) == []
    assert network_refusals(pools, on({"mode": "bridged"}, {"network": "solo", "ip": "pool"})) == [
        ("nics[1].network", "network solo not on this backend")
    ]
    assert network_refusals(pools, on({"network": "dark", "ip": "pool"})) == [
        ("nics[0].network", "network dark not connected to a node group")
    ]
    assert network_refusals(pools, on({"network": "blue", "ip": "10.8.0.5"})) == [
        ("nics[0].ip", "address 10.8.0.5 not in network blue (10.7.0.0/29)")
    ]


def test_shortage_counts_the_creates_in_flight_and_fixed_addresses() -> None:
    pools = {"blue": pool("blue", free="XX..XXXX")}  # .2 and .3 free
    wants = on({"network": "blue", "ip": "pool"})
    assert address_shortage(pools, wants) is None
    assert address_shortage(pools, wants, [wants, None]) is None
    short = address_shortage(pools, wants, [wants, wants])
    assert short == "network blue has no free address: 2 free, 2 taken by creates in flight, 1 needed"
    assert address_shortage(pools, on({"network": "blue", "ip": "10.7.0.3"})) is None
    taken = address_shortage(pools, on({"network": "blue", "ip": "10.7.0.4"}))
    assert taken is not None and "address 10.7.0.4 of network blue is taken" in taken
    assert address_shortage(pools, on({"mode": "bridged"})) is None


# -- placement -----------------------------------------------------------------------------------


def network(name: str, subnet: str, free_map: str, *, groups: bool = True, external: str = "") -> Network:
    """Ganeti's network; ``external``: the last octets reserved externally (``"0,1,7"``)."""
    base = subnet.rsplit(".", 1)[0]
    return Network(
        name=name,
        network=subnet,
        free_count=free_map.count("."),
        map=free_map,
        group_list=[["default", "bridged", "br0", ""]] if groups else [],
        external_reservations=", ".join(f"{base}.{i}" for i in external.split(",") if i),
    )


def view(name: str, *networks: Network) -> BackendView:
    nodes = [Node(name=f"{name}-n1", mfree=64 * 1024, mtotal=64 * 1024, dfree=10**6, dtotal=10**6, ctotal=8)]
    catalog = Catalog.of(name, None, nodes, None, list(networks))
    return BackendView(name=name, nodes=nodes, stats_at=0.0, catalog=catalog)


def test_placement_goes_where_the_network_is_and_has_room() -> None:
    alloc = Allocator()
    alloc.update(view("athens", network("wide", "10.88.0.0/29", "XX.XXXXX")))  # 1 free
    alloc.update(
        view(
            "sparta", network("wide", "10.88.0.0/29", "XXXX...X"), network("solo", "10.9.0.0/29", "X......X")
        )
    )
    solo = on({"network": "solo", "ip": "pool"})
    assert [alloc.place(solo).name for _ in range(4)] == ["sparta"] * 4
    assert alloc.rejected(solo) == {"athens": "network solo not on this backend"}

    alloc = Allocator()
    alloc.update(view("athens", network("wide", "10.88.0.0/29", "XX.XXXXX")))  # 1 free
    alloc.update(view("sparta", network("wide", "10.88.0.0/29", "XXXX..XX")))  # 2 free
    wide = on({"network": "wide", "ip": "pool"})
    placed = sorted(alloc.place(wide).name for _ in range(3))
    assert placed == ["athens", "sparta", "sparta"]  # each pool as far as it goes, none beyond
    with pytest.raises(NoCapacityError) as caught:
        alloc.place(wide)
    assert "no free address" in str(caught.value)
    # a fixed address goes where its pool holds it free (the other ranges are reserved there)
    alloc = Allocator()
    alloc.update(view("athens", network("wide", "10.88.0.0/29", "XX..XXXX")))
    alloc.update(view("sparta", network("wide", "10.88.0.0/29", "XXXX..XX")))
    assert alloc.place(on({"network": "wide", "ip": "10.88.0.5"})).name == "sparta"
    assert alloc.place(on({"network": "wide", "ip": "10.88.0.2"})).name == "athens"


def test_a_catalog_without_networks_checks_nothing() -> None:
    nodes = [Node(name="n1", mfree=4096, mtotal=4096, dfree=10**6, dtotal=10**6, ctotal=8)]
    alloc = Allocator()
    alloc.update(
        BackendView(name="old", nodes=nodes, stats_at=0.0, catalog=Catalog.of("old", None, nodes, None))
    )
    assert alloc.place(on({"network": "any", "ip": "pool"})).name == "old"


# -- address_conflict ----------------------------------------------------------------------------


NOW = datetime(2026, 1, 1, tzinfo=UTC)


def stored(name: str, subnet: str, backends: list[str]) -> StoredNetwork:
    return StoredNetwork(
        id="n-1", name=name, subnet=subnet, gateway=None, mac_prefix=None, mode="bridged", link=None,
        groups=None, tags=[], status=NetworkState.ACTIVE, created_at=NOW, updated_at=NOW,
        backends={b: NetworkOnBackend(b, NetworkState.ACTIVE, ["default"], None, "br0", 1, None, NOW)
                  for b in backends},
    )  # fmt: skip


def instance(name: str, backend: str, nics: list[dict[str, Any]]) -> StoredInstance:
    return StoredInstance(
        id="id-" + name, backend=backend, name=name, status=InstanceStatus.STARTED, owned=True, os="noop",
        disk_template="diskless", beparams=None, nics=nics, disks=None, tags=None, create_job_id=1,
        state_time=None, created_at=NOW, updated_at=NOW,
    )  # fmt: skip


def snapshot(
    backend: str, networks: list[StoredNetwork], instances: list[StoredInstance], ganeti: list[Network]
) -> NetworkSnapshot:
    return NetworkSnapshot(backend, {n.name: n for n in networks}, instances, {n.name: n for n in ganeti})


def test_an_address_of_two_instances_on_two_backends_is_a_conflict_on_each() -> None:
    wide = stored("wide", "10.88.0.0/29", ["athens", "sparta"])
    athens = snapshot(
        "athens", [wide],
        [instance("a1", "athens", [{"network": "wide", "ip": "10.88.0.2"}]),
         instance("a2", "athens", [{"network": "lan", "ip": "10.88.0.3"}])],
        [network("wide", "10.88.0.0/29", "XXX....X", external="0,1,7")],
    )  # fmt: skip
    sparta = snapshot(
        "sparta", [wide],
        [instance("s1", "sparta", [{"network": "wide", "ip": "10.88.0.2"}]),
         instance("s2", "sparta", [{"network": "lan", "ip": "10.88.0.3"}]),   # not a stored network
         instance("s3", "sparta", [{"network": "wide", "ip": "pool"}])],      # no address yet
        [network("wide", "10.88.0.0/29", "XXX....X", external="0,1,7")],
    )  # fmt: skip
    drifts = plan_conflicts([athens, sparta])
    assert [(d.kind, d.backend, d.network, d.address) for d in drifts] == [
        (NetworkDriftKind.ADDRESS_CONFLICT, "athens", "wide", "10.88.0.2"),
        (NetworkDriftKind.ADDRESS_CONFLICT, "sparta", "wide", "10.88.0.2"),
    ]
    assert drifts[0].detail.startswith(
        "address 10.88.0.2 of network wide is held by 2 instances: a1 (athens), s1 (sparta)"
    )
    assert "the pools of athens, sparta hold it" in drifts[0].detail
    assert NetworkDriftKind.ADDRESS_CONFLICT.value == "address_conflict"


def test_disjoint_ranges_are_no_conflict() -> None:
    wide = stored("wide", "10.88.0.0/29", ["athens", "sparta"])
    athens = snapshot("athens", [wide], [instance("a1", "athens", [{"network": "wide", "ip": "10.88.0.2"}])],
                      [network("wide", "10.88.0.0/29", "XXX....X", external="0,1,5,6,7")])  # fmt: skip
    sparta = snapshot("sparta", [wide], [instance("s1", "sparta", [{"network": "wide", "ip": "10.88.0.4"}])],
                      [network("wide", "10.88.0.0/29", "XXXXX..X", external="0,1,2,3,7")])  # fmt: skip
    assert plan_conflicts([athens, sparta]) == []
