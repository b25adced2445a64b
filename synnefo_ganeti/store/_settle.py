"""Requests settled by their create job's end, inside the writer's transaction.

The create job's end, stored by the watcher or the reconciler, ends the submitted
request with it: succeeded, failed or canceled; a create that failed for a reason of its
backend (no room, the OS missing there, the instance policy) goes back to be placed again
(up to :data:`MAX_ATTEMPTS` placements).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, bindparam, select, update

from synnefo_ganeti.jobs import JobStatus, JobSummary
from synnefo_ganeti.store._requests import RequestStatus, requests_t

__all__ = [
    "MAX_ATTEMPTS",
    "is_backend_error",
    "is_capacity_error",
    "settle_by_instance",
    "settle_job",
    "settle_requests",
]


#: the submitted requests of some create jobs of a backend (built once: read for every batch
#: of job ends)
_SUBMITTED = select(requests_t.c.id, requests_t.c.job_id, requests_t.c.attempts).where(
    requests_t.c.backend_id == bindparam("b_backend"),
    requests_t.c.job_id.in_(bindparam("b_jobs", expanding=True)),
    requests_t.c.status == RequestStatus.SUBMITTED.value,
)


def settle_requests(
    conn: Connection, backend_id: int, finals: Iterable[tuple[int, JobSummary]], now: datetime
) -> int:
    """The create jobs in ``finals`` ended: their submitted requests end with them."""
    by_job = dict(finals)
    if not by_job:
        return 0
    rows = conn.execute(_SUBMITTED, {"b_backend": backend_id, "b_jobs": list(by_job)}).all()
    ended: list[dict[str, Any]] = []
    for row in rows:
        summary = by_job[row.job_id]
        status, error = _outcome(summary)
        if status is RequestStatus.FAILED and is_backend_error(error) and row.attempts < MAX_ATTEMPTS:
            # The backend had no room after all (its node stats were older than the
            # creates that filled it), or lacks the OS, or its policy refused the spec:
            # the request goes back to be placed again (the dispatcher avoids that backend).
            why = "found no room" if is_capacity_error(error) else "was refused by its backend"
            conn.execute(
                update(requests_t)
                .where(requests_t.c.id == row.id, requests_t.c.status == RequestStatus.SUBMITTED.value)
                .values(
                    status=RequestStatus.PENDING.value,
                    backend_id=None,
                    job_id=None,
                    claimed_by=None,
                    claimed_at=None,
                    submitted_at=None,
                    error=f"job {row.job_id} {why} ({error}); placing it again",
                    updated_at=now,
                )
            )
            continue
        ended.append({"b_id": row.id, "b_status": status.value, "b_error": error, "b_now": now})
    if ended:
        conn.execute(_ENDED, ended)
    return len(rows)


# (many at once: a burst's job ends arrive together)
_ENDED = (
    update(requests_t)
    .where(requests_t.c.id == bindparam("b_id"), requests_t.c.status == RequestStatus.SUBMITTED.value)
    .values(
        status=bindparam("b_status"),
        error=bindparam("b_error"),
        finished_at=bindparam("b_now"),
        updated_at=bindparam("b_now"),
    )
)


def settle_by_instance(conn: Connection, backend_id: int, job_id: int, instance_status: str) -> None:
    """The reconciler settled a BUILD instance without the job's end: the request follows."""
    if instance_status in ("STARTED", "STOPPED"):
        status, error = RequestStatus.SUCCEEDED, None
    elif instance_status == "DESTROYED":  # a BUILD settled DESTROYED: its create was canceled
        status, error = RequestStatus.CANCELED, f"job {job_id} was canceled"
    elif instance_status == "ERROR":
        status, error = RequestStatus.FAILED, f"the reconciler found the instance {instance_status}"
    else:
        return
    settle_job(conn, backend_id, job_id, status, error)


def settle_job(
    conn: Connection, backend_id: int, job_id: int, status: RequestStatus, error: str | None
) -> None:
    """End the submitted request of create job ``job_id`` as ``status`` (a final one)."""
    now = datetime.now(UTC)
    conn.execute(
        update(requests_t)
        .where(
            requests_t.c.backend_id == backend_id,
            requests_t.c.job_id == job_id,
            requests_t.c.status == RequestStatus.SUBMITTED.value,
        )
        .values(status=status.value, error=error, finished_at=now, updated_at=now)
    )


#: placements of one request at most: a create that fails for lack of room is placed again
#: (elsewhere if need be) until this many attempts were made
MAX_ATTEMPTS = 5

_CAPACITY_ERRORS = (
    "not enough memory",
    "not enough disk",
    "insufficient_resources",
    "insufficient resources",
    "no valid allocation",
)


def is_capacity_error(message: str | None) -> bool:
    """Whether a failed create's message says the backend had no room (Ganeti's ECODE_NORES)."""
    text = (message or "").lower()
    return any(marker in text for marker in _CAPACITY_ERRORS)


#: a create that failed for these reasons (besides no room) may succeed on another backend:
#: the OS missing there (Ganeti's OS checks), its instance policy, a template it has not enabled
_BACKEND_ERRORS = (
    "not in supported os list",
    "directory for os",
    "os parameters validation failed",
    "violates policy",
    "is not enabled in cluster",
)


def is_backend_error(message: str | None) -> bool:
    """Whether a failed create's message blames its backend, not the spec: no room there
    (:func:`is_capacity_error`), or an OS, instance policy or disk template of that backend."""
    text = (message or "").lower()
    return is_capacity_error(message) or any(marker in text for marker in _BACKEND_ERRORS)


def _outcome(summary: JobSummary) -> tuple[RequestStatus, str | None]:
    status = summary.status
    if status is JobStatus.SUCCESS:
        return RequestStatus.SUCCEEDED, None
    if status is JobStatus.CANCELED:
        return RequestStatus.CANCELED, f"job {summary.job_id} was canceled"
    errors = [op.error for op in summary.ops if op.error]
    return RequestStatus.FAILED, errors[0] if errors else f"job {summary.job_id} ended in {status.value}"
