"""Crash recovery: requests of dispatchers that are gone are taken over, and a request whose
create may have reached Ganeti (sent before a crash, or its answer lost) is settled by asking
Ganeti (a job carrying its id, an instance carrying its tag) before anything is sent again."""

from __future__ import annotations

import asyncio
import functools
import logging
import time

from synnefo_ganeti import metrics
from synnefo_ganeti.dispatch._moves import NodeMoves
from synnefo_ganeti.errors import GanetiError, NotFoundError
from synnefo_ganeti.jobs import JobStatus
from synnefo_ganeti.rapi import REASON_PREFIX, RapiClient
from synnefo_ganeti.store import (
    InstanceStatus,
    Request,
    RequestStatus,
    is_job_death_error,
    is_name_taken_error,
    request_tag,
    stranded_jobs,
)

__all__ = ["Recovery"]

log = logging.getLogger("synnefo_ganeti.dispatch")

#: PostgreSQL: seconds between looks for dispatchers that are gone, and how long a dispatcher's
#: lock must stay free before its requests are taken over
TAKEOVER_CHECK = 5.0
TAKEOVER_CONFIRM = 2.5
#: seconds between looks in Ganeti's job list for a create whose answer was lost
UNKNOWN_OUTCOME_POLL = 2.0


class Recovery(NodeMoves):
    """Take-over of dead dispatchers' requests and the look in Ganeti before a create is re-sent."""

    async def _take_over_dead(self) -> list[Request]:
        """Requests held by dispatchers that are gone become ours (the caller works on them; each
        is checked against Ganeti first)."""
        assert self._lock is not None
        taken_all: list[Request] = []
        try:
            claimants = await self.store.request_claimants(exclude=self.id)
            for other in list(self._suspects):
                if other not in claimants:
                    del self._suspects[other]
            for other in claimants:
                if await self._lock.is_alive(other):
                    self._suspects.pop(other, None)
                    continue
                if self.store.dialect == "postgresql":
                    # Seen dead twice, TAKEOVER_CONFIRM seconds apart: a database restart ends every
                    # session and so frees every dispatcher's lock, but a live one takes its own
                    # again within a second (the liveness lock loop); a dead one stays free.
                    first = self._suspects.setdefault(other, time.monotonic())
                    if time.monotonic() - first < TAKEOVER_CONFIRM:
                        continue
                    del self._suspects[other]
                since = time.monotonic()
                taken = await self.store.take_over_requests(other, self.id)
                if taken:
                    log.warning(
                        "took over %d requests of dispatcher %s, which is gone (%d placed: Ganeti is asked "
                        "about those before anything is sent again)",
                        len(taken),
                        other,
                        sum(1 for r in taken if r.placed),
                    )
                for request in taken:
                    self._check_since[request.id] = since
                taken_all += taken
        except GanetiError as exc:
            log.warning("cannot look for requests of dead dispatchers (%s)", exc)
        return taken_all

    @functools.cached_property
    def _unknown_until(self) -> dict[str, float]:
        """Requests whose create got no answer -> until when (monotonic) Ganeti is given to turn
        it into a job before it may be sent again (``[dispatcher] unknown_outcome_wait``)."""
        return {}

    def _outcome_unknown(self, request_id: str) -> None:
        """The create of ``request_id`` got no answer: ask Ganeti (the caller's next round)
        until its job shows up or ``unknown_outcome_wait`` has passed."""
        now = time.monotonic()
        self._check_since[request_id] = now
        self._unknown_until[request_id] = now + self.settings.dispatcher.unknown_outcome_wait

    async def _recover(self, request: Request) -> bool:
        """A create may have reached Ganeti: ask it. True when settled; False: send it again.

        After a lost answer the job list is read again every :data:`UNKNOWN_OUTCOME_POLL`
        seconds until the job shows up or ``[dispatcher] unknown_outcome_wait`` has passed:
        ganeti-rapi may put a POST it accepted into the queue long after the client gave up."""
        name = request.backend
        assert name is not None
        if name not in self._backends:
            await self._fail(request, f"backend {name} is no longer configured; its create's fate is unknown")
            return True
        client = await self.client(name)
        since = self._check_since.pop(request.id, time.monotonic())
        until = self._unknown_until.get(request.id, 0.0)
        while True:
            try:
                settled = await self._look_up(request, name, client, since)
            except GanetiError as exc:
                # still placed: the caller's loop asks again (nothing is sent before Ganeti answers)
                log.warning(
                    "request %s: cannot ask %s about it (%s); asking again shortly", request.id, name, exc
                )
                self._check_since[request.id] = since
                await self._pause(2.0)
                return not self._claiming
            if settled:
                self._unknown_until.pop(request.id, None)
                return True
            left = until - time.monotonic()
            if left <= 0 or not self._claiming:
                break
            log.info(
                "request %s: no job of it on %s yet; asking again (up to %.0f s more) before sending it again",
                request.id,
                name,
                left,
            )
            await self._pause(min(UNKNOWN_OUTCOME_POLL, left))
            since = time.monotonic()
        if not self._claiming:
            return True  # stopping: still placed, the next dispatcher asks Ganeti
        self._unknown_until.pop(request.id, None)
        await self.store.unplace_request(request.id, self.id, error=None)
        self.stats.resubmitted += 1
        log.info("request %s: Ganeti has no job or instance of it; placing it again", request.id)
        return False

    async def _look_up(self, request: Request, name: str, client: RapiClient, since: float) -> bool:
        """Ganeti's job or instance of ``request``, recorded or settled: True; nothing: False."""
        job_id = await self._job_of(request, name, client, since)
        if job_id is not None:
            log.warning("request %s: found as job %d on %s; recorded", request.id, job_id, name)
            self.stats.recovered += 1
            # (its spec's ``start`` alone: a spec stored before a check it fails now was sent all the same)
            start = request.spec.get("start", True) is not False
            recorded = await self.store.submitted_request(request.id, job_id, start=start)
            metrics.REQUESTS.labels("submitted").inc()
            entry = self._backends.get(name)
            if entry is not None and entry.tracker is not None:
                entry.tracker.track(job_id)
            if recorded.cancel_requested:  # canceled meanwhile: cancel the job while it is queued
                await self._cancel_sent(recorded, client)
            return True
        try:
            instance = await client.get_instance(request.instance)
        except NotFoundError:
            return False
        if request_tag(request.id) in instance.tags:
            self.stats.recovered += 1
            status = InstanceStatus.STARTED if instance.oper_state else InstanceStatus.STOPPED
            await self.store.update_instance(name, request.instance, status=status)
            await self.store.finish_request(request.id, RequestStatus.SUCCEEDED, dispatcher=self.id)
            metrics.REQUESTS.labels("succeeded").inc()
            log.warning(
                "request %s: instance %s exists on %s with its tag (its job archived); succeeded",
                request.id,
                request.instance,
                name,
            )
            return True
        # someone else's instance holds the name: a conflict, and the row is never adopted
        await self._fail(
            request,
            f"conflict: the name {request.instance} is taken on backend {name} by an instance that is not "
            f"this request's (it lacks the tag {request_tag(request.id)}); choose another name",
            instance_status=InstanceStatus.DESTROYED,
        )
        return True

    async def _job_of(self, request: Request, name: str, client: RapiClient, since: float) -> int | None:
        """The job that made (or failed to make) ``request``'s instance: of the jobs carrying its
        request id, the first that did not fail, else the first whose failure is not a refusal of
        a duplicate by name (a create sent twice: the second is refused "already in the cluster",
        and the request's outcome is the first's) nor a job whose process Ganeti lost (its master
        died: its instance, if any, is found by its tag); None: no such job."""
        jobs = (await self._jobs_by_reason(name, client, since)).get(f"{REASON_PREFIX}{request.id}", [])
        stranded = stranded_jobs(request.attempt_errors, name)  # listed, never to run: not its job
        jobs = [(job_id, status) for job_id, status in jobs if job_id not in stranded]
        for job_id, status in jobs:
            if status is not JobStatus.ERROR:
                return job_id
        for job_id, _status in jobs:
            failure = (await client.get_job(job_id)).failure
            if failure is None:
                return job_id
            if not is_name_taken_error(failure.message) and not is_job_death_error(failure.message):
                return job_id
        return None

    async def _jobs_by_reason(
        self, name: str, client: RapiClient, since: float
    ) -> dict[str, list[tuple[int, JobStatus]]]:
        """Reason text -> (job id, status) of every job Ganeti holds carrying it, oldest first
        (``GET /2/jobs?bulk=1``), as listed after ``since`` (when the request's fate became
        unknown: a listing begun before that could miss a create sent just before it).

        After a crash hundreds of requests taken over at once share one listing per backend.
        """
        now = time.monotonic()
        cached = self._job_listings.get(name)
        if cached is not None and cached[0] >= since:
            return await asyncio.shield(cached[1])
        task: asyncio.Future[dict[str, list[tuple[int, JobStatus]]]] = asyncio.ensure_future(
            self._list_reasons(client)
        )
        self._job_listings[name] = (now, task)
        try:
            return await asyncio.shield(task)
        except GanetiError:
            self._job_listings.pop(name, None)
            raise

    @staticmethod
    async def _list_reasons(client: RapiClient) -> dict[str, list[tuple[int, JobStatus]]]:
        found: dict[str, list[tuple[int, JobStatus]]] = {}
        for job in sorted(await client.list_jobs(), key=lambda job: job.id):
            for reason in dict.fromkeys(job.request_ids):
                found.setdefault(reason, []).append((job.id, job.status))
        return found
