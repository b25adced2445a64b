"""Job ends of a backend whose queue directory is not local: RAPI ``/wait`` long-polls.

When the dispatcher does not run on the Ganeti master it cannot watch the queue, so
it follows every job recorded against an instance whose end is not applied yet (the
creates it submitted at once; the others as :mod:`~synnefo_ganeti.dispatch._follow`
discovers them, and on start-up) by long-polling
``GET /2/jobs/ID/wait``, a few at a time: ``concurrency`` stays well below the 20
clients ganeti-rapi serves, since the submitter and the reconciler need some too.
Jobs are followed oldest first: Ganeti runs them roughly in order, so when the oldest
ends, the next ones have often ended too and answer at once. Each end is stored like
a job file the watcher read (``Store.record``), so the instance and the request move
the same way as with the watcher. A job is followed once: one it finished following is
not taken again from a listing read before its end was applied (:meth:`JobTracker.discovered`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Iterable

from synnefo_ganeti import metrics
from synnefo_ganeti.errors import GanetiError, JobNotFoundError
from synnefo_ganeti.rapi import RapiClient
from synnefo_ganeti.reconcile import job_file
from synnefo_ganeti.store import JobVersion, Store

__all__ = ["JobTracker"]

#: how many jobs' start times :attr:`JobTracker.began` keeps (the most recent)
BEGAN_KEPT = 10_000
#: how many followed jobs the tracker remembers having finished (the most recent)
FINISHED_KEPT = 10_000

log = logging.getLogger("synnefo_ganeti.dispatch")


class JobTracker:
    """Follows jobs of one backend to their end and stores each end."""

    def __init__(
        self,
        backend: str,
        client: RapiClient,
        store: Store,
        *,
        concurrency: int = 4,
        retry_delay: float = 2.0,
        discover: bool = True,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, not {concurrency}")
        self.backend = backend
        self.client = client
        self.store = store
        self.concurrency = concurrency
        self.retry_delay = retry_delay
        #: read the backend's unapplied jobs at start (False: another follows them, or a reader
        #: hands them over: the dispatcher's ``_follow`` and ``_leases``)
        self.discover = discover
        self.ended = 0
        self._queue: deque[int] = deque()
        self._queued: set[int] = set()
        self._active: set[int] = set()
        self._wakeup = asyncio.Event()
        # job id -> when (monotonic) following it ended; forgotten once a listing without it is read
        self._finished: dict[int, float] = {}
        #: job id -> when (epoch seconds) its first ``/wait`` was sent, for the last :data:`BEGAN_KEPT` jobs
        self.began: OrderedDict[int, float] = OrderedDict()
        self._gauge = metrics.JOBS_TRACKED.labels(backend)

    def __repr__(self) -> str:
        return f"<JobTracker {self.backend} {len(self)} jobs, {self.concurrency} at a time>"

    def __len__(self) -> int:
        return len(self._queued) + len(self._active)

    def track(self, job_id: int) -> None:
        """Follow ``job_id`` until it ends (a job followed now, or whose end was just stored,
        is not added again)."""
        job_id = int(job_id)
        if job_id in self._queued or job_id in self._active or job_id in self._finished:
            return
        self._queued.add(job_id)
        # oldest first: a job id smaller than the queue's head goes in front
        if self._queue and job_id < self._queue[0]:
            self._queue.appendleft(job_id)
        else:
            self._queue.append(job_id)
        self._gauge.set(len(self))
        self._wakeup.set()

    def discovered(self, job_ids: Iterable[int], *, listed_at: float) -> int:
        """Follow the jobs of a listing of unapplied jobs read from ``listed_at`` (monotonic)
        on, except those whose following ended before (their end may be queued for the
        writer still); how many were new."""
        listed = {int(job_id) for job_id in job_ids}
        finished = self._finished
        for job_id in [j for j, ended_at in finished.items() if ended_at < listed_at and j not in listed]:
            del finished[job_id]  # applied since: the listing no longer has it
        added = 0
        for job_id in sorted(listed):
            if job_id in finished or job_id in self._queued or job_id in self._active:
                continue
            self.track(job_id)
            added += 1
        return added

    async def run(self) -> None:
        """Follow jobs until cancelled; start-up adds the jobs whose end the database lacks
        (with ``discover``)."""
        try:
            if self.discover:
                listed_at = time.monotonic()
                self.discovered(await self.store.unapplied_jobs(self.backend), listed_at=listed_at)
        except GanetiError as exc:
            log.warning("%s: cannot read the jobs in flight from the database (%s)", self.backend, exc)
        workers = [asyncio.create_task(self._worker()) for _ in range(self.concurrency)]
        try:
            await asyncio.gather(*workers)
        finally:
            for worker in workers:
                worker.cancel()
            for worker in workers:
                with contextlib.suppress(asyncio.CancelledError):
                    await worker

    async def _next(self) -> int:
        while not self._queue:
            self._wakeup.clear()
            await self._wakeup.wait()
        job_id = self._queue.popleft()
        self._queued.discard(job_id)
        self._active.add(job_id)
        return job_id

    async def _worker(self) -> None:
        while True:
            job_id = await self._next()
            try:
                await self._follow(job_id)
            finally:
                self._active.discard(job_id)
                self._gauge.set(len(self))

    async def _follow(self, job_id: int) -> None:
        if job_id not in self.began:
            self.began[job_id] = time.time()
            while len(self.began) > BEGAN_KEPT:
                self.began.popitem(last=False)
        try:
            job = await self.client.wait_for_job(job_id)
        except JobNotFoundError:
            log.warning(
                "%s: job %d is unknown to Ganeti (archived and purged?); the reconciler settles its instance",
                self.backend,
                job_id,
            )
            self._finished[job_id] = time.monotonic()
            return
        except GanetiError as exc:
            log.warning(
                "%s: following job %d failed (%s); again in %g s", self.backend, job_id, exc, self.retry_delay
            )
            await asyncio.sleep(self.retry_delay)
            self._active.discard(job_id)  # else track() takes it for followed already and drops it
            self.track(job_id)
            return
        await self.store.put(JobVersion(self.backend, job_file(job)))
        self._finished[job_id] = time.monotonic()
        self.ended += 1
        while len(self._finished) > FINISHED_KEPT:
            # a tracker that reads no listing (another dispatcher holds the follow lease) prunes none
            # in :meth:`discovered`; one dropped too early is at worst followed again, ending at once
            del self._finished[next(iter(self._finished))]
