"""The instances repository: instance rows and the jobs recorded against them.

Writes run in the writer's transactions (:meth:`Writer.call`); the row-level work is
in :mod:`synnefo_ganeti.store.instances._instances`. An instance the database lacks is a
:class:`NotFoundError`, a name already taken a :class:`ConflictError`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, TypedDict, Unpack

from sqlalchemy import case, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection

from synnefo_ganeti.errors import InvalidError
from synnefo_ganeti.jobs import JobStatus
from synnefo_ganeti.store.backends._backends import Backends, backends_t
from synnefo_ganeti.store.db._engine import Database
from synnefo_ganeti.store.db._writer import Writer
from synnefo_ganeti.store.instances._apply import record_job
from synnefo_ganeti.store.instances._instances import (
    InstanceAction,
    InstanceStatus,
    StoredInstance,
    add_instance_row,
    get_instance_by_id,
    get_instance_row,
    instance_jobs_t,
    instances_t,
)
from synnefo_ganeti.store.instances._node_state import (
    check_node_state,
    set_node_state_rows,
    store_node_states,
)
from synnefo_ganeti.store.instances._not_owned import mark_not_owned_rows
from synnefo_ganeti.store.requests import _settle
from synnefo_ganeti.store.requests._names import UniqueNames, check_name_free
from synnefo_ganeti.store.requests._requests import RequestStatus

__all__ = ["InstancePage", "Instances"]

log = logging.getLogger("synnefo_ganeti.store")


class InstancePage(TypedDict, total=False):
    """More of :meth:`Instances.list_instances`: ``name_prefix``, one ``id``, and a page:
    ``limit`` instances with an id above ``after`` (the last id seen), ordered by id."""

    name_prefix: str | None
    id: str | None
    limit: int | None
    after: str | None


_DESTROYED_LAST = case((instances_t.c.status == InstanceStatus.DESTROYED.value, 1), else_=0)

#: (``last_error``: the reconciler's stale fix says why the row ended)
_UPDATABLE = frozenset(
    {"status", "owned", "os", "disk_template", "beparams", "nics", "disks", "tags", "state_time"}
) | {"last_error"}


class Instances:
    def __init__(self, db: Database, backends: Backends, writer: Writer) -> None:
        self.db = db
        self.backends = backends
        self.writer = writer

    async def add(
        self, backend: str, name: str, values: dict[str, Any], *, unique_names: UniqueNames | None = None
    ) -> StoredInstance:
        backend_id = await self.backends.ensure(backend)

        def run(conn: Connection) -> StoredInstance:
            if unique_names is not None:
                check_name_free(conn, name, backend=backend, unique_names=unique_names)
            return add_instance_row(conn, backend_id, backend, name, values)

        return await self.writer.call(run)

    async def record_job(
        self,
        backend: str,
        name: str,
        job_id: int,
        action: InstanceAction,
        *,
        start: bool | None,
        params: dict[str, Any] | None,
    ) -> StoredInstance:
        backend_id = await self.backends.ensure(backend)
        return await self.writer.call(
            lambda conn: record_job(conn, backend_id, backend, name, job_id, action, start, params)
        )

    async def update(self, backend: str, name: str, values: dict[str, Any]) -> StoredInstance:
        unknown = set(values) - _UPDATABLE
        if unknown:
            raise InvalidError(
                f"not instance fields: {', '.join(sorted(unknown))}; use {', '.join(sorted(_UPDATABLE))}"
            )
        if "status" in values:
            values["status"] = InstanceStatus(values["status"]).value
        backend_id = await self.backends.ensure(backend)

        def run(conn: Connection) -> StoredInstance:
            instance = get_instance_row(conn, backend_id, backend, name)
            new_status = values.get("status")
            # a build settled without its job's end, or an instance gone: nothing is in progress
            done = new_status == InstanceStatus.DESTROYED or (
                instance.task == "build" and new_status not in (None, InstanceStatus.BUILD)
            )
            conn.execute(
                update(instances_t)
                .where(instances_t.c.uuid == instance.id)
                .values(
                    **values,
                    **({"task": None, "task_job_id": None} if done else {}),
                    updated_at=datetime.now(UTC),
                )
            )
            if instance.status is InstanceStatus.BUILD and new_status and instance.create_job_id is not None:
                _settle.settle_by_instance(conn, backend_id, instance.create_job_id, new_status)
            return get_instance_by_id(conn, instance.id, backend)

        return await self.writer.call(run)

    async def list_instances(
        self,
        *,
        backend: str | None = None,
        name: str | None = None,
        status: Iterable[InstanceStatus | str] | None = None,
        **page: Unpack[InstancePage],
    ) -> list[StoredInstance]:
        prefix, instance_id = page.get("name_prefix"), page.get("id")
        limit, after = page.get("limit"), page.get("after")

        async def run(conn: AsyncConnection) -> list[StoredInstance]:
            query = select(instances_t, backends_t.c.name.label("backend")).join(
                backends_t, backends_t.c.id == instances_t.c.backend_id
            )
            if limit is not None or after is not None:
                query = query.order_by(instances_t.c.uuid).limit(limit)
            else:
                # a name's live row first, then its DESTROYED ones, newest first
                query = query.order_by(
                    backends_t.c.name, instances_t.c.name, _DESTROYED_LAST, instances_t.c.id.desc()
                )
            if after is not None:
                query = query.where(instances_t.c.uuid > after)
            if instance_id is not None:
                query = query.where(instances_t.c.uuid == instance_id)
            if prefix:
                query = query.where(instances_t.c.name.startswith(prefix, autoescape=True))
            if backend is not None:
                query = query.where(backends_t.c.name == backend)
            if name is not None:
                query = query.where(instances_t.c.name == name)
            if status is not None:
                query = query.where(instances_t.c.status.in_([InstanceStatus(s).value for s in status]))
            return [StoredInstance.from_row(row, row.backend) for row in await conn.execute(query)]

        return await self.db.read(run)

    async def jobs_of(self, backend: str, name: str) -> list[dict[str, Any]]:
        async def run(conn: AsyncConnection) -> list[dict[str, Any]]:
            # the jobs of the name's current row (see _instances.current_row), not of earlier lives
            current = (
                select(instances_t.c.id)
                .join(backends_t, backends_t.c.id == instances_t.c.backend_id)
                .where(backends_t.c.name == backend, instances_t.c.name == name)
                .order_by(_DESTROYED_LAST, instances_t.c.id.desc())
                .limit(1)
                .scalar_subquery()
            )
            query = (
                select(instance_jobs_t)
                .where(instance_jobs_t.c.instance_id == current)
                .order_by(instance_jobs_t.c.job_id)
            )
            return [dict(row._mapping) for row in await conn.execute(query)]

        return await self.db.read(run)

    async def unapplied_jobs(self, backend: str) -> list[int]:
        backend_id = await self.backends.id_of(backend)
        if backend_id is None:
            return []

        async def run(conn: AsyncConnection) -> list[int]:
            rows = await conn.execute(
                select(instance_jobs_t.c.job_id)
                .where(instance_jobs_t.c.backend_id == backend_id, instance_jobs_t.c.applied_at.is_(None))
                .order_by(instance_jobs_t.c.job_id)
            )
            return [int(row.job_id) for row in rows]

        return await self.db.read(run)

    async def destroy_unbuilt(
        self, backend: str, name: str, job_id: int, result: JobStatus, *, error: str | None
    ) -> StoredInstance:
        if result is JobStatus.SUCCESS or not result.is_final:
            raise InvalidError(f"only a create that ended without success leaves nothing built, not {result}")
        backend_id = await self.backends.ensure(backend)
        if result is JobStatus.CANCELED:
            status, why = RequestStatus.CANCELED, f"job {job_id} was canceled"
        else:
            status, why = RequestStatus.FAILED, error or f"job {job_id} ended in {result.value}"

        def run(conn: Connection) -> StoredInstance:
            instance = get_instance_row(conn, backend_id, backend, name)
            now = datetime.now(UTC)
            conn.execute(
                update(instances_t)
                .where(instances_t.c.uuid == instance.id)
                .values(status=InstanceStatus.DESTROYED.value, task=None, task_job_id=None, updated_at=now)
            )
            conn.execute(
                update(instance_jobs_t)
                .where(
                    instance_jobs_t.c.backend_id == backend_id,
                    instance_jobs_t.c.job_id == job_id,
                    instance_jobs_t.c.applied_at.is_(None),
                )
                .values(applied_at=now, result=result.value)
            )
            _settle.settle_job(conn, backend_id, job_id, status, why)
            return get_instance_by_id(conn, instance.id, backend)

        return await self.writer.call(run)

    async def set_node_state(self, backend: str, node: str, state: str | None, *, detail: str | None) -> int:
        check_node_state(state)
        backend_id = await self.backends.ensure(backend)
        changed = await self.writer.call(lambda conn: set_node_state_rows(conn, backend_id, node, state))
        if changed:
            log.info(
                "node %s of backend %s is %s: %d instance(s) marked%s",
                node,
                backend,
                state or "up",
                changed,
                f" ({detail})" if detail else "",
            )
        return changed

    async def store_node_states(self, backend: str, states: Mapping[str, str | None]) -> int:
        if not states:
            return 0
        backend_id = await self.backends.ensure(backend)
        snapshot = dict(states)
        return await self.writer.call(lambda conn: store_node_states(conn, backend_id, snapshot))

    async def mark_not_owned(self, backend: str, rows: Mapping[str, str]) -> int:
        if not rows:
            return 0
        backend_id = await self.backends.ensure(backend)
        snapshot = dict(rows)
        changed = await self.writer.call(lambda conn: mark_not_owned_rows(conn, backend_id, snapshot))
        if changed:
            log.warning(
                "backend %s: Ganeti's instances %s lack the ownership marks: their rows are marked not "
                "owned (no action is sent to Ganeti for them)",
                backend,
                ", ".join(sorted(rows)),
            )
        return changed
