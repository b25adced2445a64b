"""Node choice inside one backend (``[dispatcher] node_placement = "pnode"``): pure code.

Ganeti 3.0's ``LUInstanceCreate.ExpandNames`` locks **every** node for a create that names an
iallocator (or none: the cluster's default), and only ``pnode`` (+ ``snode``) for one that names
its nodes. Creates of the first kind run their locked phase (the disks) one at a time per
cluster; of the second kind, one at a time per node. So the dispatcher can choose the nodes
itself, from the node stats it already reads (``GET /2/nodes?bulk=1``):

* a node is a candidate when it is usable (not offline, not drained, vm_capable), not marked
  full since the last stats (a create there failed for lack of room), and has room for the
  spec: its ``mfree`` less the memory of the creates placed there and not yet in its stats,
  and the same for ``dfree`` and the disk one node holds;
* among the candidates the one with the fewest creates in flight that take its lock (as primary
  or secondary) wins, then the one with the most memory left, then the most disk, then the name:
  a burst spreads over the nodes, one locked phase per node at a time;
* a mirrored template (``drbd``) takes a second node, another candidate with room for the disk
  (in the same node group when the stats say), chosen the same way, sent as ``snode``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from synnefo_ganeti.allocate._views import BackendView, Requirement, Reservation
from synnefo_ganeti.rapi import InstanceSpec, Node

__all__ = [
    "MIRRORED_TEMPLATES",
    "NodeLoad",
    "NodeLoads",
    "choose_nodes",
    "chooses_nodes",
    "node_loads",
    "placed_spec",
]

#: templates whose disks Ganeti mirrors to a second node (``constants.DTS_INT_MIRROR``)
MIRRORED_TEMPLATES = frozenset({"drbd"})


@dataclass(slots=True)
class NodeLoad:
    """What the dispatcher has put on one node that its stats do not show yet."""

    memory: int = 0  # MiB reserved by creates with this node as primary
    disk: int = 0  # MiB reserved by creates on it (primary or secondary)
    creates: int = 0  # creates in flight that take its lock


def node_loads(reservations: Iterable[Reservation], in_flight: Collection[int]) -> dict[str, NodeLoad]:
    """Per node: the reservations' memory and disk (not yet in the node stats), and the creates
    of ``in_flight`` (ids whose job has not ended) that lock it."""
    loads: dict[str, NodeLoad] = {}
    for reservation in reservations:
        req = reservation.requirement
        for index, name in enumerate(reservation.nodes):
            load = loads.setdefault(name, NodeLoad())
            if index == 0:
                load.memory += req.memory
            load.disk += req.disk_per_node
            if reservation.id in in_flight:
                load.creates += 1
    return loads


class NodeLoads:
    """:func:`node_loads` of a backend kept as its reservations come and go: every placement reads
    it, and summing every reservation each time made a burst's placements quadratic (thousands
    of reservations stay until the node stats show them). The allocator calls :meth:`add` and
    :meth:`remove` with each reservation it keeps or drops, :meth:`landed` when one's create is
    in flight no more; ``of_nodes()`` is then what :func:`node_loads` would sum. ``memory``,
    ``disk`` and ``count`` are the reservations' totals (the backend's pending capacity, which
    every placement reads too), placed on named nodes or not."""

    __slots__ = ("_by_node", "count", "disk", "memory")

    def __init__(self) -> None:
        self._by_node: dict[str, NodeLoad] = {}
        self.memory = 0
        self.disk = 0
        self.count = 0

    def add(self, reservation: Reservation, *, in_flight: bool) -> None:
        self._apply(reservation, 1, creates=in_flight)

    def remove(self, reservation: Reservation, *, in_flight: bool) -> None:
        self._apply(reservation, -1, creates=in_flight)

    def landed(self, reservation: Reservation) -> None:
        for name in reservation.nodes:
            self._by_node[name].creates -= 1

    def of_nodes(self) -> dict[str, NodeLoad]:
        """A copy: node -> its load (nodes of no reservation left out, as :func:`node_loads`)."""
        return {
            name: NodeLoad(load.memory, load.disk, load.creates)
            for name, load in self._by_node.items()
            if load.memory or load.disk or load.creates
        }

    def live(self) -> Mapping[str, NodeLoad]:
        """The loads themselves, not a copy (nodes of no reservation left may be in it, at zero):
        for reading only, as a placement does."""
        return self._by_node

    def _apply(self, reservation: Reservation, sign: int, *, creates: bool) -> None:
        req = reservation.requirement
        self.memory += sign * req.memory
        self.disk += sign * req.disk
        self.count += sign
        for index, name in enumerate(reservation.nodes):
            load = self._by_node.setdefault(name, NodeLoad())
            if index == 0:
                load.memory += sign * req.memory
            load.disk += sign * req.disk_per_node
            if creates:
                load.creates += sign


def _room(node: Node, load: NodeLoad) -> tuple[int, int]:
    return (node.mfree or 0) - load.memory, (node.dfree or 0) - load.disk


def choose_nodes(
    view: BackendView, req: Requirement, loads: Mapping[str, NodeLoad], full: Collection[str] = ()
) -> tuple[str, str | None] | str:
    """``(pnode, snode)`` (``snode`` None unless the template is mirrored), or why none fits."""
    usable = [node for node in view.usable_nodes if node.name not in full] if full else view.usable_nodes
    if not usable:
        return "no usable node (offline, drained, not vm_capable, or full since the last node stats)"
    empty = NodeLoad()
    per_node = req.disk_per_node

    def fits(node: Node, memory: int) -> bool:
        mem_left, disk_left = _room(node, loads.get(node.name, empty))
        return (memory <= 0 or mem_left >= memory) and (per_node <= 0 or disk_left >= per_node)

    def key(node: Node) -> tuple[int, int, int, str]:
        load = loads.get(node.name, empty)
        mem_left, disk_left = _room(node, load)
        return (load.creates, -mem_left, -disk_left, node.name)

    fitting = [node for node in usable if fits(node, req.memory)]
    if not fitting:
        return f"no node has room for {req.describe()} (less what is in flight there)"
    if req.disk_template not in MIRRORED_TEMPLATES:
        return min(fitting, key=key).name, None
    primaries = sorted(fitting, key=key)
    for primary in primaries:
        seconds = sorted(
            (
                node
                for node in usable
                if node.name != primary.name
                and (node.group_uuid is None or node.group_uuid == primary.group_uuid)
                and fits(node, 0)
            ),
            key=key,
        )
        if seconds:
            return primary.name, seconds[0].name
    return f"no two nodes have room for {req.describe()} (mirrored: a primary and a secondary)"


def chooses_nodes(spec: InstanceSpec, mode: str) -> bool:
    """Whether the dispatcher picks the nodes of ``spec`` under ``node_placement = mode``: only
    in ``"pnode"`` mode, and never over the request's own choice (its ``pnode``, ``iallocator``
    or ``opportunistic_locking``)."""
    return (
        mode == "pnode" and spec.pnode is None and spec.iallocator is None and not spec.opportunistic_locking
    )


def placed_spec(spec: InstanceSpec, reservation: Reservation, mode: str) -> InstanceSpec:
    """``spec`` as sent under ``node_placement = mode``: with the reservation's ``pnode`` (and
    ``snode``) when nodes were chosen; with ``opportunistic_locking`` in ``"opportunistic"`` mode
    unless it names its ``pnode`` (Ganeti allows opportunistic locking with an iallocator only:
    the cluster's default, or the request's own); unchanged otherwise."""
    if reservation.node is not None and spec.pnode is None and spec.iallocator is None:
        return spec.model_copy(update={"pnode": reservation.node, "snode": reservation.snode})
    if mode == "opportunistic" and spec.pnode is None and not spec.opportunistic_locking:
        return spec.model_copy(update={"opportunistic_locking": True})
    return spec
