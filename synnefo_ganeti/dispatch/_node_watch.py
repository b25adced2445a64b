"""Nodes down or offline: out of placement within one health interval of the first sign.

Design. A node that dies hard stays in Ganeti's node list; only its live figures go (``null``
in ``/2/nodes?bulk=1``, recorded on Ganeti 3.0), and creates placed there fail naming it. The
whole node stats (nodes, ``/2/info``, the OS list) are read every ``stats_interval`` (30 s):
too seldom to notice. So this mixin adds three signs, each acted on at once in the allocator
(:meth:`~synnefo_ganeti.allocate.Allocator.nodes_seen`,
:meth:`~synnefo_ganeti.allocate.Allocator.node_failed`; pure, see ``allocate/_liveness.py``):

* its root task ``dispatch nodes`` reads every healthy backend's nodes (``/2/nodes?bulk=1``
  alone: on a healthy cluster a tenth of a second; 5 s while a node is dead, Ganeti's RPC
  timeout) every ``health_interval`` (5 s at most): a node without its memory figures is down, one marked
  offline is offline, one with its figures again is back (the whole stats are read then);
* the whole stats read tells the same (:meth:`_nodes_read`);
* a job of any kind that ends with an error naming a node (an RPC to it failed, Ganeti refused
  it as offline: :func:`~synnefo_ganeti.store.node_fault`) marks it at once, from the writer's
  ``on_commit`` (:meth:`_note_node_faults`, which never blocks; the submitter calls it). A node
  refused as drained or not vm_capable is left out of node choice until the next stats, which
  say so themselves; so is one the node read shows drained (``gnt-node modify --drained`` behind
  the dispatcher's back) while the stats still take it for usable, and the stats are read at once;
* a job that drains a node, sets it offline or removes it (``nodes drain``, ``gnt-node modify``:
  :func:`~synnefo_ganeti.jobs.node_taken_out`), seen by the queue watcher as soon as Ganeti
  writes its file (queued), holds the node out of node choice until it ends
  (:meth:`~synnefo_ganeti.allocate.Allocator.hold_node`), and after a success until stats read
  since (:meth:`_node_job_seen`, through :class:`NodeJobsSink`). Without it a create placed while
  the drain waits for the node's lock reached Ganeti after the drain, to be refused there. Only
  the dispatcher that reads the job's file holds (the follow lease's holder); the others take the
  stats it stores, read at once after the job.

Several dispatchers on one PostgreSQL database read each backend's nodes once: the holder of its
follow lease (:mod:`._leases`) reads them every ``health_interval`` as above and writes their
states; each other dispatcher reads those states from ``backend_nodes`` at the same interval
(:meth:`_stored_nodes`: a node down or offline there is out here too; one up there that is out
here is read here once, to bring it back). The whole node stats are read by the same holder and
stored for the others (:mod:`._stats`); the signs of the jobs each one follows are its own.

What the allocator decides is written for the other processes (and ``backends show``) by the
same root task: each backend's nodes in ``backend_nodes`` (state, since, the first sign) after
every change and at least every ``stats_interval``; and each node that goes down, offline or
up again in ``Store.set_node_state`` (its instances marked, a change in the feed) when its row
in ``backend_nodes`` changed state (so two dispatchers mark it once, and a restart finds what
changed meanwhile). A sign is written within moments (the task wakes for it), a read's changes
right after the read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

from synnefo_ganeti.allocate import NodeChange, NodeState
from synnefo_ganeti.dispatch._base import DispatcherBase
from synnefo_ganeti.errors import GanetiError
from synnefo_ganeti.jobs import JobFile, JobStatus, JobSummary, node_taken_out
from synnefo_ganeti.rapi import Node
from synnefo_ganeti.store import JobVersion, NodeFault, NodeRow, Store, node_fault

__all__ = ["NODES_TASK", "NodeJobsSink", "NodeWatch"]

#: the opcodes :func:`~synnefo_ganeti.jobs.node_taken_out` looks into
_NODE_OPS = frozenset({"OP_NODE_SET_PARAMS", "OP_NODE_REMOVE"})

log = logging.getLogger("synnefo_ganeti.dispatch")

#: the name of the node reader's root task
NODES_TASK = "dispatch nodes"
#: seconds between reads of a backend's nodes at most (``health_interval`` when shorter): a read
#: takes 5 s on Ganeti while a node is dead (its RPC timeout), so a node that dies just after a
#: read begins is out of placement within about 10 s
NODES_READ_EVERY = 5.0


class NodeWatch(DispatcherBase):
    """Reads of the nodes, signs from failed jobs, and what they change (see the module)."""

    # -- signs -------------------------------------------------------------------------------------

    def _note_node_faults(self, backend: str, summary: JobSummary) -> NodeFault | None:
        """A final job of ``backend`` ended: the first node its errors blame, marked in the
        allocator now and written soon (never blocks: called in the writer's ``on_commit``)."""
        first: NodeFault | None = None
        if summary.end_time is not None and summary.end_time < self.stats.started_at:
            # a job that ended before this dispatcher started (its queue read at start): history,
            # not a sign; the node reads tell how the node is now
            return None
        for op in summary.ops:
            fault = node_fault(op.error)
            if fault is None or backend not in self._backends:
                continue
            first = first or fault
            if fault.kind == "drained" or fault.kind == "unusable":
                self.allocator.node_refused(backend, fault.node)
                continue
            change = self.allocator.node_failed(
                backend, fault.node, fault.kind, f"job {summary.job_id}: {op.error}"
            )
            if change is not None:
                self._node_changed(change)
                self._node_signs.setdefault(backend, set()).add(fault.node)
                self._node_wake.set()
        return first

    def _node_job_seen(self, backend: str, job: JobFile) -> None:
        """A version of a job with a node op, as the watcher read it (before the store has it):
        a node it takes out is held out of node choice while the op has not ended, and after
        it succeeded until the next stats (see the module)."""
        if backend not in self._backends:
            return
        for op in job.ops:
            node = node_taken_out(op.op_id, op.input)
            if node is None:
                continue
            if not op.status.is_final:
                if node not in self.allocator.held_nodes(backend):
                    log.info(
                        "backend %s: node %s out of node choice while job %s (%s) runs",
                        backend, node, job.job_id, op.op_id,
                    )  # fmt: skip
                self.allocator.hold_node(backend, node, job.job_id)
            elif job.end_time is None or job.end_time >= self.stats.started_at:
                ok = op.status is JobStatus.SUCCESS
                self.allocator.job_ended(backend, node, job.job_id, ok=ok)
                log.info(
                    "backend %s: job %s (%s of node %s) %s; %s", backend, job.job_id, op.op_id, node,
                    op.status.value, "the node out until fresh stats" if ok else "the node placed on again",
                )  # fmt: skip

    def _node_left(self, change: NodeChange) -> None:
        """A node went down or offline (see :class:`~synnefo_ganeti.dispatch._moves.NodeMoves`)."""

    def _node_changed(self, change: NodeChange) -> None:
        if change.state is not None:
            self._node_left(change)
        if change.state is None:
            log.warning("backend %s: node %s is up again (%s)", change.backend, change.node, change.detail)
            self._wake.set()  # requests waiting for room may fit now
        else:
            log.error(
                "backend %s: node %s is %s, out of placement: %s",
                change.backend,
                change.node,
                change.state,
                change.detail,
            )

    # -- reads -------------------------------------------------------------------------------------

    async def _nodes_loop(self) -> None:
        """Read every healthy backend's nodes each ``health_interval`` (5 s at most); write the signs that came
        meanwhile as they come."""
        options = self.settings.dispatcher
        next_read = 0.0
        while True:
            if time.monotonic() >= next_read or self._nodes_due:
                self._nodes_due = False
                next_read = time.monotonic() + min(options.health_interval, NODES_READ_EVERY)
                up = [n for n in self._backends if self.health is None or self.health.tracker.is_up(n)]
                # each backend's nodes read by one dispatcher, its follow lease's holder
                # (dispatch/_leases.py); the others take the states it stores
                leases = self.leases
                mine = [n for n in up if leases is None or leases.holds(n)]
                others = [n for n in up if n not in mine]
                await asyncio.gather(*(self._read_nodes(name) for name in mine), self._stored_nodes(others))
            self._node_wake.clear()
            await self._write_signs()
            if self._nodes_due:
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, next_read - time.monotonic())):
                    await self._node_wake.wait()

    async def _read_nodes(self, name: str) -> None:
        """One read of ``name``'s nodes (``/2/nodes?bulk=1``), bounded; nothing learned on failure."""
        options = self.settings.dispatcher
        timeout = max(options.health_interval, 2 * options.health_timeout)
        read_at = time.monotonic()
        try:
            client = await self.client(name)
            async with asyncio.timeout(timeout):
                nodes = await client.list_nodes()
        except TimeoutError:
            log.info("backend %s: nodes not read within %g s", name, timeout)
            return
        except (GanetiError, OSError) as exc:
            log.info("backend %s: nodes not read (%s)", name, exc)
            return
        await self._nodes_read(name, nodes, read_at, self.allocator.nodes_seen(name, nodes, read_at=read_at))

    #: a read of every backend's nodes is due now (a follow lease gained: :meth:`read_nodes_soon`)
    _nodes_due = False

    def read_nodes_soon(self) -> None:
        """Read the nodes now, not at the next interval (this dispatcher took a backend's lease)."""
        self._nodes_due = True
        self._node_wake.set()

    async def _stored_nodes(self, names: list[str]) -> None:
        """The nodes of ``names`` (read by another dispatcher) as it stored them: one down or
        offline there is out of placement here too; one up there but out here (since a sign of
        this dispatcher's own, or a state read before) is read here, once, to bring it back."""
        if not names:
            return
        try:
            stored = await self.store.backend_nodes()
        except GanetiError as exc:
            log.info("node states of %s not read (%s)", ", ".join(names), exc)
            return
        again: list[str] = []
        for name in names:
            if name not in self._backends:
                continue
            mine = self.allocator.node_states(name)
            back = False
            for row in stored.get(name, ()):
                node, state = row["name"], row["state"]
                if state in ("down", "offline"):
                    current = mine.get(node)
                    if current is None or current.state != state:
                        detail = row.get("detail") or f"{state}, as another dispatcher read it"
                        change = self.allocator.node_failed(name, node, state, detail)
                        if change is not None:
                            self._node_changed(change)
                elif node in mine:
                    back = True
            if back:
                again.append(name)
        await asyncio.gather(*(self._read_nodes(name) for name in again))

    async def _nodes_read(
        self, name: str, nodes: list[Node], read_at: float, changes: list[NodeChange]
    ) -> None:
        """After a read of every node of ``name`` begun at ``read_at`` gave ``changes`` (the
        allocator's :meth:`~synnefo_ganeti.allocate.Allocator.nodes_seen`): logged, and the
        backend's nodes written when something changed or the last write is old."""
        for change in changes:
            self._node_changed(change)
        if name not in self._backends:
            return
        last = self._nodes_written.get(name)
        if changes or last is None or read_at - last >= self.settings.dispatcher.stats_interval:
            rows = {node.name: self._node_row(name, node.name) for node in nodes}
            if await self._store_nodes(name, rows, complete=True):
                self._nodes_written[name] = read_at

    # -- writes ------------------------------------------------------------------------------------

    def _node_row(self, backend: str, node: str) -> NodeRow:
        state: NodeState | None = self.allocator.node_states(backend).get(node)
        if state is None:
            return NodeRow("up")
        return NodeRow(state.state, datetime.fromtimestamp(state.since, UTC), state.detail)

    async def _write_signs(self) -> None:
        signs, self._node_signs = self._node_signs, {}
        for backend, nodes in signs.items():
            if backend in self._backends:
                await self._store_nodes(backend, {node: self._node_row(backend, node) for node in nodes})

    async def _store_nodes(self, backend: str, rows: dict[str, NodeRow], *, complete: bool = False) -> bool:
        """Write ``rows`` to ``backend_nodes``; mark the instances of each node whose row changed
        state. False when the database could not (the next read or sign writes them)."""
        try:
            changed = await self.store.set_backend_nodes(backend, rows, complete=complete)
            for node, state in changed.items():
                row = rows[node]
                await self.store.set_node_state(
                    backend, node, None if state == "up" else state, detail=row.detail
                )
        except GanetiError as exc:
            log.warning("backend %s: node states not stored (%s); stored at the next read", backend, exc)
            self._nodes_written.pop(backend, None)
            return False
        return True


class NodeJobsSink:
    """The store, as a dispatcher's queue watcher hands it versions: a version of a job with a
    node op (``OP_NODE_SET_PARAMS``, ``OP_NODE_REMOVE``) is shown to ``seen`` first
    (:meth:`NodeWatch._node_job_seen`), so that placement knows of a drain as soon as Ganeti
    queued it, before the version's transaction commits."""

    __slots__ = ("_seen", "_store")

    def __init__(self, store: Store, seen: Callable[[str, JobFile], None]) -> None:
        self._store = store
        self._seen = seen

    async def put(self, version: JobVersion) -> None:
        job = version.job
        for op in job.ops:
            if op.op_id in _NODE_OPS:
                self._seen(version.backend, job)
                break
        await self._store.put(version)

    async def archived_final_job_ids(self, backend: str) -> set[int]:
        return await self._store.archived_final_job_ids(backend)
