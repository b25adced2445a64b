"""Each side's snapshot of one backend, as the reconciler takes them one backend at a time.

:func:`snapshot_db` (the database's instances and jobs not final), :func:`snapshot_ganeti`
(Ganeti's instances of the compared fields and its jobs, then the jobs the database needs
that the listing lacks), and :func:`complete_ganeti`, that second half alone, for a caller
that fetched the instances itself (the reconciler's pass: ``_pass.settle``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

from synnefo_ganeti.errors import JobNotFoundError
from synnefo_ganeti.jobs import JobStatus
from synnefo_ganeti.rapi import Job, RapiClient
from synnefo_ganeti.reconcile._fetch import query_instances, read_db
from synnefo_ganeti.reconcile._observe import InstanceView
from synnefo_ganeti.reconcile._plan import DbSnapshot, GanetiSnapshot
from synnefo_ganeti.store import InstanceStatus, Store

__all__ = ["complete_ganeti", "snapshot_db", "snapshot_ganeti"]

_NOT_FINAL = [status for status in JobStatus if not status.is_final]


async def snapshot_db(store: Store, backend: str, *, destroyed: bool = True) -> DbSnapshot:
    """The backend's instances and its jobs not final: a few queries, whatever their number.

    Instances: a name's current row (live, else the newest DESTROYED), not an earlier life;
    only the columns compared (:class:`~._fetch.SnapshotRow`). ``destroyed=False``: live rows
    only (:meth:`Reconciler.snapshots` then reads the DESTROYED ones of Ganeti's orphans).
    """
    instances, taken_at = await read_db(store, backend, destroyed=destroyed)
    jobs = await store.list_jobs(backend=backend, status=_NOT_FINAL)
    return DbSnapshot(
        backend=backend, instances=instances, jobs={job.job_id: job for job in jobs}, taken_at=taken_at
    )


async def snapshot_ganeti(
    client: RapiClient,
    db: DbSnapshot,
    *,
    owns: Callable[[str, list[str]], bool] | None = None,
    lookup_concurrency: int = 8,
    tag_namespace: str | None = None,
) -> GanetiSnapshot:
    """Ganeti's instances (the compared fields) and jobs, fetched concurrently, then the
    lookups the database needs.

    Looked up (``GET /2/jobs/ID``, at most ``lookup_concurrency`` at once): the database's
    jobs not final and the create jobs of its BUILD instances, when the listing lacks them.
    ``owns(name, tags) -> bool`` says which instances are ours (none without it).
    """
    taken_at = time.time()
    instances, jobs = await asyncio.gather(query_instances(client), client.list_jobs())
    return await complete_ganeti(
        client,
        db,
        instances,
        jobs,
        taken_at,
        owns=owns,
        lookup_concurrency=lookup_concurrency,
        tag_namespace=tag_namespace,
    )


async def complete_ganeti(
    client: RapiClient,
    db: DbSnapshot,
    instances: Mapping[str, InstanceView],
    jobs: list[Job],
    taken_at: float,
    *,
    owns: Callable[[str, list[str]], bool] | None = None,
    lookup_concurrency: int = 8,
    tag_namespace: str | None = None,
    marks: bool | None = None,
) -> GanetiSnapshot:
    """Ganeti's snapshot of ``instances`` and ``jobs`` (answered after ``taken_at``): the
    lookups the database needs, which instances are ours (see :func:`snapshot_ganeti`).
    ``marks``: whether ownership marks are configured (default: ``owns`` given); without,
    no instance is told "not ours" (:attr:`GanetiSnapshot.marks`)."""
    by_id = {job.id: job for job in jobs}
    wanted = {job_id for job_id in db.jobs if job_id not in by_id}
    wanted.update(
        row.create_job_id
        for row in db.instances.values()
        if row.status is InstanceStatus.BUILD
        and row.create_job_id is not None
        and row.create_job_id not in by_id
    )
    slots = asyncio.Semaphore(max(1, lookup_concurrency))

    async def look_up(job_id: int) -> tuple[int, Job | None]:
        async with slots:
            try:
                return job_id, await client.get_job(job_id)
            except JobNotFoundError:
                return job_id, None

    looked_up = dict(await asyncio.gather(*(look_up(job_id) for job_id in sorted(wanted))))
    owned = frozenset(
        name for name, instance in instances.items() if owns is not None and owns(name, instance.tags)
    )
    # (no marks configured, or no ownership said: nothing is ours, and nothing told "not ours")
    marks = owns is not None if marks is None else marks
    return GanetiSnapshot(
        backend=db.backend,
        instances=instances,
        jobs=by_id,
        looked_up=looked_up,
        owned=owned,
        taken_at=taken_at,
        tag_namespace=tag_namespace,
        marks=marks,
    )
