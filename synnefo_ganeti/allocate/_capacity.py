"""How many more instances of a flavor fit on a backend, now and keeping N+1: pure code, after
Ganeti's ``hspace`` (htools).

``hspace --standard-alloc DISK,MEM,CPU`` (``Program/Hspace.hs``) places instances of one size
one at a time (``Cluster.iterateAlloc``) until no node takes another, and counts them. A node
takes one (``Node.addPri``, the strict checks) while, after it:

- its free memory stays above 0 (``new_free_mem <= 0`` is ``FailMem``);
- its virtual CPUs stay within the policy's ``vcpu-ratio`` times its CPUs, counting the CPUs its
  OS uses (``cnos``) and those of its running primaries (``FailCPU``);
- for a template on the node's own disks (``plain``, ``drbd``: ``Instance.usesLocalStorage``),
  its free disk stays above 0 and its spindles within ``spindle-ratio`` times its
  ``spindle_count`` (``FailDisk``);

and only on nodes online, not drained and VM-capable (htools loads a drained node as offline,
``Backend/Luxi.hs`` ``parseNode``). A flavor outside the policy's bounds (``minmax``) or a
template the policy does not allow fits nowhere. Each node's count is independent, so **now** is
their sum.

**Keeping N+1** is Ganeti 2.16+'s global N+1 (``GlobalN1.hs``, on by default in hspace;
``--no-capacity-checks`` turns it off): an allocation counts only if, after it, every node of
the group could be emptied (``canEvacuateNode``): its DRBD primaries failed over to their
secondary, its diskless and shared-storage ones moved in Ganeti's order of its primaries (the
newest first: the new ones before those already there), the rest (``plain``, ``file``)
re-created the largest first (``recreate``), each where it fits. Those moves ignore the soft
checks (``algIgnoreSoftErrors``): they need memory (and local disk), not CPUs. A node's memory is
the smaller of what it reports free and what its records leave (``unallocatedMem``). Among the nodes
that take one, hspace picks the best cluster score (balance); here the node with the most free
memory left, which on nodes of one size places round-robin as hspace does.

What this model leaves out (and the docs say, docs/operations.md): DRBD's N+1 through
secondaries (``rMem``) and new ``drbd`` instances (their count is not given), exclusive storage,
group ipolicies (the cluster's applies), node tags and location scores, and memory
over-commitment.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from synnefo_ganeti.allocate._capacity_nodes import (
    LOCAL_STORAGE_TEMPLATES,
    CapacityNode,
    HostedInstance,
    capacity_nodes,
    hosted_instances,
)
from synnefo_ganeti.allocate._offers import InstancePolicy
from synnefo_ganeti.errors import InvalidError

__all__ = [
    "LOCAL_STORAGE_TEMPLATES",
    "CapacityNode",
    "Flavor",
    "FlavorCapacity",
    "HostedInstance",
    "capacity_nodes",
    "count_capacity",
    "hosted_instances",
    "policy_refusal",
]

#: templates whose instances move to any node of the group (``diskTemplateMovable``): shared
#: storage and diskless; the rest (``plain``, ``file``) are re-created elsewhere
MOVABLE_TEMPLATES = frozenset({"diskless", "sharedfile", "blockdev", "rbd", "ext", "gluster"})
#: templates this model does not count (DRBD places on two nodes; its N+1 is the secondaries')
UNMODELLED_TEMPLATES = frozenset({"drbd"})


@dataclass(frozen=True, slots=True)
class Flavor:
    """An instance size: memory and disk in MiB, virtual CPUs, spindles it uses (the policy's)."""

    memory: int
    vcpus: int
    disk: int
    spindles: int = 1

    def __post_init__(self) -> None:
        if self.memory <= 0 or self.vcpus <= 0 or self.disk < 0 or self.spindles < 0:
            raise InvalidError(
                f"flavor {self}: memory and vcpus must be above 0, disk and spindles 0 or more"
            )

    def __str__(self) -> str:
        return f"memory={self.memory},vcpus={self.vcpus},disk={self.disk}"

    @classmethod
    def parse(cls, text: str) -> Flavor:
        """``memory=MiB,vcpus=N,disk=MiB`` (each key once, all three; sizes in MiB, or with a
        ``G`` for GiB: ``memory=4G``). :class:`InvalidError` names what is wrong."""
        values: dict[str, int] = {}
        for part in text.split(","):
            key, sep, value = part.strip().partition("=")
            key = key.strip().lower()
            if not sep or key not in ("memory", "vcpus", "disk"):
                raise InvalidError(
                    f"flavor {text!r}: expected memory=MiB,vcpus=N,disk=MiB, got {part.strip()!r}"
                )
            if key in values:
                raise InvalidError(f"flavor {text!r}: {key} given twice")
            values[key] = _size(text, key, value.strip())
        missing = [k for k in ("memory", "vcpus", "disk") if k not in values]
        if missing:
            raise InvalidError(f"flavor {text!r}: missing {', '.join(missing)}")
        return cls(memory=values["memory"], vcpus=values["vcpus"], disk=values["disk"])

    @classmethod
    def standard(cls, policy: InstancePolicy) -> Flavor | None:
        """The policy's standard size (``std``), None when the policy has none."""
        std = policy.std or {}
        try:
            return cls(
                memory=int(std["memory-size"]),
                vcpus=int(std["cpu-count"]),
                disk=int(std.get("disk-size", 0)),
                spindles=int(std.get("spindle-use", 1)),
            )
        except (KeyError, TypeError, ValueError):
            return None


def _size(text: str, key: str, value: str) -> int:
    factor = 1
    if key != "vcpus" and value[-1:].upper() in ("G", "M"):
        factor = 1024 if value[-1:].upper() == "G" else 1
        value = value[:-1]
    try:
        number = int(value)
    except ValueError:
        raise InvalidError(f"flavor {text!r}: {key} must be a whole number, got {value!r}") from None
    return number * factor


@dataclass(frozen=True, slots=True)
class FlavorCapacity:
    """How many more instances of ``flavor`` (disk template ``template``) fit.

    ``now``: on every usable node until none takes one; ``n_plus_1``: keeping every node's
    primaries able to move to the others of its group. ``None`` with ``note`` when not
    counted. ``limit_now`` and ``limit_n_plus_1`` say what stopped it (``memory``, ``cpu``,
    ``disk``, ``spindles``, ``N+1``, ``policy``, ``no nodes``). ``per_node``: node -> (now,
    keeping N+1) of the new instances each would take.
    """

    flavor: Flavor
    template: str
    now: int | None
    n_plus_1: int | None
    limit_now: str | None = None
    limit_n_plus_1: str | None = None
    note: str | None = None
    per_node: dict[str, tuple[int, int]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "flavor": {"memory": self.flavor.memory, "vcpus": self.flavor.vcpus, "disk": self.flavor.disk},
            "template": self.template,
            "now": self.now,
            "n_plus_1": self.n_plus_1,
            "limit_now": self.limit_now,
            "limit_n_plus_1": self.limit_n_plus_1,
            "note": self.note,
            "per_node": {name: {"now": a, "n_plus_1": b} for name, (a, b) in sorted(self.per_node.items())},
        }


def count_capacity(
    nodes: Sequence[CapacityNode], policy: InstancePolicy, flavor: Flavor, template: str
) -> FlavorCapacity:
    """How many more instances of ``flavor`` fit on ``nodes`` (see the module)."""
    if template in UNMODELLED_TEMPLATES:
        return FlavorCapacity(
            flavor, template, None, None, note=f"{template} is not counted (DRBD: two nodes)"
        )
    refused = policy_refusal(policy, flavor, template)
    if refused is not None:
        return FlavorCapacity(flavor, template, 0, 0, "policy", "policy", note=refused)
    local = template in LOCAL_STORAGE_TEMPLATES
    fits = {n.name: _fit(n, flavor, local, policy) for n in nodes if n.usable}
    if not fits:
        return FlavorCapacity(flavor, template, 0, 0, "no nodes", "no nodes", note="no usable node")
    now = sum(count for count, _ in fits.values())
    limit_now = _main_limit([why for _, why in fits.values()])
    placed: dict[str, int] = {name: 0 for name in fits}
    groups: dict[str | None, list[CapacityNode]] = {}
    for node in nodes:
        groups.setdefault(node.group, []).append(node)
    movable = template in MOVABLE_TEMPLATES
    stopped = [_fill_group(members, fits, placed, flavor, (local, movable)) for members in groups.values()]
    n1 = sum(placed.values())
    limit_n1 = "N+1" if "N+1" in stopped and n1 < now else limit_now
    per_node = {name: (fits[name][0], placed[name]) for name in fits}
    return FlavorCapacity(flavor, template, now, n1, limit_now, limit_n1, per_node=per_node)


def policy_refusal(policy: InstancePolicy, flavor: Flavor, template: str) -> str | None:
    """Why the policy refuses ``flavor`` (None: it takes it): a template it does not allow, or
    sizes outside every ``minmax`` pair (the disk checked even for ``diskless``, as hspace does)."""
    if policy.disk_templates and template not in policy.disk_templates:
        return f"the instance policy does not allow disk template {template}"
    if not policy.minmax:
        return None
    sizes = {"memory-size": flavor.memory, "cpu-count": flavor.vcpus, "disk-size": flavor.disk}
    sizes |= {"disk-count": 1, "nic-count": 1, "spindle-use": flavor.spindles}
    for pair in policy.minmax:
        low, high = pair.get("min", {}), pair.get("max", {})
        if all(low.get(k, v) <= v <= high.get(k, v) for k, v in sizes.items()):
            return None
    bounds = "; ".join(_bounds(pair) for pair in policy.minmax)
    return f"outside the instance policy's bounds ({bounds})"


def _bounds(pair: Mapping[str, Mapping[str, int]]) -> str:
    low, high = pair.get("min", {}), pair.get("max", {})
    keys = ("memory-size", "cpu-count", "disk-size")
    return ", ".join(f"{k} {low.get(k, '?')}-{high.get(k, '?')}" for k in keys)


def _fit(node: CapacityNode, flavor: Flavor, local: bool, policy: InstancePolicy) -> tuple[int, str]:
    """How many the node takes (the strict checks of ``Node.addPri``), and what stops it."""
    limits: list[tuple[int, str]] = [(_slots(node.memory_free, flavor.memory), "memory")]
    ratio = policy.vcpu_ratio
    if ratio is not None and ratio >= 0:
        room = ratio * node.cpus - node.vcpus_used
        limits.append((max(0, int(room // flavor.vcpus)), "cpu"))
    if local:
        if flavor.disk > 0:
            limits.append((_slots(node.disk_free, flavor.disk), "disk"))
        if policy.spindle_ratio is not None and flavor.spindles > 0:
            room = policy.spindle_ratio * node.spindles - node.spindles_used
            limits.append((max(0, int(room // flavor.spindles)), "spindles"))
    return min(limits)


def _slots(free: int, size: int) -> int:
    """How many of ``size`` leave ``free`` above 0 (Ganeti fails at ``<= 0``)."""
    return max(0, (free - 1) // size) if size > 0 else 1 << 30


def _main_limit(reasons: Sequence[str]) -> str:
    """The most common reason among the nodes (ties: memory, cpu, disk, spindles)."""
    order = ("memory", "cpu", "disk", "spindles")
    return max(order, key=lambda why: (reasons.count(why), -order.index(why)))


def _fill_group(
    members: Sequence[CapacityNode],
    fits: Mapping[str, tuple[int, str]],
    placed: dict[str, int],
    flavor: Flavor,
    kind: tuple[bool, bool],
) -> str:
    """Place new instances on the group's usable nodes one at a time (the most free memory
    left first), each only if every node of the group could still be emptied; ``placed`` is
    updated. Returns why it stopped (``N+1`` or ``full``).

    Adding an instance never makes N+1 easier, so along the placements made while every one
    keeps it (those of :func:`_balanced_order`) it holds up to some point and never after: a
    bisection finds that point, then the rest go one at a time as hspace goes on, trying the
    other nodes."""
    usable = [n for n in members if n.usable and n.name in fits]
    order = _balanced_order(usable, fits, flavor)
    low, high = 0, len(order)  # order[:low] keeps N+1; find the longest prefix that does
    while low < high:
        middle = (low + high + 1) // 2
        if _redundant(members, _counts(order[:middle]), flavor, kind):
            low = middle
        else:
            high = middle - 1
    placed.update(_counts(order[:low]))
    blocked: set[str] = set()
    while True:
        candidates = [n for n in usable if n.name not in blocked and placed[n.name] < fits[n.name][0]]
        if not candidates:
            return "N+1" if blocked else "full"
        candidates.sort(key=lambda n: (-(n.memory_free - placed[n.name] * flavor.memory), n.name))
        for node in candidates:
            placed[node.name] += 1
            if _redundant(members, placed, flavor, kind):
                break
            placed[node.name] -= 1
            blocked.add(node.name)  # adding only makes N+1 harder: this node takes no more
        else:
            return "N+1"


def _balanced_order(
    usable: Sequence[CapacityNode], fits: Mapping[str, tuple[int, str]], flavor: Flavor
) -> list[str]:
    """The nodes new instances go to, one after the other, the most free memory left first
    (ties by name), each while it takes more (``fits``)."""
    heap = [(-n.memory_free, n.name) for n in usable if fits[n.name][0] > 0]
    heapq.heapify(heap)
    left = {n.name: fits[n.name][0] for n in usable}
    order = []
    while heap:
        free, name = heapq.heappop(heap)
        order.append(name)
        left[name] -= 1
        if left[name] > 0:
            heapq.heappush(heap, (free + flavor.memory, name))
    return order


def _counts(names: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return counts


def _redundant(
    members: Sequence[CapacityNode], placed: Mapping[str, int], flavor: Flavor, kind: tuple[bool, bool]
) -> bool:
    """Whether every node of the group could be emptied onto the others (``GlobalN1.redundant``)."""
    local = kind[0]  # (the flavor's template uses local storage, is movable)
    targets = {n.name: _room(n, placed, flavor, local) for n in members if n.usable}
    slots = {name: _slots_of(room, flavor, local) for name, room in targets.items()}
    total = sum(slots.values())
    for node in members:
        new = placed.get(node.name, 0)
        if not node.primaries:  # only new instances, all of one size: count the slots of the others
            if new > total - slots.get(node.name, 0):
                return False
        elif not _evacuable(node, targets, new, flavor, kind):
            return False
    return True


def _room(node: CapacityNode, placed: Mapping[str, int], flavor: Flavor, local: bool) -> tuple[int, int]:
    """A node's free memory and disk once the new instances placed there are on it."""
    count = placed.get(node.name, 0)
    return node.memory_free - count * flavor.memory, node.disk_free - (count * flavor.disk if local else 0)


def _slots_of(room: tuple[int, int], flavor: Flavor, local: bool) -> int:
    memory = _slots(room[0], flavor.memory)
    return min(memory, _slots(room[1], flavor.disk)) if local and flavor.disk > 0 else memory


def _evacuable(
    node: CapacityNode,
    targets: Mapping[str, tuple[int, int]],
    new: int,
    flavor: Flavor,
    kind: tuple[bool, bool],
) -> bool:
    """Whether ``node``'s primaries (hosted and ``new`` ones) can go to the group's other usable
    nodes (``targets``: their free memory and disk), as ``GlobalN1.canEvacuateNode`` moves them:
    DRBD ones fail over to their secondary; then the movable ones (shared storage, diskless) in
    Ganeti's order of the node's primaries, the newest first (the new ones, then the hosted ones,
    the last by name first); then the others, the largest first; each to the node with the most
    memory free where it fits."""
    free = {name: list(room) for name, room in targets.items() if name != node.name}
    for inst in node.primaries:
        if inst.template == "drbd":
            secondary = free.get(inst.secondaries[0]) if inst.secondaries else None
            if secondary is None or secondary[0] - inst.memory <= 0:
                return False
            secondary[0] -= inst.memory
    movable = [i for i in node.primaries if i.template in MOVABLE_TEMPLATES]
    others = [i for i in node.primaries if i.template not in MOVABLE_TEMPLATES and i.template != "drbd"]
    local, movable_new = kind
    new_disk = flavor.disk if local else 0
    if movable_new:  # the new ones move first, before the hosted movable ones
        if not _place_block(free, new, flavor.memory):
            return False
        new = 0
    if not _recreate(free, [(i.memory, 0) for i in sorted(movable, key=lambda i: i.name, reverse=True)]):
        return False
    hosted = sorted(((i.memory, i.disk if i.local_disk else 0) for i in others), reverse=True)
    larger = [item for item in hosted if item[0] >= flavor.memory]  # htools sorts by memory only
    smaller = hosted[len(larger) :]
    if not _recreate(free, larger):
        return False
    if not smaller:  # the new ones last: enough slots is enough
        return new <= sum(_slots_of((room[0], room[1]), flavor, local) for room in free.values())
    return _recreate(free, [(flavor.memory, new_disk)] * new + smaller)


def _place_block(free: dict[str, list[int]], count: int, memory: int) -> bool:
    """Place ``count`` instances of ``memory`` one at a time where the most memory is free;
    ``free`` is updated. False when one fits nowhere."""
    heap = [(-room[0], name) for name, room in free.items()]
    heapq.heapify(heap)
    for _ in range(count):
        if not heap or -heap[0][0] - memory <= 0:
            return False
        most, name = heapq.heappop(heap)
        free[name][0] = -most - memory
        heapq.heappush(heap, (-free[name][0], name))
    return True


def _recreate(free: dict[str, list[int]], moving: Sequence[tuple[int, int]]) -> bool:
    """Re-create ``moving`` (memory, disk) in order, each where the most memory is free and it
    fits; ``free`` is updated. False when one fits nowhere."""
    for memory, disk in moving:
        best = None
        for name, (mem_free, disk_free) in free.items():
            fits = mem_free - memory > 0 and (disk == 0 or disk_free - disk > 0)
            if fits and (best is None or mem_free > free[best][0]):
                best = name
        if best is None:
            return False
        free[best][0] -= memory
        free[best][1] -= disk
    return True
