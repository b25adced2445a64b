"""What the :class:`~synnefo_ganeti.allocate.Allocator` keeps of one backend (pure, no I/O).

:class:`BackendState` holds the last view, the reservations and their loads, the creates in
flight, the learned create time, and the nodes out of node choice for a while: ``full`` (a
create there failed for lack of room, or Ganeti refused the node as drained: until stats read
after that moment say so) and ``held`` (a job that takes the node out of placement, a drain
say, is in Ganeti's queue: until that job ends, :mod:`._node_signs`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from synnefo_ganeti.allocate._liveness import NodeLiveness
from synnefo_ganeti.allocate._nodes import NodeLoads
from synnefo_ganeti.allocate._views import BackendView, Reservation

__all__ = ["HOLD_SECONDS", "BackendState", "sync_out"]

#: seconds a node stays held for a job that takes it out (a drain waiting for the node's lock
#: behind a long create) when that job's end is never seen; the node reads and stats rule after
HOLD_SECONDS = 1800.0


@dataclass(slots=True)
class BackendState:
    view: BackendView
    order: int
    #: its nodes down or offline (out of placement and of its capacity)
    liveness: NodeLiveness
    reservations: dict[int, Reservation] = field(default_factory=dict)
    #: what ``reservations`` put on each node (kept with them: every change goes through it)
    loads: NodeLoads = field(default_factory=NodeLoads)
    # id -> monotonic time the job was accounted; dropped by the first update read after it.
    accounted: dict[int, float] = field(default_factory=dict)
    # id -> creates ahead of it (in flight when placed; in Ganeti when submitted), until its job ends.
    queue: dict[int, int] = field(default_factory=dict)
    sent: set[int] = field(default_factory=set)  # ids in ``queue`` that Ganeti has
    create_seconds: float | None = None  # learned by finished(); None until a create ended
    last_chosen: int = -1
    # node -> monotonic time a create there failed for lack of room; out until stats read after it
    full: dict[str, float] = field(default_factory=dict)
    # read_at of the node read that saw a node back; the backend is due for stats read since
    returned: float | None = None
    # job id -> (node, monotonic time first seen): a job in Ganeti's queue that takes the node
    # out of placement (drain, offline, removal); the node is out of node choice until it ends
    held: dict[int, tuple[str, float]] = field(default_factory=dict)

    def excluded(self, now: float) -> set[str] | dict[str, float]:
        """The nodes out of node choice now: ``full`` and ``held`` (holds older than
        :data:`HOLD_SECONDS` dropped)."""
        if not self.held:
            return self.full
        for job, (_, since) in list(self.held.items()):
            if now - since > HOLD_SECONDS:
                del self.held[job]
        return {*self.full, *(node for node, _ in self.held.values())}


def sync_out(backend: BackendState) -> None:
    """The view's ``out_nodes`` as the backend's node liveness says."""
    out = backend.liveness.out
    if backend.view.out_nodes != out:
        backend.view = dataclasses.replace(backend.view, out_nodes=out)
