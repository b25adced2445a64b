"""The fake cluster and its job engine: the queue, the scheduling and execution of jobs, the job files.

Design, and why:

* Every job runs as one asyncio task, as Ganeti runs one executor process per job.
  At most ``max_running_jobs`` run at once (Ganeti's cluster setting, 20 by
  default); the others stay ``queued`` in submission order.
* Each op first takes the locks its LU asks for (the opcode's ``locks=`` in the
  registry; instance, node and node-res locks as wconfd grants them, :mod:`._locks`),
  as ``mcpu.Processor._LockAndExecLU`` does; while it waits it is ``waiting``
  (``_JobProcessor._MarkWaitlock``), and it turns ``running`` with its
  ``exec_timestamp`` only once it holds them (``_OpExecCallbacks.NotifyStart``).
  A handler releases locks early where its LU's ``Exec`` does (:meth:`FakeCluster.release`);
  the rest are freed when the op ends.
* An op that fails with ``ECODE_TEMP_NORES`` (an opportunistic create that found no
  node among the ones it could lock) is retried with all locks, as
  ``_LockAndExecLU`` calls ``lu.PrepareRetry`` (its feedback line in the op log) and
  ``NotifyRetry`` (back to ``waiting``).
* Each op goes ``queued -> waiting -> running -> success | error``; checks that
  Ganeti makes in ``CheckPrereq`` fail straight from ``waiting`` (no
  ``exec_timestamp``), the others after ``running``. A failed op fails the ops
  after it with ``["OpExecError", ["Preceding opcode failed"]]``.
* Every state change is written to the queue directory as Ganeti writes it (see
  :mod:`._queue`): three luxid versions on submit (the last two once luxid enqueues it:
  :data:`ENQUEUE_AFTER`), then the executor's versions (waiting, running, one per log line,
  final); a cancel is luxid's (``CancelJob``: dequeued, told, or "not found in queue").
* Every change also wakes ``/2/jobs/ID/wait`` long-polls (one event per job).
* What an op does is its handler's, found in the registry (:mod:`._registry`) by
  ``OP_ID``: instance ops in :mod:`._ops_create` and :mod:`._ops_instances`, the others in :mod:`._ops_cluster`;
  placement checks in :mod:`._placement`; jobs and ops themselves in :mod:`._jobs`.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import random
import time
import uuid
from typing import Any

from synnefo_ganeti.jobs import JobStatus
from synnefo_ganeti.testing import (
    _ops_cluster,
    _ops_create,
    _ops_disks,
    _ops_groups,
    _ops_instances,
    _ops_moves,
    _ops_networks,
    _ops_nodes,
    _ops_tags,
)
from synnefo_ganeti.testing._cluster import FakeInstance, FakeNode, OpFailure, instance_view, node_view
from synnefo_ganeti.testing._filtering import select_jobs
from synnefo_ganeti.testing._jobs import FakeJob, FakeOp, new_job, now_ts
from synnefo_ganeti.testing._locks import LockManager, Request
from synnefo_ganeti.testing._model import ClusterModel
from synnefo_ganeti.testing._queue import QueueDir
from synnefo_ganeti.testing._registry import LOCKS, OPCODES

__all__ = ["DEFAULT_OP_TIMES", "ENQUEUE_AFTER", "FakeCluster", "FakeJob", "FakeOp"]

#: seconds a job submitted in this context stays written to the queue (listed, "queued") before
#: it joins luxid's scheduler: luxid writes a new job to every master candidate before it enqueues
#: it, and waits on a dead one's RPC timeout (``writeAndReplicateJob``); a cancel meanwhile is
#: "not found in queue" (:class:`~._slow.SlowSubmit`'s ``queued_for``)
ENQUEUE_AFTER: contextvars.ContextVar[float] = contextvars.ContextVar(
    "fake_ganeti_enqueue_after", default=0.0
)

_BEPARAMS_DEFAULTS = _ops_create.BEPARAMS_DEFAULTS  # the name benchmarks/reconcile.py imports
_HANDLER_MODULES = (_ops_cluster, _ops_create, _ops_instances, _ops_disks, _ops_groups, _ops_moves, _ops_networks,
                    _ops_nodes, _ops_tags)  # fmt: skip
TEMP_NORES = "temp_insufficient_resources"  # errors.ECODE_TEMP_NORES

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


#: Ganeti 3.0's default instance policy (``constants.IPOLICY_DEFAULTS``), as recorded in data/info.json
DEFAULT_IPOLICY: dict[str, tuple[int, int]] = {
    "memory-size": (128, 32768), "cpu-count": (1, 8), "disk-size": (1024, 1048576),
    "disk-count": (1, 16), "nic-count": (1, 8), "spindle-use": (1, 12),
}  # fmt: skip


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
        opportunistic_retry: float = 2.0,
        default_iallocator: str = "hail",
        ipolicy: dict[str, tuple[int, int]] | None = None,
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
        #: the instance policy's one minmax pair: key -> (min, max), as GET /2/info shows it
        self.ipolicy: dict[str, tuple[int, int]] = DEFAULT_IPOLICY | (ipolicy or {})
        self.disk_templates = list(disk_templates)
        self.hypervisor = hypervisor
        self.link = link
        self.group_uuid = str(uuid.uuid4())
        #: groups, networks, cluster tags, filters, exports (:mod:`._model`)
        self.model = ClusterModel.default(self.group_uuid, list(self.nodes))
        self.queue = queue
        self.max_running_jobs = max_running_jobs
        self.op_times = DEFAULT_OP_TIMES | (op_times or {})
        self.archive_after = archive_after
        self.jobs: dict[int, FakeJob] = {}
        self._serial = itertools.count(1 + (queue.last_serial if queue is not None else 0))
        self._pending: list[FakeJob] = []
        self._running: set[int] = set()
        self._held: dict[int, asyncio.TimerHandle] = {}  # submitted, not yet enqueued (ENQUEUE_AFTER)
        self._tasks: set[asyncio.Task[None]] = set()
        self.locks = LockManager(
            lambda level: list(self.nodes) if level != "instance" else list(self.instances)
        )
        #: seconds between an opportunistic create's lock attempts (``SimpleRetry(..., 2.0, ...)``
        #: in ``mcpu.Processor._AcquireLocks``)
        self.opportunistic_retry = opportunistic_retry
        self.default_iallocator = default_iallocator  # the cluster's default_iallocator (/2/info)
        self.reserved: dict[str, int] = {}  # node -> memory held by creates placed there, until they end
        #: seconds an RPC to a crashed node takes to fail (``_node_faults``; Ganeti's connect timeout: 5)
        self.rpc_timeout = 0.0
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
        return [
            node_view(node, instances, self.model.group_of(node.name).uuid) for node in self.nodes.values()
        ]

    def instance_view(self, name: str) -> dict[str, Any] | None:
        inst = self.instances.get(name)
        return None if inst is None else instance_view(inst, self.link, self.nodes.get(inst.pnode))

    def instance_views(self) -> list[dict[str, Any]]:
        nodes = self.nodes
        return [
            instance_view(inst, self.link, nodes.get(inst.pnode))
            for inst in sorted(self.instances.values(), key=lambda i: i.name)
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
        library_reason: bool = True,
        parent_reason: list[Any] | None = None,
    ) -> int:
        """Queue a job of ``(OP_ID, params)`` ops; returns its id at once, as luxid does.

        ``resource`` names the RAPI resource (``instances``); ``client`` a gnt-* command
        line instead (``("gnt-debug", "submit-job")``), as in Ganeti's reason trail.
        ``parent_reason``: the trail of the op that submits this job as its child, which
        replaces the library's entry (``mcpu._SetBaseOpParams``).
        """
        if (resource is None) == (client is None):
            raise ValueError("give exactly one of resource (RAPI) or client (command line)")
        if self._closed:
            raise RuntimeError("the fake cluster is shut down")
        job_id = next(self._serial)
        job = new_job(
            job_id, ops, resource=resource, client=client, dry_run=dry_run, user_reason=user_reason,
            library_reason=library_reason, parent_reason=parent_reason, version=self.model.version,
        )  # fmt: skip
        self.jobs[job_id] = job
        if self.queue is not None:
            self.queue.write_serial(job_id)
            self.queue.write_job(job_id, job.luxid_file(), luxid=True)
        hold = ENQUEUE_AFTER.get()
        if hold > 0:  # written and listed, not yet in the scheduler (luxid replicating it)
            self._held[job_id] = asyncio.get_running_loop().call_later(hold, self._enqueue, job)
        else:
            self._enqueue(job)
        return job_id

    def _enqueue(self, job: FakeJob) -> None:
        """``enqueueNewJobs``: the job joins the scheduler's queue (its two livelock writes)."""
        self._held.pop(job.id, None)
        if self._closed:
            return
        if self.queue is not None:
            job.livelock = f"/var/run/ganeti/livelocks/luxi-daemon_{self._boot}"
            self.queue.write_job(job.id, job.luxid_file(), luxid=True)
        job.livelock = f"/var/run/ganeti/livelocks/job_{job.id:06d}_{int(time.time())}"
        if self.queue is not None:
            self.queue.write_job(job.id, job.luxid_file(), luxid=True)
        self._pending.append(job)
        self._schedule()

    def cancel(self, job_id: int) -> tuple[bool, str]:
        """luxid's ``CancelJob`` (``Query/Server.hs``, 3.0): a job in its scheduler's queue is
        dequeued; one handed over to execution is told to cancel, which a job still waiting for
        its locks does (Ganeti answers once it has; the fake at once) and a running one does
        not; a job the scheduler holds neither queued nor running (ended, still being written to
        the master candidates, or unknown) is "not found in queue" (``JQScheduler.rmJob``)."""
        job = self.jobs.get(job_id)
        if job is None or (job not in self._pending and job_id not in self._running):
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
        if job.status in (JobStatus.QUEUED, JobStatus.WAITING):
            job.cancel_requested = True  # (it ends canceled at its next look: _acquire)
            return True, "Job successfully cancelled"
        return False, "Job no longer waiting, can't cancel (informed it anyway)"

    async def kill(self, job_id: int) -> bool:
        """The job's process dies mid-way (its master died) and a luxid fails it as Ganeti 3.0's
        does on a new master (``JQScheduler.checkForDeath``): every unfinished op ``error`` with
        the result "detected death of job N" (Ganeti also adds a reason, which the fake leaves out).
        What the op made so far (an instance in the configuration) stays. False: not running."""
        job = self.jobs.get(job_id)
        if job is None or job_id not in self._running:
            return False
        for task in [t for t in self._tasks if t.get_name() == f"fake-job-{job_id}"]:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        stamp = now_ts()
        message = f"detected death of job {job_id}"
        for op in job.ops:
            if not op.status.is_final:
                op.status = JobStatus.ERROR
                op.result = message
                op.end_timestamp = stamp
        job.end_timestamp = stamp
        job.livelock = None
        self._write(job, luxid=True)
        return True

    # ------------------------------------------------------------------ running

    def schedule(self) -> None:
        """Look at the queue again (luxid does when the filter rules change)."""
        if not self._closed:
            self._schedule()

    def _schedule(self) -> None:
        """``scheduleSomeJobs``: queued jobs a REJECT rule applies to are canceled, then as many
        as there are free slots start, in id order, as the filter rules allow (``_filtering``)."""
        free = self.max_running_jobs - len(self._running)
        if not self._pending or (free <= 0 and not self.model.filters):
            return
        running = [self.jobs[job_id] for job_id in self._running]
        rejected, chosen = select_jobs(self.model.filters.values(), self._pending, running, free)
        for job in rejected:
            self.cancel(job.id)
        for job in chosen:
            self._pending.remove(job)
            self._running.add(job.id)
            task = asyncio.get_running_loop().create_task(self._run(job), name=f"fake-job-{job.id}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _write(self, job: FakeJob, *, luxid: bool = False) -> None:
        if self.queue is not None:
            self.queue.write_job(job.id, job.luxid_file() if luxid else job.executor_file(), luxid=luxid)
        job.notify()

    def log(self, job: FakeJob, op: FakeOp, message: str) -> None:
        """Append a ``message`` line to the op's log (an LU's ``feedback_fn``/``LogInfo``)."""
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
        """Run one op, as ``mcpu.Processor.ExecOpCode``; True on success."""
        try:
            while True:
                await self._acquire(job, op)
                if job.cancel_requested:
                    op.status = JobStatus.CANCELED
                    op.end_timestamp = now_ts()
                    return False
                # Past the locks the executor resolves the opcode (uuids still unset): a
                # CheckPrereq failure is written with that form, and no exec_timestamp.
                op.stage = "resolved"
                handler = OPCODES.get(op.op_id)
                if handler is None:
                    raise OpFailure(
                        "OpPrereqError",
                        f"Opcode {op.op_id} is not supported by the fake Ganeti",
                        "wrong_input",
                    )
                try:
                    await handler(self, job, op)
                    break
                except OpFailure as failure:
                    if failure.ecode != TEMP_NORES:
                        raise
                # mcpu.Processor._LockAndExecLU: ECODE_TEMP_NORES -> LUInstanceCreate.PrepareRetry
                # (its feedback, opportunistic_locking off), NotifyRetry (waiting), locks freed.
                self.log(job, op, "* falling back to full lock allocation")
                op.resolve(opportunistic_locking=False)
                self._unreserve(op)
                self.locks.release_all(op)
                op.status = JobStatus.WAITING
                self._write(job)
            op.status = JobStatus.SUCCESS
            op.end_timestamp = now_ts()
            return True
        except OpFailure as failure:
            op.status = JobStatus.ERROR
            op.result = failure.result
            op.end_timestamp = now_ts()
            return False
        finally:
            self.locks.release_all(op)
            self._unreserve(op)

    async def _acquire(self, job: FakeJob, op: FakeOp) -> None:
        """Take the locks the op's LU asks for, level by level as ``mcpu.Processor._LockAndExecLU``.

        Levels not acquired opportunistically are collated into one request, granted whole;
        opportunistic ones (``LUInstanceCreate.ExpandNames`` with ``opportunistic_locking``)
        take the free node locks (at least ``opportunistic`` of them), then the free
        node-res locks of those nodes (``DeclareLocks``), retrying every ``opportunistic_retry``
        seconds while too few are free (``mcpu.Processor._AcquireLocks``).
        """
        declare = LOCKS.get(op.op_id)
        if declare is None:
            return
        needs = declare(self, op)
        request = Request()
        if needs.instance is not None:
            request.add("instance", needs.instance)
        for level, names in (("node", needs.node), ("node-res", needs.node_res)):
            if names is not None and not needs.opportunistic:
                request.add(level, names, shared=needs.shared)
        await self.locks.acquire(op, request)
        if needs.opportunistic:
            nodes = await self._union(job, op, "node", list(self.nodes), needs.opportunistic)
            await self._union(job, op, "node-res", nodes, needs.opportunistic)

    async def _union(self, job: FakeJob, op: FakeOp, level: str, names: list[str], count: int) -> list[str]:
        while True:  # polled, as Ganeti polls: wconfd does not wake an opportunistic request
            got = self.locks.try_union(op, level, names, count)
            if got or job.cancel_requested:
                return got
            await asyncio.sleep(self.opportunistic_retry)

    def _unreserve(self, op: FakeOp) -> None:
        if op.allocated is not None and op.reserved:
            self.reserved[op.allocated] -= op.reserved
            op.reserved = 0

    # ------------------------------------------------------------------ for the opcode handlers

    def start_running(self, job: FakeJob, op: FakeOp, **resolved: Any) -> None:
        """The op starts executing (``running``, ``exec_timestamp``), its input resolved with ``resolved``."""
        op.resolve(**resolved)
        op.stage = "resolved"
        op.status = JobStatus.RUNNING
        op.exec_timestamp = now_ts()
        self._write(job)

    async def work(self, job: FakeJob, op: FakeOp, messages: list[str], seconds: float) -> None:
        """Spend ``seconds`` in the op, writing one log line per message along the way."""
        steps = max(1, len(messages))
        for message in messages:
            await asyncio.sleep(seconds / steps)
            self.log(job, op, message)
        if not messages:
            await asyncio.sleep(seconds)

    def release(self, op: FakeOp, level: str, keep: list[str] | tuple[str, ...] = ()) -> None:
        """``ReleaseLocks(lu, level, keep=keep)``: the op gives back its ``level`` locks but ``keep``."""
        self.locks.release_level(op, level, keep)

    def reserve(self, op: FakeOp, node: str, memory: int) -> None:
        """Count ``memory`` as used on ``node`` until the op ends (a create placed there, not yet started)."""
        self._unreserve(op)
        op.allocated, op.reserved = node, memory
        self.reserved[node] = self.reserved.get(node, 0) + memory

    def op_time(self, op: FakeOp) -> float:
        """How long the op runs: ``op_times[OP_ID]`` (``op_times["dry_run"]`` for a dry run)."""
        if op.luxid.get("dry_run"):
            return self.op_times["dry_run"]
        return self.op_times.get(op.op_id, 0.05)

    def op_instance(self, op: FakeOp) -> FakeInstance:
        """The instance the op names, or Ganeti's ``unknown_entity`` failure."""
        name = str(op.luxid.get("instance_name"))
        inst = self.instances.get(name)
        if inst is None:
            raise OpFailure("OpPrereqError", f"Instance '{name}' not known", "unknown_entity")
        return inst

    # ------------------------------------------------------------------ lifecycle

    async def aclose(self) -> None:
        self._closed = True
        for handle in self._held.values():
            handle.cancel()
        self._held.clear()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
