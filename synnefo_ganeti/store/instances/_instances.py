"""Instances in the database, and their state following the end of the jobs submitted for them.

Synnefo's dispatcher callbacks moved a server's state on each job event; here the
writer does it in the same transaction that stores a job's final version, for every
job the control plane recorded against an instance (``instance_jobs``). The facade
may record a job after the watcher stored its end (the watcher can be faster): then
the end is applied when the job is recorded. Each job is applied once.

All functions here run inside the writer's transaction, on a synchronous connection.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import Connection, Row, Table, case, delete, insert, select, update

from synnefo_ganeti._serial import to_jsonable
from synnefo_ganeti.errors import ConflictError, NotFoundError
from synnefo_ganeti.jobs import JobStatus
from synnefo_ganeti.store.backends._rows import Backend
from synnefo_ganeti.store.db._locks import jobs_key, lock_keys
from synnefo_ganeti.store.instances._rows import Instance, InstanceJob
from synnefo_ganeti.store.jobs._rows import Job

__all__ = [
    "InstanceAction",
    "InstanceStatus",
    "StoredInstance",
    "add_instance_row",
    "current_row",
    "get_instance_by_id",
    "get_instance_row",
    "instance_jobs_t",
    "instance_status_after",
    "instances_t",
    "row_id_of",
]

instances_t = cast(Table, Instance.__table__)
instance_jobs_t = cast(Table, InstanceJob.__table__)
jobs_t = cast(Table, Job.__table__)
backends_t = cast(Table, Backend.__table__)


class InstanceStatus(enum.StrEnum):
    BUILD = "BUILD"
    STARTED = "STARTED"
    STOPPED = "STOPPED"
    ERROR = "ERROR"
    DESTROYED = "DESTROYED"


class InstanceAction(enum.StrEnum):
    CREATE = "create"
    STARTUP = "startup"
    SHUTDOWN = "shutdown"
    REBOOT = "reboot"
    REMOVE = "remove"
    MODIFY = "modify"
    # the cloud's operations (control/_operations.py); each value <= 16 characters (the column)
    RESIZE = "resize"
    GROW_DISK = "grow_disk"
    ATTACH_NIC = "attach_nic"
    DETACH_NIC = "detach_nic"
    ATTACH_DISK = "attach_disk"
    DETACH_DISK = "detach_disk"
    RENAME = "rename"
    REINSTALL = "reinstall"
    MIGRATE = "migrate"
    FAILOVER = "failover"
    ADD_TAGS = "add_tags"
    REMOVE_TAGS = "remove_tags"


def instance_status_after(
    action: InstanceAction, job_status: JobStatus, *, start: bool | None = None
) -> InstanceStatus | None:
    """The instance's status once a job of ``action`` ended in ``job_status``; None: unchanged."""
    if not job_status.is_final:
        return None
    success = job_status is JobStatus.SUCCESS
    if action is InstanceAction.CREATE:
        if success:
            return InstanceStatus.STARTED if start is not False else InstanceStatus.STOPPED
        if job_status is JobStatus.CANCELED:
            return InstanceStatus.DESTROYED  # canceled before it ran: the instance never existed
        return InstanceStatus.ERROR
    if not success:
        return None  # a failed startup, shutdown, reboot, remove, modify ... leaves the state alone
    if action is InstanceAction.REINSTALL:  # shutdown, reinstall, then startup unless start=False
        return InstanceStatus.STARTED if start is not False else InstanceStatus.STOPPED
    return {
        InstanceAction.STARTUP: InstanceStatus.STARTED,
        InstanceAction.REBOOT: InstanceStatus.STARTED,
        InstanceAction.SHUTDOWN: InstanceStatus.STOPPED,
        InstanceAction.REMOVE: InstanceStatus.DESTROYED,
    }.get(action)


@dataclass(frozen=True, slots=True)
class StoredInstance:
    #: the public id: a UUID string given when the row is first written (and to each new life
    #: of its name), never reused; the row's integer key stays inside the store
    id: str
    #: the backend it is placed on; None only for a request's instance not placed yet (or never)
    backend: str | None
    name: str
    status: InstanceStatus
    owned: bool
    os: str | None
    disk_template: str | None
    beparams: dict[str, Any] | None
    nics: list[dict[str, Any]] | None
    disks: list[dict[str, Any]] | None
    tags: list[str] | None
    create_job_id: int | None
    state_time: float | None
    created_at: datetime
    updated_at: datetime
    #: what is in progress ("build", "start", "stop", "reboot", "modify", "delete", ...), its job
    task: str | None = None
    task_job_id: int | None = None
    #: the last action that failed: {"action", "job_id", "message", "at"}; None after a success
    last_error: dict[str, Any] | None = None
    #: what Ganeti reports (after a create or modify ends, and on each reconcile pass)
    memory: int | None = None
    vcpus: int | None = None
    pnode: str | None = None
    #: the state of the primary node (``pnode``) as the dispatcher or a reconcile pass last saw
    #: it: None while it is up, "down" (Ganeti reads the instance ``ERROR_nodedown``: the node
    #: does not answer) or "offline" (``ERROR_nodeoffline``: an operator marked it offline). The
    #: instance's ``status`` is left as it was: what it was asked to be, not known while its node
    #: is gone. ``node_state_since``: when it was first seen so (None while up).
    node_state: str | None = None
    node_state_since: datetime | None = None
    #: the request that makes it (whose ``instance_id`` is this id); None: create_instance's, adopted
    request_id: str | None = None
    #: a delete asked while its create or another action ran, which follows their end; None: none
    delete_requested_at: datetime | None = None

    #: what ``--json`` shows: not the time of the last applied job end
    __json_fields__ = (
        "id",
        "backend",
        "name",
        "status",
        "owned",
        "os",
        "disk_template",
        "beparams",
        "nics",
        "disks",
        "tags",
        "create_job_id",
        "created_at",
        "updated_at",
        "task",
        "task_job_id",
        "last_error",
        "memory",
        "vcpus",
        "pnode",
        "node_state",
        "node_state_since",
        "request_id",
        "delete_requested_at",
    )

    def to_json(self) -> dict[str, Any]:
        result: dict[str, Any] = to_jsonable(self)
        return result

    @classmethod
    def from_row(cls, row: Row[Any], backend: str) -> StoredInstance:
        return cls(
            id=row.uuid,
            backend=backend,
            name=row.name,
            status=InstanceStatus(row.status),
            owned=bool(row.owned),
            os=row.os,
            disk_template=row.disk_template,
            beparams=row.beparams,
            nics=row.nics,
            disks=row.disks,
            tags=row.tags,
            create_job_id=row.create_job_id,
            state_time=row.state_time,
            created_at=row.created_at,
            updated_at=row.updated_at,
            task=row.task,
            task_job_id=row.task_job_id,
            last_error=row.last_error,
            memory=row.memory,
            vcpus=row.vcpus,
            pnode=row.pnode,
            node_state=row.node_state,
            node_state_since=row.node_state_since,
            request_id=row.request_id,
            delete_requested_at=row.delete_requested_at,
        )


def row_id_of(conn: Connection, instance_id: str) -> int:
    """The integer key of the row whose public id is ``instance_id`` (inside the store only)."""
    return int(conn.execute(select(instances_t.c.id).where(instances_t.c.uuid == instance_id)).scalar_one())


def current_row(conn: Connection, backend_id: int, name: str, *columns: Any) -> Row[Any] | None:
    """The row of ``name`` on the backend: the live one (not DESTROYED; at most one), else the
    most recent DESTROYED one; None: the name was never stored. ``columns``: default all."""
    query = select(*(columns or (instances_t,))).where(
        instances_t.c.backend_id == backend_id, instances_t.c.name == name
    )
    destroyed = case((instances_t.c.status == InstanceStatus.DESTROYED.value, 1), else_=0)
    return conn.execute(query.order_by(destroyed, instances_t.c.id.desc()).limit(1)).first()


def get_instance_by_id(conn: Connection, instance_id: str, backend: str) -> StoredInstance:
    """The instance whose public id is ``instance_id`` (of ``backend``): a re-read after a write."""
    row = conn.execute(select(instances_t).where(instances_t.c.uuid == instance_id)).one()
    return StoredInstance.from_row(row, backend)


def get_instance_row(conn: Connection, backend_id: int, backend: str, name: str) -> StoredInstance:
    """The instance ``name`` of ``backend`` (its live row, else its most recent one, see
    :func:`current_row`); :class:`NotFoundError` when the database has none."""
    row = current_row(conn, backend_id, name)
    if row is None:
        raise NotFoundError(
            f"instance {name} of backend {backend} is not in the database; check the name and "
            "backend ('synnefo-ganeti instances list')"
        )
    return StoredInstance.from_row(row, backend)


def add_instance_row(
    conn: Connection,
    backend_id: int,
    backend: str,
    name: str,
    values: dict[str, Any],
    *,
    task: str | None = None,
) -> StoredInstance:
    """A new row: a new life for a name whose row is DESTROYED or ERROR (an ERROR row becomes
    DESTROYED first); :class:`ConflictError` when the name's row is in any other state.

    Each life is a row of its own with a new public id: the earlier life's row stays (its id
    finds it, DESTROYED), and whoever held that id (its request) does not find the new one."""
    now = datetime.now(UTC)
    values = {
        **values,
        "uuid": values.get("uuid") or str(uuid.uuid4()),  # (a request's instance: its given id)
        "create_job_id": None,
        "state_time": None,
        "task": task,
        "task_job_id": None,
        "last_error": None,
        "updated_at": now,
    }
    row = current_row(conn, backend_id, name, instances_t.c.id, instances_t.c.status)
    if row is not None and row.status not in (InstanceStatus.DESTROYED, InstanceStatus.ERROR):
        raise ConflictError(
            f"instance {name} of backend {backend} is already in the database ({row.status}); "
            "delete it first or pick another name"
        )
    if row is not None:
        # jobs of the name's previous life not applied yet must not move its row any more (back
        # out of DESTROYED, while the name is the new row's); a batch of the backend's job
        # versions applying one now finishes first (a placement holds the writers' lock shared)
        lock_keys(conn, (jobs_key(backend_id),))
        conn.execute(
            delete(instance_jobs_t).where(
                instance_jobs_t.c.instance_id == row.id, instance_jobs_t.c.applied_at.is_(None)
            )
        )
    if row is not None and row.status == InstanceStatus.ERROR:
        # the ERROR life ends (its row stays, DESTROYED) before the new one starts
        conn.execute(
            update(instances_t)
            .where(instances_t.c.id == row.id)
            .values(status=InstanceStatus.DESTROYED.value, task=None, task_job_id=None, updated_at=now)
        )
    conn.execute(insert(instances_t).values(backend_id=backend_id, name=name, created_at=now, **values))
    return get_instance_by_id(conn, values["uuid"], backend)
