"""The dispatcher's two hot writes, set-based: placing many requests, recording many submissions.

A burst of creates has the dispatcher place and submit hundreds of requests a second; done one
by one, each is a dozen statements in the writer's transaction, and the writer (one per
process) becomes the limit. These steps do the common case of many requests in a handful of
statements (:mod:`._batch`): a request held by the caller, placed for the first time, whose
name no other instance or open request holds; a submission whose instance row is there and
whose job is not recorded nor stored as ended. Every other case is left (None) to the one-by-one
functions of :mod:`._requests_repo`, which say what is wrong or settle what is special.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    bindparam,
    delete,
    insert,
    update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.sql import Executable

from synnefo_ganeti.jobs import JobStatus
from synnefo_ganeti.store.db._batch import Outcome
from synnefo_ganeti.store.db._checked import checked
from synnefo_ganeti.store.db._locks import job_key, jobs_key, lock_keys
from synnefo_ganeti.store.db._many import execute_many
from synnefo_ganeti.store.instances._instances import (
    InstanceAction,
    InstanceStatus,
    instance_jobs_t,
    instances_t,
)
from synnefo_ganeti.store.instances._outcomes import task_of
from synnefo_ganeti.store.instances._recorded import notify_job_recorded
from synnefo_ganeti.store.requests._batch_reads import (
    ADD_CHECKS,
    ADD_CHECKS_PG,
    PLACE_CHECKS,
    REQUESTS,
    SUBMIT_CHECKS,
)
from synnefo_ganeti.store.requests._names import name_key
from synnefo_ganeti.store.requests._requests import (
    Request,
    RequestStatus,
    new_instance_id,
    requests_t,
)

__all__ = ["AddArgs", "PlaceArgs", "SubmittedArgs", "add_many", "place_many", "submitted_many"]

_OPEN = (RequestStatus.PENDING.value, RequestStatus.SUBMITTED.value)
_DESTROYED = InstanceStatus.DESTROYED.value


@dataclass(frozen=True, slots=True)
class AddArgs:
    request_id: str
    name: str
    spec: dict[str, Any]
    want_backend: str | None


@dataclass(frozen=True, slots=True)
class PlaceArgs:
    request_id: str
    dispatcher: str
    backend: str
    backend_id: int
    instance: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SubmittedArgs:
    request_id: str
    job_id: int
    start: bool | None


# a new request's row as the insert wrote it (its server defaults included): no read after it
_INSERT = insert(requests_t)


# the batch's writes (each one statement for the batch on PostgreSQL: store/db/_many.py)
_INSERT_INSTANCE = insert(instances_t)
_INSERT_INSTANCE_JOB = insert(instance_jobs_t)
_PLACED = (
    update(requests_t)
    .where(requests_t.c.id == bindparam("b_id"))
    .values(
        backend_id=bindparam("b_backend"),
        attempts=requests_t.c.attempts + 1,
        updated_at=bindparam("b_now"),
        instance_uuid=bindparam("b_uuid"),
        waiting_reason=None,
    )
)
_SUBMITTED = (
    update(requests_t)
    .where(requests_t.c.id == bindparam("b_id"), checked(requests_t.c.status) == RequestStatus.PENDING.value)
    .values(
        status=RequestStatus.SUBMITTED.value,
        job_id=bindparam("b_job"),
        error=None,
        submitted_at=bindparam("b_now"),
        updated_at=bindparam("b_now"),
        claimed_by=None,
    )
)
_CREATING = (
    update(instances_t)
    .where(instances_t.c.id == bindparam("b_row"))
    .values(
        task=task_of(InstanceAction.CREATE.value),
        task_job_id=bindparam("b_job"),
        create_job_id=bindparam("b_job"),
        updated_at=bindparam("b_now"),
    )
)


def _requests(conn: Connection, ids: Iterable[str]) -> dict[str, Any]:
    return {row.id: row for row in conn.execute(REQUESTS, {"b_ids": list(ids)})}


def add_many(conn: Connection, items: list[AddArgs]) -> list[Outcome | None]:
    """Insert new pending requests (see :func:`._requests.add`): those whose id is new and whose
    name nobody holds (the rest, repeats and clashes, are left to the one-by-one add)."""
    names = {item.name for item in items}
    lowered = sorted({name.lower() for name in names})
    # no global lock here (PostgreSQL): the ids and names of the batch are locked (see _requests.add),
    # by the checks' own function there (lock_keys' keys, sorted: the same statement in it)
    keys = sorted({*(f"request:{i.request_id}" for i in items), *(f"name:{key}" for key in lowered)})
    ids, wanted = {i.request_id for i in items}, set(lowered)
    existing: set[str] = set()
    holders: dict[str, set[str]] = defaultdict(set)
    live: set[str] = set()  # names of instances not DESTROYED (lowered)
    renamed: set[str] = set()  # names a rename in progress takes (lowered)
    checks: Executable = ADD_CHECKS
    params: dict[str, Any] = {"b_ids": sorted(ids), "b_names": lowered}
    if conn.dialect.name == "postgresql":
        checks, params["b_keys"] = ADD_CHECKS_PG, keys
    else:
        lock_keys(conn, keys)  # (nothing on SQLite: its writes are serial)
    for row in conn.execute(checks, params):
        if row.kind == "id":
            existing.add(row.id)
        elif row.kind == "request":
            if row.status in _OPEN and row.name.lower() in wanted:
                holders[row.name.lower()].add(row.id)
        elif row.kind == "instance":
            if row.status != _DESTROYED:
                live.add(row.name.lower())
        else:
            new_name = (row.params or {}).get("new_name")
            if isinstance(new_name, str) and name_key(new_name) in wanted:
                renamed.add(name_key(new_name))
    fast: list[tuple[int, AddArgs]] = []
    taken: set[str] = set()  # (every set here holds names lowered: a name is one whatever its case)
    for index, item in enumerate(items):
        key = item.name.lower()
        held = key in live or key in taken or holders[key] or key in renamed
        if item.request_id in existing or held:
            continue
        taken.add(key)
        existing.add(item.request_id)
        fast.append((index, item))
    outcomes: list[Outcome | None] = [None] * len(items)
    if not fast:
        return outcomes
    now = datetime.now(UTC)
    # every column's value is known here: the rows are written without RETURNING (reading 19
    # columns back, the spec's JSON among them, was a tenth of a cloud API's CPU in a burst)
    added = [
        Request(
            id=item.request_id,
            status=RequestStatus.PENDING,
            instance=item.name,
            spec=item.spec,
            want_backend=item.want_backend,
            backend=None,
            job_id=None,
            error=None,
            attempts=0,
            claimed_by=None,
            claimed_at=None,
            cancel_requested=False,
            created_at=now,
            updated_at=now,
            submitted_at=None,
            finished_at=None,
            instance_id=new_instance_id(),
            attempt_errors=[],
            waiting_reason=None,
        )
        for _, item in fast
    ]
    # one statement for the batch on PostgreSQL (rows unnested: db/_many.py), not one a row
    execute_many(
        conn,
        _INSERT,
        [
            {
                "id": request.id,
                "status": request.status.value,
                "name": request.instance,
                "spec": request.spec,
                "want_backend": request.want_backend,
                "attempts": 0,
                "cancel_requested": False,
                "instance_uuid": request.instance_id,
                "created_at": now,
                "updated_at": now,
            }
            for request in added
        ],
    )
    for (index, _), request in zip(fast, added, strict=True):
        outcomes[index] = (True, (request, True))
    return outcomes


def place_many(conn: Connection, items: list[PlaceArgs]) -> list[Outcome | None]:
    """Place the requests of ``items`` on their backends (see :meth:`Requests.place`)."""
    rows = _requests(conn, (item.request_id for item in items))
    # (no name's lock: the writers' lock is shared, but a request placed here is its name's one
    # open holder, which the API's checks keep so under the name's lock, and the unique index of
    # live rows stops a second row of the name on a backend; an earlier life's jobs are locked)
    live: set[str] = set()  # names with an instance row not DESTROYED (any backend)
    last_destroyed: dict[tuple[int, str], int] = {}  # (backend, name) -> its latest DESTROYED row
    holders: dict[str, set[str]] = defaultdict(set)  # name, lowered -> the open requests holding it
    # the requests whose instance row is written already (an earlier attempt's, kept): one by one
    written: set[str] = set()
    params = {
        "b_names": sorted({row.name.lower() for row in rows.values()}),
        "b_uuids": sorted({r.instance_uuid for r in rows.values() if r.instance_uuid}),
    }
    for found in conn.execute(PLACE_CHECKS, params):
        if found.kind == "written":
            written.add(found.id)
        elif found.kind == "request":
            if found.status in _OPEN:
                holders[found.name.lower()].add(found.id)
        elif found.status != _DESTROYED:
            live.add(found.name.lower())  # (lowered, as ``taken`` and ``holders``)
        else:
            key = (found.backend_id, found.name)
            last_destroyed[key] = max(found.row_id, last_destroyed.get(key, found.row_id))
    fast: list[tuple[int, PlaceArgs, Any]] = []
    taken: set[str] = set()
    for index, item in enumerate(items):
        row = rows.get(item.request_id)
        if (
            row is None
            or row.status != RequestStatus.PENDING.value
            or row.claimed_by != item.dispatcher
            or row.cancel_requested
            or row.backend_id is not None
            or row.instance_uuid in written
            or row.name.lower() in live
            or row.name.lower() in taken
            or holders[row.name.lower()] - {item.request_id}
        ):
            continue  # off the fast path: the one-by-one place says or does what is right
        taken.add(row.name.lower())
        fast.append((index, item, row))
    outcomes: list[Outcome | None] = [None] * len(items)
    if not fast:
        return outcomes
    now = datetime.now(UTC)
    stale = [
        last_destroyed[key] for key in ((i.backend_id, r.name) for _, i, r in fast) if key in last_destroyed
    ]
    if stale:
        # jobs of the names' previous lives not applied yet must not move those rows any more
        # (a batch of their backend's job versions applying one now finishes first)
        lock_keys(conn, (jobs_key(i.backend_id) for _, i, _ in fast))
        conn.execute(
            delete(instance_jobs_t).where(
                instance_jobs_t.c.instance_id.in_(stale), instance_jobs_t.c.applied_at.is_(None)
            )
        )
    # the instance's id is the request's own (given when it was written; older rows: a new one)
    new_ids = {item.request_id: row.instance_uuid or new_instance_id() for _, item, row in fast}
    by_keys: dict[frozenset[str], list[dict[str, Any]]] = defaultdict(list)
    for _, item, row in fast:
        values = {
            "status": InstanceStatus.BUILD.value,
            "owned": True,
            **item.instance,
            "uuid": new_ids[item.request_id],
            "create_job_id": None,
            "state_time": None,
            "task": task_of(InstanceAction.CREATE.value),  # in progress from now (as one by one)
            "task_job_id": None,
            "last_error": None,
            "updated_at": now,
            "backend_id": item.backend_id,
            "name": row.name,
            "request_id": item.request_id,
            "created_at": now,
        }
        by_keys[frozenset(values)].append(values)
    for rows_of_keys in by_keys.values():
        execute_many(conn, _INSERT_INSTANCE, rows_of_keys)
    execute_many(
        conn,
        _PLACED,
        [
            {
                "b_id": item.request_id,
                "b_backend": item.backend_id,
                "b_now": now,
                "b_uuid": new_ids[item.request_id],
            }
            for _, item, _ in fast
        ],
        key=("b_id",),
    )
    # the rows as written: what was read above, with this statement's values (not read back)
    for index, item, row in fast:
        before = Request.from_row(row)
        placed = replace(
            before,
            backend=item.backend,
            attempts=before.attempts + 1,
            updated_at=now,
            instance_id=new_ids[item.request_id],
            waiting_reason=None,
        )
        outcomes[index] = (True, placed)
    return outcomes


def submitted_many(conn: Connection, items: list[SubmittedArgs]) -> list[Outcome | None]:
    """Record the create jobs of ``items`` (see :meth:`Requests.submitted`)."""
    rows = _requests(conn, (item.request_id for item in items))
    pairs = [(rows[i.request_id].backend_id, i.job_id) for i in items if i.request_id in rows]
    wanted = {pair for pair in pairs if pair[0] is not None}
    # the jobs' keys, as the batch that stores their ends takes them (store/jobs/_jobs.py): of a
    # job's record and its end, the second sees the first (the writers' lock is only shared)
    lock_keys(conn, (job_key(backend_id, job_id) for backend_id, job_id in wanted))
    live: dict[tuple[int, str], list[int]] = defaultdict(list)  # live instance rows by name
    recorded: set[tuple[int, int]] = set()
    ended: set[tuple[int, int]] = set()
    params = {
        "b_names": sorted({row.name for row in rows.values()}),
        # (the backends' and the job ids' lists: a pair of one with the other is left out below)
        "b_backends": sorted({b for b, _ in wanted}),
        "b_jobs": sorted({j for _, j in wanted}),
    }
    for found in conn.execute(SUBMIT_CHECKS, params):
        if found.kind == "live":
            live[(found.backend_id, found.name)].append(found.row_id)
        elif (found.backend_id, found.job_id) not in wanted:
            continue
        elif found.kind == "recorded":
            recorded.add((found.backend_id, found.job_id))
        elif JobStatus(found.status).is_final:
            ended.add((found.backend_id, found.job_id))
    fast: list[tuple[int, SubmittedArgs, Any, int]] = []
    seen: set[tuple[int, int]] = set()
    for index, item in enumerate(items):
        row = rows.get(item.request_id)
        if (
            row is None
            or row.backend_id is None
            or row.status != RequestStatus.PENDING.value
            or row.cancel_requested
        ):
            continue
        pair = (row.backend_id, item.job_id)
        instance_rows = live.get((row.backend_id, row.name), [])
        if len(instance_rows) != 1 or pair in recorded or pair in ended or pair in seen:
            continue  # off the fast path: the one-by-one record settles it
        seen.add(pair)
        fast.append((index, item, row, instance_rows[0]))
    outcomes: list[Outcome | None] = [None] * len(items)
    if not fast:
        return outcomes
    now = datetime.now(UTC)
    execute_many(
        conn,
        _SUBMITTED,
        [{"b_id": item.request_id, "b_job": item.job_id, "b_now": now} for _, item, _, _ in fast],
        key=("b_id",),
    )
    execute_many(
        conn,
        _INSERT_INSTANCE_JOB,
        [
            {
                "backend_id": row.backend_id,
                "job_id": item.job_id,
                "instance_id": instance_row,
                "action": InstanceAction.CREATE.value,
                "start": item.start,
                "params": None,
                "recorded_at": now,
            }
            for _, item, row, instance_row in fast
        ],
    )
    # the create is in progress until its job's end is applied (store/instances/_outcomes.py)
    execute_many(
        conn,
        _CREATING,
        [{"b_row": instance_row, "b_job": item.job_id, "b_now": now} for _, item, _, instance_row in fast],
        key=("b_row",),
    )
    for backend in sorted({row.backend for _, _, row, _ in fast}):
        notify_job_recorded(conn, backend)  # the dispatcher follows them (backends without a watcher)
    # the rows as written: what was read above, with this statement's values (not read back)
    for index, item, row, _ in fast:
        submitted = replace(
            Request.from_row(row),
            status=RequestStatus.SUBMITTED,
            job_id=item.job_id,
            error=None,
            submitted_at=now,
            updated_at=now,
            claimed_by=None,
        )
        outcomes[index] = (True, submitted)
    return outcomes
