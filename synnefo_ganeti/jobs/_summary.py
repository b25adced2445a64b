"""What the store keeps of the last applied version of a job file, and how two versions compare.

Ganeti writes a job file again on every change (a status, a timestamp, each log line)
and nothing in the file numbers its versions. Which of two versions is newer is
judged by their content: a final job is newer than any non-final one; then the
number of finished ops; then the highest log serial; then the latest timestamp the
file records. Two versions with the same :meth:`JobSummary.key` are the same step of
the job in different clothes, or a change Ganeti makes without stamping a time
(``waiting -> canceling``, an op sent back from ``running`` to ``waiting`` by a lock
retry, ``waiting -> queued`` when the queue shuts down): those are applied in the
order they were read, which for one watcher is the order Ganeti wrote them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from synnefo_ganeti._serial import from_jsonable, to_jsonable
from synnefo_ganeti.jobs._files import JobFile, OpState
from synnefo_ganeti.jobs._status import JobStatus, calc_job_status

__all__ = ["JobSummary", "OpSummary", "VersionKey"]

#: (final?, finished ops, highest log serial, latest timestamp)
VersionKey = tuple[bool, int, int, float]


#: Ganeti's ECODE_NORES and ECODE_TEMP_NORES: a failed create's message keeps them, so that the
#: store and the dispatcher place it again (``store.is_capacity_error``)
_RESOURCE_ECODES = ("insufficient_resources", "temp_insufficient_resources")


def _error_message(op: OpState) -> str | None:
    """The message of a failed op's ``[ErrorType, [message, ecode]]`` result."""
    if op.status is not JobStatus.ERROR:
        return None
    result = op.result
    if isinstance(result, list) and len(result) == 2:
        kind, args = result
        if isinstance(args, list) and args:
            if len(args) > 1 and args[1] in _RESOURCE_ECODES:  # kept: placement acts on it
                return f"{kind}: {args[0]} ({args[1]})"
            return f"{kind}: {args[0]}"
        return f"{kind}: {args}"
    return None if result is None else str(result)


@dataclass(frozen=True, slots=True)
class OpSummary:
    index: int
    op_id: str
    status: JobStatus
    # (defaults: summaries stored by older versions may lack a key)
    instance: str | None = None
    start_time: float | None = None
    exec_time: float | None = None
    end_time: float | None = None
    last_serial: int = 0
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        result: dict[str, Any] = to_jsonable(self)
        return result

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> OpSummary:
        return from_jsonable(cls, raw)


@dataclass(frozen=True, slots=True)
class JobSummary:
    """The part of one job-file version that later versions are compared with."""

    job_id: int
    ops: tuple[OpSummary, ...]
    received_time: float | None = None
    start_time: float | None = None
    end_time: float | None = None

    #: the order ``to_json`` has always had (the database's column takes the dataclass as is)
    __json_fields__ = ("job_id", "received_time", "start_time", "end_time", "ops")

    @classmethod
    def of(cls, job: JobFile) -> JobSummary:
        return cls(
            job_id=job.job_id,
            ops=tuple(
                OpSummary(
                    index=op.index,
                    op_id=op.op_id,
                    status=op.status,
                    instance=op.instance,
                    start_time=op.start_time,
                    exec_time=op.exec_time,
                    end_time=op.end_time,
                    last_serial=op.last_serial,
                    error=_error_message(op),
                )
                for op in job.ops
            ),
            received_time=job.received_time,
            start_time=job.start_time,
            end_time=job.end_time,
        )

    @property
    def status(self) -> JobStatus:
        return calc_job_status(op.status for op in self.ops)

    @property
    def instance(self) -> str | None:
        return next((op.instance for op in self.ops if op.instance), None)

    @property
    def last_serial(self) -> int:
        return max((op.last_serial for op in self.ops), default=0)

    @property
    def key(self) -> VersionKey:
        """Orders versions of one job by content (see the module docstring)."""
        times = [self.received_time, self.start_time, self.end_time]
        for op in self.ops:
            times += (op.start_time, op.exec_time, op.end_time)
        latest = max((t for t in times if t is not None), default=0.0)
        finished = sum(1 for op in self.ops if op.status.is_final)
        return (self.status.is_final, finished, self.last_serial, latest)

    def supersedes(self, older: JobSummary | None) -> bool:
        """True when this version is a change to apply on top of ``older``.

        Not when it is the same version, nor an older one, nor a non-final version
        of a job already final.
        """
        if older is None:
            return True
        if self == older:
            return False
        if older.status.is_final:
            return False
        return self.key >= older.key

    def to_json(self) -> dict[str, Any]:
        result: dict[str, Any] = to_jsonable(self)
        return result

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> JobSummary:
        return from_jsonable(cls, raw)
