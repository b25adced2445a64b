"""Durable instance-create requests: the rows a cloud API writes and the dispatcher works off.

A request's life, each step one transaction:

1. ``add_request``: a row ``pending`` with the spec; the caller has its id at once.
2. ``claim_requests``: a dispatcher takes pending requests nobody holds
   (PostgreSQL: ``FOR UPDATE SKIP LOCKED``, so dispatchers never take the same row).
3. ``place_request``: the chosen backend is written, ``attempts`` counted, and the
   instance row (BUILD) added, *before* the create is sent. From here on the create
   may reach Ganeti even if the dispatcher dies, so whoever picks the request up
   again asks Ganeti first (the request id travels in the job's reason and in a tag).
4. ``submitted_request``: the job id is recorded (request ``submitted``, the
   instance's create job recorded), or ``unplace_request`` when Ganeti certainly got
   nothing (the request may go elsewhere), or ``finish_request`` (failed, canceled).
5. The create job's end, stored by the watcher or the reconciler, settles the request
   in the writer's transaction (:mod:`synnefo_ganeti.store.requests._settle`): succeeded, failed or canceled.

Functions taking a ``Connection`` run inside a store transaction.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import Connection, Row, Table, delete, func, insert, select, update

from synnefo_ganeti._serial import to_jsonable
from synnefo_ganeti.errors import ConflictError, InvalidError, NotFoundError, RequestNotHeldError
from synnefo_ganeti.store.backends._rows import Backend
from synnefo_ganeti.store.db._locks import lock_keys
from synnefo_ganeti.store.instances._rows import Instance, InstanceJob
from synnefo_ganeti.store.requests._names import UniqueNames, check_name_free, name_key, request_differences
from synnefo_ganeti.store.requests._rows import CreateRequest

__all__ = [
    "Request",
    "RequestNotHeldError",
    "RequestStatus",
    "new_instance_id",
    "new_request_id",
    "request_tag",
    "requests_t",
]

requests_t = cast(Table, CreateRequest.__table__)
backends_t = cast(Table, Backend.__table__)
instances_t = cast(Table, Instance.__table__)
instance_jobs_t = cast(Table, InstanceJob.__table__)

#: the tag a request's instance carries, so that Ganeti itself says which request made it
REQUEST_TAG_PREFIX = "synnefo-ganeti:request:"


def new_request_id() -> str:
    return str(uuid.uuid4())


def new_instance_id() -> str:
    """The id of a request's instance, given when the request is written (``Request.instance_id``)."""
    return str(uuid.uuid4())


def request_tag(request_id: str) -> str:
    return f"{REQUEST_TAG_PREFIX}{request_id}"


class RequestStatus(enum.StrEnum):
    PENDING = "pending"
    SUBMITTED = "submitted"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"

    @property
    def is_final(self) -> bool:
        return self in (RequestStatus.SUCCEEDED, RequestStatus.FAILED, RequestStatus.CANCELED)


@dataclass(frozen=True, slots=True)
class Request:
    """A durable create request as the database holds it.

    ``backend`` is where it was placed (None before); ``instance`` the instance's name;
    ``job_id`` the create job once submitted; ``error`` why it failed or was canceled.
    ``placed`` (pending with a backend) means a create may have reached Ganeti.
    ``instance_id`` is the id of the one instance (server) it makes, given when the request is
    written and the same through every attempt and placement (``get_instance(instance_id)``
    answers from the start; the instance's ``request_id`` is this request's id). Its attempts are
    that instance's history (``attempt_errors``), never instances of their own.
    ``attempt_errors``: every create of it that failed in Ganeti, oldest first, each
    ``{"attempt", "backend", "node", "job_id", "error", "at"}`` (``attempt``: the placement it
    was, as counted in ``attempts``; ``node``: the node its error names, or None; ``at``: ISO
    time): kept when it is placed again, and when it finally fails.
    ``waiting_reason``: why the dispatcher cannot place it now (no backend has room, every
    backend down or drained, ...: the backends' reasons, as the dispatcher last found them);
    None when it is not waiting (not tried yet, placed, or ended).
    """

    id: str
    status: RequestStatus
    instance: str
    spec: dict[str, Any]
    want_backend: str | None
    backend: str | None
    job_id: int | None
    error: str | None
    attempts: int
    claimed_by: str | None
    claimed_at: datetime | None
    cancel_requested: bool
    created_at: datetime
    updated_at: datetime
    submitted_at: datetime | None
    finished_at: datetime | None
    instance_id: str | None = None
    attempt_errors: list[dict[str, Any]] = field(default_factory=list)
    waiting_reason: str | None = None

    @property
    def is_final(self) -> bool:
        return self.status.is_final

    @property
    def placed(self) -> bool:
        return self.status is RequestStatus.PENDING and self.backend is not None

    __json_fields__ = (
        "id",
        "status",
        "instance",
        "instance_id",
        "backend",
        "job_id",
        "error",
        "want_backend",
        "attempts",
        "attempt_errors",
        "waiting_reason",
        "claimed_by",
        "cancel_requested",
        "created_at",
        "updated_at",
        "submitted_at",
        "finished_at",
        "spec",
    )

    def to_json(self) -> dict[str, Any]:
        result: dict[str, Any] = to_jsonable(self)
        return result

    @classmethod
    def from_row(cls, row: Row[Any]) -> Request:
        return cls(
            id=row.id,
            status=RequestStatus(row.status),
            instance=row.name,
            spec=row.spec,
            want_backend=row.want_backend,
            backend=row.backend,
            job_id=row.job_id,
            error=row.error,
            attempts=row.attempts,
            claimed_by=row.claimed_by,
            claimed_at=row.claimed_at,
            cancel_requested=bool(row.cancel_requested),
            created_at=row.created_at,
            updated_at=row.updated_at,
            submitted_at=row.submitted_at,
            finished_at=row.finished_at,
            instance_id=row.instance_uuid,
            attempt_errors=list(row.attempt_errors or ()),
            waiting_reason=row.waiting_reason,
        )


def select_requests() -> Any:
    return select(requests_t, backends_t.c.name.label("backend")).outerjoin(
        backends_t, backends_t.c.id == requests_t.c.backend_id
    )


def get(conn: Connection, request_id: str) -> Request | None:
    row = conn.execute(select_requests().where(requests_t.c.id == request_id)).first()
    return None if row is None else Request.from_row(row)


def must_get(conn: Connection, request_id: str) -> Request:
    found = get(conn, request_id)
    if found is None:
        raise NotFoundError(
            f"request {request_id} is not in the database; check the id ('synnefo-ganeti requests list')"
        )
    return found


def add(
    conn: Connection,
    *,
    request_id: str,
    name: str,
    spec: dict[str, Any],
    want_backend: str | None,
    unique_names: UniqueNames | None = None,
) -> tuple[Request, bool]:
    """Insert a pending request; the same id with the same request is returned as is (False:
    not new), with another a :class:`ConflictError` naming the fields that differ. With
    ``unique_names``, a name another instance or open request holds is a ConflictError.

    Runs without the writers' global lock (PostgreSQL): the id and the name are locked instead,
    so two processes adding either at once take turns here."""
    lock_keys(conn, (f"request:{request_id}", f"name:{name_key(name)}"))
    existing = get(conn, request_id)
    if existing is not None:
        before = (existing.instance, existing.spec, existing.want_backend)
        differ = request_differences(*before, name=name, spec=spec, backend=want_backend)
        if differ:
            raise ConflictError(
                f"request {request_id} already exists with another {', '.join(differ)}; a request id "
                "names one create: send the same request again, or leave the id out to get a new one"
            )
        return existing, False
    if unique_names is not None:
        check_name_free(conn, name, backend=want_backend, unique_names=unique_names, locked=True)
    now = datetime.now(UTC)
    conn.execute(
        insert(requests_t).values(
            id=request_id,
            status=RequestStatus.PENDING.value,
            name=name,
            spec=spec,
            want_backend=want_backend,
            attempts=0,
            cancel_requested=False,
            instance_uuid=new_instance_id(),
            created_at=now,
            updated_at=now,
        )
    )
    return must_get(conn, request_id), True


def _held(conn: Connection, request_id: str, dispatcher: str) -> Request:
    request = must_get(conn, request_id)
    if request.status is not RequestStatus.PENDING or request.claimed_by != dispatcher:
        raise RequestNotHeldError(
            f"request {request_id} is no longer held by dispatcher {dispatcher} "
            f"(status {request.status}, held by {request.claimed_by})"
        )
    return request


def finish(
    conn: Connection,
    request_id: str,
    status: RequestStatus,
    *,
    error: str | None = None,
    dispatcher: str | None = None,
) -> Request:
    """End a request that never became a job (failed placement or submission, canceled)."""
    if not status.is_final:
        raise InvalidError(f"{status} is not a final request status; use succeeded, failed or canceled")
    if dispatcher is not None:
        _held(conn, request_id, dispatcher)
    now = datetime.now(UTC)
    conn.execute(
        update(requests_t)
        .where(requests_t.c.id == request_id, requests_t.c.status.in_(_OPEN))
        .values(
            status=status.value,
            error=error,
            finished_at=now,
            updated_at=now,
            claimed_by=None,
            waiting_reason=None,
        )
    )
    return must_get(conn, request_id)


_OPEN = (RequestStatus.PENDING.value, RequestStatus.SUBMITTED.value)


def place(conn: Connection, request_id: str, dispatcher: str, backend_id: int) -> Request:
    """Write the chosen backend and count an attempt (before the create is sent)."""
    request = _held(conn, request_id, dispatcher)
    if request.cancel_requested:
        raise RequestNotHeldError(f"request {request_id} was canceled")
    now = datetime.now(UTC)
    conn.execute(
        update(requests_t)
        .where(requests_t.c.id == request_id)
        .values(
            backend_id=backend_id, attempts=requests_t.c.attempts + 1, updated_at=now, waiting_reason=None
        )
    )
    return must_get(conn, request_id)


def unplace(conn: Connection, request_id: str, dispatcher: str, *, error: str | None = None) -> Request:
    """Ganeti certainly got no create for this request: forget the backend (and the BUILD row,
    which the next placement writes again with the same id: ``instance_id`` stays the request's)."""
    request = _held(conn, request_id, dispatcher)
    if request.backend is not None and request.instance_id is not None:
        conn.execute(
            delete(instances_t).where(
                instances_t.c.uuid == request.instance_id, instances_t.c.status == "BUILD"
            )
        )
    conn.execute(
        update(requests_t)
        .where(requests_t.c.id == request_id)
        .values(backend_id=None, error=error, updated_at=datetime.now(UTC))
    )
    return must_get(conn, request_id)


def mark_submitted(conn: Connection, request_id: str, job_id: int) -> None:
    now = datetime.now(UTC)
    conn.execute(
        update(requests_t)
        .where(requests_t.c.id == request_id, requests_t.c.status == RequestStatus.PENDING.value)
        .values(
            status=RequestStatus.SUBMITTED.value,
            job_id=job_id,
            error=None,
            submitted_at=now,
            updated_at=now,
            claimed_by=None,
        )
    )


def request_cancel(conn: Connection, request_id: str) -> tuple[Request, bool]:
    """Cancel what can be canceled in the database. Returns (request, done):

    * pending, not placed and not held by a dispatcher: canceled now (done);
    * pending and held, or placed (its create may be in Ganeti: a dispatcher asks it first):
      ``cancel_requested`` set, the dispatcher honours it (not done);
    * submitted: nothing here; the caller cancels the job through RAPI (not done);
    * final: as it is (done).
    """
    request = must_get(conn, request_id)
    if request.is_final:
        return request, True
    if request.status is RequestStatus.PENDING and request.claimed_by is None and request.backend is None:
        return finish(
            conn, request_id, RequestStatus.CANCELED, error="canceled before it was submitted"
        ), True
    if request.status is RequestStatus.PENDING:
        conn.execute(
            update(requests_t)
            .where(requests_t.c.id == request_id)
            .values(cancel_requested=True, updated_at=datetime.now(UTC))
        )
        return must_get(conn, request_id), False
    return request, False  # submitted: only Ganeti can cancel its job now


def list_requests(
    conn: Connection,
    *,
    statuses: Sequence[RequestStatus] | None = None,
    backend_id: int | None = None,
    limit: int | None = None,
    newest_first: bool = True,
    name_prefix: str | None = None,
    after: str | None = None,
    by_id: bool = False,
) -> list[Request]:
    """Requests newest first (or oldest first); by id with ``by_id`` or ``after`` (ids above it)."""
    query = select_requests()
    if statuses:
        query = query.where(requests_t.c.status.in_([s.value for s in statuses]))
    if backend_id is not None:
        query = query.where(requests_t.c.backend_id == backend_id)
    if name_prefix:
        query = query.where(requests_t.c.name.startswith(name_prefix, autoescape=True))
    if after is not None:
        query = query.where(requests_t.c.id > after)
    if by_id or after is not None:
        order: tuple[Any, ...] = (requests_t.c.id,)
    elif newest_first:
        order = (requests_t.c.created_at.desc(), requests_t.c.id.desc())
    else:
        order = (requests_t.c.created_at, requests_t.c.id)
    query = query.order_by(*order)
    if limit is not None:
        query = query.limit(limit)
    return [Request.from_row(row) for row in conn.execute(query)]


def counts(
    conn: Connection, statuses: Sequence[RequestStatus] | None = None
) -> dict[tuple[str | None, str], int]:
    """(backend name or None, status) -> how many requests (of ``statuses`` only, if given)."""
    query = (
        select(backends_t.c.name, requests_t.c.status, func.count())
        .select_from(requests_t)
        .outerjoin(backends_t, backends_t.c.id == requests_t.c.backend_id)
        .group_by(backends_t.c.name, requests_t.c.status)
    )
    if statuses:
        query = query.where(requests_t.c.status.in_([s.value for s in statuses]))
    rows = conn.execute(query)
    return {(row[0], row[1]): int(row[2]) for row in rows}
