"""The requests concern's tables, on the store's one metadata (``db._schema``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    func,
)
from sqlalchemy.orm import Mapped, mapped_column

from synnefo_ganeti.store.db._schema import Base

__all__ = ["CreateRequest"]


class CreateRequest(Base):
    """A durable instance-create request (``ControlPlane.request_instance``).

    ``status``: pending (not submitted yet), submitted (the create job is recorded),
    succeeded, failed or canceled. A dispatcher ``claimed_by`` a pending request works on
    it; once it has chosen a backend (``backend_id`` set, ``attempts`` counted) the create
    may have reached Ganeti, so a dispatcher taking the request over asks Ganeti (by the
    request id in the job's reason and the instance's tags) before submitting again.
    """

    __tablename__ = "requests"
    __table_args__ = (
        Index("ix_requests_status_created_at", "status", "created_at"),
        Index("ix_requests_backend_id_job_id", "backend_id", "job_id"),
        # a request by its instance's id, given at once (migration 0011)
        Index("ix_requests_instance_uuid", "instance_uuid"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    status: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(255))
    spec: Mapped[dict[str, Any]]
    #: the backend the caller asked for (None: the dispatcher chooses)
    want_backend: Mapped[str | None] = mapped_column(String(64))
    backend_id: Mapped[int | None] = mapped_column(ForeignKey("backends.id", ondelete="SET NULL"))
    job_id: Mapped[int | None] = mapped_column(BigInteger)
    error: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    claimed_by: Mapped[str | None] = mapped_column(String(64))
    claimed_at: Mapped[datetime | None]
    #: its instance's public id (``Request.instance_id``), given when the request is written and
    #: the same through every attempt (before 0011: once placed)
    instance_uuid: Mapped[str | None] = mapped_column(String(36))
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    #: every failed attempt, oldest first: {"attempt", "backend", "node", "job_id", "error", "at"}
    #: (migration 0010)
    attempt_errors: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    #: why the dispatcher cannot place it now (None: not waiting; migration 0012)
    waiting_reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    submitted_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]


# every name check asks for the open requests by lower(name) (migration 0017)
Index("ix_requests_name_lower", func.lower(CreateRequest.name))
