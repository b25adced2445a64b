"""What a separate reader sees of the dispatchers and the operators (migration 0013).

:class:`StatusStore` (``StatusStore(store)``; it holds no state of its own) keeps:

* each dispatcher's report of itself (``dispatchers``): written every few seconds by the
  dispatcher, it says whether every root task runs, which ones, and per backend its claims and
  queue. A ``web`` process of its own, or the CLI, reads it: a dispatcher whose report is older
  than :data:`DEAD_AFTER` of its intervals, or that wrote its stop, is not alive;
* the last reconcile pass over each backend and its report (``backends.reconciled_*``);
* the audit log (``audit_log``): every operator action, who, how, what, on what, which job and
  how it ended, newest first when read.

Writes go through the store's writer; reads use the store's readers.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Table, delete, insert, select, update
from sqlalchemy.engine import Connection

from synnefo_ganeti._serial import iso
from synnefo_ganeti.store.backends._backends import backends_t
from synnefo_ganeti.store.operations._rows import AuditEntry, DispatcherRow

if TYPE_CHECKING:
    from synnefo_ganeti.store._store import Store

__all__ = [
    "AUDIT_OUTCOMES",
    "DEAD_AFTER",
    "AuditRecord",
    "DispatcherReport",
    "ReconcileRecord",
    "StatusStore",
]

dispatchers_t = cast(Table, DispatcherRow.__table__)
audit_t = cast(Table, AuditEntry.__table__)

#: a dispatcher whose last report is older than this many of its intervals is taken for dead
DEAD_AFTER = 3
#: how an audited action ended
AUDIT_OUTCOMES = ("ok", "refused", "failed")
#: stopped dispatchers' rows kept this long (each start writes a row of its own)
KEEP_STOPPED = timedelta(days=7)


@dataclass(frozen=True, slots=True)
class DispatcherReport:
    """A dispatcher as it last reported itself."""

    id: str
    host: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    interval: float
    healthy: bool
    stopped_at: datetime | None
    state: dict[str, Any]

    def alive(self, now: datetime | None = None) -> bool:
        """Running and reporting: not stopped, its last report recent."""
        now = now or datetime.now(UTC)
        fresh = now - self.heartbeat_at <= timedelta(seconds=DEAD_AFTER * self.interval)
        return self.stopped_at is None and fresh

    def to_json(self, now: datetime | None = None) -> dict[str, Any]:
        return {
            "id": self.id,
            "host": self.host,
            "pid": self.pid,
            "started_at": iso(self.started_at),
            "heartbeat_at": iso(self.heartbeat_at),
            "interval": self.interval,
            "healthy": self.healthy,
            "alive": self.alive(now),
            "stopped_at": iso(self.stopped_at),
            "state": self.state,
        }


@dataclass(frozen=True, slots=True)
class ReconcileRecord:
    """The last reconcile pass over a backend: when, by whom, its report (``BackendReport.to_json``)."""

    backend: str
    at: datetime
    by: str
    report: dict[str, Any]


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One operator action."""

    id: int
    at: datetime
    actor: str
    via: str
    action: str
    backend: str | None
    target: str | None
    job_id: int | None
    outcome: str
    detail: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "at": iso(self.at),
            "actor": self.actor,
            "via": self.via,
            "action": self.action,
            "backend": self.backend,
            "target": self.target,
            "job_id": self.job_id,
            "outcome": self.outcome,
            "detail": self.detail,
        }


class StatusStore:
    """Dispatcher reports, reconcile reports and the audit log of one :class:`Store`."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def __repr__(self) -> str:
        return f"<StatusStore {self.store.display_url}>"

    # -- dispatchers ------------------------------------------------------------------------------

    async def report_dispatcher(
        self,
        dispatcher_id: str,
        *,
        host: str,
        pid: int,
        started_at: datetime,
        interval: float,
        healthy: bool,
        state: dict[str, Any],
        stopped: bool = False,
    ) -> None:
        """Write dispatcher ``dispatcher_id``'s report (its row made on the first one); ``stopped``:
        it stops now. Rows of dispatchers stopped more than :data:`KEEP_STOPPED` ago go."""
        now = datetime.now(UTC)
        values = {
            "host": host,
            "pid": pid,
            "started_at": started_at,
            "heartbeat_at": now,
            "interval": interval,
            "healthy": healthy,
            "stopped_at": now if stopped else None,
            "state": state,
        }

        def run(conn: Connection) -> None:
            done = conn.execute(
                update(dispatchers_t).where(dispatchers_t.c.id == dispatcher_id).values(values)
            )
            if not done.rowcount:
                conn.execute(insert(dispatchers_t).values(id=dispatcher_id, **values))
                conn.execute(delete(dispatchers_t).where(dispatchers_t.c.stopped_at < now - KEEP_STOPPED))

        await self.store.call(run)

    async def dispatchers(self) -> list[DispatcherReport]:
        """Every dispatcher's last report, the newest start first."""

        def run(conn: Connection) -> list[DispatcherReport]:
            rows = conn.execute(select(dispatchers_t).order_by(dispatchers_t.c.started_at.desc()))
            return [DispatcherReport(**_aware(row._asdict())) for row in rows]

        return await self.store.call_read(run)

    # -- reconcile reports ------------------------------------------------------------------------

    async def record_reconcile(self, backend: str, report: dict[str, Any], *, by: str) -> None:
        """The report of a reconcile pass over ``backend`` that ended now, by ``by``."""
        backend_id = await self.store.ensure_backend(backend)
        now = datetime.now(UTC)
        await self.store.call(
            lambda conn: conn.execute(
                update(backends_t)
                .where(backends_t.c.id == backend_id)
                .values(reconciled_at=now, reconciled_by=by, reconcile_report=report)
            )
        )

    async def reconcile_reports(self) -> dict[str, ReconcileRecord]:
        """Per backend reconciled at least once, its last pass."""

        def run(conn: Connection) -> dict[str, ReconcileRecord]:
            rows = conn.execute(
                select(
                    backends_t.c.name,
                    backends_t.c.reconciled_at,
                    backends_t.c.reconciled_by,
                    backends_t.c.reconcile_report,
                ).where(backends_t.c.reconciled_at.is_not(None))
            )
            return {
                row.name: ReconcileRecord(
                    row.name, _utc(row.reconciled_at), row.reconciled_by or "", row.reconcile_report or {}
                )
                for row in rows
            }

        return await self.store.call_read(run)

    # -- the audit log ----------------------------------------------------------------------------

    async def audit(
        self,
        actor: str,
        action: str,
        *,
        via: str,
        backend: str | None = None,
        target: str | None = None,
        job_id: int | None = None,
        outcome: str = "ok",
        detail: str | None = None,
    ) -> int:
        """Write one operator action; its id."""
        if outcome not in AUDIT_OUTCOMES:
            raise ValueError(f"audit outcome {outcome!r}: one of {', '.join(AUDIT_OUTCOMES)}")
        row = {
            "at": datetime.now(UTC),
            "actor": actor,
            "via": via,
            "action": action,
            "backend": backend,
            "target": target,
            "job_id": job_id,
            "outcome": outcome,
            "detail": detail,
        }

        def run(conn: Connection) -> int:
            key = conn.execute(insert(audit_t).values(row)).inserted_primary_key
            assert key is not None
            return int(key[0])

        return await self.store.call(run)

    async def audit_log(
        self, *, limit: int = 100, backend: str | None = None, actor: str | None = None
    ) -> list[AuditRecord]:
        """The newest operator actions first (of ``backend``, of ``actor``)."""

        def run(conn: Connection) -> list[AuditRecord]:
            query = select(audit_t).order_by(audit_t.c.id.desc()).limit(limit)
            if backend is not None:
                query = query.where(audit_t.c.backend == backend)
            if actor is not None:
                query = query.where(audit_t.c.actor == actor)
            return [AuditRecord(**_aware(row._asdict())) for row in conn.execute(query)]

        return await self.store.call_read(run)


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _aware(row: dict[str, Any]) -> dict[str, Any]:
    return {key: _utc(value) if isinstance(value, datetime) else value for key, value in row.items()}
