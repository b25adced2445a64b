"""One action at a time on an instance: the task reserved before a job is sent to Ganeti.

The facade's actions (:mod:`synnefo_ganeti.control._actions`) run in three steps, so
that two callers (of any process) never both send a job for the same instance:

1. :func:`reserve_task`, in a writer transaction: the instance's ``task`` is set with no
   job yet; a task already in progress is a :class:`ConflictError` (a second delete
   gets the first delete's job id instead). Nothing has been sent to Ganeti.
2. The job is submitted; :func:`record_job` (``store/instances/_instances.py``) then records it and
   sets ``task_job_id``; the job's end, applied by the writer, clears the task.
3. A submit that failed: :func:`release_task` clears the reservation, and when Ganeti
   refused it, sets ``last_error`` (``job_id`` None).

A reservation whose process died between 1 and 3 would hold the instance for ever: one
with no job recorded for :data:`RESERVATION_TIMEOUT` seconds is taken as abandoned.

All functions here run inside the writer's transaction, on a synchronous connection.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Connection, select, update

from synnefo_ganeti.errors import ConflictError, NotFoundError
from synnefo_ganeti.store.instances._instances import (
    InstanceAction,
    InstanceStatus,
    StoredInstance,
    get_instance_by_id,
    get_instance_row,
    instance_jobs_t,
    instances_t,
    row_id_of,
)
from synnefo_ganeti.store.instances._outcomes import error_record, task_of

__all__ = ["RESERVATION_TIMEOUT", "Reservation", "destroy_missing", "release_task", "reserve_task"]

#: seconds after which a task reserved with no job recorded is taken as abandoned
RESERVATION_TIMEOUT = 300.0


@dataclass(frozen=True, slots=True)
class Reservation:
    """The instance as reserved; ``job_id`` set: nothing reserved, that delete is under way."""

    instance: StoredInstance
    job_id: int | None = None


def _age(when: datetime, now: datetime) -> float:
    if when.tzinfo is None:  # SQLite gives naive UTC times
        when = when.replace(tzinfo=UTC)
    return (now - when).total_seconds()


def _last_remove(conn: Connection, instance: StoredInstance) -> int | None:
    """The job id a delete returned for this DESTROYED instance: its remove (or its create's)."""
    last = conn.execute(
        select(instance_jobs_t.c.job_id, instance_jobs_t.c.action)
        .where(instance_jobs_t.c.instance_id == row_id_of(conn, instance.id))
        .order_by(instance_jobs_t.c.recorded_at.desc(), instance_jobs_t.c.job_id.desc())
        .limit(1)
    ).first()
    if last is None or last.action not in (InstanceAction.REMOVE.value, InstanceAction.CREATE.value):
        return None  # (a create: canceled or failed by a delete, which returned its id)
    return int(last.job_id)


def reserve_task(
    conn: Connection, backend_id: int, backend: str, name: str, action: InstanceAction
) -> Reservation:
    """Reserve ``action``'s task on instance ``name`` before its job is sent (see the module)."""
    now = datetime.now(UTC)
    instance = get_instance_row(conn, backend_id, backend, name)
    task = task_of(action.value)
    what = f"instance {name} of backend {backend}"
    if instance.status is InstanceStatus.DESTROYED:
        if action is InstanceAction.REMOVE:
            removed = _last_remove(conn, instance)
            if removed is not None:
                return Reservation(instance, removed)  # deleted already: the same answer again
        raise NotFoundError(f"{what} is DESTROYED")
    if instance.task is not None:
        if action is InstanceAction.REMOVE and instance.task == task and instance.task_job_id is not None:
            return Reservation(instance, instance.task_job_id)  # a second delete: the first one's job
        # a delete may follow a build the facade has seen end (its end not applied yet)
        overridable = action is InstanceAction.REMOVE and instance.task == task_of("create")
        abandoned = instance.task_job_id is None and _age(instance.updated_at, now) > RESERVATION_TIMEOUT
        if not (overridable or abandoned):
            job = f"job {instance.task_job_id}" if instance.task_job_id is not None else "its job being sent"
            raise ConflictError(
                f"{what} is busy: {instance.task!r} is in progress ({job}); "
                f"wait until it ends (the instance's task becomes None), then {action.value} it"
            )
    elif instance.status is InstanceStatus.BUILD and action is not InstanceAction.REMOVE:
        raise ConflictError(
            f"{what} is being built; wait until it is ACTIVE (STARTED), then {action.value} it"
        )
    conn.execute(
        update(instances_t)
        .where(instances_t.c.uuid == instance.id)
        .values(task=task, task_job_id=None, updated_at=now)
    )
    return Reservation(get_instance_by_id(conn, instance.id, backend))


def release_task(
    conn: Connection,
    backend_id: int,
    backend: str,
    name: str,
    action: InstanceAction,
    *,
    error: str | None = None,
    status: InstanceStatus | None = None,
) -> StoredInstance:
    """The submit of ``action`` failed: free the reservation; ``error``: Ganeti refused it.

    ``status``: the instance's new status (ERROR for a create Ganeti refused)."""
    now = datetime.now(UTC)
    instance = get_instance_row(conn, backend_id, backend, name)
    values: dict[str, object] = {}
    if instance.task == task_of(action.value) and instance.task_job_id is None:
        values.update(task=None, task_job_id=None)
    if error is not None:
        values["last_error"] = error_record(action.value, None, error, now)
    if status is not None:
        values["status"] = status.value
    if values:
        conn.execute(
            update(instances_t).where(instances_t.c.uuid == instance.id).values(**values, updated_at=now)
        )
    return get_instance_by_id(conn, instance.id, backend)


def destroy_missing(conn: Connection, backend_id: int, backend: str, name: str) -> StoredInstance:
    """Instance ``name`` (ERROR) is not in Ganeti: delete it without a job (DESTROYED)."""
    instance = get_instance_row(conn, backend_id, backend, name)
    if instance.status is not InstanceStatus.ERROR:
        raise ConflictError(
            f"instance {name} of backend {backend} is {instance.status}: only an ERROR instance "
            "that Ganeti does not have is deleted without a job"
        )
    conn.execute(
        update(instances_t)
        .where(instances_t.c.uuid == instance.id)
        .values(
            status=InstanceStatus.DESTROYED.value,
            task=None,
            task_job_id=None,
            last_error=None,
            updated_at=datetime.now(UTC),
        )
    )
    return get_instance_by_id(conn, instance.id, backend)
