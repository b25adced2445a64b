"""A job's end applied to the store: the instance it ran against (status, task, columns) and the
request that made it (settled, or placed again), in the writer's transaction that records the end."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import Connection, Table, bindparam, insert, select, update

from synnefo_ganeti.jobs import JobStatus, JobSummary
from synnefo_ganeti.store.db._any import any_of
from synnefo_ganeti.store.db._many import execute_many
from synnefo_ganeti.store.instances._column_changes import changed_columns, renamed
from synnefo_ganeti.store.instances._instances import (
    InstanceAction,
    InstanceStatus,
    StoredInstance,
    get_instance_by_id,
    get_instance_row,
    instance_jobs_t,
    instance_status_after,
    instances_t,
    row_id_of,
)
from synnefo_ganeti.store.instances._outcomes import (
    changes_after,
    instance_unknown,
    job_message,
    last_error_after,
    shut_down,
    task_of,
)
from synnefo_ganeti.store.instances._recorded import notify_job_recorded
from synnefo_ganeti.store.jobs._rows import Job
from synnefo_ganeti.store.requests._settle import requests_placed_again, settle_requests

__all__ = ["apply_final_jobs", "record_job", "stored_final_job"]

jobs_t = cast(Table, Job.__table__)


def _end_time(summary: JobSummary) -> float | None:
    if summary.end_time is not None:
        return summary.end_time
    times = [op.end_time for op in summary.ops if op.end_time is not None]
    return max(times) if times else None


#: the unapplied recorded jobs of some job ids of a backend, with their instances' columns
#: (built once: built per call, its cache key cost the dispatcher more than running it)
_UNAPPLIED = (
    select(
        instance_jobs_t.c.job_id,
        instance_jobs_t.c.action,
        instance_jobs_t.c.start,
        instance_jobs_t.c.params,
        instances_t.c.id.label("instance_id"),
        instances_t.c.status,
        instances_t.c.beparams,
        instances_t.c.state_time,
        instances_t.c.task_job_id,
    )
    .join(instances_t, instances_t.c.id == instance_jobs_t.c.instance_id)
    .where(
        instance_jobs_t.c.backend_id == bindparam("b_backend"),
        any_of(instance_jobs_t.c.job_id, "b_ids"),
        instance_jobs_t.c.applied_at.is_(None),
    )
    .order_by(instance_jobs_t.c.job_id)
)


def apply_final_jobs(
    conn: Connection, finals: Iterable[tuple[int, int, JobSummary]], now: datetime | None = None
) -> int:
    """Apply the end of each final job recorded against an instance and not applied yet.

    ``finals`` are (backend id, job id, final summary). Returns how many instances changed.
    """
    now = now or datetime.now(UTC)
    by_backend: dict[int, dict[int, JobSummary]] = {}
    for backend_id, job_id, summary in finals:
        by_backend.setdefault(backend_id, {})[job_id] = summary
    changed = 0
    for backend_id, summaries in by_backend.items():
        ids = list(summaries)
        for start in range(0, len(ids), 500):
            rows = conn.execute(
                _UNAPPLIED, {"b_backend": backend_id, "b_ids": ids[start : start + 500]}
            ).all()
            applied: list[dict[str, Any]] = []
            moved: dict[tuple[str, ...], list[dict[str, Any]]] = {}
            current = changed_columns(conn, rows, summaries)
            # a request's create that is placed again (refused by name, its process lost, failed
            # for its backend or node, moved off a dead node) leaves its instance BUILD: the one
            # server of the request, never ERROR for one attempt (store/requests/_settle.py)
            again = requests_placed_again(conn, backend_id, rows, summaries)
            for row in rows:
                summary = summaries[row.job_id]
                applied.append(
                    {"b_backend": backend_id, "b_job": row.job_id, "b_result": summary.status.value}
                )
                if row.job_id in again:
                    freed: dict[str, Any] = {}
                    if row.task_job_id == row.job_id:
                        freed = {"task": None, "task_job_id": None, "updated_at": now}
                        moved.setdefault(tuple(sorted(freed)), []).append({**freed, "b_row": row.instance_id})
                    continue
                values = _after(row, summary, now, current.get(row.instance_id))
                if "name" in values:
                    values = renamed(conn, backend_id, row.instance_id, values, summary.job_id, now)
                if values:
                    moved.setdefault(tuple(sorted(values)), []).append({**values, "b_row": row.instance_id})
                    changed += "updated_at" in values
            if applied:
                execute_many(
                    conn, _APPLIED, [{**one, "b_now": now} for one in applied], key=("b_backend", "b_job")
                )
            for keys, values_of_rows in moved.items():
                execute_many(conn, _instance_update(keys), values_of_rows, key=("b_row",))
            creates = [
                (row.job_id, summaries[row.job_id]) for row in rows if row.action == InstanceAction.CREATE
            ]
            if creates:
                settle_requests(conn, backend_id, creates, now)
    return changed


def _after(
    row: Any, summary: JobSummary, now: datetime, current: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What the end of ``row``'s job changes on its instance ({}: nothing); ``current``: the
    instance's :data:`CHANGED_COLUMNS` (when its job changes some)."""
    status = summary.status
    action = InstanceAction(row.action)
    end = _end_time(summary)
    # the end of the job the instance's task waits for frees it (see store/instances/_outcomes.py)
    task = {"task": None, "task_job_id": None} if row.task_job_id == row.job_id else {}
    if row.state_time is not None and end is not None and end < row.state_time:
        return task  # an older job's end arriving late: the instance moved on since
    values: dict[str, Any] = {**task, **last_error_after(action.value, summary, now)}
    new_status = instance_status_after(action, status, start=row.start)
    gone = action is InstanceAction.REMOVE and status is JobStatus.ERROR
    if gone and instance_unknown(job_message(summary)):
        new_status = InstanceStatus.DESTROYED  # Ganeti has no such instance: it is gone
    if new_status is InstanceStatus.DESTROYED:
        # a deferred delete's mark ends with the instance, in the same write: its follower clears
        # it once the remove is sent, and a remove that ends first would leave a DESTROYED row
        # marked until then (as the request's settle does, store/requests/_settle.py)
        values.update(task=None, task_job_id=None, delete_requested_at=None)
    if new_status is None and action is InstanceAction.REINSTALL and shut_down(summary):
        new_status = InstanceStatus.STOPPED  # its shutdown ran, then the reinstall failed
    if new_status is not None and new_status.value != row.status:
        values["status"] = new_status.value
    if status is JobStatus.SUCCESS and row.params:
        # what the action changed, as asked (Ganeti's own values follow: dispatch/_observe.py)
        values.update(changes_after(action.value, row.params, current or row._mapping))
    if new_status is not None:  # a job deciding the status moves it; a failed action moves neither
        values["state_time"] = end if end is not None else row.state_time
    if not values:
        return {}
    values["updated_at"] = now
    return values


# job ends are applied many at once (executemany), with statements built once per shape
_APPLIED = (
    update(instance_jobs_t)
    .where(
        instance_jobs_t.c.backend_id == bindparam("b_backend"), instance_jobs_t.c.job_id == bindparam("b_job")
    )
    .values(applied_at=bindparam("b_now"), result=bindparam("b_result"))
)
_INSTANCE_UPDATES: dict[tuple[str, ...], Any] = {}


def _instance_update(keys: tuple[str, ...]) -> Any:
    """``UPDATE instances SET <keys> WHERE id = :b_row``, built once per set of keys."""
    statement = _INSTANCE_UPDATES.get(keys)
    if statement is None:
        statement = update(instances_t).where(instances_t.c.id == bindparam("b_row"))
        _INSTANCE_UPDATES[keys] = statement
    return statement


def stored_final_job(conn: Connection, backend_id: int, job_id: int) -> JobSummary | None:
    """The job's stored summary if the database holds it as final."""
    row = conn.execute(
        select(jobs_t.c.summary).where(jobs_t.c.backend_id == backend_id, jobs_t.c.job_id == job_id)
    ).first()
    if row is None:
        return None
    summary = JobSummary.from_json(row.summary)
    return summary if summary.status.is_final else None


def record_job(
    conn: Connection,
    backend_id: int,
    backend: str,
    name: str,
    job_id: int,
    action: InstanceAction,
    start: bool | None,
    params: dict[str, Any] | None,
) -> StoredInstance:
    """Record ``job_id`` against instance ``name``; a final end stored already is applied now."""
    now = datetime.now(UTC)
    instance = get_instance_row(conn, backend_id, backend, name)
    exists_already = conn.execute(
        select(instance_jobs_t.c.job_id).where(
            instance_jobs_t.c.backend_id == backend_id, instance_jobs_t.c.job_id == job_id
        )
    ).first()
    if exists_already is None:
        conn.execute(
            insert(instance_jobs_t).values(
                backend_id=backend_id,
                job_id=job_id,
                instance_id=row_id_of(conn, instance.id),
                action=action.value,
                start=start,
                params=params,
                recorded_at=now,
            )
        )
        notify_job_recorded(conn, backend)  # the dispatcher follows it (backends without a watcher)
        # the action is in progress until this job's end is applied (store/instances/_outcomes.py)
        conn.execute(
            update(instances_t)
            .where(instances_t.c.uuid == instance.id)
            .values(task=task_of(action.value), task_job_id=job_id)
        )
    if action is InstanceAction.CREATE:
        conn.execute(
            update(instances_t)
            .where(instances_t.c.uuid == instance.id)
            .values(create_job_id=job_id, updated_at=now)
        )
    summary = stored_final_job(conn, backend_id, job_id)
    if summary is None:
        return get_instance_by_id(conn, instance.id, backend)
    apply_final_jobs(conn, [(backend_id, job_id, summary)], now)
    row = conn.execute(select(instances_t).where(instances_t.c.uuid == instance.id)).first()
    if row is None:
        # a create that failed at once, its end stored before this record (another process read
        # the job first): applying it took away the BUILD row of an attempt that made nothing
        return dataclasses.replace(instance, status=InstanceStatus.DESTROYED, task=None, task_job_id=None)
    return StoredInstance.from_row(row, backend)
