"""What the store gives and takes: stored jobs, their ops and events, the versions on their way
to the writer, and what the writer reports (:class:`CommitInfo`, :class:`WriterStats`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from synnefo_ganeti._serial import to_jsonable
from synnefo_ganeti.jobs import EventKind, JobFile, JobStatus

__all__ = [
    "JobVersion",
    "PruneResult",
    "StoredEvent",
    "StoredJob",
    "StoredOp",
]


@dataclass(frozen=True, slots=True)
class StoredOp:
    index: int
    op_id: str
    status: JobStatus
    instance: str | None
    start_time: datetime | None
    exec_time: datetime | None
    end_time: datetime | None
    error: str | None

    def to_json(self) -> dict[str, Any]:
        result: dict[str, Any] = to_jsonable(self)
        return result


@dataclass(frozen=True, slots=True)
class StoredJob:
    """A job as the database holds it: its last applied version."""

    backend: str
    job_id: int
    status: JobStatus
    instance: str | None
    ops: tuple[StoredOp, ...]
    received_at: datetime | None
    started_at: datetime | None
    ended_at: datetime | None
    archived: bool
    revision: int
    event_count: int
    first_seen_at: datetime
    updated_at: datetime

    @property
    def is_final(self) -> bool:
        return self.status.is_final

    def to_json(self) -> dict[str, Any]:
        result: dict[str, Any] = to_jsonable(self)
        return result


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One stored job event, as a Synnefo-style consumer reads it."""

    id: int
    backend: str
    job_id: int
    seq: int
    kind: EventKind
    status: JobStatus
    op_index: int | None
    op_id: str | None
    instance: str | None
    log_serial: int | None
    log_message: str | None
    event_time: datetime | None
    stored_at: datetime

    def to_json(self) -> dict[str, Any]:
        result: dict[str, Any] = to_jsonable(self)
        return result


@dataclass(slots=True)
class JobVersion:
    """One version of a job file as the watcher read it, on its way to the writer."""

    backend: str
    job: JobFile
    archived: bool = False
    #: time.time() when it was read (the writer reports the lag from it)
    read_at: float = field(default_factory=time.time)


@dataclass(frozen=True, slots=True)
class PruneResult:
    events: int
    jobs: int
