"""What a job's end does to an instance's ``task`` and ``last_error``: pure code.

An instance's ``task`` says what is in progress on it (``"build"``, ``"start"``,
``"stop"``, ``"reboot"``, ``"modify"``, ``"delete"``) and ``task_job_id`` its job. The
end of that job clears both; the end of any other job leaves them alone (an older job's
end arriving late must not free the instance while its newer action runs).

``last_error`` is ``{"action", "job_id", "message", "at"}`` of the last action that did
not succeed: a job that failed or was canceled (a canceled create is not one: the
instance never existed and ends DESTROYED), or a submit Ganeti refused (``job_id``
None). The next success clears it.

A remove that fails because Ganeti has no such instance (Ganeti's ``OpPrereqError``
``"Instance '...' not known"``, error code ``unknown_entity``, raised by
``cmdlib.common.ExpandInstanceUuidAndName``) did what was asked: the instance is gone.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from synnefo_ganeti.jobs import JobStatus, JobSummary

__all__ = [
    "TASKS",
    "error_record",
    "instance_unknown",
    "job_message",
    "last_error_after",
    "task_of",
]

#: the task each recorded action puts on its instance (keys: ``InstanceAction`` values)
TASKS: dict[str, str] = {
    "create": "build",
    "startup": "start",
    "shutdown": "stop",
    "reboot": "reboot",
    "modify": "modify",
    "remove": "delete",
}

_UNKNOWN_INSTANCE = re.compile(r"\bInstance '[^']*' not known\b")


def task_of(action: str) -> str:
    """The task an action (an ``InstanceAction`` value) puts on its instance."""
    return TASKS.get(action, action)


def job_message(summary: JobSummary) -> str:
    """What went wrong with a job that did not succeed: its first op error, else its status."""
    if summary.status is JobStatus.CANCELED:
        return f"job {summary.job_id} was canceled"
    errors = [op.error for op in summary.ops if op.error]
    return errors[0] if errors else f"job {summary.job_id} ended in {summary.status.value}"


def instance_unknown(message: str | None) -> bool:
    """Whether a failed job's message is Ganeti's "no such instance" (``unknown_entity``)."""
    text = message or ""
    return "unknown_entity" in text or _UNKNOWN_INSTANCE.search(text) is not None


def error_record(action: str, job_id: int | None, message: str, at: datetime) -> dict[str, Any]:
    """The ``last_error`` value (JSON)."""
    return {"action": action, "job_id": job_id, "message": message, "at": at.isoformat()}


def last_error_after(action: str, summary: JobSummary, at: datetime) -> dict[str, Any]:
    """The ``last_error`` column after a job of ``action`` ended: ``{}`` leaves it as it is."""
    status = summary.status
    if status is JobStatus.SUCCESS:
        return {"last_error": None}
    if not status.is_final:
        return {}
    if status is JobStatus.CANCELED and action == "create":
        return {}  # a create canceled before it ran: the instance never existed (DESTROYED)
    message = job_message(summary)
    if action == "remove" and status is JobStatus.ERROR and instance_unknown(message):
        return {"last_error": None}  # gone already: the remove did what was asked
    return {"last_error": error_record(action, summary.job_id, message, at)}
