"""Crash recovery: requests of dispatchers that are gone are taken over, and a request whose
create may have reached Ganeti (sent before a crash, or its answer lost) is settled by asking
Ganeti (a job carrying its id, an instance carrying its tag) before anything is sent again."""

from __future__ import annotations

import asyncio
import logging
import time

from synnefo_ganeti import metrics
from synnefo_ganeti.dispatch._wiring import BackendWiring
from synnefo_ganeti.errors import GanetiError, NotFoundError
from synnefo_ganeti.rapi import REASON_PREFIX, InstanceSpec, RapiClient
from synnefo_ganeti.store import InstanceStatus, Request, RequestStatus, request_tag

__all__ = ["Recovery"]

log = logging.getLogger("synnefo_ganeti.dispatch")

#: PostgreSQL: seconds between looks for dispatchers that are gone, and how long a dispatcher's
#: lock must stay free before its requests are taken over
TAKEOVER_CHECK = 5.0
TAKEOVER_CONFIRM = 2.5


class Recovery(BackendWiring):
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

    async def _recover(self, request: Request) -> bool:
        """A create may have reached Ganeti: ask it. True when settled; False: send it again."""
        name = request.backend
        assert name is not None
        if name not in self._backends:
            await self._fail(request, f"backend {name} is no longer configured; its create's fate is unknown")
            return True
        client = await self.client(name)
        wanted = f"{REASON_PREFIX}{request.id}"
        since = self._check_since.pop(request.id, time.monotonic())
        if since > time.monotonic():
            await self._pause(since - time.monotonic())
            if not self._claiming:
                return True  # stopping: still placed, the next dispatcher asks Ganeti
        try:
            job_id = (await self._jobs_by_reason(name, client, since)).get(wanted)
            if job_id is not None:
                log.warning(
                    "request %s: found as job %d on %s (sent before a crash); recorded",
                    request.id,
                    job_id,
                    name,
                )
                self.stats.recovered += 1
                spec = InstanceSpec.model_validate(request.spec)
                recorded = await self.store.submitted_request(request.id, job_id, start=spec.start)
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
                instance = None
        except GanetiError as exc:
            # still placed: the caller's loop asks again (nothing is sent before Ganeti answers)
            log.warning(
                "request %s: cannot ask %s about it (%s); asking again shortly", request.id, name, exc
            )
            await self._pause(2.0)
            return not self._claiming
        if instance is None:
            await self.store.unplace_request(request.id, self.id, error=None)
            self.stats.resubmitted += 1
            log.info("request %s: Ganeti has no job or instance of it; placing it again", request.id)
            return False
        if request_tag(request.id) in instance.tags:
            self.stats.recovered += 1
            status = InstanceStatus.STARTED if instance.oper_state else InstanceStatus.STOPPED
            await self.store.update_instance(name, request.instance, status=status)
            await self.store.finish_request(request.id, RequestStatus.SUCCEEDED, dispatcher=self.id)
            metrics.REQUESTS.labels("succeeded").inc()
            log.warning(
                "request %s: instance %s exists on %s with its tag (job archived); succeeded",
                request.id,
                request.instance,
                name,
            )
            return True
        await self._fail(
            request,
            f"instance {request.instance} exists on {name} but is not this request's (no tag {request_tag(request.id)})",
        )
        return True

    async def _jobs_by_reason(self, name: str, client: RapiClient, since: float) -> dict[str, int]:
        """Reason text -> job id of every job Ganeti holds (``GET /2/jobs?bulk=1``), as listed
        after ``since`` (when the request's fate became unknown: a listing begun before that
        could miss a create sent just before it).

        After a crash hundreds of requests taken over at once share one listing per backend.
        """
        now = time.monotonic()
        cached = self._job_listings.get(name)
        if cached is not None and cached[0] >= since:
            return await asyncio.shield(cached[1])
        task: asyncio.Future[dict[str, int]] = asyncio.ensure_future(self._list_reasons(client))
        self._job_listings[name] = (now, task)
        try:
            return await asyncio.shield(task)
        except GanetiError:
            self._job_listings.pop(name, None)
            raise

    @staticmethod
    async def _list_reasons(client: RapiClient) -> dict[str, int]:
        found: dict[str, int] = {}
        for job in await client.list_jobs():
            for reason in job.request_ids:
                found.setdefault(reason, job.id)
        return found


def _settled_after(client: RapiClient) -> float:
    """When a create whose answer was lost is surely in Ganeti's job list if Ganeti took it: a
    ganeti-rapi slower than our timeout may still be queueing it, and asking before it is done
    would find nothing and send the create again."""
    return time.monotonic() + min(float(client.timeout), 60.0)
