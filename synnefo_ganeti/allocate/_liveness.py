"""Which nodes of a backend are down or offline, from node reads and failed jobs (pure code).

A node that dies hard stays in Ganeti's node list (``GET /2/nodes?bulk=1``), but Ganeti no longer
reads its live figures: ``mtotal``, ``mfree``, ``dtotal``, ``dfree``, ``ctotal`` ... come back
``null`` (recorded on Ganeti 3.0: ``tests/fixtures/ganeti-3.0-nodefail/nodes_bulk_dead.json``;
Ganeti's query fills them from ``call_node_info``, which a dead node does not answer). Creates
placed there fail, naming it (:func:`synnefo_ganeti.store.node_fault`). Ganeti itself goes on
offering it to whoever names it as ``pnode``. So the dispatcher keeps, per backend, the nodes it
must leave out, and why (:class:`NodeLiveness`):

* **a read of the nodes** (:meth:`NodeLiveness.seen`): a node marked ``offline`` is "offline"; a
  node (vm_capable) whose memory figures are both null is "down" (the disk figures alone may be
  null on a cluster without LVM); a node with its figures is up again, but only when the read
  began after the last sign against it (a read that was on its way when a create failed there
  does not clear that failure), and a read that began before the latest one to show it up says
  nothing against it (the stats and the node reads overlap: the older one may answer last);
* **a failed job naming it** (:meth:`NodeLiveness.failed`): "down" (an RPC to it failed) or
  "offline" (Ganeti refused it as offline), at once; a later sign keeps the first one's ``since``
  and ``detail`` and moves ``marked_at`` on.

Each change is returned as a :class:`NodeChange` for the dispatcher to store (``backend_nodes``,
the instances' ``node_state``) and log; ``since`` is wall-clock time (``time.time()``), the
ordering of reads and signs monotonic time (``time.monotonic()``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from synnefo_ganeti.rapi import Node

__all__ = [
    "NO_FIGURES",
    "NodeChange",
    "NodeLiveness",
    "NodeState",
    "NodeStateName",
    "read_state",
    "usability_changes",
]

#: the states a node can be out of placement in ("up" is the absence of a record)
NodeStateName = Literal["down", "offline"]

#: the first sign of a node down that a node read gives
NO_FIGURES = "Ganeti no longer reads its live figures (mtotal and mfree null in /2/nodes)"
OFFLINE = "marked offline in Ganeti"
BACK = "Ganeti reads its live figures again"


@dataclass(frozen=True, slots=True)
class NodeState:
    """A node out of placement: ``state`` since ``since`` (wall clock), ``detail`` its first sign;
    ``marked_at`` (monotonic) the last sign: only a read begun after it may bring it back."""

    node: str
    state: NodeStateName
    since: float
    detail: str | None
    marked_at: float

    def to_json(self) -> dict[str, object]:
        return {"node": self.node, "state": self.state, "since": self.since, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class NodeChange:
    """A node went down or offline (``state``), or came back (``state`` None), at ``at`` (wall)."""

    backend: str
    node: str
    state: NodeStateName | None
    detail: str | None
    at: float = field(default_factory=time.time)


def read_state(node: Node) -> tuple[NodeStateName | None, str | None]:
    """What one read of ``node`` says: ("offline", why), ("down", why) or (None, None) (up)."""
    if node.offline:
        return "offline", OFFLINE
    if node.vm_capable is not False and node.mtotal is None and node.mfree is None:
        return "down", NO_FIGURES
    return None, None


class NodeLiveness:
    """The nodes of one backend that are down or offline (see the module)."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.states: dict[str, NodeState] = {}
        #: per node, when the latest read that showed it up began (monotonic)
        self._up_read_at: dict[str, float] = {}

    def __repr__(self) -> str:
        out = ", ".join(f"{s.node} {s.state}" for s in self.states.values()) or "none"
        return f"<NodeLiveness {self.backend}: out {out}>"

    @property
    def out(self) -> frozenset[str]:
        """The nodes out of placement now."""
        return frozenset(self.states)

    def _mark(
        self, node: str, state: NodeStateName, detail: str | None, now: float, wall: float
    ) -> NodeChange | None:
        current = self.states.get(node)
        if current is not None and (current.state == state or current.state == "offline"):
            # the same state (or offline, which a failure to reach it does not undo): the first
            # sign stays; only a read begun after this one may bring it back
            self.states[node] = NodeState(node, current.state, current.since, current.detail, now)
            return None
        self.states[node] = NodeState(node, state, wall, detail, now)
        return NodeChange(self.backend, node, state, detail, wall)

    def failed(
        self,
        node: str,
        state: NodeStateName,
        detail: str | None,
        *,
        now: float | None = None,
        wall: float | None = None,
    ) -> NodeChange | None:
        """A failed job names ``node`` as down (or offline): out at once; the change, if any."""
        now = time.monotonic() if now is None else now
        wall = time.time() if wall is None else wall
        return self._mark(node, state, detail, now, wall)

    def seen(
        self, nodes: Iterable[Node], *, read_at: float, now: float | None = None, wall: float | None = None
    ) -> list[NodeChange]:
        """A read of every node of the backend, begun at ``read_at`` (monotonic): the changes.

        A node the read does not list any more (removed from the cluster) is forgotten."""
        now = time.monotonic() if now is None else now
        wall = time.time() if wall is None else wall
        changes: list[NodeChange] = []
        listed: set[str] = set()
        for node in nodes:
            listed.add(node.name)
            state, why = read_state(node)
            if state is not None:
                if read_at < self._up_read_at.get(node.name, read_at):
                    continue  # a read begun before one that showed it up: what it says is older
                change = self._mark(node.name, state, why, now, wall)
                if change is not None:
                    changes.append(change)
                continue
            self._up_read_at[node.name] = max(read_at, self._up_read_at.get(node.name, read_at))
            current = self.states.get(node.name)
            if current is not None and current.marked_at <= read_at:
                del self.states[node.name]
                changes.append(NodeChange(self.backend, node.name, None, BACK, wall))
        for name in [name for name in self._up_read_at if name not in listed]:
            del self._up_read_at[name]
        for name in [name for name in self.states if name not in listed]:
            del self.states[name]
            changes.append(NodeChange(self.backend, name, None, "no longer in the cluster", wall))
        return changes


def _usable(node: Node) -> bool:
    return not node.drained and node.vm_capable is not False


def usability_changes(known: Iterable[Node], read: Iterable[Node]) -> tuple[set[str], set[str]]:
    """Nodes a read shows drained (or not vm_capable) that the ``known`` stats still take for
    usable, and the reverse: ``(unusable now, usable again)``. An operator's ``gnt-node modify
    --drained`` between two whole stats reads: the node reads (every health interval) tell it
    long before the stats do (issue 30: creates sent to a node drained 30 s before, refused)."""
    before = {node.name: _usable(node) for node in known}
    left: set[str] = set()
    back: set[str] = set()
    for node in read:
        was = before.get(node.name)
        if was is True and not _usable(node):
            left.add(node.name)
        elif was is False and _usable(node):
            back.add(node.name)
    return left, back
