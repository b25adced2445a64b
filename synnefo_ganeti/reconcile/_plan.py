"""Snapshots, drifts, and :func:`plan`: what differs between the database and Ganeti. Pure code.

Per backend the reconciler takes one snapshot of the database (its instances, and its
jobs not final) and then one of Ganeti (``/2/query/instance`` with the fields compared,
``/2/jobs?bulk=1``, and ``GET /2/jobs/ID`` for the jobs the database needs that the
listing lacks). :func:`plan` compares them in one pass over each, without I/O. An
instance that agrees with its row in everything (``QueriedInstance.settles``, most of
them on most passes) costs one quick check; the others go through the comparisons below,
which say what differs.

Rules, in the words of the drift kinds:

* Only instances the database holds as ``owned`` are checked; ``DESTROYED`` rows are
  checked only as the absence of an instance (an owned instance in Ganeti that the
  database holds as DESTROYED, or not at all, is an ``orphan``). Instances in Ganeti
  that are not ours (``GanetiSnapshot.owned``) are ignored.
* An instance with a job in flight is left alone for this cycle (no ``stale``,
  ``orphan``, ``operstate``, ``flavor``, ``nics``, ``disks`` or ``tags`` drift): a job
  not final in Ganeti's listing, a job that ended after the database snapshot was taken
  (the watcher may not have stored it yet), or a job the database holds as not final.
* ``building``: an instance in BUILD whose create job (recorded, or else a create of
  that name in Ganeti's listing) is still running is no drift; one whose create job
  succeeded, failed, was canceled or is gone is. The fix: STARTED or STOPPED as Ganeti
  runs the instance; DESTROYED when the job was canceled (before it ran: the instance
  never existed, as when the watcher stores the job's end); ERROR when the job failed,
  or when Ganeti has neither the job nor the instance. An instance in BUILD with no create job recorded
  nor seen gets ``build_grace`` seconds (the facade records the job right after
  submitting it) before it is a drift.
* ``operstate``: Ganeti's state is STARTED when ``admin_state`` is ``up`` and the
  instance runs (``oper_state`` true, or unknown for an offline node), else STOPPED.
  A STARTED or STOPPED row that differs is a drift (the fix takes Ganeti's state).
  An ERROR row is a drift only when Ganeti runs the instance; an ERROR row missing from
  Ganeti is consistent (a create that failed), not stale.
* ``flavor``, ``nics``, ``disks``, ``tags``: the expectation the row records (only what
  it names) against what Ganeti reports (see :mod:`._observe`); the fix records
  Ganeti's values.
* ``stale``: a STARTED or STOPPED row missing from Ganeti (fix: DESTROYED).
* ``job``: a job the database holds as not final that Ganeti reports final (fix: store
  the final version, so its events and the instance's state follow); one Ganeti no
  longer knows at all (``GET /2/jobs/ID`` answering nulls) is reported as unknown,
  never taken as failed, and has no fix.
* ``node_down`` (report-only, every pass while it lasts): Ganeti reads the instance
  ``ERROR_nodedown`` or ``ERROR_nodeoffline``: its primary node is down or offline, and
  whether it runs is unknown. No ``operstate`` drift then (a STARTED row is not
  "stopped"); the other comparisons go on (Ganeti's configuration still answers). The
  pass stores every row's node state as Ganeti reads it, whatever the fixes
  (``StoredInstance.node_state``: marked, and cleared once the node is back).
* ``not_owned`` (report-only, never fixed): the row is ours, or was, but Ganeti's
  instance of that name lacks the ownership marks of ``[ownership]`` (an operator's VM
  holding the name a create of ours was refused for). Nothing else is compared, so no fix
  makes the row take that instance's state (the control plane would own it, and a delete
  would remove it); the pass marks the row ``owned`` False, and every action refuses it
  (control/_actions.py). A row already marked so is reported again while the pair lasts.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from synnefo_ganeti._serial import to_jsonable
from synnefo_ganeti.jobs import JobStatus
from synnefo_ganeti.rapi import Job
from synnefo_ganeti.reconcile._fetch import QueriedInstance
from synnefo_ganeti.reconcile._observe import (
    InstanceView,
    RowView,
    beparams_differ,
    disks_differ,
    nics_differ,
    observed_beparams,
    observed_disks,
    observed_nics,
    our_tags,
    tags_differ,
)
from synnefo_ganeti.store import InstanceStatus, StoredJob
from synnefo_ganeti.store.instances._node_state import node_state_of

__all__ = [
    "BUILD_GRACE",
    "DbSnapshot",
    "Drift",
    "DriftKind",
    "Fix",
    "GanetiSnapshot",
    "ganeti_state",
    "job_instances",
    "plan",
]

#: seconds an instance may stay in BUILD with no create job recorded or seen
BUILD_GRACE = 60.0


class DriftKind(enum.StrEnum):
    STALE = "stale"
    ORPHAN = "orphan"
    BUILDING = "building"
    OPERSTATE = "operstate"
    FLAVOR = "flavor"
    NICS = "nics"
    DISKS = "disks"
    TAGS = "tags"
    JOB = "job"
    #: report-only: Ganeti reads the instance ERROR_nodedown / ERROR_nodeoffline
    NODE_DOWN = "node_down"
    #: report-only: Ganeti's instance of the row's name lacks the ownership marks
    NOT_OWNED = "not_owned"


class Fix(enum.StrEnum):
    """The database-side fixes, one per drift kind (``orphan`` is fixed in Ganeti, apart)."""

    STALE = "stale"
    BUILDING = "building"
    OPERSTATE = "operstate"
    FLAVOR = "flavor"
    NICS = "nics"
    DISKS = "disks"
    TAGS = "tags"
    JOBS = "jobs"

    @property
    def kind(self) -> DriftKind:
        return DriftKind.JOB if self is Fix.JOBS else DriftKind(self.value)


@dataclass(frozen=True, slots=True)
class DbSnapshot:
    """One backend's rows: every instance (by name) and the jobs not final (by id).

    ``instances``: :class:`~synnefo_ganeti.store.StoredInstance` or the reconciler's lighter
    :class:`~._fetch.SnapshotRow` (the columns compared)."""

    backend: str
    instances: Mapping[str, RowView]
    jobs: dict[int, StoredJob]
    taken_at: float = field(default_factory=time.time)


@dataclass(frozen=True, slots=True)
class GanetiSnapshot:
    """What one backend's Ganeti reported, taken after the :class:`DbSnapshot`.

    ``instances``: :class:`~._fetch.QueriedInstance` (or :class:`~synnefo_ganeti.rapi.Instance`)
    by name. ``jobs``: ``/2/jobs?bulk=1`` (unarchived jobs). ``looked_up``: ``GET /2/jobs/ID`` for
    the jobs the database needs and the listing lacks; ``None`` for a job Ganeti does
    not know. ``owned``: the names of Ganeti's instances the ownership settings say are
    ours (the snapshot records it so that :func:`plan` needs no settings); ``marks``: False
    when no ownership marks are configured (nothing is told ours or not: no ``not_owned``).
    """

    backend: str
    instances: Mapping[str, InstanceView]
    jobs: dict[int, Job]
    looked_up: dict[int, Job | None] = field(default_factory=dict)
    owned: frozenset[str] = frozenset()
    taken_at: float = field(default_factory=time.time)
    #: ``[ownership] tag_namespace``: only tags under it are compared (None: every tag)
    tag_namespace: str | None = None
    marks: bool = True

    def theirs(self, name: str) -> bool:
        """Ganeti has an instance ``name`` and it lacks the ownership marks (not ours)."""
        return self.marks and name in self.instances and name not in self.owned

    def job(self, job_id: int) -> Job | None:
        """The job from the listing or the lookups; ``None`` when unknown or not asked."""
        found = self.jobs.get(job_id)
        return found if found is not None else self.looked_up.get(job_id)


@dataclass(slots=True)
class Drift:
    """One difference. ``fixed`` is set by :func:`~synnefo_ganeti.reconcile.apply`.

    ``status`` (stale, building, operstate) and ``values`` (flavor, nics, disks, tags)
    are what the database-side fix writes; ``job`` is Ganeti's final job (job drifts).
    """

    kind: DriftKind
    backend: str
    instance: str | None
    detail: str
    job_id: int | None = None
    status: InstanceStatus | None = None
    values: dict[str, Any] = field(default_factory=dict)
    job: Job | None = None
    fixed: bool = False
    error: str | None = None

    #: what a report shows of a drift
    __json_fields__ = ("kind", "instance", "detail", "fixed")

    def to_json(self) -> dict[str, Any]:
        result: dict[str, Any] = to_jsonable(self)
        return result


def ganeti_state(instance: InstanceView) -> InstanceStatus:
    """STARTED when Ganeti means the instance to run and it does (or cannot tell), else STOPPED."""
    if instance.admin_state == "up" and instance.oper_state is not False:
        return InstanceStatus.STARTED
    return InstanceStatus.STOPPED


def _op_instances(op: Mapping[str, Any]) -> Iterable[str]:
    name = op.get("instance_name")
    if isinstance(name, str):
        yield name
    if isinstance(op.get("new_name"), str):
        yield op["new_name"]  # a rename: the instance has one name or the other, both are its
    for item in op.get("instances") or ():
        if isinstance(item, Mapping) and isinstance(item.get("instance_name"), str):
            yield item["instance_name"]


def job_instances(job: Job) -> set[str]:
    """The instances a job's ops name."""
    return {name for op in job.ops for name in _op_instances(op)}


def _creates(job: Job) -> set[str]:
    return {
        name
        for op in job.ops
        if op.get("OP_ID") in ("OP_INSTANCE_CREATE", "OP_INSTANCE_MULTI_ALLOC")
        for name in _op_instances(op)
    }


def _end(job: Job) -> float | None:
    return job.end_ts.as_float if job.end_ts is not None else None


def _when(value: float | datetime | None) -> float | None:
    if isinstance(value, datetime):
        return value.timestamp()
    return value


def plan(
    db_snapshot: DbSnapshot, ganeti_snapshot: GanetiSnapshot, *, build_grace: float = BUILD_GRACE
) -> list[Drift]:
    """The drifts between one backend's database and Ganeti snapshots (see the module's rules)."""
    db, gnt = db_snapshot, ganeti_snapshot
    backend = db.backend
    drifts: list[Drift] = []

    def ended_after_snapshot(job: Job) -> bool:
        end = _end(job)
        return end is not None and end > db.taken_at

    # Instances with a job in flight, and Ganeti's creates by instance name (latest wins).
    busy: set[str] = set()
    creates: dict[str, Job] = {}
    for job in gnt.jobs.values():
        if not job.is_final or ended_after_snapshot(job):
            busy.update(job_instances(job))
        for name in _creates(job):
            if name not in creates or creates[name].id < job.id:
                creates[name] = job

    # Jobs the database holds as not final.
    for job_id, stored in sorted(db.jobs.items()):
        if stored.is_final:
            continue
        if job_id in gnt.jobs:
            ganeti_job: Job | None = gnt.jobs[job_id]
        elif job_id in gnt.looked_up:
            ganeti_job = gnt.looked_up[job_id]
        else:
            continue  # not asked about: nothing to say
        if ganeti_job is not None and stored.instance is not None:
            # running, or ended and its end not stored yet: the instance's state follows it
            busy.add(stored.instance)
            busy.update(job_instances(ganeti_job))  # (a rename's new name too)
        if ganeti_job is None:
            drifts.append(
                Drift(
                    DriftKind.JOB, backend, stored.instance,
                    f"job {job_id} is {stored.status} in the database and unknown to Ganeti "
                    "(neither queued nor archived); left as it is",
                    job_id=job_id,
                )
            )  # fmt: skip
        elif ganeti_job.is_final and not ended_after_snapshot(ganeti_job):
            drifts.append(
                Drift(
                    DriftKind.JOB, backend, stored.instance,
                    f"job {job_id} is {stored.status} in the database, Ganeti says {ganeti_job.status}",
                    job_id=job_id, job=ganeti_job,
                )
            )  # fmt: skip

    for name, row in db.instances.items():
        if row.status is InstanceStatus.DESTROYED:
            continue
        observed = gnt.instances.get(name)
        theirs = gnt.theirs(name)
        if not row.owned:
            if theirs and name not in busy:
                drifts.append(_not_owned(row, observed))
            continue
        if row.status is InstanceStatus.BUILD:
            drift = _building(row, observed, gnt, creates.get(name), db.taken_at, build_grace, theirs=theirs)
            if drift is not None:
                drifts.append(drift)
            continue
        if name in busy:
            continue
        if theirs:
            drifts.append(_not_owned(row, observed))
            continue
        if isinstance(observed, QueriedInstance) and observed.settles(row, gnt.tag_namespace):
            continue  # the same in everything compared: no drift
        if observed is None:
            if row.status is not InstanceStatus.ERROR:
                drifts.append(
                    Drift(
                        DriftKind.STALE, backend, name,
                        f"{row.status} in the database, not in Ganeti",
                        status=InstanceStatus.DESTROYED,
                    )
                )  # fmt: skip
            continue
        drifts.extend(_compare(row, observed, gnt.tag_namespace))

    for name, observed in gnt.instances.items():
        if name not in gnt.owned or name in busy:
            continue
        held_row = db.instances.get(name)
        if held_row is None or held_row.status is InstanceStatus.DESTROYED:
            held = "not in the database" if held_row is None else "DESTROYED in the database"
            drifts.append(
                Drift(
                    DriftKind.ORPHAN, backend, name,
                    f"ours in Ganeti ({observed.status or observed.admin_state}), {held}",
                )
            )  # fmt: skip
    return drifts


def _not_owned(row: RowView, observed: InstanceView | None) -> Drift:
    state = "" if observed is None else f" ({observed.status or observed.admin_state})"
    return Drift(
        DriftKind.NOT_OWNED, row.backend, row.name,
        f"{row.status} in the database; Ganeti's instance {row.name}{state} lacks the ownership marks "
        "of [ownership]: not ours, never taken over (no fix; every action on the row is refused)",
    )  # fmt: skip


def _building(
    row: RowView,
    observed: InstanceView | None,
    gnt: GanetiSnapshot,
    seen_create: Job | None,
    taken_at: float,
    grace: float,
    *,
    theirs: bool = False,
) -> Drift | None:
    """The BUILD row's drift; ``theirs``: Ganeti's instance of its name lacks the ownership
    marks: only a create that failed or was canceled settles the row (ERROR, DESTROYED: the
    instance is not its), anything that would take Ganeti's state is ``not_owned``."""
    if theirs:
        drift = _building(row, None, gnt, seen_create, taken_at, grace)
        if drift is None or drift.status is InstanceStatus.DESTROYED:
            return drift
        job = gnt.job(drift.job_id) if drift.job_id is not None else None
        failed = job is not None and job.status is not JobStatus.SUCCESS
        return drift if failed else _not_owned(row, observed)
    backend, name = row.backend, row.name
    job_id = row.create_job_id
    job = gnt.job(job_id) if job_id is not None else seen_create
    if job_id is None and job is not None:
        job_id = job.id
    if job is not None:
        if not job.is_final:
            return None  # still building: leave it
        end = _end(job)
        if end is not None and end > taken_at:
            return None  # ended after the snapshot: the watcher may store it yet
        if job.status is JobStatus.SUCCESS:
            target = ganeti_state(observed) if observed is not None else InstanceStatus.ERROR
            where = f"Ganeti has it {target}" if observed is not None else "Ganeti no longer has the instance"
            detail = f"BUILD in the database, its create job {job.id} succeeded ({where})"
        elif job.status is JobStatus.CANCELED:
            # canceled before it ran: the instance never existed (as the job's end applied says)
            target = InstanceStatus.DESTROYED
            detail = f"BUILD in the database, its create job {job.id} was canceled"
        else:
            target = InstanceStatus.ERROR
            detail = f"BUILD in the database, its create job {job.id} ended in {job.status}"
        return Drift(DriftKind.BUILDING, backend, name, detail, job_id=job.id, status=target)
    if job_id is not None:  # recorded, and Ganeti no longer knows the job
        if observed is not None:
            target = ganeti_state(observed)
            detail = (
                f"BUILD in the database, its create job {job_id} is unknown to Ganeti, which has it {target}"
            )
        else:
            target = InstanceStatus.ERROR
            detail = f"BUILD in the database, its create job {job_id} and the instance are unknown to Ganeti"
        return Drift(DriftKind.BUILDING, backend, name, detail, job_id=job_id, status=target)
    if observed is not None:
        target = ganeti_state(observed)
        detail = f"BUILD in the database with no create job recorded; Ganeti has it {target}"
        return Drift(DriftKind.BUILDING, backend, name, detail, status=target)
    since = _when(row.updated_at)
    if since is not None and taken_at - since < grace:
        return None  # the create may be on its way
    return Drift(
        DriftKind.BUILDING, backend, name,
        "BUILD in the database with no create job recorded, not in Ganeti",
        status=InstanceStatus.ERROR,
    )  # fmt: skip


def _compare(row: RowView, observed: InstanceView, tag_namespace: str | None = None) -> list[Drift]:
    backend, name = row.backend, row.name
    drifts: list[Drift] = []
    state = ganeti_state(observed)
    node_state = node_state_of(observed.status)
    if node_state is not None:
        # whether it runs is unknown: no operstate drift (the instance is not "stopped")
        drifts.append(
            Drift(
                DriftKind.NODE_DOWN, backend, name,
                f"{row.status} in the database; Ganeti reads it {observed.status}: its primary node "
                f"{observed.pnode or '?'} is {node_state}",
            )
        )  # fmt: skip
    elif row.status is InstanceStatus.ERROR:
        if state is InstanceStatus.STARTED:
            drifts.append(
                Drift(
                    DriftKind.OPERSTATE, backend, name, "ERROR in the database, Ganeti runs it", status=state
                )
            )
    elif row.status is not state:
        drifts.append(
            Drift(
                DriftKind.OPERSTATE, backend, name,
                f"{row.status} in the database, {state} in Ganeti "
                f"(admin_state {observed.admin_state}, oper_state {observed.oper_state})",
                status=state,
            )
        )  # fmt: skip
    flavor = beparams_differ(row.beparams, observed)
    if flavor:
        text = ", ".join(
            f"{key} {want!r} expected, Ganeti has {have!r}" for key, (want, have) in sorted(flavor.items())
        )
        drifts.append(
            Drift(DriftKind.FLAVOR, backend, name, text, values={"beparams": observed_beparams(observed)})
        )
    nics = nics_differ(row.nics, observed)
    if nics is not None:
        drifts.append(Drift(DriftKind.NICS, backend, name, nics, values={"nics": observed_nics(observed)}))
    disks = disks_differ(row.disks, observed)
    if disks is not None:
        drifts.append(
            Drift(DriftKind.DISKS, backend, name, disks, values={"disks": observed_disks(observed)})
        )
    tags = tags_differ(row.tags, observed, tag_namespace)  # only ours: under [ownership] tag_namespace
    if tags is not None:
        ours = our_tags(observed.tags, tag_namespace)
        drifts.append(Drift(DriftKind.TAGS, backend, name, f"tags {tags}", values={"tags": ours}))
    return drifts
