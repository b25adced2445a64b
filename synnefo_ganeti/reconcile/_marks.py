"""What each reconcile pass marks in the store whatever the fixes: node states, rows not ours.

Two marks, computed from the pass's snapshots and the plan (pure), then written:

* the state of each instance's primary node as Ganeti reads it (``ERROR_nodedown`` ->
  "down", ``ERROR_nodeoffline`` -> "offline", anything else -> None), into the rows whose
  ``node_state`` differs (:meth:`Store.store_node_states`): a pass alone marks what died and
  clears it once Ganeti reads the instance normally again (the dispatcher's node watch does
  the same by node, sooner);
* ``owned`` False on the rows a ``not_owned`` drift names (:meth:`Store.mark_not_owned`):
  from then on every action refuses them. A row in BUILD is left as it is (its create's end
  settles it).

Neither is a fix: a fix takes Ganeti's state into the database; these only say what the
control plane may not touch, or why an instance does not answer. Only our rows and our
instances count (an instance of Ganeti lacking the marks never moves a row).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from synnefo_ganeti.reconcile._observe import InstanceView
from synnefo_ganeti.reconcile._plan import DbSnapshot, Drift, DriftKind, GanetiSnapshot
from synnefo_ganeti.store import InstanceStatus, Store
from synnefo_ganeti.store.instances._node_state import node_state_of

__all__ = ["node_states", "not_owned_rows", "ours", "record_marks"]


def node_states(db: DbSnapshot, gnt: GanetiSnapshot) -> dict[str, str | None]:
    """name -> the node state Ganeti reads, for each of our live rows whose stored one differs."""
    states: dict[str, str | None] = {}
    for name, row in db.instances.items():
        if row.status is InstanceStatus.DESTROYED or not row.owned or gnt.theirs(name):
            continue
        instance = gnt.instances.get(name)
        if instance is None:
            continue  # not in Ganeti: a stale drift, nothing to say of its node
        state = node_state_of(instance.status)
        if state != row.node_state:
            states[name] = state
    return states


def not_owned_rows(db: DbSnapshot, drifts: Iterable[Drift]) -> dict[str, str]:
    """name -> status of the rows still owned that a ``not_owned`` drift names (not in BUILD)."""
    rows: dict[str, str] = {}
    for drift in drifts:
        if drift.kind is not DriftKind.NOT_OWNED or drift.instance is None:
            continue
        row = db.instances.get(drift.instance)
        if row is not None and row.owned and row.status is not InstanceStatus.BUILD:
            rows[drift.instance] = row.status.value
    return rows


def ours(gnt: GanetiSnapshot) -> Mapping[str, InstanceView]:
    """Ganeti's instances less those lacking the ownership marks (their values are never
    recorded into a row of ours: :func:`~._observe.observed_changes`)."""
    if not gnt.marks or all(name in gnt.owned for name in gnt.instances):
        return gnt.instances
    return {name: instance for name, instance in gnt.instances.items() if name in gnt.owned}


async def record_marks(store: Store, db: DbSnapshot, gnt: GanetiSnapshot, drifts: Iterable[Drift]) -> int:
    """Write both marks of one backend's pass; how many rows changed."""
    changed = await store.store_node_states(db.backend, node_states(db, gnt))
    return changed + await store.mark_not_owned(db.backend, not_owned_rows(db, drifts))
