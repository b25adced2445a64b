"""The fake cluster's groups, networks (with their address pools), cluster tags, filters, exports, its
Ganeti version and what its resolver knows.

Networks follow Ganeti's ``network.AddressPool``: one bit per address for instance
reservations and one for external ones; a new network reserves its network address,
broadcast address and gateway externally (``InitializeNetwork``), instance NICs with
``ip=pool`` take the first free address (``GenerateFree``), and reserving a reserved
address or releasing a free one fails with Ganeti's messages.
"""

from __future__ import annotations

import ipaddress
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from synnefo_ganeti.testing._cluster import OpFailure
from synnefo_ganeti.testing._versions import DEFAULT_VERSION, VERSIONS, VersionProfile

__all__ = ["AddressPool", "ClusterModel", "FakeFilter", "FakeGroup", "FakeNetwork"]

# constants.IPV4_NETWORK_MIN_SIZE / MAX_SIZE: /30 to /16
_MIN_ADDRESSES, _MAX_ADDRESSES = 4, 65536


def _now() -> float:
    return time.time()


@dataclass
class FakeGroup:
    """A node group: ``objects.NodeGroup`` as ``GET /2/groups/NAME`` shows it."""

    name: str
    uuid: str = field(default_factory=lambda: str(uuid.uuid4()))
    alloc_policy: str = "preferred"
    tags: list[str] = field(default_factory=list)
    ndparams: dict[str, Any] = field(default_factory=dict)
    ipolicy: dict[str, Any] = field(default_factory=dict)
    diskparams: dict[str, Any] = field(default_factory=dict)
    networks: dict[str, list[str]] = field(default_factory=dict)  # network name -> [mode, link, vlan]
    ctime: float | int = field(default_factory=_now)
    mtime: float = field(default_factory=_now)
    serial_no: int = 1

    def touch(self) -> None:
        self.mtime = time.time()
        self.serial_no += 1


class AddressPool:
    """``network.AddressPool``: instance and external reservations of a network's addresses."""

    def __init__(self, cidr: str) -> None:
        try:
            self.network = ipaddress.IPv4Network(cidr)
        except ValueError as exc:
            raise OpFailure("OpPrereqError", f"Invalid network: {exc}", "wrong_input") from None
        size = self.network.num_addresses
        if size > _MAX_ADDRESSES:
            raise OpFailure(
                "OpPrereqError",
                f"A big network with {size} host(s) is currently not supported. please specify at most a /16 network",
                "wrong_input",
            )
        if size < _MIN_ADDRESSES:
            raise OpFailure(
                "OpPrereqError",
                f"A network with only {size} host(s) is too small, please specify at least a /30 network",
                "wrong_input",
            )
        self.reservations = [False] * size
        self.ext_reservations = [False] * size

    def index(self, address: str) -> int:
        try:
            addr = ipaddress.IPv4Address(address)
        except ValueError:
            raise OpFailure("OpPrereqError", f"Invalid IP address {address}", "wrong_input") from None
        if addr not in self.network:
            raise OpFailure("OpPrereqError", f"{self.network} does not contain {addr}", "wrong_input")
        return int(addr) - int(self.network.network_address)

    def reserve(self, address: str, *, external: bool = False) -> None:
        idx = self.index(address)
        bits = self.ext_reservations if external else self.reservations
        if bits[idx]:
            what = "already externally reserved" if external else "already used by an instance"
            raise OpFailure("OpPrereqError", f"IP {address} is {what}", "wrong_input")
        bits[idx] = True

    def release(self, address: str, *, external: bool = False) -> None:
        idx = self.index(address)
        bits = self.ext_reservations if external else self.reservations
        if not bits[idx]:
            what = "not externally reserved" if external else "not used by an instance"
            raise OpFailure("OpPrereqError", f"IP {address} is {what}", "wrong_input")
        bits[idx] = False

    def is_reserved(self, address: str) -> bool:
        idx = self.index(address)
        return self.reservations[idx] or self.ext_reservations[idx]

    def generate_free(self) -> str:
        for idx, (mine, ext) in enumerate(zip(self.reservations, self.ext_reservations, strict=True)):
            if not (mine or ext):
                return str(self.network[idx])
        raise OpFailure("OpPrereqError", f"{self.network} is full", "wrong_state")

    @property
    def reserved_count(self) -> int:
        return sum(1 for a, b in zip(self.reservations, self.ext_reservations, strict=True) if a or b)

    @property
    def free_count(self) -> int:
        return len(self.reservations) - self.reserved_count

    @property
    def map(self) -> str:
        return "".join(
            "X" if a or b else "." for a, b in zip(self.reservations, self.ext_reservations, strict=True)
        )

    def external(self) -> list[str]:
        return [str(self.network[i]) for i, bit in enumerate(self.ext_reservations) if bit]


@dataclass
class FakeNetwork:
    """A network (``objects.Network``) and its address pool."""

    name: str
    pool: AddressPool
    gateway: str | None = None
    network6: str | None = None
    gateway6: str | None = None
    mac_prefix: str | None = None
    tags: list[str] = field(default_factory=list)
    uuid: str = field(default_factory=lambda: str(uuid.uuid4()))
    ctime: float = field(default_factory=_now)
    mtime: float = field(default_factory=_now)
    serial_no: int = 1

    @property
    def network(self) -> str:
        return str(self.pool.network)

    def touch(self) -> None:
        self.mtime = time.time()
        self.serial_no += 1


@dataclass
class FakeFilter:
    """A job filter rule (``objects.FilterRule``)."""

    uuid: str
    priority: int
    predicates: list[Any]
    action: Any
    reason_trail: list[Any]
    watermark: int

    def __post_init__(self) -> None:
        # luxid parses each predicate's query filter (``Ganeti.Query.Language``) and stores it
        # serialised again: ``=`` comes back as ``==`` (measured on Ganeti 3.0)
        self.predicates = [
            [p[0], _equality(p[1])] if isinstance(p, list) and len(p) == 2 else p for p in self.predicates
        ]


def _equality(qfilter: Any) -> Any:
    """A query filter with every ``=`` as ``==``, inside ``&``, ``|`` and ``!`` too."""
    if not isinstance(qfilter, list) or not qfilter:
        return qfilter
    head = "==" if qfilter[0] == "=" else qfilter[0]
    if head in ("&", "|", "!"):
        return [head, *(_equality(item) for item in qfilter[1:])]
    return [head, *qfilter[1:]]


@dataclass
class ClusterModel:
    """What the fake cluster keeps besides nodes, instances and jobs."""

    groups: dict[str, FakeGroup]
    node_group: dict[str, str] = field(default_factory=dict)  # node name -> group name
    networks: dict[str, FakeNetwork] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)  # the cluster's
    filters: dict[str, FakeFilter] = field(default_factory=dict)
    exports: dict[str, str] = field(default_factory=dict)  # instance name -> node holding its export
    cluster_params: dict[str, Any] = field(default_factory=dict)  # set by OP_CLUSTER_SET_PARAMS
    #: which Ganeti the cluster is (:mod:`._versions`; ``FakeGaneti(version=...)``)
    version: VersionProfile = field(default_factory=lambda: VERSIONS[DEFAULT_VERSION])
    #: what the cluster's resolver knows, name -> IPv4 address (:mod:`._names`: a create's ``name_check``)
    hosts: dict[str, str] = field(default_factory=dict)

    @classmethod
    def default(cls, group_uuid: str, nodes: list[str]) -> ClusterModel:
        """One group, ``default``, holding every node (``gnt-cluster init``; its ctime is 0 there)."""
        group = FakeGroup(name="default", uuid=group_uuid, ctime=0)
        return cls(groups={"default": group}, node_group=dict.fromkeys(nodes, "default"))

    def group_of(self, node: str) -> FakeGroup:
        return self.groups[self.node_group.get(node, "default")]

    def group(self, name: str) -> FakeGroup:
        group = self.groups.get(name)
        if group is None:
            raise OpFailure("OpPrereqError", f"Group '{name}' not found", "unknown_entity")
        return group

    def network(self, name: str) -> FakeNetwork:
        net = self.networks.get(name)
        if net is None:
            raise OpFailure("OpPrereqError", f"Network '{name}' not found", "unknown_entity")
        return net
