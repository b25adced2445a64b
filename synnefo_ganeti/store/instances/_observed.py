"""What Ganeti made, stored: the instance columns filled from Ganeti's answers.

After a create or modify job ends (the dispatcher's observer) and on each reconcile pass
(the reconciler), the instance rows take what Ganeti reports: ``nics`` (each
``{"mac", "ip", "network", "mode", "link"}``), ``disks`` (each ``{"size", "uuid"}``),
``memory`` (maxmem, MiB), ``vcpus``, ``os`` and ``pnode``. The values are computed from
RAPI answers by :func:`synnefo_ganeti.reconcile._observe.observed_values`; this module
only writes them, in one writer transaction per call, and only into rows whose values
changed (an unchanged row keeps its ``updated_at``).

A snapshot of Ganeti taken at ``taken_at`` is older than the end of a job applied to the
row after it (``state_time``): such a row is left alone, the next answer fills it.
DESTROYED rows are never touched (a name reused in Ganeti is not their instance).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, bindparam, select, update

from synnefo_ganeti.store.db._any import any_of
from synnefo_ganeti.store.db._checked import checked
from synnefo_ganeti.store.db._many import execute_many
from synnefo_ganeti.store.instances._instances import InstanceStatus, instances_t

if TYPE_CHECKING:
    from synnefo_ganeti.store._store import Store

__all__ = ["OBSERVED_FIELDS", "record_observed", "store_observed"]

#: the instance columns Ganeti's answers fill
OBSERVED_FIELDS = ("nics", "disks", "memory", "vcpus", "os", "pnode")

_CHUNK = 500

_UPDATE = (
    update(instances_t)
    .where(instances_t.c.id == bindparam("row_id"))
    .values(
        {**{name: bindparam(f"new_{name}") for name in OBSERVED_FIELDS}, "updated_at": bindparam("b_now")}
    )
)


#: the live rows of some names of a backend, with their observed columns (built once: the
#: dispatcher stores what Ganeti made after every batch of creates that end)
_LIVE_OBSERVED = select(
    instances_t.c.id,
    instances_t.c.name,
    instances_t.c.state_time,
    *(instances_t.c[name] for name in OBSERVED_FIELDS),
).where(
    instances_t.c.backend_id == bindparam("b_backend"),
    any_of(instances_t.c.name, "b_names"),
    checked(instances_t.c.status) != InstanceStatus.DESTROYED.value,
)


def store_observed(
    conn: Connection,
    backend_id: int,
    observed: Mapping[str, Mapping[str, Any]],
    *,
    taken_at: float | None = None,
    now: datetime | None = None,
) -> int:
    """Write ``observed`` (instance name -> column values) into the backend's rows that differ.

    Only :data:`OBSERVED_FIELDS` are written; names the database lacks are skipped. With
    ``taken_at``, a row whose last applied job ended after it is skipped. Returns how many
    rows changed.
    """
    now = now or datetime.now(UTC)
    names = sorted(observed)
    changed = 0
    for start in range(0, len(names), _CHUNK):
        rows = conn.execute(
            _LIVE_OBSERVED, {"b_backend": backend_id, "b_names": names[start : start + _CHUNK]}
        ).all()
        updates: list[dict[str, Any]] = []
        for row in rows:
            if taken_at is not None and row.state_time is not None and row.state_time > taken_at:
                continue  # a job ended after Ganeti answered: the answer is older than the row
            seen = observed[row.name]
            if all(key not in seen or getattr(row, key) == seen[key] for key in OBSERVED_FIELDS):
                continue
            # every observed column bound (the row's own value where Ganeti said nothing): one
            # statement for all the changed rows of the chunk
            updates.append(
                {"row_id": row.id, "b_now": now}
                | {f"new_{key}": seen.get(key, getattr(row, key)) for key in OBSERVED_FIELDS}
            )
        if updates:
            execute_many(conn, _UPDATE, updates, key=("row_id",))
            changed += len(updates)
    return changed


async def record_observed(
    store: Store,
    backend: str,
    observed: Mapping[str, Mapping[str, Any]],
    *,
    taken_at: float | None = None,
) -> int:
    """:func:`store_observed` in one writer call; returns how many rows changed."""
    if not observed:
        return 0
    backend_id = await store.ensure_backend(backend)
    snapshot = {name: dict(values) for name, values in observed.items()}
    return await store.call(lambda conn: store_observed(conn, backend_id, snapshot, taken_at=taken_at))
