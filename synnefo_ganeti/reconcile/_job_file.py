"""A job-file version made of a RAPI job: how the reconciler stores the end of a job whose
file the watcher did not see (its ``jobs`` fix)."""

from __future__ import annotations

import json
from typing import Any

from synnefo_ganeti.jobs import JobFile, JobStatus, LogLine, OpState, op_instance
from synnefo_ganeti.rapi import Job

__all__ = ["job_file"]


def _time(value: Any) -> float | None:
    return None if value is None else float(value.as_float)


def job_file(job: Job) -> JobFile:
    """A job-file version made of a RAPI job (to store an end the watcher missed).

    RAPI reports no per-op timestamps: ops take the job's start, and final ops its end.
    """
    start, end = _time(job.start_ts), _time(job.end_ts)
    ops = []
    for index, op_input in enumerate(job.ops):
        status = job.opstatus[index] if index < len(job.opstatus) else job.status
        result = job.opresult[index] if job.opresult is not None and index < len(job.opresult) else None
        entries = job.oplog[index] if job.oplog is not None and index < len(job.oplog) else []
        lines = tuple(
            LogLine(
                int(entry.serial),
                entry.timestamp.as_float,
                str(entry.type),
                entry.message if isinstance(entry.message, str) else json.dumps(entry.message),
            )
            for entry in entries
        )
        ops.append(
            OpState(
                index=index,
                op_id=str(op_input.get("OP_ID", "")),
                status=status,
                instance=op_instance(op_input),
                result=result,
                log=tuple(sorted(lines, key=lambda line: line.serial)),
                start_time=start if status is not JobStatus.QUEUED else None,
                exec_time=None,
                end_time=end if status.is_final else None,
                input=dict(op_input),
            )
        )
    received = _time(job.received_ts)
    return JobFile(job_id=job.id, ops=tuple(ops), received_time=received, start_time=start, end_time=end)
