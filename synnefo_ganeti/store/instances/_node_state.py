"""The state of an instance's primary node, stored: ``instances.node_state`` and its ``since``.

Ganeti reads an instance whose primary node does not answer as ``ERROR_nodedown`` and one
whose node an operator marked offline as ``ERROR_nodeoffline``; the instance itself may run
or not, nobody can tell. The store keeps that beside the instance's ``status`` (which stays
what it was asked to be): ``node_state`` None while the node is up, ``"down"`` or
``"offline"``; ``node_state_since`` when it was first seen not up (kept from ``down`` to
``offline``; None once up again). A change of ``node_state`` is a change in the feed (the
triggers of migration 0010).

Two writers: the dispatcher, which watches nodes, marks every live instance of a node
(:func:`set_node_state_rows`); a reconcile pass marks each instance from what Ganeti says of
it (:func:`store_node_states`). Only rows whose state differs are written. DESTROYED rows are
never touched.

All functions here run inside the writer's transaction, on a synchronous connection.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Final

from sqlalchemy import Connection, bindparam, case, select, update

from synnefo_ganeti.errors import InvalidError
from synnefo_ganeti.store.db._any import any_of
from synnefo_ganeti.store.db._checked import checked
from synnefo_ganeti.store.instances._instances import InstanceStatus, instances_t

__all__ = [
    "GANETI_NODE_STATES",
    "NODE_STATES",
    "check_node_state",
    "node_state_of",
    "set_node_state_rows",
    "store_node_states",
]

#: the values of ``instances.node_state`` besides None (up)
NODE_STATES: Final = ("down", "offline")

#: Ganeti's instance status -> the node state it tells
_FROM_GANETI: Final = {"ERROR_nodedown": "down", "ERROR_nodeoffline": "offline"}
#: the instance statuses of Ganeti that say its primary node is not up
GANETI_NODE_STATES: Final = frozenset(_FROM_GANETI)

_CHUNK = 500


def node_state_of(ganeti_status: str | None) -> str | None:
    """The node state Ganeti's instance status tells: "down", "offline", or None (up)."""
    return _FROM_GANETI.get(ganeti_status or "")


def check_node_state(state: str | None) -> str | None:
    if state is not None and state not in NODE_STATES:
        raise InvalidError(f"node state {state!r} is not one of None, {', '.join(NODE_STATES)}")
    return state


def _since(state: str | None, now: datetime) -> object:
    """``node_state_since`` after a change to ``state``: kept while the node stays not up."""
    if state is None:
        return None
    return case((instances_t.c.node_state.is_(None), now), else_=instances_t.c.node_state_since)


def set_node_state_rows(
    conn: Connection, backend_id: int, node: str, state: str | None, now: datetime | None = None
) -> int:
    """Set ``node_state`` of every live instance of the backend whose ``pnode`` is ``node``;
    how many rows changed."""
    now = now or datetime.now(UTC)
    result = conn.execute(
        update(instances_t)
        .where(
            instances_t.c.backend_id == backend_id,
            instances_t.c.pnode == node,
            instances_t.c.status != InstanceStatus.DESTROYED.value,
            instances_t.c.node_state.is_distinct_from(state),
        )
        .values(node_state=state, node_state_since=_since(state, now), updated_at=now)
    )
    return int(result.rowcount or 0)


_LIVE_STATES = select(instances_t.c.id, instances_t.c.name, instances_t.c.node_state).where(
    instances_t.c.backend_id == bindparam("b_backend"),
    any_of(instances_t.c.name, "b_names"),
    checked(instances_t.c.status) != InstanceStatus.DESTROYED.value,
)


def store_node_states(
    conn: Connection,
    backend_id: int,
    states: Mapping[str, str | None],
    now: datetime | None = None,
) -> int:
    """Write ``states`` (instance name -> node state) into the backend's live rows that differ;
    names the database lacks are skipped. How many rows changed."""
    now = now or datetime.now(UTC)
    names = sorted(states)
    by_state: dict[str | None, list[int]] = {}
    for start in range(0, len(names), _CHUNK):
        rows = conn.execute(
            _LIVE_STATES, {"b_backend": backend_id, "b_names": names[start : start + _CHUNK]}
        ).all()
        for row in rows:
            state = check_node_state(states[row.name])
            if row.node_state != state:
                by_state.setdefault(state, []).append(int(row.id))
    changed = 0
    for state, ids in by_state.items():
        for start in range(0, len(ids), _CHUNK):
            result = conn.execute(
                update(instances_t)
                .where(instances_t.c.id.in_(ids[start : start + _CHUNK]))
                .values(node_state=state, node_state_since=_since(state, now), updated_at=now)
            )
            changed += int(result.rowcount or 0)
    return changed
