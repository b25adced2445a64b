"""What a job's end does to an instance's ``task``, ``last_error`` and columns: pure code.

An instance's ``task`` says what is in progress on it (``"build"``, ``"start"``,
``"stop"``, ``"reboot"``, ``"modify"``, ``"delete"``, or one of the cloud's operations,
named as its action: ``"resize"``, ``"grow_disk"``, ``"attach_nic"``, ``"rename"``, ...)
and ``task_job_id`` its job. The
end of that job clears both; the end of any other job leaves them alone (an older job's
end arriving late must not free the instance while its newer action runs).

``last_error`` is ``{"action", "job_id", "message", "at"}`` of the last action that did
not succeed: a job that failed or was canceled (a canceled create is not one: the
instance never existed and ends DESTROYED), or a submit Ganeti refused (``job_id``
None). The next success clears it.

A job that succeeds changes the columns its action changes (:func:`changes_after`: the
name after a rename, the OS after a reinstall, a NIC or disk more or less, ...), from what
the facade recorded with it, in the transaction that applies its end.

A remove that fails because Ganeti has no such instance (Ganeti's ``OpPrereqError``
``"Instance '...' not known"``, error code ``unknown_entity``, raised by
``cmdlib.common.ExpandInstanceUuidAndName``) did what was asked: the instance is gone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from synnefo_ganeti.jobs import JobStatus, JobSummary

__all__ = [
    "CHANGED_COLUMNS",
    "CHANGING_ACTIONS",
    "TASKS",
    "changes_after",
    "error_record",
    "instance_unknown",
    "job_message",
    "last_error_after",
    "shut_down",
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
    # the cloud's operations: each its own task (control/_operations.py), named as its action
}

#: the instance columns an action's success may change (:func:`changes_after`)
CHANGED_COLUMNS = ("name", "os", "pnode", "beparams", "memory", "vcpus", "nics", "disks", "tags")
#: the actions (``InstanceAction`` values) whose success changes some of them
CHANGING_ACTIONS = frozenset(
    {"modify", "resize", "grow_disk", "attach_nic", "detach_nic", "attach_disk", "detach_disk", "rename",
     "reinstall", "migrate", "failover", "add_tags", "remove_tags"}
)  # fmt: skip

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


def shut_down(summary: JobSummary) -> bool:
    """Whether the job's ``OP_INSTANCE_SHUTDOWN`` ran to success (a reinstall's first op)."""
    return any(op.op_id == "OP_INSTANCE_SHUTDOWN" and op.status is JobStatus.SUCCESS for op in summary.ops)


def _without(items: list[Any] | None, index: Any) -> list[Any] | None:
    if items is None or not isinstance(index, int) or not -len(items) <= index < len(items):
        return items  # not known here: Ganeti's values, stored after the end, say it
    return [item for at, item in enumerate(items) if at != index % len(items)]


def changes_after(action: str, params: Mapping[str, Any], row: Mapping[str, Any]) -> dict[str, Any]:
    """The columns (of :data:`CHANGED_COLUMNS`) a job of ``action`` changes when it succeeds.

    ``params`` is what the facade recorded with the job (``instance_jobs.params``), ``row``
    the instance's current columns. The change is the one asked for, applied in the same
    transaction as the end (so a caller who sees the task cleared sees it too); Ganeti's own
    values (a NIC's MAC and IP, a disk's uuid, the node an allocator chose) are stored after
    the end by the dispatcher's observer and by each reconcile pass.
    """
    out: dict[str, Any] = {}
    if action in ("modify", "resize"):
        out["beparams"] = {**(row.get("beparams") or {}), **params}
        if "maxmem" in params:
            out["memory"] = int(params["maxmem"])
        if "vcpus" in params:
            out["vcpus"] = int(params["vcpus"])
    elif action == "grow_disk":
        disks = [dict(disk) for disk in row.get("disks") or []]
        index, amount = params.get("disk"), int(params.get("amount") or 0)
        if isinstance(index, int) and 0 <= index < len(disks) and "size" in disks[index]:
            disks[index]["size"] = int(disks[index]["size"]) + amount
            out["disks"] = disks
    elif action == "attach_nic":
        out["nics"] = [*(row.get("nics") or []), dict(params.get("nic") or {})]
    elif action == "attach_disk":
        out["disks"] = [*(row.get("disks") or []), dict(params.get("disk") or {})]
    elif action in ("detach_nic", "detach_disk"):
        column = "nics" if action == "detach_nic" else "disks"
        left = _without(row.get(column), params.get("index"))
        if left is not row.get(column):
            out[column] = left
    elif action == "rename" and params.get("new_name"):
        out["name"] = str(params["new_name"])
    elif action == "reinstall" and params.get("os"):
        out["os"] = str(params["os"])
    elif action in ("migrate", "failover") and params.get("target_node"):
        out["pnode"] = str(params["target_node"])
    elif action in ("add_tags", "remove_tags"):
        ours = set(params.get("tags") or ())
        tags = set(row.get("tags") or ())
        out["tags"] = sorted(tags | ours if action == "add_tags" else tags - ours)
    return out
