"""The submitter: claims pending requests and, for each, places it, writes the placement,
sends the create and records its job (or places it again, or fails it). What the allocator
learns from those jobs' ends lives in ``_ends``."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time

import pydantic

from synnefo_ganeti import metrics
from synnefo_ganeti._backoff import Backoff
from synnefo_ganeti.allocate import NoCapacityError, Requirement, Reservation, chooses_nodes, placed_spec
from synnefo_ganeti.dispatch import _reservations
from synnefo_ganeti.dispatch._ends import JobEnds
from synnefo_ganeti.dispatch._recovery import TAKEOVER_CHECK
from synnefo_ganeti.dispatch._waiting import WaitingKind, WaitingReasons, waiting_kind
from synnefo_ganeti.errors import (
    AuthenticationError,
    ConflictError,
    CreateOutcomeUnknownError,
    GanetiError,
    RapiError,
    StoreError,
    TransportError,
    UnavailableError,
)
from synnefo_ganeti.rapi import InstanceSpec, is_transient, is_unsent
from synnefo_ganeti.reconcile._observe import expectation
from synnefo_ganeti.store import (
    Request,
    RequestNotHeldError,
    RequestStatus,
    request_tag,
    stranded_backend,
)

__all__ = ["Submitter"]

log = logging.getLogger("synnefo_ganeti.dispatch")

#: a request whose work failed (the database down or locked): first and longest wait before trying again
OUTAGE_BACKOFF = (0.5, 10.0)
#: a request that could not be placed (no room, backend refused): first and longest wait
PLACEMENT_BACKOFF = (0.5, 10.0)
#: seconds a count of the pending requests stands for the next claims: the claim loop runs each
#: time a request's work ends, hundreds of times a second in a burst, and a count each time read
#: every pending request of the burst (issue 31)
PENDING_COUNT_TTL = 0.5
#: ... but when the count leaves this dispatcher nothing to claim (none were pending, or it took
#: its share since), it counts again after this many seconds: requests may have come, or the
#: others may not have taken theirs. :meth:`Dispatcher.wake` (a request written here) forgets it.
PENDING_RECOUNT = 0.1


@dataclasses.dataclass(slots=True)
class _PendingCount:
    """A count of the pending requests: when it was read, how many, how many this one took since."""

    at: float
    pending: int
    taken: int = 0


class _NoRoom(str):
    """Why a request was not placed: no backend takes it now; ``kind`` (dispatch/_waiting.py)."""

    kind: WaitingKind

    @classmethod
    def of(cls, exc: NoCapacityError) -> _NoRoom:
        room = cls(exc)
        room.kind = waiting_kind(exc.reasons)
        return room


class Submitter(JobEnds):
    """Claim, place, submit, record: one task per claimed request."""

    @functools.cached_property
    def _waiting(self) -> WaitingReasons:
        """The requests held here that no backend takes now, and why (``Request.waiting_reason``)."""
        return WaitingReasons()

    def _capacity(self) -> int:
        """How many claimed requests may be worked on at once. Only ``submit_concurrency`` per
        backend hold a RAPI connection; the rest wait in the store's writer, whose calls of one
        kind go in one transaction: a deep queue there is what makes its batches big."""
        options = self.settings.dispatcher
        return max(options.claim_batch, options.submit_concurrency * max(1, len(self._backends)) * 2)

    def _spawn_taken(self, taken: list[Request]) -> None:
        for request in taken:
            self.stats.claimed += 1
            self._spawn(request)

    async def _submit_loop(self) -> None:
        self._spawn_taken(await self._take_over_dead())
        options = self.settings.dispatcher
        last_takeover = last_sweep = time.monotonic()
        while self._claiming:
            room = self._capacity() - len(self._inflight)
            claimed: list[Request] = []
            limit = await self._claim_limit(room)
            if limit > 0:
                try:
                    claimed = await self.store.claim_requests(self.id, limit)
                except GanetiError as exc:
                    log.warning("cannot claim requests (%s); trying again", exc)
            self._claimed(len(claimed))
            for request in claimed:
                self.stats.claimed += 1
                self._spawn(request)
            if len(claimed) >= limit > 0:
                await asyncio.sleep(0)  # more may be waiting: claim again at once
                continue
            if self.store.dialect == "postgresql" and (
                time.monotonic() - last_takeover > TAKEOVER_CHECK or self._suspects
            ):
                self._spawn_taken(await self._take_over_dead())
                last_takeover = time.monotonic()
            if time.monotonic() - last_sweep >= _reservations.SWEEP_INTERVAL and self._job_requests:
                last_sweep = time.monotonic()
                try:
                    await self._sweep_reservations()
                except GanetiError as exc:
                    log.warning("cannot look for reservations of ended requests (%s); trying again", exc)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(options.poll_interval):
                    await self._wake.wait()

    async def _claim_limit(self, room: int) -> int:
        """How many requests to claim now: ``room`` and ``claim_batch`` at most and, while other
        dispatchers claim on the database, this one's fair share of the pending requests
        (``ceil(pending / claiming dispatchers)``, the live ones: ``_leases``) less what it took
        since they were counted or holds now, whichever is more: a burst is split evenly, and a
        dispatcher whose requests end fast does not take the others' share before they look."""
        limit = min(room, self.settings.dispatcher.claim_batch)
        claimers = 1 if self.leases is None else self.leases.claimers()
        if limit <= 0 or claimers <= 1:
            return max(0, limit)
        now = time.monotonic()
        count = self._pending_count
        if (
            count is None
            or now - count.at >= PENDING_COUNT_TTL
            or (now - count.at >= PENDING_RECOUNT and self._share_left(count, claimers) <= 0)
        ):
            try:
                counts = await self.store.request_counts(status=[RequestStatus.PENDING])
            except GanetiError as exc:
                log.info("pending requests not counted (%s); claiming up to %d", exc, limit)
                return limit
            count = self._pending_count = _PendingCount(now, sum(counts.values()))
        return max(0, min(limit, self._share_left(count, claimers)))

    #: the last count of the pending requests (``None``: count before the next claim)
    _pending_count: _PendingCount | None = None

    def _share_left(self, count: _PendingCount, claimers: int) -> int:
        return -(-count.pending // claimers) - max(count.taken, len(self._inflight))

    def _claimed(self, taken: int) -> None:
        if self._pending_count is not None:
            self._pending_count.taken += taken

    def _count_pending_again(self) -> None:
        """Requests may have come (written in this process): count them before the next claim."""
        self._pending_count = None

    def _spawn(self, request: Request) -> None:
        task = asyncio.create_task(self._process(request), name=f"request {request.id}")
        self._inflight.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        self._wake.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("request task %s failed", task.get_name(), exc_info=task.exception())

    async def _process(self, request: Request) -> None:
        """Work on one claimed request until it is submitted or ended (or no longer ours).

        A database that fails under it (a restart, a lock held too long: a :class:`StoreError`)
        does not drop it: the request stays claimed by this live dispatcher, so nobody else
        would take it; it is worked on again once the database answers, from what the database
        then says (a create sent before the failure is found in Ganeti by its request id, not
        sent again)."""
        try:
            await self._work_on_through_outages(request)
        finally:
            self._waiting.forget(request.id)  # (its reason: cleared with its placement or end)

    async def _work_on_through_outages(self, request: Request) -> None:
        backoff = Backoff(*OUTAGE_BACKOFF)
        fresh = True  # as the claim (or the take-over) just read it
        while True:
            try:
                await self._work_on(request, fresh=fresh)
                return
            except RequestNotHeldError as exc:
                if await self._canceled_meanwhile(request.id):
                    return
                log.info("request %s: %s", request.id, exc)
                return
            except GanetiError as exc:
                if not self._claiming:
                    log.warning("request %s: %s; stopping: the next dispatcher takes it up", request.id, exc)
                    return
                delay = backoff.next()
                log.warning("request %s: %s; trying again in %g s", request.id, exc, delay)
                self._check_since.setdefault(request.id, time.monotonic())
                fresh = False
                await self._pause(delay)

    async def _canceled_meanwhile(self, request_id: str) -> bool:
        """A cancel (a delete of its server) came while this dispatcher worked on the request, before
        anything was sent (its placement refused): it ends canceled now, not left held forever."""
        latest = await self.store.get_request(request_id)
        if (
            latest is None
            or not latest.cancel_requested
            or latest.status is not RequestStatus.PENDING
            or latest.claimed_by != self.id
            or latest.placed
        ):
            return False
        await self._cancel(latest)
        return True

    async def _work_on(self, request: Request, *, fresh: bool = False) -> None:
        """``fresh``: ``request`` was just read (claimed): the first round need not read it again."""
        backoff = Backoff(*PLACEMENT_BACKOFF)
        while True:
            if not fresh:
                again = await self.store.get_request(request.id)
                if again is None or again.is_final or again.claimed_by != self.id:
                    return
                request = again
            fresh = False
            if request.placed:  # before a cancel: the create may be in Ganeti already
                if await self._recover(request):
                    return
                continue  # Ganeti has nothing of it: place it again (or cancel it)
            if request.cancel_requested:
                await self._cancel(request)
                return
            if await self._attempts_spent(request):
                return
            outcome = await self._place_and_submit(request)
            if not isinstance(outcome, _NoRoom):
                self._waiting.forget(request.id)  # placed (its reason cleared with it), or done with
            if outcome is None:
                return
            if not self._claiming:
                return  # stopping: a placed request is picked up by the next dispatcher
            self.stats.placement_retries += 1
            if request.id in self._check_since:
                # maybe sent: Ganeti is asked (next round) before the request may fail or go elsewhere
                await self._pause(backoff.next())
                continue
            age = time.time() - request.created_at.timestamp()
            if age > self.settings.dispatcher.placement_timeout:
                count = len(request.attempt_errors)
                before = (
                    f"; its create failed {count} time(s) before, {_last_failure(request)}" if count else ""
                )
                await self._fail(
                    request,
                    f"not placed within {self.settings.dispatcher.placement_timeout:g} s: {outcome}{before}",
                )
                return
            if isinstance(outcome, _NoRoom):
                await self._note_waiting(request, outcome)
                await self._room.wait(backoff.next(), self._stop)  # in line for the next freed place
            else:
                await self._pause(backoff.next())

    async def _note_waiting(self, request: Request, why: _NoRoom) -> None:
        """Write why the request waits (``Request.waiting_reason``); a database that cannot is no
        reason to stop waiting (the next round writes it)."""
        try:
            await self._waiting.note(self.store, request.id, self.id, why.kind, str(why))
        except GanetiError as exc:
            log.info("request %s: its waiting reason not written (%s)", request.id, exc)

    async def _place_and_submit(self, request: Request) -> str | None:
        """None when the request is done with (submitted, failed); else why to try again later.

        A :class:`StoreError` (the database down or locked) is raised: :meth:`_process` tries
        again later; only a real clash (:class:`ConflictError`: the name taken) fails it."""
        try:
            spec = InstanceSpec.model_validate(request.spec)
        except pydantic.ValidationError as exc:  # stored before a check it fails now (its name)
            await self._fail(request, f"its spec is refused now: {exc}")
            return None
        try:
            reservation = self._reserve(request, spec)
        except NoCapacityError as exc:
            avoid = self._avoid.get(request.id, set())
            if avoid and (request.want_backend in avoid or avoid >= set(self._backends)):
                # its create failed for a reason of the backend on every backend it may go to
                self._avoid.pop(request.id, None)
                why = (request.error or "its create failed").removesuffix("; placing it again")
                await self._fail(request, f"{why}; no other backend takes it")
                return None
            return _NoRoom.of(exc)
        name = reservation.name
        tags = list(
            dict.fromkeys([*spec.tags, *self.settings.ownership.tags_for_new(), request_tag(request.id)])
        )
        submitted = placed_spec(
            spec.model_copy(update={"tags": tags}), reservation, self.settings.dispatcher.node_placement
        )
        try:
            unique = self.settings.ownership.unique_names
            await self.store.place_request(
                request.id,
                self.id,
                name,
                expectation(spec, tags, self.settings.ownership.tag_namespace),
                unique_names=unique,
            )
        except RequestNotHeldError:
            self.allocator.release(reservation)
            raise
        except ConflictError as exc:  # the name is taken on that backend
            self.allocator.release(reservation)
            await self._fail(request, str(exc))
            return None
        except StoreError:  # the database could not do it now: never a reason to fail the request
            self.allocator.release(reservation)
            raise
        entry = self._backends.get(name)
        if entry is None:
            self.allocator.release(reservation)
            await self.store.unplace_request(request.id, self.id, error=f"backend {name} was removed")
            return f"backend {name} was removed"
        client = await self.client(name)
        try:
            async with entry.submit_slots:
                job_id = await client.create_instance(submitted, request_id=request.id)
        except CreateOutcomeUnknownError as exc:
            self._outcome_unknown(request.id)
            self._leave_out(name)  # its creates go unanswered: the others take the next ones
            self.allocator.release(reservation)
            metrics.SUBMISSIONS.labels(name, "unknown").inc()
            log.warning(
                "request %s on %s: outcome unknown (%s); Ganeti is asked again shortly", request.id, name, exc
            )
            return str(exc)
        except GanetiError as exc:
            self.allocator.release(reservation)
            if _not_taken(exc):
                self._leave_out(name)
                outcome = "refused" if isinstance(exc, UnavailableError) else "error"
                metrics.SUBMISSIONS.labels(name, outcome).inc()
                await self.store.unplace_request(request.id, self.id, error=f"{name}: {exc}")
                log.info("request %s: %s did not take it (%s); placing it again", request.id, name, exc)
                return f"{name}: {exc}"
            if is_transient(exc):
                # Sent, maybe: the client's own look found nothing, but a slow Ganeti may take it
                # yet. The request stays placed; _recover asks Ganeti again before it goes elsewhere.
                self._outcome_unknown(request.id)
                self._leave_out(name)
                metrics.SUBMISSIONS.labels(name, "unknown").inc()
                log.warning(
                    "request %s on %s: no answer (%s); Ganeti is asked again shortly", request.id, name, exc
                )
                return f"{name}: {exc}"
            metrics.SUBMISSIONS.labels(name, "error").inc()
            await self._fail(request, f"{name} refused the create: {exc}", placed=True)
            return None
        self._jobs[(name, job_id)] = reservation
        self._job_requests[(name, job_id)] = request.id
        self.allocator.submitted(reservation)
        try:
            recorded = await self.store.submitted_request(request.id, job_id, start=spec.start)
        finally:
            # the reservation sweep's clock starts once the request names its job in the store (or
            # that write failed): a sweep before would read the request still placed, with no job,
            # and give back the room of a create that runs (_reservations.py)
            if (name, job_id) in self._job_requests:
                self._submitted_at[(name, job_id)] = time.monotonic()
        self.stats.submitted += 1
        metrics.SUBMISSIONS.labels(name, "ok").inc()
        metrics.REQUESTS.labels("submitted").inc()
        if entry.tracker is not None:
            entry.tracker.track(job_id)
        log.debug("request %s: %s on %s as job %d", request.id, spec.name, name, job_id)
        if recorded.cancel_requested:
            await self._cancel_sent(recorded, client)
        else:  # its answer came after its node left placement: that node's move did not see it
            self._answered_after_its_node_left(name, job_id, reservation.nodes)
        return None

    async def _attempts_spent(self, request: Request) -> bool:
        """A request whose creates failed (placed again: no room, its backend or its node) fails
        once ``max_attempts`` of them failed; its ``error`` then names the last failure and how
        many there were (each in ``attempt_errors``). (One that finds no room to be placed again
        fails at ``placement_timeout``, as any request: :meth:`_work_on`.)"""
        count, limit = len(request.attempt_errors), self.settings.dispatcher.max_attempts
        if count < limit:
            return False
        self._avoid.pop(request.id, None)
        await self._fail(
            request, f"its create failed {count} times (max_attempts {limit}); {_last_failure(request)}"
        )
        return True

    def _reserve(self, request: Request, spec: InstanceSpec) -> Reservation:
        # a create of it stranded on a backend: there only (Ganeti refuses its name twice there)
        wanted = request.want_backend or stranded_backend(request.attempt_errors)
        if wanted is not None and wanted not in self._backends:
            raise NoCapacityError(
                Requirement.of(spec), {wanted: "not a backend of this dispatcher's configuration"}
            )
        nodes = chooses_nodes(spec, self.settings.dispatcher.node_placement)
        return self.allocator.place(spec, only=wanted, nodes=nodes, exclude=self._avoid.get(request.id, ()))


def _last_failure(request: Request) -> str:
    """``the last: job J on BACKEND node N: ERROR``, of its ``attempt_errors``."""
    last = request.attempt_errors[-1]
    node = f" node {last['node']}" if last.get("node") else ""
    return f"the last: job {last.get('job_id')} on {last.get('backend')}{node}: {last.get('error')}"


def _not_taken(error: GanetiError) -> bool:
    """A create this backend certainly did not take: place it elsewhere. A 502/504 and a success
    answer that is not a job id count (an answer came, and the client looked for the job after
    it and found none), and so do refused credentials and a TLS failure (no HTTP was spoken):
    the backend is at fault, not the request."""
    return (
        isinstance(error, UnavailableError | AuthenticationError)
        or is_unsent(error)
        or (isinstance(error, TransportError) and not error.maybe_sent)
        or (type(error) is RapiError and (error.status or 0) < 400)
    )
