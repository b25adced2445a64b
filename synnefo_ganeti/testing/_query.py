"""``GET /2/query/job?fields=...``: the job query as Ganeti 3.0 answers it.

The answer is ``objects.QueryResponse.ToDict()`` (``rapi/rlib2.py`` ``R_2_query``): the
field definitions (``name``, ``title``, ``kind``, ``doc`` from ``query._BuildJobFields``)
and, per job in id order, each field as ``[status, value]`` (``RS_NORMAL`` 0; an unknown
field is ``RS_UNKNOWN`` 1 with ``null``, its kind ``unknown``). ``opstart`` is each op's
``start_timestamp`` (before acquiring locks), ``opexec`` its ``exec_timestamp`` (after).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from synnefo_ganeti.testing import _opcodes

if TYPE_CHECKING:
    from synnefo_ganeti.testing._engine import FakeCluster
    from synnefo_ganeti.testing._jobs import FakeJob

__all__ = ["query_jobs"]

_Getter = Callable[["FakeJob"], Any]
_TS = "(tuple containing seconds and microseconds)"
# name -> (title, kind, doc, value), as query._BuildJobFields
_JOB_FIELDS: dict[str, tuple[str, str, str, _Getter]] = {
    "id": ("ID", "number", "Job ID", lambda j: j.id),
    "status": ("Status", "text", "Job status", lambda j: j.status.value),
    "priority": ("Priority", "number", "Current job priority (19 to -20)", lambda j: 0),
    "archived": ("Archived", "bool", "Whether job is archived", lambda j: j.archived),
    "ops": ("OpCodes", "other", "List of all opcodes", lambda j: [op.input for op in j.ops]),
    "opresult": ("OpCode_result", "other", "List of opcodes results", lambda j: [op.result for op in j.ops]),
    "opstatus": ("OpCode_status", "other", "List of opcodes status", lambda j: [op.status.value for op in j.ops]),
    "oplog": ("OpCode_log", "other", "List of opcode output logs", lambda j: [op.log for op in j.ops]),
    "opstart": ("OpCode_start", "other", "List of opcode start timestamps (before acquiring locks)",
                lambda j: [op.start_timestamp for op in j.ops]),
    "opexec": ("OpCode_exec", "other", "List of opcode execution start timestamps (after acquiring locks)",
               lambda j: [op.exec_timestamp for op in j.ops]),
    "opend": ("OpCode_end", "other", "List of opcode execution end timestamps",
              lambda j: [op.end_timestamp for op in j.ops]),
    "oppriority": ("OpCode_prio", "other", "List of opcode priorities", lambda j: [0 for _ in j.ops]),
    "summary": ("Summary", "other", "List of per-opcode summaries",
                lambda j: [_opcodes.summary(op.input) for op in j.ops]),
    "received_ts": ("Received", "other", f"Timestamp of when job was received {_TS}",
                    lambda j: j.received_timestamp),
    "start_ts": ("Start", "other", f"Timestamp of job start {_TS}", lambda j: j.start_timestamp),
    "end_ts": ("End", "other", f"Timestamp of job end {_TS}", lambda j: j.end_timestamp),
}  # fmt: skip


def query_jobs(cluster: FakeCluster, fields: list[str]) -> dict[str, Any]:
    """``QueryResponse.ToDict()`` of a job query for ``fields`` over the jobs still in the queue."""
    defs: list[dict[str, Any]] = []
    for name in fields:
        title, kind, doc, _ = _JOB_FIELDS.get(name, (name, "unknown", f"Unknown field '{name}'", _unknown))
        defs.append({"name": name, "title": title, "kind": kind, "doc": doc})
    data = [
        [[0, _JOB_FIELDS[name][3](job)] if name in _JOB_FIELDS else [1, None] for name in fields]
        for job in sorted(cluster.jobs.values(), key=lambda j: j.id)
        if not job.archived
    ]
    return {"fields": defs, "data": data}


def _unknown(job: FakeJob) -> None:
    return None
