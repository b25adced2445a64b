"""Names and request ids that must not clash: checked in the writer transaction that writes.

A name is unique while its instance is not DESTROYED: across all backends
(``[ownership] unique_names = "global"``, the default) or on each backend (``"backend"``).
Names are compared whatever their case, as DNS compares them (``Web.example.org`` and
``web.example.org`` are one name): every check here compares ``lower(name)`` (the index
``ix_instances_name_lower`` of migration 0012 serves it); the name itself is kept as given,
as Ganeti keeps it.
A create request not final yet holds its name too (it becomes an instance soon), and so
does a rename in progress (its job recorded and not applied yet) the name it renames to. The
check runs inside the writer's transaction that writes the row, with the name locked (SQLite
``BEGIN IMMEDIATE``; PostgreSQL a lock per name, :func:`~synnefo_ganeti.store.db._locks.lock_keys`),
so two processes cannot both pass it.

On the same backend, :func:`~synnefo_ganeti.store.instances._instances.add_instance_row` keeps its
rule: an ERROR or DESTROYED row starts a new life, any other is taken (an ERROR row of the
same name in another case is taken: that row would not start the new life, it would stay).

A request id names one create: the same id with a different request is refused with the
fields that differ (:func:`request_differences`).

Functions taking a ``Connection`` run inside a store transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, cast

from sqlalchemy import Connection, Table, func, select, text

from synnefo_ganeti.errors import ConflictError
from synnefo_ganeti.store.backends._rows import Backend
from synnefo_ganeti.store.db._locks import lock_keys
from synnefo_ganeti.store.instances._rows import RENAMING, Instance, InstanceJob
from synnefo_ganeti.store.requests._rows import CreateRequest

__all__ = ["UniqueNames", "check_name_free", "name_key", "renaming_to", "request_differences"]

UniqueNames = Literal["global", "backend"]

instances_t = cast(Table, Instance.__table__)
requests_t = cast(Table, CreateRequest.__table__)
backends_t = cast(Table, Backend.__table__)
instance_jobs_t = cast(Table, InstanceJob.__table__)
# (the modules of RequestStatus and InstanceStatus use this one: their values, spelled out)
_OPEN = ("pending", "submitted")
_DESTROYED, _ERROR = "DESTROYED", "ERROR"


def name_key(name: str) -> str:
    """What a name is compared by: its lower case (``lower(name)`` in SQL; names are ASCII)."""
    return name.lower()


def check_name_free(
    conn: Connection,
    name: str,
    *,
    backend: str | None,
    unique_names: UniqueNames,
    exclude_request: str | None = None,
    exclude_instance: str | None = None,
    locked: bool = False,
) -> None:
    """:class:`ConflictError` when ``name`` (for ``backend``, None: any), in any case, is held
    by another instance not DESTROYED or by another request not final, under ``unique_names``.

    ``exclude_request``: the request doing the placing; ``exclude_instance``: the id of the
    instance row that request placed before (its own earlier attempt).

    The name is locked first (PostgreSQL) until the transaction ends: every write that takes a
    name checks it here or in the set-based add, so two cannot both pass for one name
    (``locked``: the caller holds that lock already, taken with others in one statement)."""
    if not locked:
        lock_keys(conn, (f"name:{name_key(name)}",))
    _check_instances(conn, name, backend, unique_names, exclude_instance)
    _check_requests(conn, name, backend, unique_names, exclude_request)
    _check_renames(conn, name, backend, unique_names, exclude_instance)


#: the rename jobs recorded and not applied yet, with their instances (built once: read by
#: every batch of new requests, its cache key cost more than running it)
def renames_in_progress(*columns: Any) -> Any:
    """``columns`` of the rename jobs recorded and not applied yet, with their instance and backend."""
    return (
        select(*columns)
        .select_from(instance_jobs_t)
        .join(instances_t, instances_t.c.id == instance_jobs_t.c.instance_id)
        .join(backends_t, backends_t.c.id == instance_jobs_t.c.backend_id)
        .where(text(RENAMING))  # spelled as the partial index's condition: SQLite uses it then
    )


_RENAMING = renames_in_progress(
    instance_jobs_t.c.job_id,
    instance_jobs_t.c.params,
    instances_t.c.uuid,
    instances_t.c.name.label("old"),
    backends_t.c.name.label("backend"),
)


def renaming_to(conn: Connection, names: set[str] | None = None) -> dict[str, list[Any]]:
    """New name, lowered (:func:`name_key`) -> the renames in progress to it, in any case
    (rows: ``job_id``, ``uuid``, ``old``, ``backend``); of ``names`` only if given.

    Read from the rename jobs recorded and not applied yet (the partial index of migration
    0008): the few in flight, not the table."""
    rows = conn.execute(_RENAMING)
    keys = None if names is None else {name_key(name) for name in names}
    found: dict[str, list[Any]] = {}
    for row in rows:
        new_name = (row.params or {}).get("new_name")
        if isinstance(new_name, str) and (keys is None or name_key(new_name) in keys):
            found.setdefault(name_key(new_name), []).append(row)
    return found


def _check_renames(
    conn: Connection, name: str, backend: str | None, unique_names: UniqueNames, exclude: str | None
) -> None:
    for row in renaming_to(conn, {name}).get(name_key(name), []):
        if row.uuid == exclude:
            continue
        if unique_names == "backend" and backend is not None and row.backend != backend:
            continue
        raise ConflictError(
            f"instance name {name} is taken by a rename in progress: instance {row.uuid} ({row.old} "
            f"of backend {row.backend}) is being renamed to it (job {row.job_id}); wait for its end "
            "or pick another name"
        )


def _check_instances(
    conn: Connection, name: str, backend: str | None, unique_names: UniqueNames, exclude: str | None
) -> None:
    rows = conn.execute(
        select(
            instances_t.c.uuid,
            instances_t.c.name,
            instances_t.c.status,
            backends_t.c.name.label("backend"),
        )
        .join(backends_t, backends_t.c.id == instances_t.c.backend_id)
        .where(func.lower(instances_t.c.name) == name_key(name), instances_t.c.status != _DESTROYED)
        .order_by(backends_t.c.name)
    ).all()
    for row in rows:
        if row.uuid == exclude:
            continue
        if backend is not None and row.backend == backend:
            if row.status == _ERROR and row.name == name:
                continue  # on its own backend an ERROR name starts a new life
        elif unique_names == "backend":
            continue
        named = "" if row.name == name else f" as {row.name} (names are one whatever their case)"
        if row.backend == backend:
            raise ConflictError(
                f"instance {name} of backend {backend} is already in the database{named} ({row.status}, "
                f"id {row.uuid}); delete it first or pick another name"
            )
        raise ConflictError(
            f"instance name {name} is taken: instance {row.uuid} of backend {row.backend}{named} is "
            f"{row.status} (names are unique across backends); delete it first or pick another name"
        )


def _check_requests(
    conn: Connection, name: str, backend: str | None, unique_names: UniqueNames, exclude: str | None
) -> None:
    query = (
        select(
            requests_t.c.id,
            requests_t.c.name,
            requests_t.c.want_backend,
            backends_t.c.name.label("backend"),
        )
        .outerjoin(backends_t, backends_t.c.id == requests_t.c.backend_id)
        .where(func.lower(requests_t.c.name) == name_key(name), requests_t.c.status.in_(_OPEN))
        .order_by(requests_t.c.created_at, requests_t.c.id)
    )
    if exclude is not None:
        query = query.where(requests_t.c.id != exclude)
    for row in conn.execute(query):
        target = row.backend or row.want_backend
        if unique_names == "backend" and backend is not None and target is not None and target != backend:
            continue
        named = "" if row.name == name else f" as {row.name} (names are one whatever their case)"
        raise ConflictError(
            f"instance name {name} is taken by request {row.id}{named}, which has not ended yet; "
            "wait for it (or cancel it) or pick another name"
        )


def request_differences(
    existing_name: str,
    existing_spec: Mapping[str, Any],
    existing_backend: str | None,
    *,
    name: str,
    spec: Mapping[str, Any],
    backend: str | None,
) -> list[str]:
    """The fields in which a repeated request differs from the stored one (sorted; [] if none)."""
    fields = {key for key in set(existing_spec) | set(spec) if existing_spec.get(key) != spec.get(key)}
    if existing_name != name:
        fields.add("name")
    if backend is not None and existing_backend != backend:
        fields.add("backend")  # (left out again: any backend, the one it has will do)
    return sorted(fields)
