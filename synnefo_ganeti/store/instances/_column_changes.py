"""The instance columns a succeeded operation changes, read and guarded inside the writer's transaction.

:func:`~synnefo_ganeti.store.instances._outcomes.changes_after` (pure) says what an operation's end
changes from the instance's current columns; applying job ends (``store/instances/_instances.py``,
``apply_final_jobs``) reads those columns here only for the rows that need them (a burst of
creates and power actions reads none), and :func:`renamed` keeps a rename from taking a name
another live row of the backend holds (the unique index would refuse it and fail the whole
transaction of job ends).

Functions here run inside the writer's transaction, on a synchronous connection.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Connection, Table, select

from synnefo_ganeti.jobs import JobStatus, JobSummary
from synnefo_ganeti.store.db._any import any_of
from synnefo_ganeti.store.instances._outcomes import CHANGED_COLUMNS, CHANGING_ACTIONS, error_record
from synnefo_ganeti.store.instances._rows import Instance

__all__ = ["changed_columns", "renamed"]

instances_t = cast(Table, Instance.__table__)
_DESTROYED = "DESTROYED"  # InstanceStatus.DESTROYED (its module imports this one)
#: the changed columns of some instances (built once: one statement text whatever their number)
_CHANGED = select(instances_t.c.id, *(instances_t.c[column] for column in CHANGED_COLUMNS)).where(
    any_of(instances_t.c.id, "b_ids")
)


def changed_columns(
    conn: Connection, rows: Iterable[Any], summaries: dict[int, JobSummary]
) -> dict[int, dict[str, Any]]:
    """Instance row id -> its :data:`CHANGED_COLUMNS`, for the rows (``instance_jobs`` joined with
    ``instances``) whose job succeeded and changes some."""
    ids = [
        row.instance_id
        for row in rows
        if row.params and row.action in CHANGING_ACTIONS and summaries[row.job_id].status is JobStatus.SUCCESS
    ]
    if not ids:
        return {}
    found = conn.execute(_CHANGED, {"b_ids": ids}).all()
    return {row.id: {column: getattr(row, column) for column in CHANGED_COLUMNS} for row in found}


def renamed(
    conn: Connection, backend_id: int, row_id: int, values: dict[str, Any], job_id: int, now: datetime
) -> dict[str, Any]:
    """A rename's end: the row takes its new name unless another live row of the backend took it
    while the rename ran (the facade checks the name at submit, it does not hold it): then the
    name stays and ``last_error`` says why."""
    taken = conn.execute(
        select(instances_t.c.uuid).where(
            instances_t.c.backend_id == backend_id,
            instances_t.c.name == values["name"],
            instances_t.c.status != _DESTROYED,
            instances_t.c.id != row_id,
        )
    ).first()
    if taken is None:
        return values
    message = (
        f"renamed to {values['name']} in Ganeti, but instance {taken.uuid} holds that name in the "
        "database: the row keeps its old name until the reconciler settles it"
    )
    kept = {key: value for key, value in values.items() if key != "name"}
    return kept | {"last_error": error_record("rename", job_id, message, now)}
