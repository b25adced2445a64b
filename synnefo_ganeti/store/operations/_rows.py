"""The operations' tables, on the metadata of :mod:`._schema`: what the dispatchers report of
themselves and the operators' audit log (migration 0013), incidents and their repairs, rolling
maintenance runs (migration 0014)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Boolean, Double, Index, Integer, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from synnefo_ganeti.store.db._schema import Base, BigId

__all__ = ["AuditEntry", "DispatcherRow", "IncidentRow", "MaintenanceRun"]


class DispatcherRow(Base):
    """A dispatcher as it last reported itself (migration 0013): a separate console or CLI reads
    whether it is alive (``heartbeat_at`` recent, ``stopped_at`` None), its root tasks, its claims
    and queue per backend."""

    __tablename__ = "dispatchers"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime]
    heartbeat_at: Mapped[datetime]
    #: how often it reports (seconds): older than a few of these, it is taken for dead
    interval: Mapped[float] = mapped_column(Double)
    #: every root task still running and none failed
    healthy: Mapped[bool] = mapped_column(Boolean)
    stopped_at: Mapped[datetime | None]
    #: {"tasks": [...], "problem": ..., "backends": {name: {...}}, "stats": {...}}
    state: Mapped[dict[str, Any]]


class AuditEntry(Base):
    """One operator action (migration 0013): who, what, on what, when, which job, how it ended."""

    __tablename__ = "audit_log"
    __table_args__ = (Index("ix_audit_log_at", "at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    at: Mapped[datetime]
    #: who: a console user, "cli:USER@HOST", a token's name
    actor: Mapped[str] = mapped_column(String(255))
    #: how: "console", "cli", "api"
    via: Mapped[str] = mapped_column(String(16))
    action: Mapped[str] = mapped_column(String(64))
    backend: Mapped[str | None] = mapped_column(String(64))
    #: the node, instance or request acted on
    target: Mapped[str | None] = mapped_column(String(255))
    job_id: Mapped[int | None] = mapped_column(BigInteger)
    #: "ok", "refused", "failed"
    outcome: Mapped[str] = mapped_column(String(16))
    detail: Mapped[str | None] = mapped_column(Text)


class IncidentRow(Base):
    """Something wrong the dispatcher found and, where policy allows, repaired (migration 0014):
    a node down, an instance stopped or in error while it should run, a migration that left it
    stopped. Open while ``closed_at`` is None; ``action`` and ``job_id`` the repair sent."""

    __tablename__ = "incidents"
    __table_args__ = (
        Index("ix_incidents_backend_closed_at", "backend", "closed_at"),
        Index("ix_incidents_opened_at", "opened_at"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    #: "node-down", "instance-stopped", "instance-error", "migration-stopped"
    kind: Mapped[str] = mapped_column(String(32))
    backend: Mapped[str] = mapped_column(String(64))
    node: Mapped[str | None] = mapped_column(String(255))
    instance: Mapped[str | None] = mapped_column(String(255))
    opened_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    #: the repair sent: "start", "migrate", "failover", "fence" (node-down), or None (report only)
    action: Mapped[str | None] = mapped_column(String(32))
    job_id: Mapped[int | None] = mapped_column(BigInteger)
    closed_at: Mapped[datetime | None]
    #: how it ended: "repaired" (its repair succeeded), "resolved" (it went away), "failed"
    outcome: Mapped[str | None] = mapped_column(String(32))
    detail: Mapped[str | None] = mapped_column(Text)


class MaintenanceRun(Base):
    """A rolling maintenance of one backend (migration 0014): its plan (groups of nodes), where it
    is (group, node, phase), so that a run killed resumes where it was; one running per backend."""

    __tablename__ = "maintenance_runs"
    __table_args__ = (
        Index(
            "ix_maintenance_runs_one_running",
            "backend",
            unique=True,
            postgresql_where=text("status = 'running'"),
            sqlite_where=text("status = 'running'"),
        ),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    backend: Mapped[str] = mapped_column(String(64))
    #: "running", "done", "failed", "canceled"
    status: Mapped[str] = mapped_column(String(16))
    #: the operator's command, run with each node's name ({node})
    command: Mapped[str] = mapped_column(Text)
    #: {"groups": [[node, ...], ...], ...}
    plan: Mapped[dict[str, Any]]
    #: {"group": i, "node": name, "phase": "drain" | "evacuate" | "command" | "wait" | "undrain", ...}
    position: Mapped[dict[str, Any]]
    #: who started it (a user, "cli:USER@HOST") and which process runs it now, last seen when
    started_by: Mapped[str] = mapped_column(String(255))
    owner: Mapped[str | None] = mapped_column(String(64))
    heartbeat_at: Mapped[datetime | None]
    started_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    error: Mapped[str | None] = mapped_column(Text)
