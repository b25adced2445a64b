"""The job and opcode model shared by every part: statuses, status computation, job files
and the events between two versions of one."""

from __future__ import annotations

from synnefo_ganeti.jobs._files import (
    EventKind,
    JobEvent,
    JobFile,
    JobFileError,
    LogLine,
    OpState,
    job_events,
    node_taken_out,
    op_instance,
    parse_job_file,
)
from synnefo_ganeti.jobs._status import FINAL_STATUSES, JobStatus, calc_job_status
from synnefo_ganeti.jobs._summary import JobSummary, OpSummary, VersionKey

__all__ = [
    "FINAL_STATUSES",
    "EventKind",
    "JobEvent",
    "JobFile",
    "JobFileError",
    "JobStatus",
    "JobSummary",
    "LogLine",
    "OpState",
    "OpSummary",
    "VersionKey",
    "calc_job_status",
    "job_events",
    "node_taken_out",
    "op_instance",
    "parse_job_file",
]
