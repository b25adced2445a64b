"""The nodes and instances a capacity count starts from (:mod:`._capacity`), made from RAPI's
``GET /2/nodes?bulk=1`` and ``GET /2/instances?bulk=1`` answers as htools loads them
(``Backend/Luxi.hs``: a drained node is offline; ``cnos`` the CPUs its OS uses; a node's memory
the smaller of reported and recorded free, ``Node.unallocatedMem``). Pure code.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from synnefo_ganeti.rapi import Instance, Node

__all__ = [
    "LOCAL_STORAGE_TEMPLATES",
    "RUNNING_STATES",
    "CapacityNode",
    "HostedInstance",
    "capacity_nodes",
    "hosted_instances",
]

#: templates whose disks live on the primary's own storage (htools' ``usesLocalStorage``)
LOCAL_STORAGE_TEMPLATES = frozenset({"plain", "drbd"})
#: the instance statuses whose memory counts as used on the primary (htools' ``Instance.usesMemory``)
RUNNING_STATES = frozenset({"running", "ERROR_up", "ERROR_wrongnode"})


@dataclass(frozen=True, slots=True)
class HostedInstance:
    """What an existing instance holds on its primary: memory and disk (MiB), virtual CPUs."""

    name: str
    primary: str | None
    memory: int
    vcpus: int = 1
    disk: int = 0
    template: str | None = None
    secondaries: tuple[str, ...] = ()
    #: not ``offline`` (htools' ``Instance.notOffline``): its CPUs count on its primary
    online: bool = True
    #: running (``running``, ``ERROR_up``, ``ERROR_wrongnode``): its memory counts on its primary
    running: bool = True

    @property
    def local_disk(self) -> bool:
        return self.template in LOCAL_STORAGE_TEMPLATES


@dataclass(frozen=True, slots=True)
class CapacityNode:
    """One node as the count sees it (MiB); ``usable``: online, not drained, VM-capable;
    ``memory_free``: what instances may still take (:func:`capacity_nodes`: the smaller of what
    Ganeti reports free and what its records leave)."""

    name: str
    group: str | None = None
    usable: bool = True
    memory_free: int = 0
    disk_free: int = 0
    cpus: int = 0
    #: CPUs its OS uses (``cnos``: htools starts a node's used virtual CPUs there)
    os_cpus: int = 1
    #: the ``spindle_count`` node parameter
    spindles: int = 1
    primaries: tuple[HostedInstance, ...] = ()

    @property
    def vcpus_used(self) -> int:
        return self.os_cpus + sum(i.vcpus for i in self.primaries if i.online)

    @property
    def spindles_used(self) -> int:
        return sum(1 for i in self.primaries if i.local_disk)


def hosted_instances(instances: Iterable[Instance]) -> tuple[HostedInstance, ...]:
    """``GET /2/instances?bulk=1``'s instances as the count needs them (``beparams`` sizes)."""
    return tuple(
        HostedInstance(
            name=inst.name,
            primary=inst.pnode,
            memory=_int(inst.beparams.get("maxmem"), _int(inst.beparams.get("memory"), inst.oper_ram or 0)),
            vcpus=_int(inst.beparams.get("vcpus"), inst.oper_vcpus or 1),
            disk=sum(inst.disk_sizes),
            template=inst.disk_template,
            secondaries=tuple(inst.snodes),
            online=inst.admin_state != "offline",
            running=inst.status in RUNNING_STATES if inst.status else bool(inst.oper_state),
        )
        for inst in instances
    )


def capacity_nodes(
    nodes: Sequence[Node],
    instances: Sequence[HostedInstance] = (),
    *,
    groups: Mapping[str, str] | None = None,
) -> tuple[CapacityNode, ...]:
    """``GET /2/nodes?bulk=1``'s nodes with their primaries; ``groups`` maps group UUIDs to names."""
    by_primary: dict[str, list[HostedInstance]] = {}
    for inst in instances:
        if inst.primary is not None:
            by_primary.setdefault(inst.primary, []).append(inst)
    result = []
    for node in sorted(nodes, key=lambda n: n.name):
        extra: dict[str, Any] = node.model_extra or {}
        found = extra.get("ndparams")
        ndparams: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        group = node.group_uuid
        result.append(
            CapacityNode(
                name=node.name,
                group=(groups or {}).get(group, group) if group else None,
                usable=not node.offline and not node.drained and node.vm_capable is not False,
                memory_free=_memory_free(node, by_primary.get(node.name, ())),
                disk_free=node.dfree or 0,
                cpus=node.ctotal or 0,
                os_cpus=_int(extra.get("cnos"), 1),
                spindles=_int(ndparams.get("spindle_count"), 1),
                primaries=tuple(by_primary.get(node.name, ())),
            )
        )
    return tuple(result)


def _memory_free(node: Node, primaries: Iterable[HostedInstance]) -> int:
    """The smaller of what the node reports free and what its records leave (total, less the
    node's own, less its running primaries'): htools' ``unallocatedMem`` at load, ``min(fMem,
    tMem - nMem - iMem)`` (hspace 3.0.2 counts an instance of the fake hypervisor, which uses no
    real memory, all the same)."""
    reported = node.mfree or 0
    if node.mtotal is None or node.mnode is None:
        return reported
    recorded = node.mtotal - node.mnode - sum(i.memory for i in primaries if i.running)
    return min(reported, recorded)


def _int(value: Any, default: int) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else default
