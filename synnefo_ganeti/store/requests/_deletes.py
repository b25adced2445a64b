"""Deletes that wait for what runs: asked while an instance's create or another action runs,
written here at once (the caller never waits, never gets "busy"), done as soon as it ends.

``instances.delete_requested_at`` marks them (migration 0011); the request that makes the
instance, while open, gets ``cancel_requested`` with it, so that a create that fails or is
placed again never makes the instance later. Whoever follows them (the dispatcher, or the
facade that deferred one: control/_deferred.py) reads :func:`deletes_due`, removes each one
like any delete, and clears the mark with :func:`clear_delete` once its remove is sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Connection, func, select, update

from synnefo_ganeti.store.backends._backends import backends_t
from synnefo_ganeti.store.instances._instances import InstanceStatus, instances_t
from synnefo_ganeti.store.requests._requests import RequestStatus, requests_t

__all__ = ["DueDelete", "clear_delete", "defer_delete", "deletes_due"]


@dataclass(frozen=True, slots=True)
class DueDelete:
    """An instance whose deferred delete may be done now: nothing runs on it any more."""

    id: str
    backend: str
    name: str
    status: InstanceStatus
    asked_at: datetime


def defer_delete(conn: Connection, instance_id: str, request_id: str | None) -> bool:
    """Mark instance ``instance_id`` to be deleted once what runs on it ends (and its open request
    ``request_id`` canceled for good); False: it is DESTROYED already (nothing to do)."""
    now = datetime.now(UTC)
    done = conn.execute(
        update(instances_t)
        .where(
            instances_t.c.uuid == instance_id,
            instances_t.c.status != InstanceStatus.DESTROYED.value,
            instances_t.c.delete_requested_at.is_(None),
        )
        .values(delete_requested_at=now)
    )
    if request_id is not None:
        conn.execute(
            update(requests_t)
            .where(
                requests_t.c.id == request_id,
                requests_t.c.status.in_((RequestStatus.PENDING.value, RequestStatus.SUBMITTED.value)),
            )
            .values(cancel_requested=True, updated_at=now)
        )
    if done.rowcount:
        return True
    row = conn.execute(select(instances_t.c.status).where(instances_t.c.uuid == instance_id)).first()
    return row is not None and row.status != InstanceStatus.DESTROYED.value


_DUE = (
    select(
        instances_t.c.uuid,
        backends_t.c.name.label("backend"),
        instances_t.c.name,
        instances_t.c.status,
        instances_t.c.delete_requested_at,
    )
    .join(backends_t, backends_t.c.id == instances_t.c.backend_id)
    .where(
        instances_t.c.delete_requested_at.is_not(None),
        instances_t.c.status.not_in((InstanceStatus.DESTROYED.value, InstanceStatus.BUILD.value)),
        instances_t.c.task.is_(None),
    )
    .order_by(instances_t.c.delete_requested_at)
)


def deletes_due(conn: Connection, limit: int = 100) -> list[DueDelete]:
    """The marked instances nothing runs on any more (no task; built, or failed), oldest first."""
    return [
        DueDelete(row.uuid, row.backend, row.name, InstanceStatus(row.status), row.delete_requested_at)
        for row in conn.execute(_DUE.limit(limit))
    ]


def clear_delete(conn: Connection, instance_id: str) -> None:
    """The deferred delete of ``instance_id`` was sent (or is no longer needed)."""
    conn.execute(
        update(instances_t).where(instances_t.c.uuid == instance_id).values(delete_requested_at=None)
    )


def pending_deletes(conn: Connection) -> int:
    """How many deferred deletes wait (what runs on their instances has not ended yet, or due)."""
    counted = conn.execute(
        select(func.count()).where(
            instances_t.c.delete_requested_at.is_not(None),
            instances_t.c.status != InstanceStatus.DESTROYED.value,
        )
    ).scalar_one()
    return int(counted)
