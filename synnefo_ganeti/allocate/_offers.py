"""What a backend offers a cloud, as one typed model: :class:`BackendCatalog` (pure code).

``await cp.catalog(backend)`` builds it from five RAPI answers read together with the node
stats: ``GET /2/info`` (the enabled disk templates, the instance policy), ``GET /2/os``
(the OSes; Ganeti lists an OS with variants only as ``os+variant``, see
``cli.CalculateOSNames``, so the variants are grouped back under their OS),
``GET /2/networks?bulk=1``, ``GET /2/groups?bulk=1`` and ``GET /2/nodes?bulk=1``. A cloud
API shows it as its flavors' and images' source of truth; the placement checks use the
narrower :class:`~synnefo_ganeti.allocate.Catalog` built from the same answers.

The model holds Ganeti's words where a cloud needs no other (policy keys such as
``memory-size``, a network's ``mode`` and ``link`` per group) and is frozen: a new
answer is a new catalog. :meth:`BackendCatalog.to_json` is what ``synnefo-ganeti backends
show --json`` prints.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from synnefo_ganeti._serial import to_jsonable
from synnefo_ganeti.rapi import ClusterInfo, Group, Network, Node

__all__ = [
    "BackendCatalog",
    "GroupOffer",
    "InstancePolicy",
    "NetworkLink",
    "NetworkOffer",
    "NodeStats",
    "OsOffer",
]


@dataclass(frozen=True, slots=True)
class OsOffer:
    """One OS; ``variants`` empty: give ``name`` alone, else ``name+variant`` (Ganeti's form)."""

    name: str
    variants: tuple[str, ...] = ()

    @property
    def choices(self) -> tuple[str, ...]:
        """What a spec's ``os`` may be for this OS."""
        return tuple(f"{self.name}+{v}" for v in self.variants) if self.variants else (self.name,)


@dataclass(frozen=True, slots=True)
class NetworkLink:
    """A network's connection to a node group: its NICs there get ``mode`` and ``link``."""

    group: str
    mode: str | None = None
    link: str | None = None
    vlan: str | None = None


@dataclass(frozen=True, slots=True)
class NetworkOffer:
    """A Ganeti network: its subnet, the addresses its pool has free, the groups it reaches."""

    name: str
    subnet: str | None = None
    gateway: str | None = None
    subnet6: str | None = None
    gateway6: str | None = None
    mac_prefix: str | None = None
    free_count: int | None = None
    reserved_count: int | None = None
    groups: tuple[NetworkLink, ...] = ()


@dataclass(frozen=True, slots=True)
class GroupOffer:
    """A node group: its nodes and allocation policy, and the networks connected to it."""

    name: str
    uuid: str | None = None
    alloc_policy: str | None = None
    nodes: tuple[str, ...] = ()
    networks: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeStats:
    """One node's capacity as Ganeti reports it (MiB; ``None``: not reported, as for an offline node)."""

    name: str
    group: str | None = None
    offline: bool = False
    drained: bool = False
    vm_capable: bool = True
    memory_total: int | None = None
    memory_free: int | None = None
    disk_total: int | None = None
    disk_free: int | None = None
    cpus: int | None = None
    instances: int | None = None

    @property
    def usable(self) -> bool:
        """Whether new instances may go there (online, not drained, VM-capable)."""
        return not self.offline and not self.drained and self.vm_capable


@dataclass(frozen=True, slots=True)
class InstancePolicy:
    """The cluster's instance policy (``ipolicy`` of ``/2/info``): what sizes an instance may have.

    ``minmax`` holds Ganeti's pairs (``{"min": {...}, "max": {...}}``, keys ``memory-size``,
    ``cpu-count``, ``disk-size``, ``disk-count``, ``nic-count``, ``spindle-use``); a spec must fit
    one pair. ``std`` is the standard size; ``disk_templates`` the templates it allows.
    """

    minmax: tuple[dict[str, dict[str, int]], ...] = ()
    std: dict[str, int] | None = None
    disk_templates: tuple[str, ...] = ()
    vcpu_ratio: float | None = None
    spindle_ratio: float | None = None

    @classmethod
    def of(cls, ipolicy: Mapping[str, Any]) -> InstancePolicy:
        pairs = tuple(
            {"min": dict(pair.get("min") or {}), "max": dict(pair.get("max") or {})}
            for pair in ipolicy.get("minmax") or ()
            if isinstance(pair, Mapping)
        )
        std = ipolicy.get("std")
        templates = ipolicy.get("disk-templates")
        return cls(
            minmax=pairs,
            std=dict(std) if isinstance(std, Mapping) else None,
            disk_templates=tuple(str(t) for t in templates) if isinstance(templates, list) else (),
            vcpu_ratio=_number(ipolicy.get("vcpu-ratio")),
            spindle_ratio=_number(ipolicy.get("spindle-ratio")),
        )


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass(frozen=True, slots=True)
class BackendCatalog:
    """What one backend offers: OSes with variants, disk templates, networks, the instance
    policy, node groups, and each node's stats, as read at ``read_at``.

    ``oses`` is None when the backend's RAPI serves no ``/2/os`` (any OS may be asked for).
    ``disk_templates`` are those both enabled and allowed by the policy.
    """

    backend: str
    cluster: str
    read_at: datetime
    oses: tuple[OsOffer, ...] | None
    disk_templates: tuple[str, ...]
    policy: InstancePolicy
    groups: tuple[GroupOffer, ...]
    networks: tuple[NetworkOffer, ...]
    nodes: tuple[NodeStats, ...]
    #: the cluster's Ganeti (``/2/info`` ``software_version``: "3.0.2", "3.1.0~rc2"), None if not told
    ganeti_version: str | None = None

    @property
    def memory_free(self) -> int:
        """MiB free on the usable nodes, in all."""
        return sum(node.memory_free or 0 for node in self.nodes if node.usable)

    @property
    def disk_free(self) -> int:
        """MiB of disk free on the usable nodes, in all."""
        return sum(node.disk_free or 0 for node in self.nodes if node.usable)

    def os_choices(self) -> tuple[str, ...] | None:
        """Every value a spec's ``os`` may take here (None: not known, any)."""
        if self.oses is None:
            return None
        return tuple(choice for offer in self.oses for choice in offer.choices)

    def to_json(self) -> dict[str, Any]:
        result: dict[str, Any] = to_jsonable(self)
        result["memory_free"], result["disk_free"] = self.memory_free, self.disk_free
        return result

    @classmethod
    def of(
        cls,
        backend: str,
        *,
        info: ClusterInfo,
        nodes: Sequence[Node],
        oses: Iterable[str] | None,
        networks: Sequence[Network],
        groups: Sequence[Group],
        read_at: datetime,
    ) -> BackendCatalog:
        """The catalog of the answers of one backend."""
        policy = InstancePolicy.of(info.ipolicy)
        enabled = list(dict.fromkeys(info.enabled_disk_templates))
        allowed = set(policy.disk_templates) if policy.disk_templates else None
        group_names = {group.uuid: group.name for group in groups if group.uuid}
        links = {
            net.name: tuple(_link(item) for item in net.group_list if _link(item).group) for net in networks
        }
        return cls(
            backend=backend,
            cluster=info.name,
            ganeti_version=info.software_version,
            read_at=read_at,
            oses=None if oses is None else os_offers(oses),
            disk_templates=tuple(t for t in enabled if allowed is None or t in allowed),
            policy=policy,
            groups=tuple(
                GroupOffer(
                    name=group.name,
                    uuid=group.uuid,
                    alloc_policy=group.alloc_policy,
                    nodes=tuple(sorted(group.node_list)),
                    networks=tuple(
                        sorted(n for n, ls in links.items() if any(x.group == group.name for x in ls))
                    ),
                )
                for group in sorted(groups, key=lambda g: g.name)
            ),
            networks=tuple(
                NetworkOffer(
                    name=net.name,
                    subnet=net.network,
                    gateway=net.gateway,
                    subnet6=net.network6,
                    gateway6=net.gateway6,
                    mac_prefix=net.mac_prefix,
                    free_count=net.free_count,
                    reserved_count=net.reserved_count,
                    groups=links[net.name],
                )
                for net in sorted(networks, key=lambda n: n.name)
            ),
            nodes=tuple(
                NodeStats(
                    name=node.name,
                    group=group_names.get(node.group_uuid) if node.group_uuid else None,
                    offline=node.offline,
                    drained=node.drained,
                    vm_capable=node.vm_capable is not False,
                    memory_total=node.mtotal,
                    memory_free=node.mfree,
                    disk_total=node.dtotal,
                    disk_free=node.dfree,
                    cpus=node.ctotal,
                    instances=node.pinst_cnt,
                )
                for node in sorted(nodes, key=lambda n: n.name)
            ),
        )


def os_offers(names: Iterable[str]) -> tuple[OsOffer, ...]:
    """``/2/os``'s names (``os`` or ``os+variant``) grouped by OS, sorted."""
    variants: dict[str, list[str]] = {}
    for name in names:
        base, _, variant = str(name).partition("+")
        found = variants.setdefault(base, [])
        if variant and variant not in found:
            found.append(variant)
    return tuple(OsOffer(name, tuple(sorted(found))) for name, found in sorted(variants.items()))


def _link(item: Any) -> NetworkLink:
    """One ``group_list`` entry: ``[group, mode, link, vlan]`` (older Ganetis: a string)."""
    if isinstance(item, list | tuple) and item:
        parts = [None if part in (None, "") else str(part) for part in item]
        parts += [None] * (4 - len(parts))
        return NetworkLink(group=parts[0] or "", mode=parts[1], link=parts[2], vlan=parts[3])
    if isinstance(item, str):
        # "group(mode, link)" of Ganeti 2.x's list
        group, _, rest = item.partition("(")
        mode, _, link = rest.rstrip(")").partition(",")
        return NetworkLink(group=group.strip(), mode=mode.strip() or None, link=link.strip() or None)
    return NetworkLink(group="")
