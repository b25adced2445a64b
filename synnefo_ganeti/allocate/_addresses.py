"""One network across backends: each backend's range of its addresses, and whether a backend
can give a spec's NICs theirs (pure code).

A network on several backends is one IPv4 subnet, but each backend's Ganeti keeps its own
address pool of it, and two pools hand out the same first free address
(``AddressPool.GenerateFree``). So each backend gets its own range: the subnet's host
addresses (all but the network and broadcast addresses) are cut into contiguous blocks,
one per backend in the order of their names (:func:`backend_range`), and every host address
outside a backend's block is reserved externally in that backend's pool
(:func:`reserved_elsewhere`, sent as ``add_reserved_ips`` of ``OP_NETWORK_SET_PARAMS``
before the network is connected to any node group). Ganeti itself then hands out only the
backend's own block, for ``ip="pool"`` and for a fixed address alike (``ReserveIp`` refuses
one reserved), and gives an address back when its instance is removed. Nothing moves when a
request is placed again elsewhere: its address is chosen by the backend that creates it.

Placement reads each backend's networks (``GET /2/networks?bulk=1``) as
:class:`NetworkPool`: :func:`network_refusals` says why a backend never takes a spec's
NICs (a network it lacks or has connected to no node group, a fixed address outside the
subnet), :func:`address_shortage` why it cannot now (its pool has fewer free addresses than
the NICs asking for one, those of the creates in flight there counted; a fixed address
taken).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from synnefo_ganeti.rapi import InstanceSpec, Network

__all__ = [
    "NetworkPool",
    "NicNeed",
    "address_shortage",
    "backend_range",
    "network_refusals",
    "nic_needs",
    "pools_of",
    "reserved_elsewhere",
]


def _hosts(subnet: str) -> tuple[int, int]:
    """The first and last host address of ``subnet`` as integers (network and broadcast out)."""
    net = ipaddress.IPv4Network(subnet)
    return int(net.network_address) + 1, int(net.broadcast_address) - 1


def backend_range(
    subnet: str, backends: Iterable[str], backend: str
) -> tuple[ipaddress.IPv4Address, ipaddress.IPv4Address] | None:
    """The first and last address ``backend``'s pool hands out; None when the network is on that
    backend alone (the whole subnet) or the range is empty (more backends than addresses)."""
    names = sorted(set(backends))
    if backend not in names or len(names) < 2:
        return None
    first, last = _hosts(subnet)
    count, index = last - first + 1, names.index(backend)
    low, high = first + count * index // len(names), first + count * (index + 1) // len(names) - 1
    if high < low:
        return None
    return ipaddress.IPv4Address(low), ipaddress.IPv4Address(high)


def reserved_elsewhere(subnet: str, gateway: str | None, backends: Iterable[str], backend: str) -> list[str]:
    """The host addresses ``backend``'s pool must hold reserved: every one outside its range
    (none when the network is on one backend), the gateway left out (Ganeti reserves it)."""
    names = sorted(set(backends))
    if backend not in names or len(names) < 2:
        return []
    first, last = _hosts(subnet)
    own = backend_range(subnet, names, backend)
    low, high = (int(own[0]), int(own[1])) if own is not None else (last + 1, last)
    skip = int(ipaddress.IPv4Address(gateway)) if gateway else None
    return [
        str(ipaddress.IPv4Address(value))
        for value in range(first, last + 1)
        if not low <= value <= high and value != skip
    ]


@dataclass(frozen=True, slots=True)
class NetworkPool:
    """A network in one backend's Ganeti, as placement needs it: its subnet, whether it is
    connected to a node group, its free address count and ``map`` (``X`` reserved, ``.`` free)."""

    name: str
    subnet: str | None = None
    connected: bool = False
    free: int | None = None
    map: str | None = None

    @classmethod
    def of(cls, net: Network) -> NetworkPool:
        return cls(
            name=net.name,
            subnet=net.network,
            connected=bool(net.group_list),
            free=net.free_count if net.free_count is not None else (net.map or "").count(".") or None,
            map=net.map,
        )

    def is_free(self, address: str) -> bool | None:
        """Whether ``address`` is free in this pool; None: not known (no map, not in the subnet)."""
        if self.subnet is None or self.map is None:
            return None
        try:
            net = ipaddress.IPv4Network(self.subnet)
            offset = int(ipaddress.IPv4Address(address)) - int(net.network_address)
        except ValueError:
            return None
        if not 0 <= offset < len(self.map):
            return None
        return self.map[offset] == "."


def pools_of(networks: Iterable[Network]) -> dict[str, NetworkPool]:
    """Ganeti's networks of one backend, by name."""
    return {net.name: NetworkPool.of(net) for net in networks}


@dataclass(slots=True)
class NicNeed:
    """What a spec asks of one network: ``pool`` NICs taking a free address, the ``fixed``
    addresses, and each NIC's index (for the field named in a refusal)."""

    pool: int = 0
    fixed: list[tuple[int, str]] = field(default_factory=list)
    indexes: list[int] = field(default_factory=list)


def nic_needs(spec: InstanceSpec | None) -> dict[str, NicNeed]:
    """Per network the spec's NICs name: what they ask of it."""
    needs: dict[str, NicNeed] = {}
    for index, nic in enumerate(spec.nics if spec is not None else ()):
        if not isinstance(nic, Mapping) or not nic.get("network"):
            continue
        need = needs.setdefault(str(nic["network"]), NicNeed())
        need.indexes.append(index)
        ip: Any = nic.get("ip")
        if ip is None or str(ip).lower() == "none":
            continue  # no address (Ganeti's _ComputeNics: ip None or "none")
        if str(ip).lower() == "pool":
            need.pool += 1
        else:
            need.fixed.append((index, str(ip)))
    return needs


def network_refusals(pools: Mapping[str, NetworkPool], spec: InstanceSpec) -> list[tuple[str, str]]:
    """``(field, reason)`` for each network of ``spec`` this backend never gives it: one it does
    not have, one connected to no node group, a fixed address outside the subnet."""
    out: list[tuple[str, str]] = []
    for name, need in nic_needs(spec).items():
        where = f"nics[{need.indexes[0]}].network"
        pool = pools.get(name)
        if pool is None:
            out.append((where, f"network {name} not on this backend"))
            continue
        if not pool.connected:
            out.append((where, f"network {name} not connected to a node group"))
            continue
        if pool.subnet is None:
            continue
        subnet = ipaddress.IPv4Network(pool.subnet)
        for index, ip in need.fixed:
            try:
                inside = ipaddress.IPv4Address(ip) in subnet
            except ValueError:
                inside = False
            if not inside:
                out.append((f"nics[{index}].ip", f"address {ip} not in network {name} ({subnet})"))
    return out


def address_shortage(
    pools: Mapping[str, NetworkPool], spec: InstanceSpec, pending: Iterable[InstanceSpec | None] = ()
) -> str | None:
    """Why this backend cannot give ``spec``'s NICs their addresses now (None: it can):
    a pool with fewer free addresses than the NICs asking for one (and those of the creates
    in flight there, ``pending``), or a fixed address its pool holds."""
    needs = nic_needs(spec)
    if not needs:
        return None
    waiting: dict[str, int] = {}
    for other in pending:
        for name, need in nic_needs(other).items():
            if name in needs:
                waiting[name] = waiting.get(name, 0) + need.pool + len(need.fixed)
    for name, need in needs.items():
        pool = pools.get(name)
        if pool is None:
            continue  # a refusal of its own (network_refusals)
        for _, ip in need.fixed:
            if pool.is_free(ip) is False:
                return f"address {ip} of network {name} is taken (or in another backend's range) here"
        if need.pool and pool.free is not None:
            ahead = waiting.get(name, 0)
            if pool.free - ahead < need.pool:
                return (
                    f"network {name} has no free address: {pool.free} free, "
                    f"{ahead} taken by creates in flight, {need.pool} needed"
                )
    return None
