"""Requests settled by their create job's end, inside the writer's transaction.

The create job's end, stored by the watcher or the reconciler, ends the submitted
request with it: succeeded, failed or canceled; a create that failed for a reason of its
backend (no room, the OS missing there, the instance policy) or of its node (down, offline, drained:
:mod:`._node_errors`) goes back to be placed again. Every failed create is kept in the request's
``attempt_errors``; the dispatcher fails a request once ``[dispatcher] max_attempts`` creates of
it failed (it knows the setting; this transaction may run in any process).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, bindparam, delete, select, update

from synnefo_ganeti.jobs import JobStatus, JobSummary
from synnefo_ganeti.store.db._any import any_of
from synnefo_ganeti.store.db._checked import checked
from synnefo_ganeti.store.db._many import execute_many
from synnefo_ganeti.store.instances._node_errors import is_node_error, named_node
from synnefo_ganeti.store.requests._requests import (
    RequestStatus,
    backends_t,
    instances_t,
    requests_t,
)

__all__ = [
    "PLACED_AGAIN",
    "attempt_error",
    "disposition",
    "is_backend_error",
    "is_capacity_error",
    "is_job_death_error",
    "is_name_taken_error",
    "marked_attempt",
    "requests_placed_again",
    "settle_by_instance",
    "settle_job",
    "settle_requests",
    "unsubmit",
    "waits_on",
]


#: the submitted requests of some create jobs of a backend (built once: read for every batch
#: of job ends)
_SUBMITTED = select(
    requests_t.c.id,
    requests_t.c.job_id,
    requests_t.c.attempts,
    requests_t.c.attempt_errors,
    requests_t.c.cancel_requested,
    requests_t.c.instance_uuid,
).where(
    requests_t.c.backend_id == bindparam("b_backend"),
    any_of(requests_t.c.job_id, "b_jobs"),
    checked(requests_t.c.status) == RequestStatus.SUBMITTED.value,
)


#: what a create job's end does to its submitted request (:func:`disposition`)
REFUSED, DIED, MOVED, AGAIN, ENDED, FAILED = "refused", "died", "moved", "again", "ended", "failed"
#: the dispositions after which the request is placed again: the instance stays BUILD (the one
#: server its request makes, whatever its attempts), never ERROR for an attempt that failed
PLACED_AGAIN = frozenset({REFUSED, DIED, MOVED, AGAIN})


def disposition(row: Any, summary: JobSummary) -> str:
    """What the end ``summary`` of ``row``'s create job (a submitted request: ``cancel_requested``,
    ``attempt_errors``, ``job_id``) does to it: one of :data:`REFUSED` (Ganeti refused it by name),
    :data:`DIED` (its process lost), :data:`MOVED` (canceled to be placed elsewhere), :data:`AGAIN`
    (failed for a reason of its backend or node: placed again), :data:`ENDED` (succeeded or
    canceled) or :data:`FAILED`."""
    status, error = _outcome(summary)
    if status is RequestStatus.FAILED and is_name_taken_error(error):
        return REFUSED
    if status is RequestStatus.FAILED and is_job_death_error(error):
        return DIED
    if status is RequestStatus.CANCELED and not row.cancel_requested and _moving(row) is not None:
        return MOVED
    if status is not RequestStatus.FAILED:
        return ENDED
    if is_backend_error(error) or is_node_error(error) is not None:
        return AGAIN
    return FAILED


def requests_placed_again(
    conn: Connection, backend_id: int, rows: Iterable[Any], summaries: dict[int, JobSummary]
) -> dict[int, str]:
    """Of the create jobs among ``rows`` (instance-job rows with ``job_id`` and ``action``), those
    whose submitted request goes back to be placed again, with their :func:`disposition`: their
    instance is not moved by the job's end (read only when some job may be)."""
    maybe = [
        row.job_id
        for row in rows
        if row.action == "create" and summaries[row.job_id].status is not JobStatus.SUCCESS
    ]
    if not maybe:
        return {}
    found = conn.execute(_SUBMITTED, {"b_backend": backend_id, "b_jobs": maybe}).all()
    again = {row.job_id: disposition(row, summaries[row.job_id]) for row in found}
    return {job: kind for job, kind in again.items() if kind in PLACED_AGAIN}


def settle_requests(
    conn: Connection, backend_id: int, finals: Iterable[tuple[int, JobSummary]], now: datetime
) -> int:
    """The create jobs in ``finals`` ended: their submitted requests end with them."""
    by_job = dict(finals)
    if not by_job:
        return 0
    rows = conn.execute(_SUBMITTED, {"b_backend": backend_id, "b_jobs": list(by_job)}).all()
    ended: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    backend: list[str] = []  # its name, read once when a create failed
    for row in rows:
        summary = by_job[row.job_id]
        status, error = _outcome(summary)
        kind = disposition(row, summary)
        if row.cancel_requested and kind in (REFUSED, AGAIN):
            # deleted while its create ran, and the create made nothing: never placed again
            _cancel_deleted(
                conn, row, now, f"deleted while being built; job {row.job_id} made nothing ({error})"
            )
            continue
        if kind == REFUSED:
            # Ganeti refused it by name: a duplicate of this request's own create (sent again
            # after an answer was lost; the request's outcome is then the first job's) or
            # someone else's instance. Placed again on this backend, unsubmitted: the
            # dispatcher asks Ganeti which (the jobs carrying its id, the instance's tags).
            unsubmit(
                conn,
                row.id,
                now,
                error=f"job {row.job_id} was refused ({error}); asking Ganeti whose instance holds the name",
            )
            continue
        if kind == DIED:
            # Ganeti lost the job's process mid-way (its master died: the new master's luxid fails
            # every job it finds started, "detected death of job N"): its instance may exist or
            # not. Still placed on this backend, unsubmitted, an attempt counted: the dispatcher
            # asks Ganeti (an instance carrying the request's tag settles it; none: sent again).
            if not backend:
                backend.append(conn.execute(_BACKEND_NAME, {"b_backend": backend_id}).scalar_one())
            unsubmit(
                conn,
                row.id,
                now,
                error=f"job {row.job_id} died in Ganeti ({error}); asking Ganeti whether it made the instance",
                attempt_errors=[*(row.attempt_errors or ()), attempt_error(row, backend[0], error, now)],
            )
            continue
        if kind == MOVED:
            # canceled by the dispatcher while still queued on a node that went down: Ganeti
            # made nothing, and the request goes back to be placed elsewhere
            unsubmit(
                conn,
                row.id,
                now,
                error=f"job {row.job_id} was canceled while queued ({_moving(row)}); placing it again",
                placed=False,
                instance_uuid=row.instance_uuid,
            )
            continue
        if kind == ENDED:
            ended.append({"b_id": row.id, "b_status": status.value, "b_error": error, "b_now": now})
            continue
        if not backend:
            backend.append(conn.execute(_BACKEND_NAME, {"b_backend": backend_id}).scalar_one())
        attempts = [*(row.attempt_errors or ()), attempt_error(row, backend[0], error, now)]
        node = is_node_error(error)
        if kind == AGAIN:
            # The backend had no room after all (its node stats were older than the
            # creates that filled it), or lacks the OS, or its policy refused the spec: the
            # request goes back to be placed again (the dispatcher avoids that backend). Or
            # its node is down, offline or drained, and Ganeti made no instance: placed
            # again (the dispatcher took that node out of placement when this job ended).
            if node is not None:
                why = f"failed on node {node}"
            else:
                why = "found no room" if is_capacity_error(error) else "was refused by its backend"
            unsubmit(
                conn,
                row.id,
                now,
                error=f"job {row.job_id} {why} ({error}); placing it again",
                placed=False,
                attempt_errors=attempts,
                instance_uuid=row.instance_uuid,
            )
            continue
        failed.append({"b_id": row.id, "b_error": error, "b_now": now, "b_attempts": attempts})
    if ended:
        execute_many(conn, _ENDED, ended, key=("b_id",))
    if failed:
        execute_many(conn, _FAILED, failed, key=("b_id",))
    return len(rows)


_BACKEND_NAME = select(backends_t.c.name).where(backends_t.c.id == bindparam("b_backend"))


def _cancel_deleted(conn: Connection, row: Any, now: datetime, error: str) -> None:
    """The submitted request ``row`` ends canceled (its instance was deleted while its create ran,
    which made nothing), and its instance DESTROYED."""
    conn.execute(
        update(requests_t)
        .where(requests_t.c.id == row.id, checked(requests_t.c.status) == RequestStatus.SUBMITTED.value)
        .values(status=RequestStatus.CANCELED.value, error=error, finished_at=now, updated_at=now)
    )
    if row.instance_uuid is not None:
        conn.execute(
            update(instances_t)
            .where(instances_t.c.uuid == row.instance_uuid, checked(instances_t.c.status) != "DESTROYED")
            .values(status="DESTROYED", task=None, task_job_id=None, delete_requested_at=None, updated_at=now)
        )


def unsubmit(
    conn: Connection,
    request_id: str,
    now: datetime,
    *,
    error: str,
    placed: bool = True,
    attempt_errors: list[dict[str, Any]] | None = None,
    instance_uuid: str | None = None,
) -> bool:
    """A submitted request back to pending, unclaimed, its job forgotten: still ``placed`` on its
    backend (the dispatcher asks Ganeti about it before anything is sent again), or not (placed
    anew: its instance row, ``instance_uuid``, which the failed create made nothing of, goes until
    the next placement writes it again, with the same id); ``attempt_errors``: the list to keep.
    False: it was no longer submitted."""
    values: dict[str, Any] = {
        "status": RequestStatus.PENDING.value,
        "job_id": None,
        "claimed_by": None,
        "claimed_at": None,
        "submitted_at": None,
        "error": error,
        "updated_at": now,
    }
    if not placed:
        values["backend_id"] = None
    if attempt_errors is not None:
        values["attempt_errors"] = attempt_errors
    done = conn.execute(
        update(requests_t)
        .where(requests_t.c.id == request_id, requests_t.c.status == RequestStatus.SUBMITTED.value)
        .values(**values)
    )
    if done.rowcount and not placed and instance_uuid is not None:
        conn.execute(
            delete(instances_t).where(instances_t.c.uuid == instance_uuid, instances_t.c.status == "BUILD")
        )
    return bool(done.rowcount)


def _moving(row: Any) -> str | None:
    """Why the dispatcher canceled the request's create job ``row.job_id`` to place it again
    (:func:`mark_moving`), or None."""
    last = (row.attempt_errors or [None])[-1]
    if isinstance(last, dict) and last.get("moved") and last.get("job_id") == row.job_id:
        return str(last.get("error"))
    return None


def waits_on(request_id: str, job_id: int) -> tuple[Any, ...]:
    """The conditions of a request still submitted and waiting on ``job_id``."""
    return (
        requests_t.c.id == request_id,
        requests_t.c.status == RequestStatus.SUBMITTED.value,
        requests_t.c.job_id == job_id,
    )


def marked_attempt(
    row: Any, backend: str, node: str | None, job_id: int, error: str, now: datetime, mark: str
) -> dict[str, Any]:
    """An attempt error the dispatcher writes about ``job_id`` itself (``mark``: ``"moved"``, or
    ``"stranded"``), ``row`` the request's ``attempts``."""
    return {
        "attempt": int(row.attempts or 0),
        "backend": backend,
        "node": node,
        "job_id": job_id,
        "error": error,
        "at": now.isoformat(),
        mark: True,
    }


def mark_moving(conn: Connection, request_id: str, job_id: int, *, backend: str, node: str, why: str) -> bool:
    """The attempt error that tells :func:`settle_requests` the canceled ``job_id`` is to be placed
    again (``"moved": True``); False when the request no longer waits on that job."""
    row = conn.execute(
        select(requests_t.c.attempts, requests_t.c.attempt_errors).where(*waits_on(request_id, job_id))
    ).first()
    if row is None:
        return False
    now = datetime.now(UTC)
    entry = marked_attempt(row, backend, node, job_id, why, now, "moved")
    conn.execute(
        update(requests_t)
        .where(requests_t.c.id == request_id)
        .values(attempt_errors=[*(row.attempt_errors or ()), entry], updated_at=now)
    )
    return True


def unmark_moving(conn: Connection, request_id: str, job_id: int) -> bool:
    """The cancel of ``job_id`` did not go through (Ganeti runs it already): the attempt error
    :func:`mark_moving` wrote is taken back (the job's own end tells what happened)."""
    row = conn.execute(select(requests_t.c.attempt_errors).where(requests_t.c.id == request_id)).first()
    errors = list(row.attempt_errors or ()) if row is not None else []
    if not errors or not (errors[-1].get("moved") and errors[-1].get("job_id") == job_id):
        return False
    conn.execute(
        update(requests_t).where(requests_t.c.id == request_id).values(attempt_errors=errors[:-1] or None)
    )
    return True


def attempt_error(row: Any, backend: str, error: str | None, now: datetime) -> dict[str, Any]:
    """One failed attempt of a request, as ``requests.attempt_errors`` keeps it: ``row`` has the
    request's ``attempts`` (placements so far: this one's number) and the create's ``job_id``."""
    return {
        "attempt": int(row.attempts or 0),
        "backend": backend,
        "node": named_node(error),
        "job_id": row.job_id,
        "error": error,
        "at": now.isoformat(),
    }


# (many at once: a burst's job ends arrive together)
_ENDED = (
    update(requests_t)
    .where(
        requests_t.c.id == bindparam("b_id"), checked(requests_t.c.status) == RequestStatus.SUBMITTED.value
    )
    .values(
        status=bindparam("b_status"),
        error=bindparam("b_error"),
        finished_at=bindparam("b_now"),
        updated_at=bindparam("b_now"),
    )
)


# a failed create's request: its error and every failed attempt (many at once, as above)
_FAILED = (
    update(requests_t)
    .where(
        requests_t.c.id == bindparam("b_id"), checked(requests_t.c.status) == RequestStatus.SUBMITTED.value
    )
    .values(
        status=RequestStatus.FAILED.value,
        error=bindparam("b_error"),
        attempt_errors=bindparam("b_attempts", type_=requests_t.c.attempt_errors.type),
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
            checked(requests_t.c.status) == RequestStatus.SUBMITTED.value,
        )
        .values(status=status.value, error=error, finished_at=now, updated_at=now)
    )


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
    # a network of the spec missing there, not connected, or its pool full (Ganeti's NIC checks)
    "unable to get a free ip",
    "no netparams found",
)
_NETWORK_MISSING = re.compile(r"network '[^']*' not found")


def is_name_taken_error(message: str | None) -> bool:
    """Whether a failed create's message is Ganeti's refusal of a name it holds already
    (``LUInstanceCreate.CheckPrereq``: "Instance '...' is already in the cluster", ECODE_EXISTS):
    the create made nothing, and the instance of that name is another job's."""
    return "is already in the cluster" in (message or "")


#: what Ganeti writes as the result of a job whose process it lost: Ganeti 3.0's luxid
#: (``JQScheduler.checkForDeath``, reason ``gnt:daemon:luxid:deathdetection``; on a new master
#: for every job the dead one had started, within ``LUXID_JOBQUEUE_POLL_INTERVAL``, 307 s) and
#: Ganeti 2.x's masterd at startup (``jqueue.py``)
_JOB_DEATH = re.compile(r"^(?:detected death of job \d+|Unclean master daemon shutdown)$")


def is_job_death_error(message: str | None) -> bool:
    """Whether a failed create's message is Ganeti losing the job's process mid-way (its master
    died, or the process was killed), not a failure of the create: its instance may exist or not."""
    return _JOB_DEATH.match((message or "").strip()) is not None


def is_backend_error(message: str | None) -> bool:
    """Whether a failed create's message blames its backend, not the spec: no room there
    (:func:`is_capacity_error`), or an OS, instance policy or disk template of that backend."""
    text = (message or "").lower()
    return (
        is_capacity_error(message)
        or any(marker in text for marker in _BACKEND_ERRORS)
        or _NETWORK_MISSING.search(text) is not None
    )


def _outcome(summary: JobSummary) -> tuple[RequestStatus, str | None]:
    status = summary.status
    if status is JobStatus.SUCCESS:
        return RequestStatus.SUCCEEDED, None
    if status is JobStatus.CANCELED:
        return RequestStatus.CANCELED, f"job {summary.job_id} was canceled"
    errors = [op.error for op in summary.ops if op.error]
    return RequestStatus.FAILED, errors[0] if errors else f"job {summary.job_id} ended in {status.value}"
