"""The fake cluster and its job engine.

Design, and why:

* Every job runs as one asyncio task, as Ganeti runs one executor process per job.
  At most ``max_running_jobs`` run at once (Ganeti's cluster setting, 20 by
  default); the others stay ``queued`` in submission order.
* Instance ops take their primary node's lock for their whole run, as Ganeti's
  node locks serialise instance operations on a node; an op waiting for a lock
  is ``waiting``, as in Ganeti.
* Each op goes ``queued -> waiting -> running -> success | error``; checks that
  Ganeti makes in ``CheckPrereq`` fail straight from ``waiting`` (no
  ``exec_timestamp``), the others after ``running``. A failed op fails the ops
  after it with ``["OpExecError", ["Preceding opcode failed"]]``.
* Every state change is written to the queue directory as Ganeti writes it (see
  :mod:`._queue`): three luxid versions on submit, then the executor's versions
  (waiting, running, one per log line, final); a cancel is luxid's.
* Every change also wakes ``/2/jobs/ID/wait`` long-polls (one event per job).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from synnefo_ganeti.jobs import JobStatus, calc_job_status
from synnefo_ganeti.testing import _opcodes
from synnefo_ganeti.testing._cluster import (
    FakeInstance,
    FakeNode,
    OpFailure,
    free_capacity,
    instance_view,
    new_mac,
    node_view,
    parse_size,
)
from synnefo_ganeti.testing._queue import QueueDir

__all__ = ["DEFAULT_OP_TIMES", "FakeCluster", "FakeJob", "FakeOp"]

Timestamp = list[int]

DEFAULT_OP_TIMES: dict[str, float] = {
    "OP_INSTANCE_CREATE": 0.3,
    "OP_INSTANCE_REMOVE": 0.2,
    "OP_INSTANCE_STARTUP": 0.1,
    "OP_INSTANCE_SHUTDOWN": 0.1,
    "OP_INSTANCE_REBOOT": 0.15,
    "OP_INSTANCE_SET_PARAMS": 0.05,
    "OP_INSTANCE_MULTI_ALLOC": 0.02,
    "dry_run": 0.02,
}

_BEPARAMS_DEFAULTS = {"vcpus": 1, "auto_balance": True, "always_failover": False, "spindle_use": 1}
_INSTANCE_OPS = frozenset(
    {"OP_INSTANCE_CREATE", "OP_INSTANCE_REMOVE", "OP_INSTANCE_STARTUP", "OP_INSTANCE_SHUTDOWN",
     "OP_INSTANCE_REBOOT", "OP_INSTANCE_SET_PARAMS"}
)  # fmt: skip


def now_ts() -> Timestamp:
    t = time.time()
    return [int(t), int((t % 1) * 1_000_000)]


@dataclass
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


class FakeCluster:
    """An in-memory Ganeti cluster with a job queue; the state behind :class:`FakeGaneti`."""

    def __init__(
        self,
        *,
        name: str = "cluster.fake.test",
        nodes: int | list[FakeNode] = 3,
        node_memory: int = 32768,
        node_disk: int = 512 * 1024,
        node_cpus: int = 8,
        oses: tuple[str, ...] = ("noop",),
        disk_templates: tuple[str, ...] = ("diskless", "file"),
        hypervisor: str = "fake",
        link: str = "gntbr0",
        queue: QueueDir | None = None,
        max_running_jobs: int = 20,
        op_times: dict[str, float] | None = None,
        archive_after: float | None = None,
    ) -> None:
        self.name = name
        if isinstance(nodes, int):
            if nodes < 1:
                raise ValueError("a fake cluster needs at least one node")
            nodes = [
                FakeNode(name=f"node{i}.fake.test", mtotal=node_memory, dtotal=node_disk, ctotal=node_cpus,
                         master=i == 1, ip=f"198.51.100.{9 + i}")
                for i in range(1, nodes + 1)
            ]  # fmt: skip
        self.nodes: dict[str, FakeNode] = {node.name: node for node in nodes}
        self.instances: dict[str, FakeInstance] = {}
        self.oses = set(oses)
        self.disk_templates = list(disk_templates)
        self.hypervisor = hypervisor
        self.link = link
        self.group_uuid = str(uuid.uuid4())
        self.queue = queue
        self.max_running_jobs = max_running_jobs
        self.op_times = DEFAULT_OP_TIMES | (op_times or {})
        self.archive_after = archive_after
        self.jobs: dict[int, FakeJob] = {}
        self._serial = itertools.count(1)
        self._pending: list[FakeJob] = []
        self._running: set[int] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._node_locks: dict[str, asyncio.Lock] = {}
        self._reserved: dict[str, int] = {}
        self._boot = int(time.time())
        self._closed = False

    def __repr__(self) -> str:
        return (
            f"<FakeCluster {self.name} {len(self.nodes)} nodes, {len(self.instances)} instances, "
            f"{len(self._running)} running jobs, {len(self._pending)} queued>"
        )

    # ------------------------------------------------------------------ views

    def node_views(self) -> list[dict[str, Any]]:
        instances = list(self.instances.values())
        return [node_view(node, instances, self.group_uuid) for node in self.nodes.values()]

    def instance_view(self, name: str) -> dict[str, Any] | None:
        inst = self.instances.get(name)
        return None if inst is None else instance_view(inst, self.link)

    def instance_views(self) -> list[dict[str, Any]]:
        return [
            instance_view(inst, self.link) for inst in sorted(self.instances.values(), key=lambda i: i.name)
        ]

    def job(self, job_id: int) -> FakeJob | None:
        return self.jobs.get(job_id)

    # ------------------------------------------------------------------ submit

    def submit(
        self,
        ops: list[tuple[str, dict[str, Any]]],
        *,
        resource: str | None = None,
        client: tuple[str, str] | None = None,
        dry_run: bool = False,
        user_reason: str | None = None,
    ) -> int:
        """Queue a job of ``(OP_ID, params)`` ops; returns its id at once, as luxid does.

        ``resource`` names the RAPI resource (``instances``); ``client`` a gnt-* command
        line instead (``("gnt-debug", "submit-job")``), as in Ganeti's reason trail.
        """
        if (resource is None) == (client is None):
            raise ValueError("give exactly one of resource (RAPI) or client (command line)")
        if self._closed:
            raise RuntimeError("the fake cluster is shut down")
        job_id = next(self._serial)
        received = now_ts()
        ns = time.time_ns()
        fake_ops: list[FakeOp] = []
        for index, (op_id, params) in enumerate(ops):
            reason: list[Any] = []
            if user_reason is not None:
                reason.append(["gnt:user", user_reason, ns])
            if client is not None:
                reason.append([f"gnt:client:{client[0]}", client[1], ns])
            else:
                reason.append([f"gnt:library:rlib2:{resource}", "", ns])
            snake = op_id.removeprefix("OP_").lower()
            reason.append([f"gnt:opcode:{snake}", f"job={job_id};index={index}", ns + 3000])
            luxid = _opcodes.luxid_input(op_id, params, reason, dry_run=dry_run, cli=client is not None)
            fake_ops.append(FakeOp(luxid=luxid))
        job = FakeJob(id=job_id, ops=fake_ops, received_timestamp=received)
        self.jobs[job_id] = job
        if self.queue is not None:
            self.queue.write_serial(job_id)
            self.queue.write_job(job_id, job.luxid_file(), luxid=True)
            job.livelock = f"/var/run/ganeti/livelocks/luxi-daemon_{self._boot}"
            self.queue.write_job(job_id, job.luxid_file(), luxid=True)
            job.livelock = f"/var/run/ganeti/livelocks/job_{job_id:06d}_{int(time.time())}"
            self.queue.write_job(job_id, job.luxid_file(), luxid=True)
        else:
            job.livelock = f"/var/run/ganeti/livelocks/job_{job_id:06d}_{int(time.time())}"
        self._pending.append(job)
        self._schedule()
        return job_id

    def cancel(self, job_id: int) -> tuple[bool, str]:
        """Ganeti's cancel: a queued (or lock-waiting) job is canceled, a running or ended one not."""
        job = self.jobs.get(job_id)
        if job is None or job.archived:
            return False, f"Job {job_id} not found in queue"
        if job in self._pending:
            self._pending.remove(job)
            stamp = now_ts()
            for op in job.ops:
                op.status = JobStatus.CANCELED
                op.end_timestamp = stamp
            job.end_timestamp = stamp
            job.livelock = None
            self._write(job, luxid=True)
            self._finished(job)
            return True, f"Dequeued job {job_id}"
        if job.status is JobStatus.WAITING and not job.cancel_requested:
            job.cancel_requested = True
            return True, f"Job {job_id} will be canceled"
        return False, f"Job {job_id} is no longer waiting in the queue"

    # ------------------------------------------------------------------ running

    def _schedule(self) -> None:
        while self._pending and len(self._running) < self.max_running_jobs:
            job = self._pending.pop(0)
            self._running.add(job.id)
            task = asyncio.get_running_loop().create_task(self._run(job), name=f"fake-job-{job.id}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _write(self, job: FakeJob, *, luxid: bool = False) -> None:
        if self.queue is not None:
            self.queue.write_job(job.id, job.luxid_file() if luxid else job.executor_file(), luxid=luxid)
        job.notify()

    def _log(self, job: FakeJob, op: FakeOp, message: str) -> None:
        job.log_serial += 1
        op.log.append([job.log_serial, now_ts(), "message", message])
        self._write(job)

    async def _run(self, job: FakeJob) -> None:
        try:
            job.process_id = random.randint(2000, 60000)
            failed = False
            for index, op in enumerate(job.ops):
                if failed:
                    if job.cancel_requested:
                        op.status = JobStatus.CANCELED
                        op.end_timestamp = now_ts()
                    else:
                        op.status = JobStatus.ERROR
                        op.result = ["OpExecError", ["Preceding opcode failed"]]
                    continue
                op.status = JobStatus.WAITING
                op.start_timestamp = now_ts()
                op.stage = "waiting"
                for later in job.ops[index + 1 :]:
                    later.stage = "waiting"
                if index == 0:
                    job.start_timestamp = op.start_timestamp
                self._write(job)
                failed = not await self._run_op(job, op)
                if not failed and index + 1 < len(job.ops):
                    self._write(job)  # Ganeti writes each op's success before the next op starts
            job.end_timestamp = now_ts()
            self._write(job)
        finally:
            self._running.discard(job.id)
            self._finished(job)
            if not self._closed:
                self._schedule()

    def _finished(self, job: FakeJob) -> None:
        if self.archive_after is not None and self.queue is not None and not self._closed:
            loop = asyncio.get_running_loop()
            loop.call_later(self.archive_after, self.archive, job.id)

    def archive(self, job_id: int) -> bool:
        """Move an ended job to ``archive/<id // 10000>/`` as ``gnt-job archive`` does."""
        job = self.jobs.get(job_id)
        if job is None or job.archived or not job.status.is_final:
            return False
        job.archived = True
        if self.queue is not None:
            self.queue.archive(job_id)
        return True

    async def _run_op(self, job: FakeJob, op: FakeOp) -> bool:
        """Run one op; True on success."""
        node = self._lock_node(op)
        lock = self._node_locks.setdefault(node, asyncio.Lock()) if node else None
        try:
            if lock is not None:
                await lock.acquire()
            if job.cancel_requested:
                op.status = JobStatus.CANCELED
                op.end_timestamp = now_ts()
                return False
            # Past the locks the executor resolves the opcode (uuids still unset): a
            # CheckPrereq failure is written with that form, and no exec_timestamp.
            op.stage = "resolved"
            handler = getattr(self, f"_op_{op.op_id.removeprefix('OP_').lower()}", None)
            if handler is None:
                raise OpFailure(
                    "OpPrereqError", f"Opcode {op.op_id} is not supported by the fake Ganeti", "wrong_input"
                )
            await handler(job, op)
            op.status = JobStatus.SUCCESS
            op.end_timestamp = now_ts()
            return True
        except OpFailure as failure:
            op.status = JobStatus.ERROR
            op.result = failure.result
            op.end_timestamp = now_ts()
            return False
        finally:
            if lock is not None and lock.locked():
                lock.release()
            if op.allocated is not None:
                self._reserved[op.allocated] -= op.reserved
                op.reserved = 0

    def _lock_node(self, op: FakeOp) -> str | None:
        if op.op_id not in _INSTANCE_OPS:
            return None
        if op.op_id == "OP_INSTANCE_CREATE":
            return op.luxid.get("pnode") or self._allocate(op)
        inst = self.instances.get(str(op.luxid.get("instance_name")))
        return inst.pnode if inst is not None else None

    def _free(self, node: FakeNode) -> tuple[int | None, int | None]:
        return free_capacity(node, self.instances.values())

    def _allocate(self, op: FakeOp) -> str | None:
        """Like an iallocator: the usable node with the most free memory, less what creates
        already placed there still hold (so a burst of creates spreads over the nodes)."""
        usable = [n for n in self.nodes.values() if not n.offline and not n.drained and n.vm_capable]
        if not usable:
            return None
        node = max(usable, key=lambda n: ((self._free(n)[0] or 0) - self._reserved.get(n.name, 0), n.name))
        beparams = op.luxid.get("beparams") or {}
        try:
            memory = parse_size("memory", beparams.get("memory", beparams.get("maxmem", 128)))
        except OpFailure:
            memory = 0
        op.allocated, op.reserved = node.name, memory
        self._reserved[node.name] = self._reserved.get(node.name, 0) + memory
        return node.name

    def _start_running(self, job: FakeJob, op: FakeOp, **resolved: Any) -> None:
        op.resolve(**resolved)
        op.stage = "resolved"
        op.status = JobStatus.RUNNING
        op.exec_timestamp = now_ts()
        self._write(job)

    async def _work(self, job: FakeJob, op: FakeOp, messages: list[str], seconds: float) -> None:
        """Spend ``seconds`` in the op, writing one log line per message along the way."""
        steps = max(1, len(messages))
        for message in messages:
            await asyncio.sleep(seconds / steps)
            self._log(job, op, message)
        if not messages:
            await asyncio.sleep(seconds)

    def _time(self, op: FakeOp) -> float:
        if op.luxid.get("dry_run"):
            return self.op_times["dry_run"]
        return self.op_times.get(op.op_id, 0.05)

    def _instance(self, op: FakeOp) -> FakeInstance:
        name = str(op.luxid.get("instance_name"))
        inst = self.instances.get(name)
        if inst is None:
            raise OpFailure("OpPrereqError", f"Instance '{name}' not known", "unknown_entity")
        return inst

    # ------------------------------------------------------------------ opcodes

    async def _op_instance_create(self, job: FakeJob, op: FakeOp) -> None:
        p = op.luxid
        name = str(p["instance_name"])
        op.resolve(osparams_private=None, osparams_secret=None)
        if name in self.instances:
            raise OpFailure("OpPrereqError", f"Instance '{name}' is already in the cluster", "already_exists")
        template = str(p.get("disk_template"))
        if template not in self.disk_templates:
            raise OpFailure(
                "OpPrereqError",
                f"Cannot create an instance with disk template '{template}', as it's not enabled in cluster. "
                f"Enabled disk templates are: {','.join(self.disk_templates)}",
                "wrong_input",
            )
        node = self.nodes[op.allocated] if op.allocated is not None else self._choose_node(p, name)
        file_driver = p.get("file_driver") or ("loop" if template in ("file", "sharedfile") else None)
        self._start_running(
            job, op, pnode=node.name, pnode_uuid=node.uuid, hypervisor=p.get("hypervisor") or self.hypervisor,
            file_driver=file_driver,
        )  # fmt: skip
        # Once running, the executor has turned "memory" into maxmem/minmem (written with what
        # comes next); the private/secret OS parameters appear with the first log line.
        beparams = dict(p.get("beparams") or {})
        memory = beparams.pop("memory", None)
        for key in ("maxmem", "minmem"):
            if memory is not None:
                beparams.setdefault(key, memory)
        op.resolve(
            beparams={key: beparams[key] for key in ("maxmem", "minmem") if key in beparams}
            | {key: value for key, value in beparams.items() if key not in ("maxmem", "minmem")}
        )
        custom = {
            key: parse_size(key, value) if key in ("maxmem", "minmem") else value
            for key, value in beparams.items()
        }
        maxmem = int(custom.get("maxmem", 128))
        vcpus = custom.get("vcpus", 1)
        if not isinstance(vcpus, int) or isinstance(vcpus, bool):
            raise OpFailure(
                "TypeEnforcementError", f"'vcpus' (value {vcpus}) is not a valid int", prereq=False
            )
        op.resolve(osparams_private={}, osparams_secret={})
        disks = [dict(d) for d in p.get("disks") or []]
        for index, disk in enumerate(disks):
            disk["size"] = parse_size(f"disk/{index}", disk.get("size"))
        self._check_policy(maxmem, vcpus, template, disks)
        if str(p.get("os_type")) not in self.oses:
            raise OpFailure(
                "OpExecError",
                f"OS Parameters validation failed on node {node.name}: Directory for OS {p.get('os_type')} not "
                "found in search path",
                prereq=False,
            )
        self._check_room(node, maxmem if p.get("start", True) else 0, disks, template, name)
        if p.get("dry_run"):
            await self._work(
                job,
                op,
                [" - INFO: dry-run mode requested, not actually executing the operation"],
                self._time(op),
            )
            op.result = [node.uuid]
            return
        messages = [
            "* creating instance disks...",
            f"adding instance {name} to cluster config",
            "adding disks to cluster config",
        ]
        if p.get("start", True):
            messages.append("* starting instance...")
        await self._work(job, op, messages[:1], self._time(op) / len(messages))
        full = _BEPARAMS_DEFAULTS | custom
        full.setdefault("minmem", maxmem)
        full.setdefault("maxmem", maxmem)
        full["memory"] = full["maxmem"]
        inst = FakeInstance(
            name=name, pnode=node.name, os=str(p.get("os_type")), disk_template=template,
            hypervisor=str(p.get("hypervisor") or self.hypervisor), beparams=full,
            custom_beparams={k: v for k, v in custom.items() if k != "memory"},
            nics=[{"mac": new_mac(), "uuid": str(uuid.uuid4()), "mode": nic.get("mode", "bridged"),
                   "link": nic.get("link", self.link), "ip": nic.get("ip"), "name": nic.get("name"),
                   "network": nic.get("network")} for nic in p.get("nics") or []],
            disks=[{"size": d["size"], "uuid": str(uuid.uuid4()), "name": d.get("name")} for d in disks],
            tags=list(p.get("tags") or []), hvparams=dict(p.get("hvparams") or {}),
            admin_state="up" if p.get("start", True) else "down", oper_state=False,
        )  # fmt: skip
        self.instances[name] = inst
        await self._work(job, op, messages[1:], self._time(op) * (len(messages) - 1) / len(messages))
        inst.oper_state = bool(p.get("start", True))
        op.result = [node.name]

    def _choose_node(self, p: dict[str, Any], name: str) -> FakeNode:
        wanted = p.get("pnode")
        if wanted:
            node = self.nodes.get(str(wanted))
            if node is None:
                raise OpFailure("OpPrereqError", f"Node '{wanted}' not known", "unknown_entity")
            if node.offline:
                raise OpFailure(
                    "OpPrereqError", f"Cannot use offline primary node '{node.name}'", "wrong_state"
                )
            if node.drained:
                raise OpFailure(
                    "OpPrereqError", f"Cannot use drained primary node '{node.name}'", "wrong_state"
                )
            return node
        usable = [n for n in self.nodes.values() if not n.offline and not n.drained and n.vm_capable]
        if not usable:
            raise OpFailure(
                "OpPrereqError",
                f"Can't compute nodes using iallocator 'hail': Request failed: No valid allocation solutions "
                f"for instance {name}",
                "insufficient_resources",
            )
        return max(usable, key=lambda n: (self._free(n)[0] or 0, n.name))

    def _check_policy(self, memory: int, vcpus: int, template: str, disks: list[dict[str, Any]]) -> None:
        problems = []
        if not 128 <= memory <= 32768:
            problems.append(f"memory-size value {memory} is not in range [128, 32768]")
        if not 1 <= vcpus <= 8:
            problems.append(f"cpu-count value {vcpus} is not in range [1, 8]")
        if template != "diskless":
            problems += [
                f"disk-size/{i} value {d['size']} is not in range [1024, 1048576]"
                for i, d in enumerate(disks)
                if not 1024 <= d["size"] <= 1048576
            ]
        if problems:
            raise OpFailure(
                "OpPrereqError",
                f"Instance allocation to group {self.group_uuid} (default) violates policy: {', '.join(problems)}",
                "wrong_input",
                prereq=False,
            )

    def _check_room(
        self, node: FakeNode, memory: int, disks: list[dict[str, Any]], template: str, name: str
    ) -> None:
        mfree, dfree = self._free(node)
        if memory and mfree is not None and memory > mfree:
            raise OpFailure(
                "OpPrereqError",
                f"Not enough memory on node {node.name} for starting instance {name}: needed {memory} MiB, "
                f"available {mfree} MiB",
                "insufficient_resources",
                prereq=False,
            )
        needed = 0 if template == "diskless" else sum(d["size"] for d in disks)
        if needed and dfree is not None and needed > dfree:
            raise OpFailure(
                "OpPrereqError",
                f"Not enough disk space on target node {node.name} vg xenvg: required {needed} MiB, available "
                f"{dfree} MiB",
                "insufficient_resources",
                prereq=False,
            )

    async def _op_instance_remove(self, job: FakeJob, op: FakeOp) -> None:
        inst = self._instance(op)
        self._start_running(job, op, instance_uuid=inst.uuid)
        await self._work(job, op, [], self._time(op))
        if not op.luxid.get("dry_run"):
            self.instances.pop(inst.name, None)

    async def _op_instance_shutdown(self, job: FakeJob, op: FakeOp) -> None:
        inst = self._instance(op)
        self._start_running(job, op, instance_uuid=inst.uuid)
        await self._work(job, op, [], self._time(op))
        if not op.luxid.get("dry_run"):
            inst.oper_state = False
            if not op.luxid.get("no_remember"):
                inst.admin_state = "down"
            inst.touch()

    async def _op_instance_startup(self, job: FakeJob, op: FakeOp) -> None:
        inst = self._instance(op)
        node = self.nodes[inst.pnode]
        if not inst.oper_state:
            self._check_room(node, inst.memory, [], "diskless", inst.name)
        self._start_running(job, op, instance_uuid=inst.uuid)
        await self._work(job, op, [], self._time(op))
        if not op.luxid.get("dry_run"):
            inst.oper_state = True
            inst.admin_state = "up"
            inst.touch()

    async def _op_instance_reboot(self, job: FakeJob, op: FakeOp) -> None:
        inst = self._instance(op)
        if inst.admin_state != "up":
            raise OpFailure(
                "OpPrereqError", f"Instance {inst.name} is marked to be down, cannot reboot", "wrong_state"
            )
        self._start_running(job, op, instance_uuid=inst.uuid)
        await self._work(job, op, [], self._time(op))
        if not op.luxid.get("dry_run"):
            inst.oper_state = True

    async def _op_instance_set_params(self, job: FakeJob, op: FakeOp) -> None:
        inst = self._instance(op)
        p = op.luxid
        beparams = dict(p.get("beparams") or {})
        if not any(p.get(key) for key in ("beparams", "hvparams", "nics", "disks", "osparams", "os_name")):
            raise OpFailure("OpPrereqError", "No changes submitted", "wrong_input")
        self._start_running(job, op, instance_uuid=inst.uuid)
        changes: list[list[Any]] = []
        if "memory" in beparams:
            memory = beparams.pop("memory")
            beparams.setdefault("maxmem", memory)
            beparams.setdefault("minmem", memory)
        for key, value in beparams.items():
            if key in ("maxmem", "minmem"):
                value = parse_size(key, value)
            elif key == "vcpus" and (not isinstance(value, int) or isinstance(value, bool)):
                raise OpFailure(
                    "TypeEnforcementError", f"'vcpus' (value {value}) is not a valid int", prereq=False
                )
            beparams[key] = value
            changes.append([f"be/{key}", value])
        changes += [[f"hv/{key}", value] for key, value in (p.get("hvparams") or {}).items()]
        await self._work(job, op, [], self._time(op))
        if not p.get("dry_run"):
            inst.beparams.update(beparams)
            inst.beparams["memory"] = inst.beparams.get("maxmem", inst.memory)
            inst.custom_beparams.update(beparams)
            inst.hvparams.update(p.get("hvparams") or {})
            inst.touch()
        op.result = changes

    async def _op_instance_multi_alloc(self, job: FakeJob, op: FakeOp) -> None:
        children: list[dict[str, Any]] = []
        resolved_children: list[dict[str, Any]] = []
        for body in op.luxid.get("instances") or []:
            params = dict(body) | {"comment": "Submitted by OP_INSTANCE_MULTI_ALLOC"}
            children.append(params)
            node = self._choose_node(params, str(params.get("instance_name")))
            child = _opcodes.luxid_input("OP_INSTANCE_CREATE", params, op.luxid["reason"], dry_run=False)
            resolved = _opcodes.resolved_input(
                child,
                {"pnode": node.name, "pnode_uuid": node.uuid, "hypervisor": params.get("hypervisor") or self.hypervisor,
                 "helper_startup_timeout": None, "helper_shutdown_timeout": None},
            )  # fmt: skip
            resolved_children.append(resolved | {"dry_run": None})
        self._start_running(job, op, instances=resolved_children, iallocator=op.luxid.get("iallocator"))
        await self._work(job, op, [], self._time(op))
        dry_run = bool(op.luxid.get("dry_run"))
        ids = [self.submit([("OP_INSTANCE_CREATE", child)], resource="instances_multi_alloc", dry_run=dry_run)
               for child in children]  # fmt: skip
        op.result = {
            "allocatable": [str(child.get("instance_name")) for child in children],
            "failed": [],
            "jobs": [[True, job_id] for job_id in ids],
        }

    async def _op_test_delay(self, job: FakeJob, op: FakeOp) -> None:
        nodes = [self.nodes[name].uuid for name in op.luxid.get("on_nodes") or [] if name in self.nodes]
        self._start_running(job, op, duration=float(op.luxid.get("duration") or 0.0), on_node_uuids=nodes)
        await asyncio.sleep(float(op.luxid.get("duration") or 0.0))

    # ------------------------------------------------------------------ lifecycle

    async def aclose(self) -> None:
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
