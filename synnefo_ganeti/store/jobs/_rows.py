"""The jobs concern's tables, on the store's one metadata (``db._schema``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from synnefo_ganeti.store.db._schema import Base, BigId

__all__ = ["Job", "JobEventRow"]


class Job(Base):
    """The last applied version of one Ganeti job.

    ``summary`` is what later versions are compared with (exact floats, see
    :class:`synnefo_ganeti.jobs.JobSummary`); ``ops`` the ops as the CLI shows them;
    ``revision`` counts applied versions and ``event_count`` the events stored.
    """

    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_status_ended_at", "status", "ended_at"),)

    backend_id: Mapped[int] = mapped_column(ForeignKey("backends.id", ondelete="CASCADE"), primary_key=True)
    job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    status: Mapped[str] = mapped_column(String(16))
    instance: Mapped[str | None] = mapped_column(String(255), index=True)
    ops: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    summary: Mapped[dict[str, Any]]
    received_at: Mapped[datetime | None]
    started_at: Mapped[datetime | None]
    ended_at: Mapped[datetime | None]
    archived: Mapped[bool] = mapped_column(Boolean, default=False)
    revision: Mapped[int] = mapped_column(Integer)
    event_count: Mapped[int] = mapped_column(Integer)
    first_seen_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class JobEventRow(Base):
    """One change between two versions of a job file: a job status, an op status or a log entry."""

    __tablename__ = "job_events"
    __table_args__ = (
        UniqueConstraint("backend_id", "job_id", "seq"),
        ForeignKeyConstraint(
            ["backend_id", "job_id"], ["jobs.backend_id", "jobs.job_id"], ondelete="CASCADE"
        ),
        Index("ix_job_events_stored_at", "stored_at"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    backend_id: Mapped[int] = mapped_column(Integer)
    job_id: Mapped[int] = mapped_column(BigInteger)
    seq: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16))
    op_index: Mapped[int | None] = mapped_column(Integer)
    op_id: Mapped[str | None] = mapped_column(String(64))
    instance: Mapped[str | None] = mapped_column(String(255))
    log_serial: Mapped[int | None] = mapped_column(Integer)
    log_message: Mapped[str | None] = mapped_column(Text)
    event_time: Mapped[datetime | None]
    stored_at: Mapped[datetime]
