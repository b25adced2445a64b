"""The requests repository: durable create requests, each step one writer transaction.

The row-level steps are in :mod:`synnefo_ganeti.store.requests._requests`; the steps that also
touch the request's instance row (place, submitted, finish) are put together here. An
unknown request is a :class:`NotFoundError`; a request no longer held by the caller a
:class:`RequestNotHeldError`; an instance name taken a :class:`ConflictError`.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, TypedDict, Unpack

from sqlalchemy import and_, delete, select, update
from sqlalchemy.engine import Connection

from synnefo_ganeti.errors import ConflictError
from synnefo_ganeti.store.backends._backends import Backends, backends_t
from synnefo_ganeti.store.db._batch import Batched
from synnefo_ganeti.store.db._engine import Database
from synnefo_ganeti.store.db._locks import job_key, jobs_key, lock_keys
from synnefo_ganeti.store.db._writer import Writer
from synnefo_ganeti.store.instances._apply import record_job
from synnefo_ganeti.store.instances._instances import (
    InstanceAction,
    InstanceStatus,
    add_instance_row,
    instance_jobs_t,
    instances_t,
)
from synnefo_ganeti.store.instances._outcomes import task_of
from synnefo_ganeti.store.requests import _claims, _lost, _requests, _settle
from synnefo_ganeti.store.requests._names import UniqueNames, check_name_free
from synnefo_ganeti.store.requests._requests import Request, RequestStatus
from synnefo_ganeti.store.requests._requests_batch import (
    AddArgs,
    PlaceArgs,
    SubmittedArgs,
    add_many,
    place_many,
    submitted_many,
)

__all__ = ["RequestPage", "Requests"]


class RequestPage(TypedDict, total=False):
    """More of :meth:`Requests.list_requests`: ``name_prefix``, and a page ordered by id
    (``by_id``, or ``after``: only the requests with an id above the last one seen)."""

    name_prefix: str | None
    after: str | None
    by_id: bool


def _replace_row(
    conn: Connection, instance_id: str, backend_id: int, values: dict[str, Any], task: str
) -> bool:
    """The request's instance row written by an earlier attempt takes this placement (on this
    backend or another: the same instance, the same id); False: it has none yet."""
    row = conn.execute(
        select(instances_t.c.id, instances_t.c.backend_id).where(instances_t.c.uuid == instance_id)
    ).first()
    if row is None:
        return False
    # a batch applying one of those jobs' ends now finishes first, or finds them gone
    lock_keys(conn, (jobs_key(row.backend_id),))
    # the earlier attempt's jobs not applied yet must not move it any more
    conn.execute(
        delete(instance_jobs_t).where(
            instance_jobs_t.c.instance_id == row.id, instance_jobs_t.c.applied_at.is_(None)
        )
    )
    conn.execute(
        update(instances_t)
        .where(instances_t.c.id == row.id)
        .values(
            **values,
            backend_id=backend_id,
            create_job_id=None,
            state_time=None,
            task=task,
            task_job_id=None,
            pnode=None,
            node_state=None,
            node_state_since=None,
            updated_at=datetime.now(UTC),
        )
    )
    return True


class Requests:
    def __init__(self, db: Database, backends: Backends, writer: Writer) -> None:
        self.db = db
        self.backends = backends
        self.writer = writer

    async def add(
        self,
        spec: dict[str, Any],
        *,
        name: str,
        backend: str | None,
        request_id: str | None,
        unique_names: UniqueNames | None = None,
    ) -> tuple[Request, bool]:
        rid = request_id or _requests.new_request_id()
        # many at once when queued together (an API's burst): only with the names' check on
        batch = None if unique_names is None else Batched(add_many, AddArgs(rid, name, spec, backend))
        return await self.writer.call(
            lambda conn: _requests.add(
                conn, request_id=rid, name=name, spec=spec, want_backend=backend, unique_names=unique_names
            ),
            batch=batch,
            exclusive=False,  # the request's id and name are locked instead (see _requests.add)
        )

    async def get(self, request_id: str) -> Request | None:
        return await self.db.call_read(lambda conn: _requests.get(conn, request_id))

    async def list_requests(
        self,
        *,
        status: Iterable[RequestStatus | str] | None,
        backend: str | None,
        limit: int | None,
        newest_first: bool,
        **page: Unpack[RequestPage],
    ) -> list[Request]:
        statuses = [RequestStatus(s) for s in status] if status is not None else None
        backend_id = None
        if backend is not None:
            backend_id = await self.backends.id_of(backend)
            if backend_id is None:
                return []
        return await self.db.call_read(
            lambda conn: _requests.list_requests(
                conn,
                statuses=statuses,
                backend_id=backend_id,
                limit=limit,
                newest_first=newest_first,
                name_prefix=page.get("name_prefix"),
                after=page.get("after"),
                by_id=page.get("by_id", False),
            )
        )

    async def counts(
        self, *, status: Iterable[RequestStatus | str] | None
    ) -> dict[tuple[str | None, str], int]:
        statuses = [RequestStatus(s) for s in status] if status is not None else None
        return await self.db.call_read(lambda conn: _requests.counts(conn, statuses))

    async def claim(self, dispatcher: str, limit: int) -> list[Request]:
        skip_locked = self.db.dialect == "postgresql"
        return await self.writer.call(
            lambda conn: _claims.claim(conn, dispatcher, limit, skip_locked=skip_locked), exclusive=False
        )

    async def claimants(self, *, exclude: str) -> set[str]:
        return await self.db.call_read(lambda conn: _claims.claimants(conn, exclude))

    async def take_over(self, old: str, new: str) -> list[Request]:
        return await self.writer.call(lambda conn: _claims.take_over(conn, old, new), exclusive=False)

    async def release(self, dispatcher: str) -> int:
        return await self.writer.call(lambda conn: _claims.release(conn, dispatcher), exclusive=False)

    async def place(
        self,
        request_id: str,
        dispatcher: str,
        backend: str,
        instance: dict[str, Any],
        *,
        unique_names: UniqueNames | None = None,
    ) -> Request:
        backend_id = await self.backends.ensure(backend)

        def run(conn: Connection) -> Request:
            before = _requests.must_get(conn, request_id)
            if unique_names is not None:  # (under the name's lock: see place_many)
                check_name_free(
                    conn,
                    before.instance,
                    backend=backend,
                    unique_names=unique_names,
                    exclude_request=request_id,
                    exclude_instance=before.instance_id,
                )
            request = _requests.place(conn, request_id, dispatcher, backend_id)
            instance_id = before.instance_id or _requests.new_instance_id()
            values = {"status": InstanceStatus.BUILD.value, "owned": True, **instance}
            values["request_id"] = request_id
            # the create is in progress from now (its job, once sent, is recorded against it)
            build = task_of(InstanceAction.CREATE.value)
            if not _replace_row(conn, instance_id, backend_id, values, build):
                values["uuid"] = instance_id
                add_instance_row(conn, backend_id, backend, request.instance, values, task=build)
            # the request points at its own instance row, whatever later lives of its name do
            conn.execute(
                update(_requests.requests_t)
                .where(_requests.requests_t.c.id == request_id)
                .values(instance_uuid=instance_id)
            )
            return _requests.must_get(conn, request_id)

        # many at once in a few statements, when the writer finds them queued together; the
        # writers' lock shared (an earlier attempt's jobs are locked: _replace_row)
        batch = Batched(place_many, PlaceArgs(request_id, dispatcher, backend, backend_id, instance))
        return await self.writer.call(run, batch=batch, shared=True)

    async def unplace(self, request_id: str, dispatcher: str, *, error: str | None) -> Request:
        return await self.writer.call(
            lambda conn: _requests.unplace(conn, request_id, dispatcher, error=error)
        )

    async def submitted(self, request_id: str, job_id: int, *, start: bool | None) -> Request:
        cached = self.backends.ids

        def run(conn: Connection) -> Request:
            request = _requests.must_get(conn, request_id)
            if request.backend is None:
                raise ConflictError(f"request {request_id} has no backend: place it before recording its job")
            backend_id = (
                cached.get(request.backend)
                or conn.execute(
                    select(backends_t.c.id).where(backends_t.c.name == request.backend)
                ).scalar_one()
            )
            # the job's key, as the batch that stores its end takes it: of the two, the second
            # sees the first (record_job applies an end stored already; the batch, a record)
            lock_keys(conn, (job_key(backend_id, job_id),))
            _requests.mark_submitted(conn, request_id, job_id)
            record_job(
                conn,
                backend_id,
                request.backend,
                request.instance,
                job_id,
                InstanceAction.CREATE,
                start,
                None,
            )
            if request.cancel_requested and request.instance_id is not None:
                # deleted while its create was sent: the delete follows the create's end
                conn.execute(
                    update(instances_t)
                    .where(
                        instances_t.c.uuid == request.instance_id,
                        instances_t.c.delete_requested_at.is_(None),
                    )
                    .values(delete_requested_at=datetime.now(UTC))
                )
            return _requests.must_get(conn, request_id)

        batch = Batched(submitted_many, SubmittedArgs(request_id, job_id, start))
        return await self.writer.call(run, batch=batch, shared=True)  # (the job's key instead)

    async def finish(
        self,
        request_id: str,
        final: RequestStatus,
        *,
        error: str | None,
        dispatcher: str | None,
        instance_status: InstanceStatus | None,
    ) -> Request:
        def run(conn: Connection) -> Request:
            request = _requests.must_get(conn, request_id)
            # a final request's name may have started a new life on its backend: leave that alone
            if request.backend is not None and instance_status is not None and not request.is_final:
                backend_id = conn.execute(
                    select(backends_t.c.id).where(backends_t.c.name == request.backend)
                ).scalar_one()
                # the row it placed: its create never sent; or, placed again after Ganeti refused
                # its create by name (a job that made nothing), the row that job was recorded on
                which = (
                    instances_t.c.uuid == request.instance_id
                    if request.placed and request.instance_id is not None
                    else and_(instances_t.c.name == request.instance, instances_t.c.create_job_id.is_(None))
                )
                conn.execute(
                    update(instances_t)
                    .where(
                        instances_t.c.backend_id == backend_id,
                        which,
                        instances_t.c.status == InstanceStatus.BUILD.value,
                    )
                    .values(
                        status=instance_status.value,
                        task=None,
                        task_job_id=None,
                        updated_at=datetime.now(UTC),
                    )
                )
            return _requests.finish(conn, request_id, final, error=error, dispatcher=dispatcher)

        return await self.writer.call(run)

    async def mark_moving(self, request_id: str, job_id: int, *, backend: str, node: str, why: str) -> bool:
        def run(conn: Connection) -> bool:
            return _settle.mark_moving(conn, request_id, job_id, backend=backend, node=node, why=why)

        return await self.writer.call(run)

    async def job_lost(
        self, request_id: str, job_id: int, *, error: str, stranded: tuple[str, str | None] | None = None
    ) -> bool:
        return await self.writer.call(
            lambda conn: _lost.job_lost(conn, request_id, job_id, error=error, stranded=stranded)
        )

    async def unmark_moving(self, request_id: str, job_id: int) -> bool:
        return await self.writer.call(lambda conn: _settle.unmark_moving(conn, request_id, job_id))

    async def cancel(self, request_id: str) -> tuple[Request, bool]:
        return await self.writer.call(lambda conn: _requests.request_cancel(conn, request_id))
