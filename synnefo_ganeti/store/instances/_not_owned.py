"""Rows whose instance in Ganeti is not ours: ``owned`` False, so that nothing acts on them.

A create refused because an operator's VM (without the ownership marks of ``[ownership]``)
holds the name leaves an ERROR row of that name; the reconciler reports the pair as
``not_owned`` and marks the row here. From then on no fix takes Ganeti's state into it and
every action refuses it (control/_actions.py): the control plane never takes over, changes
or removes an instance it does not own. The mark is never taken back by the control plane.

Runs inside the writer's transaction, on a synchronous connection.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

from sqlalchemy import Connection, update

from synnefo_ganeti.store.instances._instances import InstanceStatus, instances_t

__all__ = ["mark_not_owned_rows"]


def mark_not_owned_rows(
    conn: Connection, backend_id: int, rows: Mapping[str, str], now: datetime | None = None
) -> int:
    """Set ``owned`` False on the backend's live rows ``rows`` names (name -> the status the
    reconciler saw: a row that moved on since, or a new life of the name, is left alone);
    how many rows changed."""
    now = now or datetime.now(UTC)
    changed = 0
    for name, status in sorted(rows.items()):
        if status == InstanceStatus.DESTROYED.value:
            continue
        result = conn.execute(
            update(instances_t)
            .where(
                instances_t.c.backend_id == backend_id,
                instances_t.c.name == name,
                instances_t.c.status == status,
                instances_t.c.owned.is_(True),
            )
            .values(owned=False, updated_at=now)
        )
        changed += int(result.rowcount or 0)
    return changed
