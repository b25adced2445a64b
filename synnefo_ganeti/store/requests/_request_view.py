"""A request's instance before (or without) its row: what ``get_instance(request.instance_id)``
answers while the request waits to be placed, between two attempts, or after it ended with
nothing made (failed before any create succeeded, or canceled).

A request's instance id is given when the request is written (``Request.instance_id``); its row
is written when the request is placed and goes when an attempt made nothing and the request is
placed again. So the one id always finds the one server: its row while there is one, else this
view of its request (status BUILD while open, ERROR once failed, DESTROYED once canceled).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

from synnefo_ganeti.store.instances._instances import InstanceAction, InstanceStatus, StoredInstance
from synnefo_ganeti.store.instances._outcomes import task_of
from synnefo_ganeti.store.requests._requests import Request, RequestStatus, requests_t, select_requests

__all__ = ["request_by_instance", "view_of_request"]


def request_by_instance(conn: Connection, instance_id: str) -> Request | None:
    """The request whose instance id is ``instance_id``; None: none."""
    row = conn.execute(select_requests().where(requests_t.c.instance_uuid == instance_id)).first()
    return None if row is None else Request.from_row(row)


def view_of_request(request: Request) -> StoredInstance | None:
    """The instance of ``request`` as its request tells it (see the module); None: the request
    has no instance id (written before migration 0011 and never placed)."""
    if request.instance_id is None:
        return None
    spec: dict[str, Any] = request.spec
    if request.status is RequestStatus.FAILED:
        status = InstanceStatus.ERROR
    elif request.status is RequestStatus.CANCELED:
        status = InstanceStatus.DESTROYED
    elif request.status is RequestStatus.SUCCEEDED:
        status = InstanceStatus.STARTED if spec.get("start", True) else InstanceStatus.STOPPED
    else:
        status = InstanceStatus.BUILD
    last_error = None
    if status is InstanceStatus.ERROR:
        at = request.finished_at or request.updated_at
        last_error = {
            "action": InstanceAction.CREATE.value,
            "job_id": request.job_id,
            "message": request.error,
            "at": at.isoformat(),
        }
    beparams = dict(spec.get("beparams") or {}) or None
    return StoredInstance(
        id=request.instance_id,
        backend=request.backend,
        name=request.instance,
        status=status,
        owned=True,
        os=spec.get("os"),
        disk_template=spec.get("disk_template"),
        beparams=beparams,
        nics=spec.get("nics"),
        disks=spec.get("disks"),
        tags=spec.get("tags"),
        create_job_id=request.job_id,
        state_time=None,
        created_at=request.created_at,
        updated_at=request.updated_at,
        task=task_of(InstanceAction.CREATE.value) if status is InstanceStatus.BUILD else None,
        last_error=last_error,
        request_id=request.id,
    )
