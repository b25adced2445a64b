"""The changes concern's tables, on the store's one metadata (``db._schema``)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Double,
    String,
    Text,
)
from sqlalchemy.orm import Mapped, mapped_column

from synnefo_ganeti.store.db._schema import Base, BigId

__all__ = ["ChangeRow", "FeedCursor"]


class ChangeRow(Base):
    """The change feed (``ControlPlane.changes``): one row per change of a request's status or
    error or waiting reason, or of an instance's status, task, last error or node state. Written
    by database triggers (migrations 0005, 0010 and 0012), so that every process's writes are in
    it, in commit order; ``at`` is seconds since the epoch."""

    __tablename__ = "changes"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(16))
    key: Mapped[str] = mapped_column(String(64))
    status: Mapped[str | None] = mapped_column(String(16))
    task: Mapped[str | None] = mapped_column(String(16))
    error: Mapped[str | None] = mapped_column(Text)
    at: Mapped[float] = mapped_column(Double)
    #: an instance's node state after the change (None: its node is up; requests: None)
    node_state: Mapped[str | None] = mapped_column(String(16))
    #: a request's waiting reason after the change (instances: None; migration 0012)
    waiting_reason: Mapped[str | None] = mapped_column(Text)


class FeedCursor(Base):
    """How far a consumer of the change feed got (the webhook: ``name`` "webhook")."""

    __tablename__ = "feed_cursors"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    last_id: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[datetime]
