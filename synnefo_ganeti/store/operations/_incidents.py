"""Incidents and their repairs (migration 0014's ``incidents``), and their rows in the change feed.

:class:`IncidentStore` (``IncidentStore(store)``; it holds no state of its own) keeps what the
dispatcher's repair task (``dispatch repair``, docs/operations.md "Repair by policy") found
wrong on a backend: a node down, an instance stopped or in error while it should run, a
migration that left it stopped; the repair it sent, if policy allowed one (``action``,
``job_id``); and how it ended (``outcome``: :data:`OUTCOMES`).

Every write of an incident (opened, a repair sent, closed) also writes a row of the change feed
(``changes``: ``kind`` "incident", ``key`` the incident's id, ``status`` "open" or its outcome,
``task`` its action, ``error`` its detail) in the same transaction. The feed's other rows are
written by triggers; these are written here, so that migration 0012's trigger function stays as
it is. On PostgreSQL the row's id comes from migration 0015's trigger on ``changes`` (the feed
writers' lock first, so that readers keep to the horizon, ``store/changes/_horizon.py``), and
the transaction NOTIFYs the feed's channel (an empty payload), as the triggers do.

Writes go through the store's writer; reads use the store's readers.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, cast

from sqlalchemy import Table, func, insert, select, update
from sqlalchemy.engine import Connection

from synnefo_ganeti._serial import iso
from synnefo_ganeti.errors import NotFoundError
from synnefo_ganeti.store.changes._rows import ChangeRow
from synnefo_ganeti.store.operations._rows import IncidentRow

if TYPE_CHECKING:
    from synnefo_ganeti.store._store import Store

__all__ = ["INCIDENT_KINDS", "OUTCOMES", "Incident", "IncidentStore"]

incidents_t = cast(Table, IncidentRow.__table__)
changes_t = cast(Table, ChangeRow.__table__)

#: what an incident is about
INCIDENT_KINDS: Final = ("node-down", "instance-stopped", "instance-error", "migration-stopped")
#: how an incident ended: its repair's job succeeded; the problem went away by itself (or an
#: operator's hand); the repair failed (its job, the fence command, or Ganeti refused it)
OUTCOMES: Final = ("repaired", "resolved", "failed")
#: the change feed's channel (store/changes/_changes.py's CHANGES_CHANNEL; not imported: no cycle)
_CHANNEL = "synnefo_ganeti_changes"


@dataclass(frozen=True, slots=True)
class Incident:
    """One incident: open while ``closed_at`` is None."""

    id: int
    kind: str
    backend: str
    node: str | None
    instance: str | None
    opened_at: datetime
    updated_at: datetime
    action: str | None
    job_id: int | None
    closed_at: datetime | None
    outcome: str | None
    detail: str | None

    @property
    def open(self) -> bool:
        return self.closed_at is None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "backend": self.backend,
            "node": self.node,
            "instance": self.instance,
            "opened": iso(self.opened_at),
            "updated": iso(self.updated_at),
            "action": self.action,
            "job": self.job_id,
            "closed": iso(self.closed_at),
            "outcome": self.outcome,
            "detail": self.detail,
        }


class IncidentStore:
    """The incidents of one :class:`Store` (see the module)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def __repr__(self) -> str:
        return f"<IncidentStore {self.store.display_url}>"

    async def open_incident(
        self,
        kind: str,
        backend: str,
        *,
        node: str | None = None,
        instance: str | None = None,
        detail: str | None = None,
    ) -> Incident:
        """Open an incident (or give the open one of the same kind, backend, node and instance,
        its ``detail`` written when it changed: a change of the feed too)."""
        if kind not in INCIDENT_KINDS:
            raise ValueError(f"incident kind {kind!r}: one of {', '.join(INCIDENT_KINDS)}")

        def run(conn: Connection) -> Incident:
            found = conn.execute(
                select(incidents_t).where(
                    incidents_t.c.kind == kind,
                    incidents_t.c.backend == backend,
                    _is(incidents_t.c.node, node),
                    _is(incidents_t.c.instance, instance),
                    incidents_t.c.closed_at.is_(None),
                )
            ).first()
            if found is not None:
                incident = _incident(found)
                if detail is None or detail == incident.detail:
                    return incident
                conn.execute(
                    update(incidents_t)
                    .where(incidents_t.c.id == incident.id)
                    .values(detail=detail, updated_at=datetime.now(UTC))
                )
                _feed(conn, incident.id, "open", incident.action, detail)
                return self._get(conn, incident.id)
            now = datetime.now(UTC)
            values = {
                "kind": kind,
                "backend": backend,
                "node": node,
                "instance": instance,
                "opened_at": now,
                "updated_at": now,
                "detail": detail,
            }
            key = conn.execute(insert(incidents_t).values(values)).inserted_primary_key
            assert key is not None
            incident_id = int(key[0])
            _feed(conn, incident_id, "open", None, detail)
            return self._get(conn, incident_id)

        return await self.store.call(run)

    async def set_repair(
        self, incident_id: int, action: str, *, job_id: int | None = None, detail: str | None = None
    ) -> Incident:
        """The repair sent for an open incident: ``action`` and its job (None: no job, a fence)."""

        def run(conn: Connection) -> Incident:
            values: dict[str, Any] = {"action": action, "job_id": job_id, "updated_at": datetime.now(UTC)}
            if detail is not None:
                values["detail"] = detail
            conn.execute(
                update(incidents_t)
                .where(incidents_t.c.id == incident_id, incidents_t.c.closed_at.is_(None))
                .values(values)
            )
            incident = self._get(conn, incident_id)
            _feed(conn, incident_id, "open", action, incident.detail)
            return incident

        return await self.store.call(run)

    async def close_incident(self, incident_id: int, outcome: str, *, detail: str | None = None) -> Incident:
        """Close an open incident with ``outcome`` (one of :data:`OUTCOMES`); a closed one is
        returned unchanged."""
        if outcome not in OUTCOMES:
            raise ValueError(f"incident outcome {outcome!r}: one of {', '.join(OUTCOMES)}")

        def run(conn: Connection) -> Incident:
            now = datetime.now(UTC)
            values: dict[str, Any] = {"closed_at": now, "updated_at": now, "outcome": outcome}
            if detail is not None:
                values["detail"] = detail
            done = conn.execute(
                update(incidents_t)
                .where(incidents_t.c.id == incident_id, incidents_t.c.closed_at.is_(None))
                .values(values)
            )
            incident = self._get(conn, incident_id)
            if done.rowcount:
                _feed(conn, incident_id, outcome, incident.action, incident.detail)
            return incident

        return await self.store.call(run)

    async def incidents(
        self, *, open_only: bool = False, backend: str | None = None, limit: int | None = 500
    ) -> list[Incident]:
        """The incidents, newest first (open ones only; of ``backend``)."""

        def run(conn: Connection) -> list[Incident]:
            query = select(incidents_t).order_by(incidents_t.c.id.desc())
            if open_only:
                query = query.where(incidents_t.c.closed_at.is_(None))
            if backend is not None:
                query = query.where(incidents_t.c.backend == backend)
            if limit is not None:
                query = query.limit(limit)
            return [_incident(row) for row in conn.execute(query)]

        return await self.store.call_read(run)

    async def get(self, incident_id: int) -> Incident:
        """One incident; :class:`NotFoundError` when there is none of that id."""
        return await self.store.call_read(lambda conn: self._get(conn, incident_id))

    @staticmethod
    def _get(conn: Connection, incident_id: int) -> Incident:
        row = conn.execute(select(incidents_t).where(incidents_t.c.id == incident_id)).first()
        if row is None:
            raise NotFoundError(f"no incident {incident_id}")
        return _incident(row)


def _is(column: Any, value: str | None) -> Any:
    return column.is_(None) if value is None else column == value


def _feed(conn: Connection, incident_id: int, status: str, action: str | None, detail: str | None) -> None:
    """The change-feed row of an incident's write, in its transaction (see the module)."""
    now = datetime.now(UTC).timestamp()
    key = conn.execute(
        insert(changes_t).values(
            kind="incident", key=str(incident_id), status=status, task=action, error=detail, at=now
        )
    ).inserted_primary_key
    if conn.dialect.name == "postgresql" and key is not None:
        conn.execute(select(func.pg_notify(_CHANNEL, "")))  # (one a transaction, as the triggers')


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _incident(row: Any) -> Incident:
    values = row._asdict()
    return Incident(
        id=int(values["id"]),
        kind=values["kind"],
        backend=values["backend"],
        node=values["node"],
        instance=values["instance"],
        opened_at=cast(datetime, _utc(values["opened_at"])),
        updated_at=cast(datetime, _utc(values["updated_at"])),
        action=values["action"],
        job_id=values["job_id"],
        closed_at=_utc(values["closed_at"]),
        outcome=values["outcome"],
        detail=values["detail"],
    )
