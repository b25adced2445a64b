"""What moving a node's instances away does, decided in pure code: the plan of
:meth:`~synnefo_ganeti.ControlPlane.evacuate_node` and ``failover_node``, and their typed report.

Per primary instance of the node (as Ganeti lists them), followed from Ganeti 3.0's
``TLMigrateInstance.CheckPrereq`` (``cmdlib/instance_migration.py``):

* a disk template outside ``constants.DTS_MIRRORED`` (``plain``, ``file``) moves neither way
  (``Instance's disk layout 'file' does not allow migrations``): the instance is skipped, and
  the report says why;
* ``drbd`` (``DTS_INT_MIRROR``) goes to its secondary node only (an iallocator or another
  target is refused): when that node is drained, offline or not answering, it is skipped
  (``CheckNodeNotDrained`` would refuse the job);
* the others (``DTS_EXT_MIRROR``: ``diskless``, ``sharedfile``, ``rbd``, ``ext``, ``blockdev``,
  ``gluster``) go to any node: the one our node placement picks (``allocate/_nodes.py``
  ``choose_nodes``: usable, answering, room for its memory less what earlier moves of the same
  plan put there, the most memory left), or Ganeti's iallocator's choice when one is named
  (the target is then known once the job ended);
* a running instance is live-migrated, one not running (stopped, or its node dead) failed over
  (Ganeti refuses to migrate an instance that does not run: ``Can't migrate, please use
  failover``), as is one whose ``always_failover`` is set; ``failover_node`` fails every one over.

Never a drained or offline node as target, nor one whose live figures do not read (down).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from synnefo_ganeti.allocate import BackendView, NodeLoad, Requirement, choose_nodes
from synnefo_ganeti.rapi import Instance, Node

__all__ = [
    "EXT_MIRROR",
    "INT_MIRROR",
    "MOVABLE",
    "InstanceMove",
    "MoveAction",
    "MoveOutcome",
    "NodeMoveReport",
    "PlannedMove",
    "Progress",
    "plan_moves",
]

#: ``constants.DTS_INT_MIRROR``: moves to its secondary node only
INT_MIRROR = frozenset({"drbd"})
#: ``constants.DTS_EXT_MIRROR``: moves to any node (shared or external storage, or no disk)
EXT_MIRROR = frozenset({"blockdev", "diskless", "ext", "gluster", "rbd", "sharedfile"})
#: ``constants.DTS_MIRRORED``: the templates Ganeti migrates and fails over
MOVABLE = INT_MIRROR | EXT_MIRROR


class MoveAction(enum.StrEnum):
    MIGRATE = "migrate"
    FAILOVER = "failover"
    NONE = "none"  # nothing sent: the instance cannot move (see ``error``)


class MoveOutcome(enum.StrEnum):
    MOVED = "moved"  # its job succeeded
    FAILED = "failed"  # refused, or its job failed
    SKIPPED = "skipped"  # nothing sent: Ganeti would not move it


@dataclass(frozen=True, slots=True)
class PlannedMove:
    """One instance's move as decided before anything is sent."""

    name: str
    action: MoveAction
    #: the node it goes to; None with an iallocator (Ganeti's choice) or when it cannot move
    target: str | None
    owned: bool = True
    #: why it cannot move (action ``none``)
    why: str | None = None


@dataclass(frozen=True, slots=True)
class InstanceMove:
    """What happened to one instance: ``owned`` False for an instance Ganeti has and the store
    does not (not ours: moved through the RAPI client directly, the store untouched)."""

    name: str
    action: MoveAction
    target: str | None
    job_id: int | None
    outcome: MoveOutcome
    error: str | None = None
    owned: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "action": self.action.value,
            "target": self.target,
            "job_id": self.job_id,
            "outcome": self.outcome.value,
            "error": self.error,
            "owned": self.owned,
        }


@dataclass(frozen=True, slots=True)
class NodeMoveReport:
    """The end of an evacuate or failover of ``node``: one :class:`InstanceMove` per primary
    instance it had, in name order. ``ok`` when every one moved."""

    backend: str
    node: str
    operation: str  # "evacuate" or "failover"
    moves: tuple[InstanceMove, ...] = ()
    iallocator: str | None = None
    #: failover: whether this call marked the node offline (False: it was offline already)
    marked_offline: bool = False
    counts: dict[str, int] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        counts = {outcome.value: 0 for outcome in MoveOutcome}
        for move in self.moves:
            counts[move.outcome.value] += 1
        object.__setattr__(self, "counts", counts)

    @property
    def ok(self) -> bool:
        return all(move.outcome is MoveOutcome.MOVED for move in self.moves)

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "node": self.node,
            "operation": self.operation,
            "iallocator": self.iallocator,
            "marked_offline": self.marked_offline,
            "ok": self.ok,
            "counts": dict(self.counts),
            "moves": [move.to_json() for move in self.moves],
        }

    def __repr__(self) -> str:
        parts = ", ".join(f"{n} {k}" for k, n in self.counts.items())
        return f"<NodeMoveReport {self.operation} {self.backend}/{self.node}: {parts}>"


#: ``progress(done, total, move)``: once before the first move (0, total, None), then after each
Progress = Callable[[int, int, InstanceMove | None], None]


def _memory(instance: Instance) -> int:
    for key in ("maxmem", "memory"):
        value = instance.beparams.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return instance.oper_ram or 0


def _why_not_target(node: Node | None, name: str) -> str | None:
    if node is None:
        return f"node {name} is not in the cluster"
    if node.offline:
        return f"node {name} is offline"
    if node.drained:
        return f"node {name} is drained"
    if node.mfree is None:
        return f"node {name} does not answer (its live figures do not read)"
    return None


def plan_moves(
    node: str,
    instances: Iterable[Instance],
    nodes: Iterable[Node],
    *,
    ours: Collection[str],
    iallocator: str | None = None,
    failover: bool = False,
) -> list[PlannedMove]:
    """The move of each primary instance of ``node`` (in name order); ``ours``: the names the store
    holds as this control plane's; ``failover``: fail every one over (the node is dead)."""
    by_name = {n.name: n for n in nodes}
    others = [n for n in by_name.values() if n.name != node and n.mfree is not None]
    view = BackendView(name="", nodes=others)
    loads: dict[str, NodeLoad] = {}
    plan = []
    for inst in sorted((i for i in instances if i.pnode == node), key=lambda i: i.name):
        owned = inst.name in ours
        template = inst.disk_template or "unknown"
        running = bool(inst.oper_state) and not failover
        action = (
            MoveAction.MIGRATE
            if running and not inst.beparams.get("always_failover")
            else MoveAction.FAILOVER
        )
        if template not in MOVABLE:
            why = (
                f"disk template {template} does not allow migrations or failovers (Ganeti moves "
                f"{', '.join(sorted(MOVABLE))}); its disks stay on {node}"
            )
            plan.append(PlannedMove(inst.name, MoveAction.NONE, None, owned, why))
            continue
        if template in INT_MIRROR:
            secondary = inst.snodes[0] if inst.snodes else None
            refusal = (
                "no secondary node"
                if secondary is None
                else _why_not_target(by_name.get(secondary), secondary)
            )
            if refusal is not None:
                why = f"{template} moves to its secondary node only: {refusal}"
                plan.append(PlannedMove(inst.name, MoveAction.NONE, None, owned, why))
            else:
                plan.append(PlannedMove(inst.name, action, secondary, owned))
            continue
        if iallocator is not None:
            plan.append(PlannedMove(inst.name, action, None, owned))
            continue
        memory = _memory(inst)
        need = Requirement(memory=memory, disk=0, vcpus=1, disk_template="diskless")
        chosen = choose_nodes(view, need, loads)
        if isinstance(chosen, str):
            plan.append(PlannedMove(inst.name, MoveAction.NONE, None, owned, f"no target: {chosen}"))
            continue
        target = chosen[0]
        loads.setdefault(target, NodeLoad()).memory += memory
        plan.append(PlannedMove(inst.name, action, target, owned))
    return plan
