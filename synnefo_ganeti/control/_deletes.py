"""A delete always wins: at any stage of an instance, it is taken at once and never refused as busy.

* A request's instance not submitted yet (waiting to be placed, placed, between attempts): its
  request is canceled for good; it never creates later (a dispatcher sending its create just now
  cancels the job while queued, or the delete follows the create's end).
* A create running: its job is canceled if Ganeti has not started it (nothing is made); else the
  delete is written (``instances.delete_requested_at``, store/requests/_deletes.py) and follows the
  create's end; a create that fails or would be placed again ends the request canceled instead.
* Another action running (stop, reboot, modify, ...): the delete is written and follows its end.
* Otherwise the remove is sent now, as :func:`~synnefo_ganeti.control._actions.delete` does.

The outcome comes by the change feed (DESTROYED). Deferred deletes are done by whoever follows
them: the dispatcher (every :data:`FOLLOW_EVERY` seconds and on its own writes), and the process
that deferred one, while any waits (:class:`DeleteFollower`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from synnefo_ganeti.control._actions import Owns, delete
from synnefo_ganeti.errors import ConflictError, GanetiError, JobNotFoundError, NotFoundError
from synnefo_ganeti.jobs import JobStatus
from synnefo_ganeti.rapi import RapiClient
from synnefo_ganeti.store import InstanceStatus, RequestStatus, Store, StoredInstance

__all__ = ["FOLLOW_EVERY", "DeleteFollower", "delete_always", "follow_deletes"]

log = logging.getLogger("synnefo_ganeti.control")

#: how often a follower looks for deferred deletes that may be done (besides its own writes)
FOLLOW_EVERY = 1.0
#: how long a delete waits for a create job it canceled to end (Ganeti ends a canceled queued job at once)
CANCELED_WAIT = 10.0

ClientOf = Callable[[str], Awaitable[RapiClient]]


async def delete_always(
    store: Store,
    client_of: ClientOf,
    instance: StoredInstance,
    *,
    owns: Owns | None,
    build_timeout: float | None = None,
) -> tuple[int | None, bool]:
    """Delete ``instance`` now or once what runs on it ends: (the job id, or None; deferred)."""
    if instance.request_id is not None and instance.status is not InstanceStatus.DESTROYED:
        request = await store.get_request(instance.request_id)
        if request is not None and request.status is RequestStatus.PENDING:
            request, done = await store.cancel_request(request.id)
            if done:
                log.info("delete of %s: its request %s is canceled for good", instance.id, request.id)
                return None, False
            # held by a dispatcher, or placed (its create may be in Ganeti): the dispatcher
            # honours the cancel; should the create be made after all, the delete follows it
            if instance.backend is not None:
                await store.defer_delete(instance.id, request_id=request.id)
            return None, True
    backend = instance.backend
    if backend is None:
        return None, False  # a request's instance that ended with nothing made: nothing to remove
    if instance.status is InstanceStatus.BUILD:
        job_id = await _cancel_build(store, await client_of(backend), instance, build_timeout)
        if job_id is not None:
            return job_id, False
        await store.defer_delete(instance.id, request_id=instance.request_id)
        return None, True
    if instance.owned and instance.task is not None and instance.task != "delete":
        await store.defer_delete(instance.id, request_id=instance.request_id)
        return None, True
    try:
        return await delete(store, await client_of(backend), backend, instance.name, owns=owns), False
    except ConflictError:
        # an action took the instance since it was read: the delete follows its end (any other
        # conflict, an instance not ours, is the caller's to see)
        now = await store.get_instance(None, None, id=instance.id)
        if now is None or not now.owned or now.task is None or now.task == "delete":
            raise
        await store.defer_delete(instance.id, request_id=instance.request_id)
        return None, True


async def _cancel_build(
    store: Store, client: RapiClient, instance: StoredInstance, timeout: float | None
) -> int | None:
    """Cancel a BUILD instance's create while Ganeti has not started it: its job id, the instance
    DESTROYED (it never exists); None: not canceled (being sent, or running)."""
    job_id = instance.create_job_id
    if job_id is None or instance.backend is None:
        return None
    try:
        canceled = await client.cancel_job(job_id)
    except GanetiError as exc:
        log.warning(
            "delete of %s: cannot cancel its create job %d (%s); it follows the create",
            instance.id,
            job_id,
            exc,
        )
        return None
    if not canceled.success:
        return None
    try:
        job = await client.wait_for_job(job_id, timeout=CANCELED_WAIT if timeout is None else timeout)
    except (JobNotFoundError, TimeoutError):
        job = None
    except GanetiError:
        job = None
    result = job.status if job is not None and job.is_final else JobStatus.CANCELED
    if result is JobStatus.SUCCESS:
        return None  # it ran after all: the remove follows (deferred)
    failure = job.failure if job is not None else None
    error = None if failure is None else f"{failure.type}: {failure.message}"
    log.info("delete of %s on %s: its create job %d was canceled", instance.name, instance.backend, job_id)
    await store.destroy_unbuilt(instance.backend, instance.name, job_id, result, error=error)
    return job_id


async def follow_deletes(store: Store, client_of: ClientOf, *, owns: Owns | None) -> int:
    """One pass over the deferred deletes that may be done now: each one sent; how many."""
    sent = 0
    for due in await store.deletes_due():
        try:
            client = await client_of(due.backend)
            job_id = await delete(store, client, due.backend, due.name, owns=owns)
        except ConflictError:
            continue  # busy again (an action sent meanwhile): the next pass
        except NotFoundError:
            await store.clear_delete(due.id)
            continue
        except GanetiError as exc:
            log.warning(
                "deferred delete of %s (%s on %s): %s; trying again", due.id, due.name, due.backend, exc
            )
            continue
        await store.clear_delete(due.id)
        log.info("deferred delete of %s (%s on %s) sent: job %s", due.id, due.name, due.backend, job_id)
        sent += 1
    return sent


class DeleteFollower:
    """The deferred deletes of one process, followed while any waits (a task started on demand)."""

    def __init__(
        self, store: Callable[[], Store], client_of: ClientOf, owns: Callable[[], Owns | None]
    ) -> None:
        self._store = store
        self._client_of = client_of
        self._owns = owns
        self._task: asyncio.Task[None] | None = None

    def kick(self) -> None:
        """A delete was deferred: follow until none waits."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="deferred deletes")

    async def _run(self) -> None:
        store = self._store()
        while await store.pending_deletes():
            try:
                await follow_deletes(store, self._client_of, owns=self._owns())
            except GanetiError as exc:
                log.warning("deferred deletes: %s; trying again", exc)
            await asyncio.sleep(0.2)  # (a busy writer commits all the time: not a pass per commit)
            await store.wait_for_change(FOLLOW_EVERY)

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
