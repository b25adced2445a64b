"""The backends concern's tables, on the store's one metadata (``db._schema``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
)
from sqlalchemy.orm import Mapped, mapped_column

from synnefo_ganeti.store.db._schema import Base, BigId

__all__ = ["Backend", "BackendEvent", "BackendNode", "BackendStats"]


class Backend(Base):
    """One Ganeti cluster, known by the name the configuration gives it."""

    __tablename__ = "backends"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime]
    #: drained by an operator (``synnefo-ganeti backends drain``): no new instances
    drained: Mapped[bool] = mapped_column(Boolean, default=False)
    drained_at: Mapped[datetime | None]
    #: what the dispatcher's health checks last concluded: "up", "down" or None (never checked)
    health: Mapped[str | None] = mapped_column(String(8))
    health_at: Mapped[datetime | None]
    health_detail: Mapped[str | None] = mapped_column(Text)
    #: the last reconcile pass over it: when, by which dispatcher, its report (migration 0013)
    reconciled_at: Mapped[datetime | None]
    reconciled_by: Mapped[str | None] = mapped_column(String(64))
    reconcile_report: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class BackendEvent(Base):
    """Something that happened to a backend as a whole: health went down or up, drained."""

    __tablename__ = "backend_events"
    __table_args__ = (Index("ix_backend_events_backend_id_at", "backend_id", "at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    backend_id: Mapped[int] = mapped_column(ForeignKey("backends.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text)
    at: Mapped[datetime]


class BackendNode(Base):
    """A node of a backend as the dispatcher last read it (migration 0010): whether Ganeti
    still reads its live figures ("up"), not ("down"), or it is marked offline, and since when."""

    __tablename__ = "backend_nodes"

    backend_id: Mapped[int] = mapped_column(ForeignKey("backends.id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    #: "up", "down" or "offline"
    state: Mapped[str] = mapped_column(String(16))
    #: when it entered ``state``
    since: Mapped[datetime]
    #: the last read that confirmed ``state``
    seen_at: Mapped[datetime]
    #: the first sign of a down node (no live figures, an RPC failure, a failed create naming it)
    detail: Mapped[str | None] = mapped_column(Text)


class BackendStats(Base):
    """A backend's whole node stats (nodes with their figures, ``/2/info``, the OS list, the
    networks) as the holder of its follow lease last read them (migration 0016): the other
    dispatchers take them from here instead of asking Ganeti."""

    __tablename__ = "backend_stats"

    backend_id: Mapped[int] = mapped_column(ForeignKey("backends.id", ondelete="CASCADE"), primary_key=True)
    #: the dispatcher's ``NodeStats.to_json()`` (``dispatch/_stats.py``)
    stats: Mapped[dict[str, Any]] = mapped_column(JSON)
    #: when the read began
    read_at: Mapped[datetime]
