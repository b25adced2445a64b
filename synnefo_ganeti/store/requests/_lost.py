"""A create job Ganeti no longer knows (lost), or lists but will never run (stranded): its
request goes back to be placed, and what a stranded job means for its next placement."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, delete, select, update

from synnefo_ganeti.store.requests._requests import instance_jobs_t, instances_t, requests_t
from synnefo_ganeti.store.requests._settle import marked_attempt, unsubmit, waits_on

__all__ = ["job_lost", "stranded_backend", "stranded_jobs"]


def job_lost(
    conn: Connection,
    request_id: str,
    job_id: int,
    *,
    error: str,
    stranded: tuple[str, str | None] | None = None,
) -> bool:
    """Ganeti no longer knows the create job ``job_id`` the request waits on: the request goes back
    to "placed" on its backend, unsubmitted, so that the dispatcher asks Ganeti for a job carrying
    its id or an instance carrying its tag before placing it again. False: it waits on that job no
    more (its end came meanwhile).

    ``stranded`` (backend, node): Ganeti lists the job "queued" but its scheduler will not run it
    (luxid wrote it and never enqueued it; it runs when luxid restarts): an attempt error saying
    so (``"stranded": True``) makes the dispatcher pass that job over when it asks Ganeti, and
    place the request on that backend only (:func:`stranded_backend`), where Ganeti refuses a
    second instance of its name should the stranded job ever run."""
    now = datetime.now(UTC)
    row = conn.execute(
        select(
            requests_t.c.backend_id,
            requests_t.c.instance_uuid,
            requests_t.c.attempts,
            requests_t.c.attempt_errors,
        ).where(*waits_on(request_id, job_id))
    ).first()
    if row is None:
        return False
    # the job is no more: forget it against the instance (a restored cluster may give its id to
    # another job), and the BUILD row goes back to "not sent", to be found in Ganeti or dropped
    conn.execute(
        delete(instance_jobs_t).where(
            instance_jobs_t.c.backend_id == row.backend_id,
            instance_jobs_t.c.job_id == job_id,
            instance_jobs_t.c.applied_at.is_(None),
        )
    )
    conn.execute(
        update(instances_t)
        .where(
            instances_t.c.uuid == row.instance_uuid,
            instances_t.c.status == "BUILD",
            instances_t.c.create_job_id == job_id,
        )
        .values(create_job_id=None, task_job_id=None, updated_at=now)
    )
    attempts = None
    if stranded is not None:
        backend, node = stranded
        attempts = [
            *(row.attempt_errors or ()),
            marked_attempt(row, backend, node, job_id, error, now, "stranded"),
        ]
    return unsubmit(conn, request_id, now, error=error, attempt_errors=attempts)


def stranded_backend(attempt_errors: Sequence[Any] | None) -> str | None:
    """The backend on which one of a request's creates was stranded (:func:`job_lost`), which it
    is placed on from then on; None: none was."""
    return next(
        (e.get("backend") for e in attempt_errors or () if isinstance(e, dict) and e.get("stranded")), None
    )


def stranded_jobs(attempt_errors: Sequence[Any] | None, backend: str) -> set[int]:
    """The ids of a request's create jobs stranded on ``backend`` (:func:`job_lost`): never its job."""
    return {
        int(e["job_id"])
        for e in attempt_errors or ()
        if isinstance(e, dict)
        and e.get("stranded")
        and e.get("backend") == backend
        and e.get("job_id") is not None
    }
