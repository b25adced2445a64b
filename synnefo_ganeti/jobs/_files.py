"""Ganeti's job files: parsing one version, and the events between two versions.

Pure code (no I/O): the queue watcher reads files and calls :func:`parse_job_file`;
the store keeps the last version it applied per job and calls :func:`job_events`
with it and the new one. Shapes and semantics follow real Ganeti 3.0 files
(tests/fixtures/ganeti-3.0-queue): timestamps are ``[seconds, microseconds]``,
log lines ``[serial, [sec, usec], type, message]``, no job-level status (it is
computed from the ops, as Ganeti does).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import orjson

from synnefo_ganeti.errors import JobFileError
from synnefo_ganeti.jobs._status import STATUS_BY_VALUE, JobStatus, calc_job_status

if TYPE_CHECKING:
    from synnefo_ganeti.jobs._summary import JobSummary

__all__ = [
    "EventKind",
    "JobEvent",
    "JobFile",
    "JobFileError",
    "LogLine",
    "OpState",
    "job_events",
    "node_taken_out",
    "op_instance",
    "parse_job_file",
]

MAX_JOB_FILE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class LogLine:
    serial: int
    time: float
    type: str
    message: str


@dataclass(frozen=True, slots=True)
class OpState:
    """One op of one version of a job file."""

    index: int
    op_id: str
    status: JobStatus
    instance: str | None
    result: Any
    log: tuple[LogLine, ...]
    start_time: float | None
    exec_time: float | None
    end_time: float | None
    input: dict[str, Any]

    @property
    def last_serial(self) -> int:
        return self.log[-1].serial if self.log else 0


@dataclass(frozen=True, slots=True)
class JobFile:
    """One version of ``job-<id>`` as written by luxid or the job's executor."""

    job_id: int
    ops: tuple[OpState, ...]
    received_time: float | None
    start_time: float | None
    end_time: float | None

    @property
    def status(self) -> JobStatus:
        return calc_job_status(op.status for op in self.ops)

    @property
    def is_final(self) -> bool:
        return self.status.is_final

    @property
    def instance(self) -> str | None:
        """The instance the job is about (its first op naming one), if any."""
        return next((op.instance for op in self.ops if op.instance), None)

    @property
    def last_serial(self) -> int:
        return max((op.last_serial for op in self.ops), default=0)


class _NotATime(Exception):
    pass


def _seconds(value: Any) -> float | None:
    """Ganeti's ``[seconds, microseconds]`` as a float (None for None); :class:`_NotATime` else.
    (``type(...) is int``: JSON's integers, not its booleans; read ten times a version.)"""
    if value is None:
        return None
    if type(value) is list and len(value) == 2:
        seconds, micro = value
        if type(seconds) is int and type(micro) is int:
            return float(seconds + micro / 1_000_000)
    raise _NotATime


def _time(value: Any, what: str) -> float | None:
    try:
        return _seconds(value)
    except _NotATime:
        raise JobFileError(f"{what} is {value!r}, not [seconds, microseconds]") from None


def op_instance(op_input: Mapping[str, Any]) -> str | None:
    """The instance an opcode's input is about (``instance_name``, or a one-instance multi-alloc)."""
    name = op_input.get("instance_name")
    if isinstance(name, str):
        return name
    instances = op_input.get("instances")
    if isinstance(instances, list) and len(instances) == 1 and isinstance(instances[0], Mapping):
        single = instances[0].get("instance_name")
        return single if isinstance(single, str) else None
    return None


def node_taken_out(op_id: str, op_input: Mapping[str, Any]) -> str | None:
    """The node an opcode takes out of new placement, if any: a node modify that drains it,
    sets it offline or not ``vm_capable`` (``OP_NODE_SET_PARAMS``), or its removal
    (``OP_NODE_REMOVE``). Ganeti refuses creates there once such a job succeeds."""
    if op_id == "OP_NODE_SET_PARAMS":
        if not (
            op_input.get("drained") is True
            or op_input.get("offline") is True
            or op_input.get("vm_capable") is False
        ):
            return None
    elif op_id != "OP_NODE_REMOVE":
        return None
    node = op_input.get("node_name")
    return node if isinstance(node, str) and node else None


def _op(index: int, raw: Any) -> OpState:
    if not isinstance(raw, dict):
        raise JobFileError(f"op {index} is not an object")
    op_input = raw.get("input")
    if not isinstance(op_input, dict) or not isinstance(op_input.get("OP_ID"), str):
        raise JobFileError(f"op {index} has no input with an OP_ID")
    status = STATUS_BY_VALUE.get(str(raw.get("status")))  # (not the enum's call: slow)
    if status is None:
        raise JobFileError(f"op {index} has status {raw.get('status')!r}, not one of Ganeti's")
    log_raw = raw.get("log") or []
    if not isinstance(log_raw, list):
        raise JobFileError(f"op {index} log is not a list")
    log: list[LogLine] = []
    for entry in log_raw:
        if not (isinstance(entry, list) and len(entry) == 4 and isinstance(entry[0], int)):
            raise JobFileError(f"op {index} has a log entry {entry!r:.80}, not [serial, time, type, message]")
        try:
            when = _seconds(entry[1])
        except _NotATime:
            _time(entry[1], f"op {index} log {entry[0]} time")  # (raises, naming it)
            raise
        message = entry[3] if isinstance(entry[3], str) else json.dumps(entry[3])
        log.append(LogLine(entry[0], when or 0.0, str(entry[2]), message))
    if len(log) > 1:
        log.sort(key=_serial)
    try:
        start, exec_, end = (
            _seconds(raw.get("start_timestamp")),
            _seconds(raw.get("exec_timestamp")),
            _seconds(raw.get("end_timestamp")),
        )
    except _NotATime:
        for key in ("start_timestamp", "exec_timestamp", "end_timestamp"):
            _time(raw.get(key), f"op {index} {key}")  # (the first bad one raises, naming it)
        raise
    return OpState(
        index=index,
        op_id=op_input["OP_ID"],
        status=status,
        instance=op_instance(op_input),
        result=raw.get("result"),
        log=tuple(log),
        start_time=start,
        exec_time=exec_,
        end_time=end,
        input=op_input,
    )


def _serial(line: LogLine) -> int:
    return line.serial


def parse_job_file(data: bytes) -> JobFile:
    """Parse one version of a job file; :class:`JobFileError` says what is wrong with it."""
    if len(data) > MAX_JOB_FILE_BYTES:
        raise JobFileError(f"{len(data)} bytes, more than the {MAX_JOB_FILE_BYTES} a job file may have")
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as bad:
            raise JobFileError(f"not UTF-8 ({bad.reason} at byte {bad.start})") from None
        raise JobFileError(
            f"not JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); truncated?"
        ) from None
    if not isinstance(raw, dict):
        raise JobFileError("not a JSON object")
    job_id = raw.get("id")
    if isinstance(job_id, str) and job_id.isdigit():
        job_id = int(job_id)
    if not isinstance(job_id, int) or isinstance(job_id, bool):
        raise JobFileError(f"id is {raw.get('id')!r}, not a job number")
    ops = raw.get("ops")
    if not isinstance(ops, list) or not ops:
        raise JobFileError("ops is missing or empty")
    return JobFile(
        job_id=job_id,
        ops=tuple(_op(index, op) for index, op in enumerate(ops)),
        received_time=_time(raw.get("received_timestamp"), "received_timestamp"),
        start_time=_time(raw.get("start_timestamp"), "start_timestamp"),
        end_time=_time(raw.get("end_timestamp"), "end_timestamp"),
    )


class EventKind(StrEnum):
    JOB_STATUS = "job_status"
    OP_STATUS = "op_status"
    LOG = "log"


@dataclass(frozen=True, slots=True)
class JobEvent:
    """One change between two versions of a job file."""

    job_id: int
    kind: EventKind
    status: JobStatus  # the job's status for JOB_STATUS, else the op's
    op_index: int | None = None
    op_id: str | None = None
    instance: str | None = None
    log_serial: int | None = None
    log_message: str | None = None
    event_time: float | None = None


def _op_time(op: OpState, job: JobFile) -> float | None:
    """When an op reached its status, as Synnefo's eventd chose it."""
    if op.status is JobStatus.QUEUED:
        time = job.received_time
    elif op.status in (JobStatus.WAITING, JobStatus.CANCELING):
        time = op.start_time
    elif op.status is JobStatus.RUNNING:
        time = op.exec_time
    else:
        time = op.end_time
    return time if time is not None else job.end_time


def _job_time(job: JobFile, events: list[JobEvent]) -> float | None:
    """When the job reached its status: its end, or the latest op change behind it."""
    if job.status.is_final and job.end_time is not None:
        return job.end_time
    times = [event.event_time for event in events if event.event_time is not None]
    if times:
        return max(times)
    return job.received_time if job.status is JobStatus.QUEUED else job.start_time


def job_events(previous: JobFile | JobSummary | None, current: JobFile) -> list[JobEvent]:
    """The changes from ``previous`` (None: never seen) to ``current``, in the order they happened.

    Per op: its status if it changed to a non-final one, then its new log lines, then its
    status if it became final; the ops' events merged in time order; last, the job's status
    if it changed, at the time of the latest op change behind it (or the job's end).
    An op going ``running -> waiting`` (a lock retry) is a change like any other.
    ``previous`` may be the :class:`JobSummary` the store kept of it.
    """
    if previous is not None and previous.job_id != current.job_id:
        raise ValueError(f"job {previous.job_id} and job {current.job_id} are different jobs")
    events: list[JobEvent] = []
    job_id = current.job_id
    for op in current.ops:
        before = previous.ops[op.index] if previous is not None and op.index < len(previous.ops) else None
        changed = before is None or before.status is not op.status
        status_event = (
            JobEvent(
                job_id=job_id,
                kind=EventKind.OP_STATUS,
                status=op.status,
                op_index=op.index,
                op_id=op.op_id,
                instance=op.instance,
                event_time=_op_time(op, current),
            )
            if changed
            else None
        )
        final = op.status.is_final
        if status_event is not None and not final:
            events.append(status_event)
        seen = before.last_serial if before is not None else 0
        if op.log and op.log[-1].serial > seen:
            events.extend(
                JobEvent(
                    job_id=job_id,
                    kind=EventKind.LOG,
                    status=op.status,
                    op_index=op.index,
                    op_id=op.op_id,
                    instance=op.instance,
                    log_serial=line.serial,
                    log_message=line.message,
                    event_time=line.time,
                )
                for line in op.log
                if line.serial > seen
            )
        if status_event is not None and final:
            events.append(status_event)
    # Across ops, in time order (an op still queued was queued before another one ended);
    # stable, so an op's own events keep their order when their times tie.
    events.sort(key=lambda event: event.event_time if event.event_time is not None else float("-inf"))
    if previous is None or previous.status is not current.status:
        events.append(
            JobEvent(
                job_id=job_id,
                kind=EventKind.JOB_STATUS,
                status=current.status,
                instance=current.instance,
                event_time=_job_time(current, events),
            )
        )
    return events
