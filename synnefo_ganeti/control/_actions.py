"""Actions on an instance with outcomes: one at a time, each followed to ``task`` and ``last_error``.

An action (start, stop, reboot, modify, delete, and the operations of
:mod:`synnefo_ganeti.control._operations`) runs in three steps (see
:mod:`synnefo_ganeti.store.instances._tasks`): the instance's task is reserved in a writer
transaction (a task in progress is a :class:`ConflictError`, raised before anything is
sent to Ganeti), the job is submitted, and the job is recorded (``task_job_id``); its
end, applied by the writer, clears the task and sets or clears ``last_error``. A submit
that fails gives the reservation back; one Ganeti refused (a :class:`RapiError`) also
sets ``last_error``. Each action's writes carry a reason of their own
(``?reason=synnefo-ganeti:<action>:<id>``, :func:`~synnefo_ganeti.rapi.job_reason`): when the
answer is lost after sending (a timeout, a broken connection, a 504), the job list is read for
it, and the job found is recorded and followed like any other; none found is an
:class:`~synnefo_ganeti.errors.OutcomeUnknownError` (the reservation given back, ``last_error``
saying so), never a failure.

Deletes follow what Synnefo expects:

* a second delete while the first one's job runs returns that job's id (and so does a
  delete of an instance its remove ended);
* an ERROR instance that Ganeti does not have (``GET /2/instances/NAME`` answers 404)
  ends DESTROYED without a job: :func:`delete` returns None;
* a remove job that fails because Ganeti has no such instance ends it DESTROYED
  (``store/instances/_instances.py``, applying the job's end).

Never what is not ours: an instance the store holds as not owned (the reconciler marks a
row whose instance in Ganeti lacks the ownership marks of ``[ownership]``:
``reconcile/_marks.py``) is refused every action with a :class:`ConflictError` naming it
and why, before anything is reserved or sent to Ganeti. Its delete too, except for an ERROR
row (a create that failed, often because an operator's VM holds the name): that one ends
DESTROYED without a job, Ganeti's instance left alone; as does an ERROR row whose name
Ganeti gives an instance lacking the marks (``owns``, asked before any remove is sent).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import Connection

from synnefo_ganeti.errors import (
    ConflictError,
    GanetiError,
    OutcomeUnknownError,
    RapiError,
    RapiNotFoundError,
)
from synnefo_ganeti.rapi import REASON_PREFIX, RapiClient, is_transient, is_unsent, job_reason
from synnefo_ganeti.store import InstanceAction, InstanceStatus, Store, StoredInstance
from synnefo_ganeti.store.instances._instances import get_instance_row
from synnefo_ganeti.store.instances._tasks import Reservation, destroy_missing, release_task, reserve_task

__all__ = ["delete", "refuse_not_owned", "run_action", "submit_refused"]

log = logging.getLogger("synnefo_ganeti.control")

Submit = Callable[[RapiClient], Awaitable[int]]


Precheck = Callable[[Connection], None]

#: ``owns(name, tags)``: whether an instance of Ganeti carries the ownership marks
Owns = Callable[[str, list[str]], bool]


def refuse_not_owned(instance: StoredInstance, action: InstanceAction) -> None:
    """:class:`ConflictError` for an action on an instance the store holds as not ours (the
    delete of an ERROR one excepted: it ends DESTROYED without a job, see :func:`delete`)."""
    if instance.owned or instance.status is InstanceStatus.DESTROYED:
        return
    if action is InstanceAction.REMOVE and instance.status is InstanceStatus.ERROR:
        return
    raise ConflictError(
        f"instance {instance.name} of backend {instance.backend} is not this control plane's: "
        "Ganeti's instance of that name lacks the ownership marks of [ownership] (the reconciler "
        f"reported it not_owned); no {action.value} is sent to Ganeti for it. An operator's VM is "
        "theirs to manage; delete an ERROR row of that name to forget it"
    )


async def _reserve(
    store: Store, backend: str, name: str, action: InstanceAction, precheck: Precheck | None = None
) -> Reservation:
    backend_id = await store.ensure_backend(backend)

    def reserve(conn: Connection) -> Reservation:
        refuse_not_owned(get_instance_row(conn, backend_id, backend, name), action)
        if precheck is not None:
            precheck(
                conn
            )  # in the reservation's transaction: a rename's new name free (store/requests/_names.py)
        return reserve_task(conn, backend_id, backend, name, action)

    return await store.call(reserve)


async def _release(
    store: Store, backend: str, name: str, action: InstanceAction, exc: BaseException | None
) -> None:
    """Give the reservation back after a failed submit (shielded: a cancelled caller too)."""
    error = str(exc) if isinstance(exc, RapiError | OutcomeUnknownError) else None
    backend_id = await store.ensure_backend(backend)
    release = store.call(lambda conn: release_task(conn, backend_id, backend, name, action, error=error))
    await asyncio.shield(release)


async def _submit_reserved(
    store: Store,
    client: RapiClient,
    backend: str,
    name: str,
    action: InstanceAction,
    call: Submit,
    params: dict[str, Any] | None,
    start: bool | None = None,
) -> int:
    reason = f"{REASON_PREFIX}{action.value}:{uuid.uuid4().hex}"
    try:
        with job_reason(reason):
            job_id = await call(client)
    except GanetiError as exc:
        if is_unsent(exc) or not (is_transient(exc) or _garbled(exc)):
            await _release(store, backend, name, action, exc)
            raise
        # the answer was lost after sending: the job may be in Ganeti (or reach it later)
        found = await _find_job(client, reason)
        if found is None:
            unknown = OutcomeUnknownError(
                f"{client.where}: the {action.value} of {name} got no answer ({exc}) and no job carries its "
                f"reason '{reason}' yet: it may still run (Ganeti can queue it after the answer was lost); "
                "look for that job before doing it again",
                url=client.url,
                reason=reason,
            )
            await _release(store, backend, name, action, unknown)
            raise unknown from exc
        log.warning(
            "%s of %s on %s: the answer was lost, found as job %d", action.value, name, backend, found
        )
        job_id = found
    except BaseException as exc:
        await _release(store, backend, name, action, exc)
        raise
    await store.record_instance_job(backend, name, job_id, action, params=params, start=start)
    return job_id


async def _find_job(client: RapiClient, reason: str) -> int | None:
    """The job whose reason trail holds ``reason``, or None (also when Ganeti cannot be asked)."""
    try:
        jobs = await client.list_jobs()
    except GanetiError:
        return None
    return next((job.id for job in jobs if reason in job.request_ids), None)


def _garbled(error: GanetiError) -> bool:
    """A success answer that is not a job id: Ganeti may hold the job."""
    return type(error) is RapiError and (error.status is None or error.status < 400)


async def run_action(
    store: Store,
    client: RapiClient,
    backend: str,
    name: str,
    action: InstanceAction,
    call: Submit,
    *,
    params: dict[str, Any] | None = None,
    start: bool | None = None,
    precheck: Precheck | None = None,
) -> int:
    """Reserve, submit and record ``action`` on instance ``name``; returns the job id.

    :class:`NotFoundError` for an instance the database lacks (or holds DESTROYED),
    :class:`ConflictError` while another action is in progress on it. ``params`` and
    ``start`` are recorded with the job (what its end changes, store/instances/_outcomes.py);
    ``precheck`` runs in the reservation's transaction and may refuse (a name taken)."""
    reservation = await _reserve(store, backend, name, action, precheck)
    if reservation.job_id is not None:
        return reservation.job_id
    return await _submit_reserved(store, client, backend, name, action, call, params, start)


async def _destroy_without_job(store: Store, backend: str, name: str, why: str) -> None:
    backend_id = await store.ensure_backend(backend)
    await store.call(lambda conn: destroy_missing(conn, backend_id, backend, name))
    log.info("delete of %s on %s: ERROR and %s: DESTROYED without a job", name, backend, why)


async def delete(
    store: Store, client: RapiClient, backend: str, name: str, *, owns: Owns | None = None
) -> int | None:
    """Remove instance ``name``: the remove's job id, or None when nothing was left to remove.

    ``owns``: an ERROR instance whose name Ganeti gives an instance lacking the ownership marks
    is not removed from Ganeti (it is not ours): it ends DESTROYED without a job."""
    reservation = await _reserve(store, backend, name, InstanceAction.REMOVE)
    if reservation.job_id is not None:
        return reservation.job_id
    if reservation.instance.status is InstanceStatus.ERROR:
        if not reservation.instance.owned:
            await _destroy_without_job(store, backend, name, "Ganeti's instance of that name is not ours")
            return None
        try:
            found = await client.get_instance(name)
        except RapiNotFoundError:
            await _destroy_without_job(store, backend, name, "not in Ganeti")
            return None
        except BaseException as exc:
            await _release(store, backend, name, InstanceAction.REMOVE, exc)
            raise
        if owns is not None and not owns(name, found.tags):
            await _destroy_without_job(store, backend, name, "Ganeti's instance of that name lacks our marks")
            return None
    return await _submit_reserved(
        store, client, backend, name, InstanceAction.REMOVE, lambda c: c.delete_instance(name), None
    )


async def submit_refused(
    store: Store, backend: str, name: str, action: InstanceAction, exc: BaseException
) -> None:
    """Ganeti refused the submit of ``action`` (a create: the instance ends ERROR): ``last_error`` says why."""
    backend_id = await store.ensure_backend(backend)
    status = InstanceStatus.ERROR if action is InstanceAction.CREATE else None
    await store.call(
        lambda conn: release_task(
            conn,
            backend_id,
            backend,
            name,
            action,
            error=str(exc) if isinstance(exc, RapiError) else f"{type(exc).__name__}: {exc}",
            status=status,
        )
    )
