"""A fake job and its ops: their states, and their three written forms.

* :class:`FakeOp`: an op's status, result, log and timestamps, and its ``input`` in the
  form of its stage (``luxid``, ``waiting``, ``resolved``: see :mod:`._opcodes`).
* :class:`FakeJob`: the ops of one job; the job file as luxid writes it and as the job's
  executor writes it (key orders differ, as Ganeti's do), and the RAPI views of the job.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from synnefo_ganeti.jobs import JobStatus, calc_job_status
from synnefo_ganeti.testing import _opcodes

if TYPE_CHECKING:
    from synnefo_ganeti.testing._versions import VersionProfile

__all__ = ["FakeJob", "FakeOp", "Timestamp", "new_job", "now_ts"]

Timestamp = list[int]


def now_ts() -> Timestamp:
    t = time.time()
    return [int(t), int((t % 1) * 1_000_000)]


@dataclass(eq=False)  # an op is its identity: a lock owner
class FakeOp:
    luxid: dict[str, Any]
    status: JobStatus = JobStatus.QUEUED
    result: Any = None
    log: list[list[Any]] = field(default_factory=list)
    start_timestamp: Timestamp | None = None
    exec_timestamp: Timestamp | None = None
    end_timestamp: Timestamp | None = None
    _stage: str = "luxid"
    resolved: dict[str, Any] = field(default_factory=dict)
    allocated: str | None = None  # the node an allocator chose for a create without pnode
    reserved: int = 0  # memory held on that node until the op ends
    _input: dict[str, Any] | None = None  # the input of the current stage, built once

    @property
    def op_id(self) -> str:
        return str(self.luxid["OP_ID"])

    @property
    def stage(self) -> str:
        """``luxid``, ``waiting`` or ``resolved``: which form of the input is written (see _opcodes)."""
        return self._stage

    @stage.setter
    def stage(self, value: str) -> None:
        if value != self._stage:
            self._stage = value
            self._input = None

    def resolve(self, **values: Any) -> None:
        self.resolved.update(values)
        self._input = None

    def file_entry(self, *, priority_first: bool) -> dict[str, Any]:
        """The op in a job file; luxid puts ``priority`` before the timestamps, the executor after."""
        entry: dict[str, Any] = {
            "input": self.input,
            "status": self.status.value,
            "result": self.result,
            "log": self.log,
        }
        if priority_first:
            entry["priority"] = 0
        entry |= {
            "start_timestamp": self.start_timestamp,
            "exec_timestamp": self.exec_timestamp,
            "end_timestamp": self.end_timestamp,
        }
        if not priority_first:
            entry["priority"] = 0
        return entry

    @property
    def input(self) -> dict[str, Any]:
        if self._input is None:
            if self._stage == "luxid":
                self._input = self.luxid
            elif self._stage == "waiting":
                self._input = _opcodes.waiting_input(self.luxid)
            else:
                self._input = _opcodes.resolved_input(self.luxid, self.resolved)
        return self._input


@dataclass
class FakeJob:
    id: int
    ops: list[FakeOp]
    received_timestamp: Timestamp
    start_timestamp: Timestamp | None = None
    end_timestamp: Timestamp | None = None
    livelock: str | None = None
    process_id: int | None = None
    log_serial: int = 0
    archived: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    cancel_requested: bool = False

    @property
    def status(self) -> JobStatus:
        return calc_job_status(op.status for op in self.ops)

    def notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def luxid_file(self) -> dict[str, Any]:
        """The job file as luxid writes it (queued versions, cancel): its key order, ``livelock`` only once set."""
        content: dict[str, Any] = {
            "id": self.id,
            "ops": [op.file_entry(priority_first=True) for op in self.ops],
            "received_timestamp": self.received_timestamp,
            "start_timestamp": self.start_timestamp,
            "end_timestamp": self.end_timestamp,
        }
        if self.livelock is not None:
            content["livelock"] = self.livelock
        return content

    def executor_file(self) -> dict[str, Any]:
        """The job file as the job's executor writes it (waiting, running, log lines, end)."""
        return {
            "id": self.id,
            "ops": [op.file_entry(priority_first=False) for op in self.ops],
            "start_timestamp": self.start_timestamp,
            "end_timestamp": self.end_timestamp,
            "received_timestamp": self.received_timestamp,
            "livelock": self.livelock,
            "process_id": self.process_id,
        }

    def rapi_view(self, *, bulk: bool = False) -> dict[str, Any]:
        """``GET /2/jobs/ID`` (``bulk``: an item of ``/2/jobs?bulk=1``, without oplog and opresult)."""
        view: dict[str, Any] = {
            "id": self.id,
            "ops": [_opcodes.rapi_input(op.input) for op in self.ops],
            "status": self.status.value,
            "summary": [_opcodes.summary(op.input) for op in self.ops],
            "opstatus": [op.status.value for op in self.ops],
            "received_ts": self.received_timestamp,
            "start_ts": self.start_timestamp,
            "end_ts": self.end_timestamp,
        }
        if not bulk:
            view["oplog"] = [op.log for op in self.ops]
            view["opresult"] = [op.result for op in self.ops]
        return view

    def wait_info(self, fields: list[str]) -> list[Any]:
        view = self.rapi_view()
        return [view.get(name) for name in fields]

    def log_since(self, serial: int) -> list[list[Any]]:
        return sorted((entry for op in self.ops for entry in op.log if entry[0] > serial), key=lambda e: e[0])


def new_job(
    job_id: int,
    ops: list[tuple[str, dict[str, Any]]],
    *,
    resource: str | None,
    client: tuple[str, str] | None,
    dry_run: bool,
    user_reason: str | None,
    library_reason: bool,
    parent_reason: list[Any] | None,
    version: VersionProfile,
) -> FakeJob:
    """A new job of ``(OP_ID, params)`` ops as luxid makes it: each op's input with its reason
    trail (the user's reason, then the parent op's trail, the gnt-* client or rlib2's entry, then
    the opcode's own), received now (see :meth:`~._engine.FakeCluster.submit`)."""
    received = now_ts()
    ns = time.time_ns()
    fake_ops: list[FakeOp] = []
    for index, (op_id, params) in enumerate(ops):
        reason: list[Any] = []
        if user_reason is not None:
            reason.append(["gnt:user", user_reason, ns])
        if parent_reason is not None:
            reason.extend(list(entry) for entry in parent_reason)
        elif client is not None:
            reason.append([f"gnt:client:{client[0]}", client[1], ns])
        elif library_reason:  # not for ops a resource builds itself (rlib2's reinstall)
            reason.append([f"gnt:library:rlib2:{resource}", "", ns])
        snake = op_id.removeprefix("OP_").lower()
        reason.append([f"gnt:opcode:{snake}", f"job={job_id};index={index}", ns + 3000])
        luxid = _opcodes.luxid_input(
            op_id, params, reason, dry_run=dry_run, cli=client is not None, version=version
        )
        fake_ops.append(FakeOp(luxid=luxid))
    return FakeJob(id=job_id, ops=fake_ops, received_timestamp=received)
