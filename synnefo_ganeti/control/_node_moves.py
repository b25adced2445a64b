"""The facade's evacuate_node, failover_node (moving a node's instances away): :class:`NodeMoves`, a base of :class:`~synnefo_ganeti.ControlPlane`.

Both read the node and its primary instances from Ganeti, decide every move in pure code
(:func:`~synnefo_ganeti.control._node_plan.plan_moves`: live-migrate what runs, fail over the
rest, skip what Ganeti cannot move; the target by our node placement, by the instance's
secondary for ``drbd``, or by Ganeti's iallocator when one is named), then run the moves one
at a time, each job followed to its end:

* an instance of ours (the store holds it, owned) moves through the facade's action machinery
  (:func:`~synnefo_ganeti.control._actions.run_action`, as ``migrate_instance`` and
  ``failover_instance``): its task reserved (one busy with another action is reported failed,
  nothing sent), the job recorded with its target, the job's end stored as soon as it ended
  (the watcher or the dispatcher may store it too: versions merge), and Ganeti's ``pnode``
  stored once it succeeded (an iallocator's choice is known only then);
* an instance the store does not hold as ours (an operator's VM on the node) is moved too,
  through the RAPI client directly, and reported ``owned`` false: the store is not touched.

Moves run one after the other: Ganeti locks the source node for each, so sending them at once
gains nothing, and our placement then sees what the previous moves took.

Why ``evacuate_node`` wants the node drained first (a :class:`ConflictError` that says how,
rather than a flag that drains it): draining is a change of the node an operator makes on
purpose and undoes on purpose (``nodes drain`` / ``undrain``); while the node is not drained
the dispatcher may place new instances on it in the middle of the evacuation, and an
evacuate that drained silently would leave the node drained after a failed run without the
operator having asked for it. ``failover_node`` is for a dead node: it marks the node offline
first (``OpNodeSetParams offline``, ``auto_promote`` so that a master candidate's role passes
to another), which makes Ganeti stop asking it anything and lets the failovers proceed. It
refuses (:class:`ConflictError`) while Ganeti still reads the node's live figures unless
``yes=True``: marking a live node offline and starting its instances elsewhere runs each of
them twice.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from synnefo_ganeti.control._actions import run_action
from synnefo_ganeti.control._node_plan import (
    InstanceMove,
    MoveAction,
    MoveOutcome,
    NodeMoveReport,
    PlannedMove,
    Progress,
    plan_moves,
)
from synnefo_ganeti.errors import ConflictError, GanetiError, JobFailedError, NotFoundError
from synnefo_ganeti.rapi import Node, RapiClient
from synnefo_ganeti.reconcile import job_file
from synnefo_ganeti.store import InstanceAction, InstanceStatus, record_observed

if TYPE_CHECKING:
    from synnefo_ganeti.config import Settings
    from synnefo_ganeti.store import Store

__all__ = ["NodeMoves"]

log = logging.getLogger("synnefo_ganeti.control")

Submit = Callable[[RapiClient], Awaitable[int]]


class NodeMoves:
    """evacuate_node, failover_node on the facade (see the module)."""

    if TYPE_CHECKING:

        @property
        def store(self) -> Store: ...

        @property
        def settings(self) -> Settings: ...

        async def client(self, backend: str) -> RapiClient: ...

    async def evacuate_node(
        self,
        backend: str,
        node: str,
        *,
        iallocator: str | None = None,
        progress: Progress | None = None,
        priority: int | None = None,
    ) -> NodeMoveReport:
        """Move every primary instance off ``node`` of ``backend``: live-migrate what runs, fail
        over the rest, to the node our placement picks (or ``iallocator``'s choice, e.g. "hail");
        each job followed to its end, sent at ``priority`` (Ganeti's default when None; a rolling
        maintenance sends its moves low). Returns the report (per instance: action, target, job,
        outcome, error); an instance that could not move is in it, not raised.

        The node must be drained first (:class:`ConflictError` otherwise, naming the command);
        an offline node, or one that does not answer, is failover_node's (ConflictError), and the
        master is refused (Ganeti drains it only after a master failover). An unknown backend is a ConfigError, an unknown
        node a :class:`NotFoundError`."""
        self.settings.backend(backend)
        client = await self.client(backend)
        found = await _node(client, backend, node)
        if found.offline:
            raise ConflictError(
                f"node {node} of backend {backend} is offline: Ganeti reaches it no more, so nothing "
                f"can migrate off it; fail its instances over instead ('synnefo-ganeti nodes failover "
                f"{backend} {node}')"
            )
        if found.role == "M":
            raise ConflictError(
                f"node {node} is the master of backend {backend}: Ganeti drains the master only after a "
                "master failover; run 'gnt-cluster master-failover' on another master candidate, then drain "
                "and evacuate it"
            )
        if found.mfree is None:
            raise ConflictError(
                f"node {node} of backend {backend} does not answer Ganeti (its live figures do not read): "
                "nothing can migrate off it; if it is dead, fail its instances over instead "
                f"('synnefo-ganeti nodes failover {backend} {node}')"
            )
        if not found.drained:
            raise ConflictError(
                f"node {node} of backend {backend} is not drained: drain it first ('synnefo-ganeti nodes "
                f"drain {backend} {node}') so that no new instance lands there while its instances move away"
            )
        return await self._move_all(
            backend, client, node, "evacuate", iallocator=iallocator, progress=progress, priority=priority
        )

    async def failover_node(
        self, backend: str, node: str, *, yes: bool = False, progress: Progress | None = None
    ) -> NodeMoveReport:
        """Recover the instances of a dead ``node``: mark it offline in Ganeti (unless it is
        already), then fail each primary instance over with ``ignore_consistency`` to the node
        our placement picks (``drbd``: its secondary), each job followed to its end.

        :class:`ConflictError` while Ganeti still reads the node's live figures (it is not dead)
        unless ``yes=True``, which says the node is really dead or fenced; and for the master
        (``gnt-cluster master-failover`` first). A job that could not mark the node offline
        raises :class:`JobFailedError`, nothing moved."""
        self.settings.backend(backend)
        client = await self.client(backend)
        found = await _node(client, backend, node)
        if found.role == "M":
            raise ConflictError(
                f"node {node} is the master of backend {backend}: Ganeti changes the master's role only "
                "by a master failover; run 'gnt-cluster master-failover' on another master candidate first"
            )
        marked = False
        if not found.offline:
            if found.mfree is not None and not yes:
                raise ConflictError(
                    f"node {node} of backend {backend} still answers Ganeti (its live figures read): it "
                    "does not look dead. Marking it offline and starting its instances elsewhere would run "
                    "them twice; drain and evacuate it instead, or pass --yes (yes=True) only if the node "
                    "is really dead or fenced"
                )
            job_id = await client.modify_node(node, offline=True, auto_promote=True)
            job = await client.wait_for_job(job_id)
            if job.status.value != "success":
                why = job.failure.message if job.failure is not None else f"it ended {job.status.value}"
                message = f"{client.where}: marking node {node} offline failed (job {job_id}): {why}"
                if job.failure is None:
                    raise GanetiError(message, url=client.url)
                raise JobFailedError(message, url=client.url, job_id=job_id, failure=job.failure)
            marked = True
            log.warning("node %s of %s marked offline (job %d)", node, backend, job_id)
        return await self._move_all(
            backend, client, node, "failover", failover=True, progress=progress, marked_offline=marked
        )

    # -- the moves -------------------------------------------------------------------------------

    async def _move_all(
        self,
        backend: str,
        client: RapiClient,
        node: str,
        operation: str,
        *,
        iallocator: str | None = None,
        failover: bool = False,
        progress: Progress | None = None,
        marked_offline: bool = False,
        priority: int | None = None,
    ) -> NodeMoveReport:
        instances, nodes = await client.list_instances(), await client.list_nodes()
        live = [s for s in InstanceStatus if s is not InstanceStatus.DESTROYED]
        rows = await self.store.list_instances(backend=backend, status=live)
        ours = {r.name for r in rows if r.owned}
        plan = plan_moves(node, instances, nodes, ours=ours, iallocator=iallocator, failover=failover)
        total = len(plan)
        if progress is not None:
            progress(0, total, None)
        moves: list[InstanceMove] = []
        for planned in plan:
            move = await self._move_one(
                backend, client, planned, iallocator, ignore_consistency=failover, priority=priority
            )
            moves.append(move)
            log.info(
                "%s of %s: %s %s to %s: %s%s", operation, node, move.action.value, move.name,
                move.target or "?", move.outcome.value, f" ({move.error})" if move.error else "",
            )  # fmt: skip
            if progress is not None:
                progress(len(moves), total, move)
        return NodeMoveReport(
            backend, node, operation, tuple(moves), iallocator=iallocator, marked_offline=marked_offline
        )

    async def _move_one(
        self,
        backend: str,
        client: RapiClient,
        planned: PlannedMove,
        iallocator: str | None,
        *,
        ignore_consistency: bool,
        priority: int | None = None,
    ) -> InstanceMove:
        name, target = planned.name, planned.target

        def result(
            outcome: MoveOutcome, job_id: int | None, error: str | None, to: str | None
        ) -> InstanceMove:
            return InstanceMove(name, planned.action, to, job_id, outcome, error, planned.owned)

        if planned.action is MoveAction.NONE:
            return result(MoveOutcome.SKIPPED, None, planned.why, None)
        chooser = None if target is not None else iallocator
        if planned.action is MoveAction.MIGRATE:
            action = InstanceAction.MIGRATE

            def call(c: RapiClient) -> Awaitable[int]:
                return c.migrate_instance(name, target_node=target, iallocator=chooser, priority=priority)
        else:
            action = InstanceAction.FAILOVER

            def call(c: RapiClient) -> Awaitable[int]:
                return c.failover_instance(
                    name,
                    target_node=target,
                    iallocator=chooser,
                    ignore_consistency=ignore_consistency or None,
                    priority=priority,
                )

        try:
            if planned.owned:
                job_id = await run_action(
                    self.store, client, backend, name, action, call, params={"target_node": target}
                )
            else:
                job_id = await call(client)
        except GanetiError as exc:  # busy (another action), or refused by Ganeti: nothing runs
            return result(MoveOutcome.FAILED, None, str(exc), target)
        try:
            job = await client.wait_for_job(job_id)
        except GanetiError as exc:
            return result(MoveOutcome.FAILED, job_id, f"job {job_id} could not be followed: {exc}", target)
        if planned.owned:
            await self.store.record(backend, job_file(job))  # its end applied now: task cleared, pnode set
        if job.status.value != "success":
            error = (
                job.failure.message if job.failure is not None else f"job {job_id} ended {job.status.value}"
            )
            return result(MoveOutcome.FAILED, job_id, error, target)
        try:
            landed = (await client.get_instance(name)).pnode or target
        except GanetiError:
            landed = target
        if planned.owned and landed is not None:
            await record_observed(self.store, backend, {name: {"pnode": landed}})
        return result(MoveOutcome.MOVED, job_id, None, landed)


async def _node(client: RapiClient, backend: str, node: str) -> Node:
    try:
        return await client.get_node(node)
    except NotFoundError:
        names = ", ".join(sorted(n.name for n in await client.list_nodes()))
        raise NotFoundError(f"backend {backend} has no node {node}; its nodes: {names}") from None
