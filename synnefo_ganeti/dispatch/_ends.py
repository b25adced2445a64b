"""The ends of this dispatcher's creates: what the allocator learns, and where they are read.

A create's end tells the allocator how its reservation ends (accounted, released, its node
full or faulty), frees its place in line (:mod:`._room`) and counts the request's end. The
ends come two ways:

* **This process's writer stored them** (:meth:`JobEnds._on_commit`, a ``Store.on_commit``
  listener): its queue watcher or job tracker read the job, or it stored an end another
  dispatcher had stored first (``CommitInfo.ended_before``).
* **Another dispatcher stored them** (:meth:`JobEnds._own_ends_loop`, the root task
  ``dispatch own ends``; PostgreSQL with several dispatchers). A backend's queue folder is read
  by the holder of its follow lease alone (``dispatch/_leases.py``): it stores every version of
  every job there, this dispatcher's creates among them. The others read no job file of that
  backend (reading each version of their own creates' files cost a second dispatcher more
  than anything else it did: issue 31), and their watcher of it is paused, no inotify instance
  at all (``_wiring._pause_watchers``); each learns its creates' ends from the ``jobs`` rows
  the holder wrote. It listens only while another dispatcher holds such a lease: PostgreSQL
  wakes every listening connection of the database at each commit that notifies. Woken by every commit that stores job events (``NOTIFY`` on the events
  channel), it waits :data:`OWN_ENDS_LINGER` for the commits made meanwhile, then reads in one
  statement per backend which of its creates in flight there ended; at least every
  :data:`OWN_ENDS_POLL` seconds whatever it heard (a notification lost, the listening connection
  being opened again). The read is of state, not of events: an end stored before this
  dispatcher knew its job's id is found by the next read. When nobody holds the lease for a
  while, the ends wait for the next holder (it reads the whole folder at once); the reservation
  sweep (``_reservations``) is the last resort, as for a backend that lost its jobs.

Each end is handled once: the first way that brings it takes the create out of ``_jobs``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable

from synnefo_ganeti import metrics
from synnefo_ganeti._backoff import Backoff
from synnefo_ganeti.allocate import Reservation
from synnefo_ganeti.dispatch._reservations import ReservationSweep
from synnefo_ganeti.errors import GanetiError
from synnefo_ganeti.jobs import JobStatus, JobSummary
from synnefo_ganeti.store import CommitInfo, EventsSignal, is_backend_error, is_capacity_error, is_node_error

__all__ = ["OWN_ENDS_LINGER", "OWN_ENDS_POLL", "OWN_ENDS_TASK", "JobEnds"]

log = logging.getLogger("synnefo_ganeti.dispatch")

#: the root task that reads this dispatcher's creates' ends other dispatchers stored
OWN_ENDS_TASK = "dispatch own ends"
#: seconds between two reads of them at most (whatever the notifications say)
OWN_ENDS_POLL = 1.0
#: seconds a wake waits for the commits made meanwhile, so that one read takes them all
OWN_ENDS_LINGER = 0.02
#: seconds of polling before listening again after the database refused the connection (the
#: first pause; it doubles up to 30 s), and the pause after a read the database could not answer
OWN_ENDS_RETRY = 2.0

_REQUEST_END = {JobStatus.SUCCESS: "succeeded", JobStatus.ERROR: "failed", JobStatus.CANCELED: "canceled"}


class JobEnds(ReservationSweep):
    """Job ends handled: from this process's commits, and this dispatcher's creates' ends
    that another dispatcher stored (see the module)."""

    def _on_commit(self, info: CommitInfo) -> None:
        """Job ends the writer stored: the allocator learns, capacity is accounted, and a node
        a failed job (of any kind) blames is out of placement at once."""
        # (ended_before: ends another dispatcher stored first, of jobs this one submitted)
        self._jobs_ended((*info.applied, *info.ended_before))

    def _jobs_ended(self, summaries: Iterable[tuple[str, JobSummary]]) -> int:
        """Handles the ends among ``summaries`` of this dispatcher's creates; returns how many."""
        ended = 0
        for backend, summary in summaries:
            if not summary.status.is_final:
                continue
            if summary.status is JobStatus.ERROR:
                self._note_node_faults(backend, summary)
            reservation = self._jobs.pop((backend, summary.job_id), None)
            request_id = self._job_requests.pop((backend, summary.job_id), None)
            self._submitted_at.pop((backend, summary.job_id), None)
            if reservation is None:
                continue
            ended += 1
            self._create_ended(backend, summary, reservation, request_id)
        if ended:
            self._wake.set()
            self._room.free(ended)
        return ended

    def _create_ended(
        self, backend: str, summary: JobSummary, reservation: Reservation, request_id: str | None
    ) -> None:
        ok = summary.status is JobStatus.SUCCESS
        error = next((op.error for op in summary.ops if op.error), None)
        if request_id is not None:
            self._remember_refusal(request_id, backend, error if not ok else None, reservation)
        if not ok and is_capacity_error(error):
            self.stats.capacity_retries += 1  # the store put the request back to be placed again
            # its nodes had no room after all (stale stats): none of them until fresh stats
            self.allocator.node_full(reservation)
        elif not ok and is_node_error(error) is not None:
            self.stats.node_retries += 1  # placed again; its node is out (_note_node_faults)
        elif not ok and is_backend_error(error):
            pass  # placed again (another backend): counted when it ends
        elif (backend, summary.job_id) in self._moved_jobs:
            self._moved_jobs.discard((backend, summary.job_id))  # canceled to be placed again
        else:
            metrics.REQUESTS.labels(_REQUEST_END.get(summary.status, "failed")).inc()
        seconds = None
        if summary.end_time is not None and summary.received_time is not None:
            seconds = max(0.0, summary.end_time - summary.received_time)
        if seconds is not None:
            self.allocator.finished(reservation, seconds, ok=ok)
        elif ok:
            self.allocator.accounted(reservation)
        else:
            self.allocator.release(reservation)

    def _remember_refusal(
        self, request_id: str, backend: str, error: str | None, reservation: Reservation | None = None
    ) -> None:
        """A create that failed for a reason of its backend other than room (the OS missing
        there, its policy: the store puts it back to be placed) is not placed there again;
        that backend's OS list is read again at its next node stats. One that failed because of
        the node the dispatcher chose changes nothing here (that node is out of placement for
        every request); because of a node Ganeti's iallocator asked (no node chosen: Ganeti
        fails every such create while a node not offline does not answer), that backend is
        avoided like one that refused it."""
        if error is not None and is_node_error(error) is not None:
            if reservation is not None and reservation.node is None:
                self._avoid.setdefault(request_id, set()).add(backend)
            return
        if error is not None and is_backend_error(error) and not is_capacity_error(error):
            self._avoid.setdefault(request_id, set()).add(backend)
            self.catalogs.forget(backend)
        else:
            self._avoid.pop(request_id, None)

    # -- ends another dispatcher stored ----------------------------------------------------------

    def _reads_own_ends(self, backend: str) -> bool:
        """Whether this dispatcher learns ``backend``'s creates' ends from the store: another
        dispatcher holds the follow lease of its queue folder (this one reads no file there)."""
        entry = self._backends.get(backend)
        leases = self.leases
        return (
            entry is not None
            and entry.watcher is not None
            and leases is not None
            and leases.shared
            and not leases.holds(backend)
        )

    def _others_follow(self) -> bool:
        """Whether another dispatcher follows a backend whose queue folder this one watches."""
        return any(self._reads_own_ends(name) for name in self._backends)

    async def _own_ends_loop(self) -> None:
        """The root task ``dispatch own ends`` (see the module); never ends on its own."""
        backoff = Backoff(initial=OWN_ENDS_RETRY, maximum=30.0)
        while True:
            # no LISTEN while this dispatcher holds every lease: PostgreSQL wakes every listener
            # of the database at every commit that notifies, whatever its channel
            if not self._others_follow():
                await asyncio.sleep(OWN_ENDS_POLL)
                continue
            listen = self.store.events_signal()
            try:
                signal = await listen.__aenter__()
            except Exception as exc:  # the driver's own errors (refused, reset, closed...)
                pause = backoff.next()
                log.warning(
                    "reading this dispatcher's creates' ends: cannot LISTEN (%s); polling for %g s",
                    exc,
                    pause,
                )
                await self._own_ends_polling(pause)
                continue
            backoff.reset()
            try:
                dropped = await self._own_ends_rounds(signal)
            finally:
                try:
                    await listen.__aexit__(None, None, None)
                except Exception as exc:  # closing a connection the database dropped
                    log.info(
                        "reading this dispatcher's creates' ends: closing the LISTEN connection: %s", exc
                    )
            if dropped:
                log.warning(
                    "reading this dispatcher's creates' ends: the database dropped the LISTEN connection; again"
                )

    async def _own_ends_polling(self, seconds: float) -> None:
        """Without a signal: a read every :data:`OWN_ENDS_POLL` for ``seconds``."""
        deadline = time.monotonic() + seconds
        while True:
            await self._read_own_ends_safely()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            await asyncio.sleep(min(OWN_ENDS_POLL, left))

    async def _own_ends_rounds(self, signal: EventsSignal | None) -> bool:
        """Read, then wait for the next commit of job events (or the poll): until the signal dies
        (True), or this dispatcher holds every lease again (False, after a last read)."""
        while signal is None or signal.alive:
            if signal is not None:
                signal.event.clear()
            others = self._others_follow()
            await self._read_own_ends_safely()
            if not others:
                return False
            if signal is None:
                await asyncio.sleep(OWN_ENDS_POLL)
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(OWN_ENDS_POLL):
                    await signal.event.wait()
            await asyncio.sleep(OWN_ENDS_LINGER)
        return True

    async def _read_own_ends_safely(self) -> None:
        try:
            await self.read_own_ends()
        except GanetiError as exc:  # the database: the next read tries again
            log.warning("reading this dispatcher's creates' ends: %s; again soon", exc)
            await asyncio.sleep(OWN_ENDS_RETRY)

    async def read_own_ends(self) -> int:
        """One read of this dispatcher's creates in flight on backends another dispatcher
        follows: those stored as ended are handled; returns how many."""
        wanted: dict[str, list[int]] = {}
        for backend, job_id in list(self._jobs):
            if self._reads_own_ends(backend):
                wanted.setdefault(backend, []).append(job_id)
        found = 0
        for backend, job_ids in wanted.items():
            summaries = await self.store.ended_jobs(backend, job_ids)
            found += self._jobs_ended((backend, summary) for summary in summaries)
        self.stats.ends_read += found
        return found
