"""Ganeti's job and opcode statuses, and the job status computed from op statuses.

Pure code, no I/O: shared by the RAPI client, the queue watcher and the store.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

__all__ = ["FINAL_STATUSES", "STATUS_BY_VALUE", "JobStatus", "calc_job_status"]


class JobStatus(enum.StrEnum):
    """A job's (or an opcode's) status; the values are Ganeti's own strings."""

    QUEUED = "queued"
    WAITING = "waiting"
    CANCELING = "canceling"
    RUNNING = "running"
    CANCELED = "canceled"
    SUCCESS = "success"
    ERROR = "error"

    @property
    def is_final(self) -> bool:
        """True for ``canceled``, ``success`` and ``error``: Ganeti never changes it again."""
        return self in FINAL_STATUSES


FINAL_STATUSES: frozenset[JobStatus] = frozenset({JobStatus.CANCELED, JobStatus.SUCCESS, JobStatus.ERROR})
#: a status, or its value, -> the status (a dict finds both: a StrEnum's member hashes and
#: compares as its value; an enum's call is ten times slower, and this runs for every op of
#: every job-file version the watcher reads, several times)
STATUS_BY_VALUE: dict[str, JobStatus] = {status.value: status for status in JobStatus}


def calc_job_status(op_statuses: Iterable[JobStatus | str]) -> JobStatus:
    """The job status Ganeti derives from its ops' statuses (``_QueuedJob.CalcStatus``).

    All ops succeeded: ``success``. Otherwise the first op that is canceling,
    canceled or in error decides; before that, the latest waiting or running op;
    a job with only queued (and successful) ops is ``queued``.
    """
    status = JobStatus.QUEUED
    all_success = True
    seen = False
    for raw in op_statuses:
        seen = True
        op = STATUS_BY_VALUE.get(raw) or JobStatus(raw)  # (a member or its value; an unknown raises)
        if op is JobStatus.SUCCESS:
            continue
        all_success = False
        if op is JobStatus.QUEUED:
            continue
        if op in (JobStatus.WAITING, JobStatus.RUNNING):
            status = op
            continue
        # canceling, canceled, error: decides the job
        return op
    if seen and all_success:
        return JobStatus.SUCCESS
    return status
