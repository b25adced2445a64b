"""The plan of a rolling maintenance: which nodes can go down together while every instance keeps
running elsewhere. Pure code, no I/O; after Ganeti's ``hroller`` (``Program/Hroller.hs``).

hroller sees the nodes as the vertices of a graph whose edges join the primary and the secondary
node of each instance (``Node.mkNodeGraph``), colours it with a few heuristics (largest first,
DSatur, ``Graph.hs``) and keeps the colouring with the fewest colours: nodes of one colour share
no instance, so they may reboot at once. For online maintenance (``clearNodes``) it then splits
each colour class into groups whose primaries all fit on the nodes outside the group, and puts
the master last (``masterLast``). :func:`plan_maintenance` does the same, with three choices of
its own:

* **Room is memory.** A group is accepted only when every primary instance of its nodes that is
  up (``admin_state`` up) finds a target outside the group with enough free memory left: a
  ``drbd`` instance its secondary (Ganeti moves it nowhere else), any other mirrored template
  the usable node (online, not drained, VM-capable) with the most memory left, the largest
  instance first (``recreate`` in htools' ``GlobalN1.hs``). An instance that is down needs no
  memory to fail over. The groups are simulated one after the other: what a group moves away
  stays where it went, and the group's nodes come back empty for the next ones.
* **The master alone and last.** Ganeti drains the master only after a master failover; its
  turn hands the role over first (:mod:`~synnefo_ganeti.control._maintenance`), so it is a group
  of its own at the end (hroller puts it last in the last group).
* **What cannot stay up is a problem, not a silent stop.** A running instance whose template
  does not move (``plain``, ``file``: outside ``DTS_MIRRORED``) or that finds no room is named in
  :attr:`MaintenancePlan.problems`; a run refuses a plan with problems (hroller's
  ``--skip-non-redundant`` would leave such nodes out).

Offline nodes take no part (:attr:`MaintenancePlan.skipped`), as in hroller.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from synnefo_ganeti.rapi import Instance, Node

__all__ = [
    "MOVABLE_TEMPLATES",
    "MaintenanceGroup",
    "MaintenanceInstance",
    "MaintenanceNode",
    "MaintenancePlan",
    "PlannedMove",
    "maintenance_inputs",
    "plan_maintenance",
]

#: Ganeti's ``DTS_MIRRORED``: the templates it migrates and fails over
MOVABLE_TEMPLATES = frozenset({"drbd", "blockdev", "diskless", "ext", "gluster", "rbd", "sharedfile"})


@dataclass(frozen=True, slots=True)
class MaintenanceNode:
    """A node as the plan sees it; ``usable``: online, not drained, VM-capable (a move target)."""

    name: str
    memory_free: int = 0
    master: bool = False
    offline: bool = False
    usable: bool = True


@dataclass(frozen=True, slots=True)
class MaintenanceInstance:
    """An instance as the plan sees it: memory in MiB; ``up``: Ganeti should run it."""

    name: str
    primary: str | None
    memory: int = 0
    template: str | None = None
    secondaries: tuple[str, ...] = ()
    up: bool = True


@dataclass(frozen=True, slots=True)
class PlannedMove:
    """Where the plan expects an instance to go when its primary's group goes down."""

    instance: str
    source: str
    target: str


@dataclass(frozen=True, slots=True)
class MaintenanceGroup:
    """Nodes that go down together, and the moves the plan counted for them."""

    nodes: tuple[str, ...]
    moves: tuple[PlannedMove, ...] = ()
    master: bool = False


@dataclass(frozen=True, slots=True)
class MaintenancePlan:
    """The groups in order (the master's last), offline nodes left out, and what would not stay up."""

    groups: tuple[MaintenanceGroup, ...]
    master: str | None = None
    skipped: tuple[str, ...] = ()
    problems: tuple[str, ...] = field(default_factory=tuple)

    @property
    def node_groups(self) -> list[list[str]]:
        return [list(g.nodes) for g in self.groups]

    def to_json(self) -> dict[str, Any]:
        return {
            "groups": [
                {
                    "nodes": list(g.nodes),
                    "master": g.master,
                    "moves": [{"instance": m.instance, "from": m.source, "to": m.target} for m in g.moves],
                }
                for g in self.groups
            ],
            "master": self.master,
            "skipped": list(self.skipped),
            "problems": list(self.problems),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MaintenancePlan:
        groups = tuple(
            MaintenanceGroup(
                tuple(g["nodes"]),
                tuple(PlannedMove(m["instance"], m["from"], m["to"]) for m in g.get("moves", ())),
                bool(g.get("master", False)),
            )
            for g in data.get("groups", ())
        )
        return cls(
            groups,
            data.get("master"),
            tuple(data.get("skipped", ())),
            tuple(data.get("problems", ())),
        )


def maintenance_inputs(
    nodes: Iterable[Node], instances: Iterable[Instance]
) -> tuple[list[MaintenanceNode], list[MaintenanceInstance]]:
    """Ganeti's bulk nodes and instances as the plan reads them (memory: ``beparams`` maxmem)."""
    plan_nodes = [
        MaintenanceNode(
            name=n.name,
            memory_free=n.mfree or 0,
            master=n.role == "M",
            offline=n.offline,
            usable=not n.offline and not n.drained and n.vm_capable is not False and n.mfree is not None,
        )
        for n in nodes
    ]
    plan_instances = [
        MaintenanceInstance(
            name=i.name,
            primary=i.pnode,
            memory=_int(i.beparams.get("maxmem"), _int(i.beparams.get("memory"), i.oper_ram or 0)),
            template=i.disk_template,
            secondaries=tuple(i.snodes),
            up=i.admin_state == "up",
        )
        for i in instances
    ]
    return plan_nodes, plan_instances


def _int(value: Any, default: int) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


def plan_maintenance(
    nodes: Sequence[MaintenanceNode], instances: Sequence[MaintenanceInstance]
) -> MaintenancePlan:
    """The groups of ``nodes`` that can go down together (see the module)."""
    online = sorted((n for n in nodes if not n.offline), key=lambda n: n.name)
    skipped = tuple(sorted(n.name for n in nodes if n.offline))
    master = next((n.name for n in online if n.master), None)
    names = [n.name for n in online if n.name != master]
    classes = _colour_classes(names, _edges(names, instances))
    state = _State(online, instances)
    groups: list[MaintenanceGroup] = []
    problems: list[str] = []
    for members in classes:
        remaining = list(members)
        while remaining:
            group: list[str] = []
            moves: list[PlannedMove] = []
            for name in list(remaining):
                trial = state.clear([*group, name])
                if trial[1] and group:  # it does not fit with this group: a later one
                    continue
                group.append(name)
                remaining.remove(name)
                moves, why = trial
                if why:  # alone it does not fit either: a group of its own, its problems told
                    problems.extend(why)
                    break
            state.apply(moves)
            groups.append(MaintenanceGroup(tuple(group), tuple(moves)))
    if master is not None:
        moves, why = state.clear([master])
        problems.extend(why)
        state.apply(moves)
        groups.append(MaintenanceGroup((master,), tuple(moves), master=True))
    return MaintenancePlan(tuple(groups), master, skipped, tuple(problems))


def _edges(names: Sequence[str], instances: Iterable[MaintenanceInstance]) -> dict[str, set[str]]:
    """Node -> the nodes it shares an instance with (primary and secondaries)."""
    known = set(names)
    edges: dict[str, set[str]] = {name: set() for name in names}
    for inst in instances:
        members = [n for n in (inst.primary, *inst.secondaries) if n in known]
        for a in members:
            edges[a].update(b for b in members if b != a)
    return edges


def _colour_classes(names: Sequence[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """The colour classes of the fewer-colour one of two greedy colourings (largest first and
    DSatur, as hroller), the largest class first; ties broken by name."""
    candidates = [_colour(names, edges, dsatur=False), _colour(names, edges, dsatur=True)]
    best = min(candidates, key=lambda colours: len(set(colours.values())))
    classes: dict[int, list[str]] = {}
    for name in sorted(names):
        classes.setdefault(best[name], []).append(name)
    return sorted(classes.values(), key=lambda c: (-len(c), c))


def _colour(names: Sequence[str], edges: dict[str, set[str]], *, dsatur: bool) -> dict[str, int]:
    colours: dict[str, int] = {}
    left = set(names)
    while left:
        if dsatur:  # the most differently coloured neighbours first, then the highest degree
            pick = min(
                left,
                key=lambda n: (-len({colours[m] for m in edges[n] if m in colours}), -len(edges[n]), n),
            )
        else:  # largest first: the highest degree first
            pick = min(left, key=lambda n: (-len(edges[n]), n))
        used = {colours[m] for m in edges[pick] if m in colours}
        colours[pick] = next(c for c in range(len(names) + 1) if c not in used)
        left.remove(pick)
    return colours


class _State:
    """Free memory per node and the primary of each instance, as the groups before left them."""

    def __init__(self, nodes: Sequence[MaintenanceNode], instances: Sequence[MaintenanceInstance]) -> None:
        self.free = {n.name: n.memory_free for n in nodes}
        self.usable = {n.name for n in nodes if n.usable}
        self.instances = {i.name: i for i in instances}
        self.primary = {i.name: i.primary for i in instances}

    def __repr__(self) -> str:
        return f"<_State {len(self.free)} nodes, {len(self.instances)} instances>"

    def clear(self, group: Sequence[str]) -> tuple[list[PlannedMove], list[str]]:
        """The moves that empty ``group``'s nodes (largest instance first), and what would not
        stay up (an empty list: it fits)."""
        down = set(group)
        free = dict(self.free)
        moves: list[PlannedMove] = []
        problems: list[str] = []
        hosted = [self.instances[n] for n, p in sorted(self.primary.items()) if p in down]
        for inst in sorted(hosted, key=lambda i: (-i.memory, i.name)):
            source = self.primary[inst.name]
            assert source is not None
            need = inst.memory if inst.up else 0
            if inst.template not in MOVABLE_TEMPLATES:
                if inst.up:
                    problems.append(
                        f"{inst.name} on {source}: disk template {inst.template} does not move "
                        f"(Ganeti migrates {', '.join(sorted(MOVABLE_TEMPLATES))}); it would stop"
                    )
                continue
            if inst.template == "drbd":
                targets = [s for s in inst.secondaries if s != source]
            else:
                targets = sorted(self.usable - down, key=lambda n: (-free[n], n))
            targets = [t for t in targets if t in self.usable and t not in down]
            target = next((t for t in targets if free[t] >= need), None)
            if target is None:
                where = "its secondary" if inst.template == "drbd" else "any node outside its group"
                problems.append(
                    f"{inst.name} on {source}: {need} MiB of memory fit on no usable node ({where})"
                )
                continue
            free[target] -= need
            moves.append(PlannedMove(inst.name, source, target))
        return moves, problems

    def apply(self, moves: Iterable[PlannedMove]) -> None:
        """The group's moves done: memory taken on targets, given back on sources."""
        for move in moves:
            inst = self.instances[move.instance]
            need = inst.memory if inst.up else 0
            self.free[move.target] -= need
            self.free[move.source] += need
            self.primary[move.instance] = move.target
            if inst.template == "drbd":  # the old primary is its secondary now
                self.instances[move.instance] = replace(inst, secondaries=(move.source,))
