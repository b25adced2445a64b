"""The allocator's node signs: a node down, offline, refused, full, or about to be drained.

:class:`NodeSigns`, a base of :class:`~synnefo_ganeti.allocate.Allocator`, takes what the
dispatcher learns of single nodes between two whole stats reads:

* a read of every node (:meth:`NodeSigns.nodes_seen`) and a failed job naming one
  (:meth:`NodeSigns.node_failed`): down or offline, out of placement (:mod:`._liveness`);
* a create refused for lack of room (:meth:`NodeSigns.node_full`) or because Ganeti takes the
  node as drained (:meth:`NodeSigns.node_refused`): out of node choice until stats read after;
* a job in Ganeti's queue that drains the node, sets it offline or removes it
  (:meth:`NodeSigns.hold_node`, seen by the queue watcher before the job runs): out of node
  choice until the job ends (:meth:`NodeSigns.job_ended`), then until stats read after its end.
  Without it, a create placed while the drain waits for the node's lock would reach Ganeti
  after the drain and be refused there.

Pure: no I/O, no clock unless asked.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from synnefo_ganeti.allocate._backend_state import BackendState, sync_out
from synnefo_ganeti.allocate._liveness import NodeChange, NodeState, NodeStateName, usability_changes
from synnefo_ganeti.allocate._views import Reservation
from synnefo_ganeti.rapi import Node

__all__ = ["NodeSigns"]


class NodeSigns:
    """Node signs and holds on the allocator (see the module)."""

    _backends: dict[str, BackendState]

    def node_full(self, reservation: Reservation, *, now: float | None = None) -> None:
        """The create failed for lack of room on its nodes (stale stats): they are out of node
        choice until stats read after ``now`` (the backend is due for a refresh meanwhile)."""
        backend = self._backends.get(reservation.name)
        if backend is not None:
            at = time.monotonic() if now is None else now
            for node in reservation.nodes:
                backend.full[node] = at

    def nodes_seen(
        self, name: str, nodes: Iterable[Node], *, read_at: float, now: float | None = None
    ) -> list[NodeChange]:
        """A read of every node of ``name`` begun at ``read_at`` (monotonic): nodes without live
        figures (or offline) out of placement, those with them back (read after the last sign
        against them); the changes. A node back makes the backend due for fresh stats; so does
        one drained (out of node choice at once) or undrained since the stats."""
        backend = self._backends.get(name)
        if backend is None:
            return []
        now = time.monotonic() if now is None else now
        nodes = list(nodes)
        changes = backend.liveness.seen(nodes, read_at=read_at, now=now)
        drained, undrained = usability_changes(backend.view.nodes, nodes)
        for node in drained:
            backend.full.setdefault(node, read_at)  # until stats read since, which say it
        if undrained or any(change.state is None for change in changes):
            backend.returned = read_at  # its figures: in the stats of this read, or a later one
        sync_out(backend)
        return changes

    def node_failed(
        self,
        name: str,
        node: str,
        state: NodeStateName = "down",
        detail: str | None = None,
        *,
        now: float | None = None,
    ) -> NodeChange | None:
        """A job failed naming ``node`` of ``name`` (an RPC to it failed, it is offline): out of
        placement at once, until a node read begun after now shows its figures; the change."""
        backend = self._backends.get(name)
        if backend is None:
            return None
        change = backend.liveness.failed(node, state, detail, now=now)
        sync_out(backend)
        return change

    def node_refused(self, name: str, node: str, *, now: float | None = None) -> None:
        """Ganeti refused ``node`` for a reason its next stats show (drained, not vm_capable): out
        of node choice until stats read after ``now``, as :meth:`node_full`."""
        backend = self._backends.get(name)
        if backend is not None:
            backend.full[node] = time.monotonic() if now is None else now

    def node_states(self, name: str) -> dict[str, NodeState]:
        """The nodes of ``name`` down or offline now, and since when and why."""
        backend = self._backends.get(name)
        return {} if backend is None else dict(backend.liveness.states)

    # -- jobs that take a node out (drain, offline, removal) -------------------------------------

    def hold_node(self, name: str, node: str, job_id: int, *, now: float | None = None) -> None:
        """Job ``job_id`` of ``name``, not ended, takes ``node`` out of placement (a drain, say:
        :func:`~synnefo_ganeti.jobs.node_taken_out`): out of node choice until
        :meth:`job_ended` (or :data:`HOLD_SECONDS`), so that no create goes there meanwhile."""
        backend = self._backends.get(name)
        if backend is not None and job_id not in backend.held:
            backend.held[job_id] = (node, time.monotonic() if now is None else now)

    def job_ended(self, name: str, node: str, job_id: int, *, ok: bool, now: float | None = None) -> None:
        """That job ended: its hold goes; when it succeeded, ``node`` stays out of node choice
        until stats read after ``now`` (which show it drained, offline or gone)."""
        backend = self._backends.get(name)
        if backend is None:
            return
        backend.held.pop(job_id, None)
        if ok:
            backend.full[node] = time.monotonic() if now is None else now

    def held_nodes(self, name: str) -> set[str]:
        """Nodes of ``name`` held out by jobs not ended (:meth:`hold_node`)."""
        backend = self._backends.get(name)
        return set() if backend is None else {node for node, _ in backend.held.values()}
