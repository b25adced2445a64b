"""Creates still queued on a node that went down are moved off it: canceled while Ganeti has not
started them, and placed again elsewhere.

Design. Ganeti runs the creates of one node one at a time (each takes the node's lock), so a
burst leaves many queued behind the one running on each node. When that node dies, each of
them in turn takes the lock and fails on it (the lab: about 10 s each, RPC timeouts), and only
then is its request placed again: the dead node's queue drains at Ganeti's pace while the
other nodes stand idle (the node-faults benchmark: 20 creates queued on the dead node, the
last one placed elsewhere 60 to 90 s after the crash). So when a node leaves placement
(:class:`~synnefo_ganeti.dispatch._node_watch.NodeWatch`), the dispatcher cancels every create
it submitted there whose job Ganeti has not started (``DELETE /2/jobs/ID``; Ganeti cancels only
a job that is queued or waiting for its locks) after writing on the request why
(:meth:`~synnefo_ganeti.store.Store.mark_moving`): the canceled job's end then puts the request
back to be placed (``store/requests/_settle.py``), where the user's cancel would have ended it. A job
that already runs is left to end on its own (it fails naming the node, and the request is
placed again the same way). A job Ganeti lists but has not enqueued yet (a create found in the
job list after its POST's answer was lost: with a node dead, luxid writes the job to every master
candidate before it enqueues it) answers the cancel "not found in queue": the cancel is sent again
until Ganeti enqueues it (:meth:`~._base.DispatcherBase._cancel_queued`). One still not enqueued
after a minute is stranded: luxid wrote it and will not run it until it restarts (the 3-node lab,
2026-12-01: job 207 stayed listed "queued" for good, and its request, left to wait for its end,
kept a CI run waiting past its 240 s). Its request is placed again, on that backend only
(:meth:`~._reservations.ReservationSweep._job_stranded`): Ganeti refuses a second instance of its
name there, should the stranded job ever run.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Iterable

from synnefo_ganeti.allocate import NodeChange
from synnefo_ganeti.dispatch._wiring import BackendWiring
from synnefo_ganeti.errors import GanetiError
from synnefo_ganeti.rapi import RapiClient

__all__ = ["NodeMoves"]

log = logging.getLogger("synnefo_ganeti.dispatch")

#: looks (0.05 s apart) for the job id of a create just sent to be written before it is moved
RECORDING_WAIT_TRIES = 100


class NodeMoves(BackendWiring):
    """Cancel and place again the creates queued on a node that left placement (see the module)."""

    @functools.cached_property
    def _moving_tasks(self) -> set[asyncio.Task[int]]:
        return set()

    @functools.cached_property
    def _moved_jobs(self) -> set[tuple[str, int]]:
        """(backend, job id) of the creates canceled to be placed again, until their end is stored."""
        return set()

    def _node_left(self, change: NodeChange) -> None:
        """``change.node`` went down or offline: move off it what is still queued there."""
        if not self._claiming:
            return  # stopping: the next dispatcher reads the node again and moves what is left
        self._start_move(
            change.backend,
            change.node,
            _left_placement(change.backend, change.node, change.detail or change.state or "down"),
            None,
            f"move off {change.backend}/{change.node}",
        )

    def _answered_after_its_node_left(self, backend: str, job_id: int, nodes: Iterable[str]) -> None:
        """A create whose job id came back (and was recorded) after one of ``nodes`` left placement:
        Ganeti answered its POST late (with a node dying, the lab's master takes 15-30 s and more to
        turn a POST into a job), so the move off that node did not see it; move it off now."""
        if not self._claiming:
            return
        states = self.allocator.node_states(backend)
        left = next((states[node] for node in nodes if node in states), None)
        if left is None:
            return
        self._start_move(
            backend,
            left.node,
            _left_placement(backend, left.node, left.detail or left.state),
            job_id,
            f"move {backend} job {job_id} off {left.node}",
        )

    def _start_move(self, backend: str, node: str, reason: str, only: int | None, name: str) -> None:
        task = asyncio.create_task(self._move_off(backend, node, reason, only=only), name=name)
        self._moving_tasks.add(task)
        task.add_done_callback(self._moving_done)

    def _moving_done(self, task: asyncio.Task[int]) -> None:
        self._moving_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s failed", task.get_name(), exc_info=task.exception())

    async def _note_moving(self, request_id: str, job_id: int, backend: str, node: str, why: str) -> bool:
        """:meth:`~synnefo_ganeti.store.Store.mark_moving`, once the submitter has recorded the job
        (a create just sent is in ``_jobs`` before its job id is written): False when the request
        waits on that job no more."""
        for _ in range(RECORDING_WAIT_TRIES):
            if await self.store.mark_moving(request_id, job_id, backend=backend, node=node, why=why):
                return True
            request = await self.store.get_request(request_id)
            if (
                request is None
                or request.job_id is not None
                or request.is_final
                or (backend, job_id) not in self._jobs
            ):
                return False  # recorded, and waiting on another job or none: its job ended meanwhile
            await asyncio.sleep(0.05)  # placed, its job id being written: a moment
        return False

    @functools.cached_property
    def _moves_under_way(self) -> set[tuple[str, int]]:
        """(backend, job id) of the creates a move is canceling now (one move a create)."""
        return set()

    def _probe_stranded(self, backend: str, job_id: int) -> None:
        """A create of this dispatcher that Ganeti lists queued while a newer job has left the
        queue (:meth:`~._reservations.ReservationSweep._lost_jobs`): luxid may never have enqueued
        it. Its cancel tells: dequeued (Ganeti held it after all: placed again, as a move's), or
        "not found in queue" for a minute (stranded: :meth:`_job_stranded`)."""
        reservation = self._jobs.get((backend, job_id))
        if not self._claiming or reservation is None:
            return
        if (backend, job_id) in self._moves_under_way:
            return  # asked already
        reason = (
            f"job {job_id} stayed queued on {backend} while newer jobs started; asked whether Ganeti holds it"
        )
        log.warning("%s (its cancel tells)", reason)
        node = reservation.node or "(Ganeti's choice)"
        self._start_move(backend, node, reason, job_id, f"probe {backend} job {job_id}")

    async def _move_off(self, backend: str, node: str, reason: str, *, only: int | None = None) -> int:
        """Cancel the creates this dispatcher submitted on ``node`` (``only``: that job, wherever it
        is) that Ganeti has not started; returns how many it canceled. ``reason``: what each
        request is told."""
        placed = [
            (job_id, self._job_requests.get((name, job_id)))
            for (name, job_id), reservation in list(self._jobs.items())
            if name == backend and (job_id == only if only is not None else node in reservation.nodes)
        ]
        if not placed or backend not in self._backends:
            return 0
        client = await self.client(backend)
        moved = 0
        for job_id, request_id in placed:
            key = (backend, job_id)
            if request_id is None or key in self._moves_under_way or key in self._moved_jobs:
                continue  # (moved already, or being moved: by its node's move or its late answer's)
            self._moves_under_way.add(key)
            try:
                moved += await self._move_one(client, backend, node, job_id, request_id, reason)
            finally:
                self._moves_under_way.discard(key)
        if moved:
            self.stats.moved += moved
        return moved

    async def _move_one(
        self, client: RapiClient, backend: str, node: str, job_id: int, request_id: str, reason: str
    ) -> int:
        """Cancel one create queued on ``node``, noted on its request first; 1 if Ganeti canceled it."""
        try:
            # first the note, then the cancel: the canceled job's end may be stored at once
            if not await self._note_moving(request_id, job_id, backend, node, reason):
                return 0  # its job ended meanwhile
            self._moved_jobs.add((backend, job_id))
            try:
                result, stranded = await self._cancel_queued(client, job_id)
            except GanetiError:
                self._moved_jobs.discard((backend, job_id))
                await self.store.unmark_moving(request_id, job_id)
                raise
            if not result.success:
                self._moved_jobs.discard((backend, job_id))
                await self.store.unmark_moving(request_id, job_id)
                if stranded:  # (counted apart: DispatcherStats.stranded)
                    await self._job_stranded(backend, node, job_id, request_id)
                    return 0
        except GanetiError as exc:
            log.warning(
                "request %s: job %d on %s not canceled (%s); it ends on its own",
                request_id,
                job_id,
                node,
                exc,
            )
            return 0
        if not result.success:
            log.info(
                "request %s: job %d on %s not canceled (%s); it ends on its own",
                request_id,
                job_id,
                node,
                result.message,
            )
            return 0
        log.warning("request %s: job %d canceled while queued on %s; placed again", request_id, job_id, node)
        return 1


def _left_placement(backend: str, node: str, why: str) -> str:
    """What a request whose create is moved off ``node`` is told."""
    return f"node {node} of {backend} left placement ({why})"
