"""What needs an operator's look (the page ``/attention``), read from the store in one go.

* **failed jobs**: the newest jobs that ended in error, each with the message of its failed op
  (what Ganeti said);
* **instances in error**: stored ERROR, each with its last error (the action, the job, Ganeti's
  message) and whether its node is down or offline;
* **requests waiting**: pending requests the dispatcher cannot place now, and why (its last
  ``waiting_reason``), the oldest first;
* **open incidents**: what the dispatcher's repair task found wrong and has not closed (a node
  down, an instance that should run; its repair, if policy sent one), the newest first.

Every part is bounded (:data:`LIMIT` rows); a part cut off says how many it holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from synnefo_ganeti.control import ControlPlane
from synnefo_ganeti.jobs import JobStatus
from synnefo_ganeti.store import (
    Incident,
    IncidentStore,
    InstanceStatus,
    Request,
    RequestStatus,
    StoredInstance,
    StoredJob,
)

__all__ = ["LIMIT", "Attention", "FailedJob", "attention"]

#: the rows shown per part
LIMIT = 200


@dataclass(frozen=True, slots=True)
class FailedJob:
    """A job that ended in error, with the op that failed and Ganeti's message."""

    job: StoredJob
    op: str
    message: str


@dataclass(slots=True)
class Attention:
    failed_jobs: list[FailedJob] = field(default_factory=list)
    failed_total: int = 0
    instances: list[StoredInstance] = field(default_factory=list)
    waiting: list[Request] = field(default_factory=list)
    incidents: list[Incident] = field(default_factory=list)

    @property
    def count(self) -> int:
        return self.failed_total + len(self.instances) + len(self.waiting) + len(self.incidents)


def _failed(job: StoredJob) -> FailedJob:
    for op in job.ops:
        if op.status is JobStatus.ERROR or op.error:
            return FailedJob(job, op.op_id, op.error or "")
    return FailedJob(job, job.ops[0].op_id if job.ops else "", "")


async def attention(cp: ControlPlane) -> Attention:
    """Failed jobs (newest first), instances in error, requests waiting (oldest first), open
    incidents (newest first)."""
    store = cp.store
    jobs = await store.list_jobs(status=[JobStatus.ERROR])
    jobs.sort(key=lambda j: j.ended_at or j.updated_at, reverse=True)
    instances = await store.list_instances(status=[InstanceStatus.ERROR])
    pending = await store.list_requests(status=[RequestStatus.PENDING], newest_first=False, limit=LIMIT * 5)
    return Attention(
        failed_jobs=[_failed(job) for job in jobs[:LIMIT]],
        failed_total=len(jobs),
        instances=instances[:LIMIT],
        waiting=[r for r in pending if r.waiting_reason][:LIMIT],
        incidents=await IncidentStore(store).incidents(open_only=True, limit=LIMIT),
    )
