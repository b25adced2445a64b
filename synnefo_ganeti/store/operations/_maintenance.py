"""Rolling maintenance runs as stored (``maintenance_runs``, migration 0014), so that a run killed
resumes where it was.

:class:`MaintenanceStore` (``MaintenanceStore(store)``; it holds no state of its own) keeps one
row per run: its backend, status, the operator's command, its plan (the groups, and the run's
options under ``"options"``), where it is (``position``: group, phase, node, the nodes done in
the phase, steps done and in all), who started it, which process runs it (``owner``) and when
that process last said so (``heartbeat_at``).

Statuses: ``running`` (a process runs it, or ran it and was killed: its heartbeat is old),
``failed`` (a step failed: the error is stored, the position kept; running it again resumes
there), ``done`` and ``canceled`` (final). At most one ``running`` run per backend (a partial
unique index); :meth:`MaintenanceStore.begin` decides, in one write transaction, whether a
start is new, resumes a run (killed or failed), or is refused (:class:`ConflictError` naming the
run that holds the backend while its owner's heartbeat is fresh). Every later write of the
runner (:meth:`save`, :meth:`finish`) says which owner writes: a run canceled or taken over
meanwhile is not written, and the runner learns it (False).

Writes go through the store's writer; reads use the store's readers.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, cast
from uuid import uuid4

from sqlalchemy import Table, insert, select, update
from sqlalchemy.engine import Connection

from synnefo_ganeti._serial import iso
from synnefo_ganeti.errors import ConflictError, NotFoundError
from synnefo_ganeti.store.operations._rows import MaintenanceRun

if TYPE_CHECKING:
    from synnefo_ganeti.store._store import Store

__all__ = ["MAINTENANCE_STATUSES", "MaintenanceRecord", "MaintenanceStore"]

runs_t = cast(Table, MaintenanceRun.__table__)

#: every status a run may have; the last two are final
MAINTENANCE_STATUSES = ("running", "failed", "done", "canceled")
_RESUMABLE = ("running", "failed")


@dataclass(frozen=True, slots=True)
class MaintenanceRecord:
    """One stored run (see the module)."""

    id: str
    backend: str
    status: str
    command: str
    plan: dict[str, Any]
    position: dict[str, Any]
    started_by: str
    owner: str | None
    heartbeat_at: datetime | None
    started_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    error: str | None

    @property
    def steps_done(self) -> int:
        return int(self.position.get("steps_done", 0))

    @property
    def steps_total(self) -> int:
        return int(self.position.get("steps_total", 0))

    @property
    def options(self) -> dict[str, Any]:
        found = self.plan.get("options")
        return found if isinstance(found, dict) else {}

    def alive(self, stale_after: float, now: datetime | None = None) -> bool:
        """Running and its owner's heartbeat younger than ``stale_after`` seconds."""
        now = now or datetime.now(UTC)
        if self.status != "running" or self.heartbeat_at is None:
            return False
        return now - self.heartbeat_at < timedelta(seconds=stale_after)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "backend": self.backend,
            "status": self.status,
            "command": self.command,
            "plan": self.plan,
            "position": self.position,
            "steps_done": self.steps_done,
            "steps_total": self.steps_total,
            "started_by": self.started_by,
            "owner": self.owner,
            "heartbeat_at": iso(self.heartbeat_at),
            "started_at": iso(self.started_at),
            "updated_at": iso(self.updated_at),
            "finished_at": iso(self.finished_at),
            "error": self.error,
        }


class MaintenanceStore:
    """The rolling maintenance runs of one :class:`Store` (see the module)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def __repr__(self) -> str:
        return f"<MaintenanceStore {self.store.display_url}>"

    async def begin(
        self,
        backend: str,
        *,
        owner: str,
        started_by: str,
        stale_after: float,
        new: tuple[str, dict[str, Any], dict[str, Any]] | None,
    ) -> tuple[MaintenanceRecord, bool]:
        """Take ``backend``'s unfinished run (running with an old heartbeat, or failed) for
        ``owner``: (the run, True). Without one, start ``new`` = (command, plan, position) as a
        running run of ``owner``: (the run, False); with ``new`` None, :class:`NotFoundError`.
        :class:`ConflictError` while another owner's run holds the backend (its heartbeat
        younger than ``stale_after`` seconds)."""

        def run(conn: Connection) -> tuple[MaintenanceRecord, bool]:
            now = datetime.now(UTC)
            found = conn.execute(
                select(runs_t)
                .where(runs_t.c.backend == backend, runs_t.c.status.in_(_RESUMABLE))
                .order_by(runs_t.c.started_at.desc())
                .limit(1)
            ).first()
            if found is not None:
                record = _record(found)
                if record.owner != owner and record.alive(stale_after, now):
                    raise ConflictError(
                        f"backend {backend} is held by maintenance run {record.id} (started by "
                        f"{record.started_by}, run by {record.owner}, last heartbeat "
                        f"{iso(record.heartbeat_at)}); wait for it or cancel it "
                        f"('synnefo-ganeti maintenance cancel {backend}')"
                    )
                values = {"status": "running", "owner": owner, "heartbeat_at": now, "updated_at": now}
                conn.execute(update(runs_t).where(runs_t.c.id == record.id).values(values))
                return _record(conn.execute(select(runs_t).where(runs_t.c.id == record.id)).one()), True
            if new is None:
                raise NotFoundError(f"backend {backend} has no maintenance run to resume")
            command, plan, position = new
            row: dict[str, Any] = {
                "id": str(uuid4()),
                "backend": backend,
                "status": "running",
                "command": command,
                "plan": plan,
                "position": position,
                "started_by": started_by,
                "owner": owner,
                "heartbeat_at": now,
                "started_at": now,
                "updated_at": now,
                "finished_at": None,
                "error": None,
            }
            conn.execute(insert(runs_t).values(row))
            return MaintenanceRecord(**row), False

        return await self.store.call(run)

    async def save(self, run_id: str, owner: str, position: dict[str, Any]) -> bool:
        """Where run ``run_id`` is now (and a heartbeat); False when ``owner`` no longer runs it
        (canceled, or taken over)."""
        now = datetime.now(UTC)
        values = {"position": position, "heartbeat_at": now, "updated_at": now}
        return await self._owned_update(run_id, owner, values)

    async def heartbeat(self, run_id: str, owner: str) -> bool:
        """``owner`` still runs ``run_id``; False when it does not any more."""
        return await self._owned_update(run_id, owner, {"heartbeat_at": datetime.now(UTC)})

    async def finish(self, run_id: str, owner: str, status: str, error: str | None = None) -> bool:
        """The run ended ``status`` (done, failed); False when ``owner`` no longer ran it."""
        if status not in ("done", "failed"):
            raise ValueError(f"a run finishes done or failed, not {status!r}")
        now = datetime.now(UTC)
        values: dict[str, Any] = {"status": status, "error": error, "updated_at": now, "heartbeat_at": now}
        values["finished_at"] = now if status == "done" else None
        return await self._owned_update(run_id, owner, values)

    async def cancel(self, backend: str, *, by: str) -> MaintenanceRecord:
        """Cancel ``backend``'s unfinished run (running or failed): it runs no further step (a
        running one stops at its next step). :class:`NotFoundError` when there is none."""

        def run(conn: Connection) -> MaintenanceRecord:
            now = datetime.now(UTC)
            found = conn.execute(
                select(runs_t.c.id)
                .where(runs_t.c.backend == backend, runs_t.c.status.in_(_RESUMABLE))
                .order_by(runs_t.c.started_at.desc())
                .limit(1)
            ).first()
            if found is None:
                raise NotFoundError(f"backend {backend} has no maintenance run to cancel")
            conn.execute(
                update(runs_t)
                .where(runs_t.c.id == found.id)
                .values(status="canceled", finished_at=now, updated_at=now, error=f"canceled by {by}")
            )
            return _record(conn.execute(select(runs_t).where(runs_t.c.id == found.id)).one())

        return await self.store.call(run)

    async def runs(self, *, backend: str | None = None, limit: int = 50) -> list[MaintenanceRecord]:
        """The newest runs first (of ``backend``)."""

        def run(conn: Connection) -> list[MaintenanceRecord]:
            query = select(runs_t).order_by(runs_t.c.started_at.desc()).limit(limit)
            if backend is not None:
                query = query.where(runs_t.c.backend == backend)
            return [_record(row) for row in conn.execute(query)]

        return await self.store.call_read(run)

    async def get(self, run_id: str) -> MaintenanceRecord:
        """Run ``run_id``; :class:`NotFoundError` when there is none."""

        def run(conn: Connection) -> MaintenanceRecord | None:
            row = conn.execute(select(runs_t).where(runs_t.c.id == run_id)).first()
            return None if row is None else _record(row)

        found = await self.store.call_read(run)
        if found is None:
            raise NotFoundError(f"no maintenance run {run_id}")
        return found

    async def _owned_update(self, run_id: str, owner: str, values: dict[str, Any]) -> bool:
        def run(conn: Connection) -> bool:
            done = conn.execute(
                update(runs_t)
                .where(runs_t.c.id == run_id, runs_t.c.owner == owner, runs_t.c.status == "running")
                .values(values)
            )
            return bool(done.rowcount)

        return await self.store.call(run)


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _record(row: Any) -> MaintenanceRecord:
    data = dict(row._mapping)
    for key in ("heartbeat_at", "started_at", "updated_at", "finished_at"):
        data[key] = _utc(data[key])
    return MaintenanceRecord(**data)
