"""No phantom reservations: the room a submitted create holds in the allocator is given back
however its create ends or is settled, even when its job's end is never seen here.

Design. A submitted create's reservation is released when the writer stores its job's end
(:meth:`~synnefo_ganeti.dispatch._submitter.Submitter._on_commit`). A backend that lost the job
(a cluster restored from a backup, a fake restarted empty, a queue wiped) never reports that
end, and its room would stay "pending" for good: placement then waits on room only phantom
reservations hold, and requests fail after ``placement_timeout`` with "no room ... pending".
So every :data:`SWEEP_INTERVAL` seconds the submit loop sweeps the reservations older than
:data:`SWEEP_AFTER` (counted from when the request's submit, naming its job, was stored: before,
the request reads as still placed, and its running create's room must not be given back):

* the request ended or went elsewhere meanwhile (the reconciler or another process settled
  it): the reservation is given back;
* the request still waits on that job, older than :data:`LOST_AFTER`: Ganeti is asked (one job
  listing per backend, at most every :data:`LOST_CHECK` seconds, then ``GET /2/jobs/ID`` for a job
  the listing lacks, which also reads the archive); a job Ganeti does not know is lost: the
  reservation is given back and the request goes back to "placed" (``Store.job_lost``), where
  the dispatcher asks Ganeti for a job carrying its id or an instance carrying its tag before it
  places it again (:meth:`~synnefo_ganeti.dispatch._recovery.Recovery._recover`);
* a job Ganeti lists still queued while a newer one has left the queue (Ganeti schedules the
  jobs of one priority in id order) may be one luxid wrote and never enqueued (the 3-node lab
  with a master candidate dead: job 207 stayed so for good). Unless a job filter rule on the
  backend may hold it on purpose, its cancel asks (:meth:`~._moves.NodeMoves._probe_stranded`):
  dequeued, the request is placed again as a move's; "not found in queue" for a minute, it is
  stranded (:meth:`ReservationSweep._job_stranded`).

Each one given back is logged and counted (``synnefo_ganeti_reservations_reclaimed_total``).
"""

from __future__ import annotations

import functools
import logging
import time

from synnefo_ganeti import metrics
from synnefo_ganeti.dispatch._recovery import Recovery
from synnefo_ganeti.dispatch._room import RoomQueue
from synnefo_ganeti.errors import GanetiError, JobNotFoundError
from synnefo_ganeti.jobs import JobStatus
from synnefo_ganeti.rapi import RapiClient

__all__ = ["LOST_AFTER", "LOST_CHECK", "SWEEP_AFTER", "SWEEP_INTERVAL", "ReservationSweep"]

log = logging.getLogger("synnefo_ganeti.dispatch")

#: seconds between sweeps of the reservations
SWEEP_INTERVAL = 5.0
#: a submitted create's reservation is checked against the store once it is this old (seconds)
SWEEP_AFTER = 10.0
#: ... and its job looked for in Ganeti once it is this old
LOST_AFTER = 60.0
#: seconds between such looks in one backend's job list
LOST_CHECK = 30.0


class ReservationSweep(Recovery):
    """Give back the reservations whose job's end is never seen here (see the module)."""

    @functools.cached_property
    def _submitted_at(self) -> dict[tuple[str, int], float]:
        """(backend, job id) of a submitted create -> when it was submitted (monotonic)."""
        return {}

    @functools.cached_property
    def _lost_checked(self) -> dict[str, float]:
        """backend -> when its job list was last read for lost jobs (monotonic)."""
        return {}

    @functools.cached_property
    def _room(self) -> RoomQueue:
        """The requests waiting for room, in line."""
        return RoomQueue()

    def _give_back(self, key: tuple[str, int]) -> bool:
        reservation = self._jobs.pop(key, None)
        self._job_requests.pop(key, None)
        self._submitted_at.pop(key, None)
        if reservation is None:
            return False
        self.allocator.release(reservation)
        return True

    async def _sweep_reservations(self) -> int:
        """One sweep (see the module); returns how many reservations were given back."""
        now = time.monotonic()
        due = [  # (one whose submit is not stored yet has no time here: never due)
            (key, request_id)
            for key, request_id in self._job_requests.items()
            if (at := self._submitted_at.get(key)) is not None and now - at >= SWEEP_AFTER
        ]
        given_back = 0
        waiting: dict[str, list[tuple[int, str]]] = {}
        for key, request_id in due:
            request = await self.store.get_request(request_id)
            if request is not None and not request.is_final and (request.backend, request.job_id) == key:
                if now - self._submitted_at.get(key, now) >= LOST_AFTER:
                    waiting.setdefault(key[0], []).append((key[1], request_id))
                continue  # still waiting on that job
            if self._give_back(key):
                given_back += 1
                state = "gone" if request is None else request.status.value
                log.warning(
                    "request %s: its create job %d on %s never reported its end here (the request is %s); "
                    "its reservation is given back",
                    request_id,
                    key[1],
                    key[0],
                    state,
                )
        for backend, jobs in waiting.items():
            if now - self._lost_checked.get(backend, 0.0) >= LOST_CHECK and backend in self._backends:
                self._lost_checked[backend] = now
                given_back += await self._lost_jobs(backend, jobs)
        if given_back:
            metrics.RESERVATIONS_RECLAIMED.inc(given_back)
            self._wake.set()
            self._room.free(given_back)
        return given_back

    async def _lost_jobs(self, backend: str, jobs: list[tuple[int, str]]) -> int:
        """Of ``jobs`` (job id, request id) that ``backend`` should hold, those it does not know:
        their reservations given back, their requests placed (asked about) again."""
        try:
            client = await self.client(backend)
            listed = {job.id: job.status for job in await client.list_jobs()}
        except GanetiError as exc:
            log.info("backend %s: its jobs not listed (%s); lost jobs looked for later", backend, exc)
            return 0
        # the newest job that left the queue: one of ours older than it, still queued, may be
        # one luxid never enqueued (stranded): its cancel tells, unless a filter rule holds jobs
        newest_started = max(
            (job for job, status in listed.items() if status is not JobStatus.QUEUED), default=0
        )
        overtaken = [job for job, _ in jobs if listed.get(job) is JobStatus.QUEUED and job < newest_started]
        if overtaken and not await self._filtered(backend, client):
            for job_id in overtaken:
                self._probe_stranded(backend, job_id)
        given_back = 0
        for job_id, request_id in jobs:
            if job_id in listed:
                continue
            try:
                await client.get_job(job_id)  # archived, maybe: GET /2/jobs/ID reads the archive too
                continue
            except JobNotFoundError:
                pass
            except GanetiError as exc:
                log.info("backend %s: job %d not looked up (%s)", backend, job_id, exc)
                continue
            error = (
                f"job {job_id} vanished from backend {backend} (Ganeti no longer knows it: restored from a "
                "backup, or its queue lost); asking Ganeti for the request's instance before placing it again"
            )
            if not await self.store.job_lost(request_id, job_id, error=error):
                continue  # its end came meanwhile
            if self._give_back((backend, job_id)):
                given_back += 1
            log.error("request %s: %s", request_id, error)
        return given_back

    async def _filtered(self, backend: str, client: RapiClient) -> bool:
        """Whether ``backend`` has job filter rules (one may hold a create queued on purpose, while
        newer jobs start); True also when they cannot be read."""
        try:
            return bool(await client.list_filters())
        except GanetiError as exc:
            log.info(
                "backend %s: its filter rules not read (%s); queued creates asked about later", backend, exc
            )
            return True

    async def _job_stranded(self, backend: str, node: str | None, job_id: int, request_id: str) -> bool:
        """Ganeti lists the create ``job_id`` queued, but its scheduler does not hold it and will
        not run it until luxid restarts (:meth:`~._base.DispatcherBase._cancel_queued`): its
        reservation is given back and the request placed again, on ``backend`` only (Ganeti refuses
        a second instance of its name, should the stranded job run one day), that job passed over
        when Ganeti is asked about the request (``Store.job_lost(stranded=...)``). False: the
        request waits on that job no more."""
        error = (
            f"job {job_id} is stranded on backend {backend}: Ganeti lists it queued, but its scheduler does "
            "not hold it (luxid wrote it and never enqueued it, as with a master candidate dead; it would run "
            f"only when ganeti-luxid restarts); placing the request again, on {backend} only, where Ganeti "
            "refuses a second instance of its name"
        )
        if not await self.store.job_lost(request_id, job_id, error=error, stranded=(backend, node)):
            return False
        self.stats.stranded += 1
        metrics.STRANDED_JOBS.labels(backend).inc()
        if self._give_back((backend, job_id)):
            metrics.RESERVATIONS_RECLAIMED.inc()
            self._wake.set()
            self._room.free(1)
        log.error("request %s: %s", request_id, error)
        return True
