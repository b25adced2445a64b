"""Every recorded job followed: jobs recorded by any process handed to the backends' trackers.

A cloud API, the CLI or another dispatcher records the jobs it sends for an instance
(start, stop, reboot, modify, delete, create) in ``instance_jobs``. On a backend whose
queue directory is local, the queue watcher sees every job anyway. On the others only a
:class:`~synnefo_ganeti.dispatch.JobTracker` learns of a job's end, and it must be told
which jobs to follow: :class:`RecordedJobs`, one root task (``dispatch follow jobs``) for
all of them, reads the recorded jobs whose end is not applied yet and hands each backend's
list to its tracker, which follows the new ones (a job is followed once: the tracker
ignores the ones it follows or has just finished).

When it reads:

* at start (every job left unfinished by a crash or a stop is followed again);
* PostgreSQL: when a job of a tracked backend is recorded (the recording transaction's
  ``NOTIFY synnefo_ganeti_jobs``; LISTEN on a connection of its own), and every
  ``safety_interval`` in case a notification was lost (the listening connection is
  opened again when the database dropped it);
* SQLite: every ``poll_interval`` (at most 0.5 s), as there is no notification across
  processes.

So a job starts being followed well within 1 s of being recorded, as long as the tracker
has a free ``/wait`` slot (``[dispatcher] track_concurrency``). A database that cannot
answer is retried after ``retry_delay``: the loop never ends on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping

from synnefo_ganeti._backoff import Backoff
from synnefo_ganeti.dispatch._tracker import JobTracker
from synnefo_ganeti.errors import GanetiError
from synnefo_ganeti.store import Store
from synnefo_ganeti.store.instances._recorded import JobSignal

__all__ = ["FOLLOW_TASK", "RecordedJobs"]

log = logging.getLogger("synnefo_ganeti.dispatch")

#: the name of the root task
FOLLOW_TASK = "dispatch follow jobs"

#: SQLite: the longest pause between two reads (whatever ``poll_interval`` says)
MAX_POLL = 0.5


class RecordedJobs:
    """Reads the recorded, unapplied jobs and hands them to the trackers of ``trackers()``."""

    def __init__(
        self,
        store: Store,
        trackers: Callable[[], Mapping[str, JobTracker]],
        *,
        poll_interval: float = MAX_POLL,
        safety_interval: float = 5.0,
        retry_delay: float = 1.0,
    ) -> None:
        self.store = store
        self.trackers = trackers
        self.poll_interval = min(poll_interval, MAX_POLL)
        self.safety_interval = safety_interval
        self.retry_delay = retry_delay
        self.reads = 0
        self.handed = 0  # jobs handed to a tracker that was not following them yet
        self.listening = False

    def __repr__(self) -> str:
        how = "on NOTIFY" if self.listening else f"every {self.poll_interval:g} s"
        return f"<RecordedJobs {len(self.trackers())} backends, read {how}, {self.handed} jobs handed>"

    async def run(self) -> None:
        """Until cancelled: read now, then on each signal (or poll), handing jobs to the trackers."""
        backoff = Backoff(initial=self.retry_delay, maximum=30.0)
        while True:
            if not self.trackers():
                # every backend followed by a watcher: no LISTEN (PostgreSQL wakes every listener
                # of the database at every commit that notifies, whatever its channel)
                await asyncio.sleep(self.poll_interval)
                continue
            listen = self.store.listen_jobs()
            try:
                signal = await listen.__aenter__()
            except Exception as exc:  # the driver's own errors (refused, reset...)
                await self._without_signal(backoff.next(), exc)
                continue
            backoff.reset()
            self.listening = signal is not None
            try:
                dropped = await self._loop(signal)
            finally:
                self.listening = False
                try:
                    await listen.__aexit__(None, None, None)
                except Exception as exc:  # closing a connection the database dropped
                    log.info("following recorded jobs: closing the LISTEN connection: %s", exc)
            if dropped:
                log.warning("following recorded jobs: the database dropped the LISTEN connection; again")

    async def _without_signal(self, pause: float, exc: BaseException) -> None:
        """The LISTEN connection could not be opened: poll for ``pause`` seconds, then try again."""
        log.warning("following recorded jobs: cannot LISTEN (%s); polling for %g s", exc, pause)
        deadline = time.monotonic() + pause
        while time.monotonic() < deadline:
            await self.read_once()
            await asyncio.sleep(min(self.poll_interval, max(0.0, deadline - time.monotonic())))

    async def _loop(self, signal: JobSignal | None) -> bool:
        """Reads until the signal dies (True) or no backend has a tracker any more (False)."""
        await self.read_once()
        while signal is None or signal.alive:
            if not self.trackers():
                return False
            if signal is None:
                await asyncio.sleep(self.poll_interval)
                await self.read_once()
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.safety_interval):
                    await signal.event.wait()
            notified = signal.event.is_set()
            announced = signal.clear()
            if not signal.alive:
                return True
            if notified and announced and not announced & set(self.trackers()):
                continue  # only backends a watcher follows
            await self.read_once()
        return True

    async def read_once(self) -> int:
        """One read of the unapplied jobs, handed to the trackers; how many were new to them
        (0 when the database could not answer: the next read tries again)."""
        trackers = dict(self.trackers())
        if not trackers:
            return 0
        listed_at = time.monotonic()
        try:
            found = await self.store.unapplied_jobs_by_backend(trackers)
        except GanetiError as exc:
            log.warning("following recorded jobs: cannot read them (%s); again soon", exc)
            await asyncio.sleep(self.retry_delay)
            return 0
        self.reads += 1
        added = 0
        for name, tracker in trackers.items():
            added += tracker.discovered(found.get(name, ()), listed_at=listed_at)
        if added:
            log.debug("following %d more recorded jobs", added)
        self.handed += added
        return added
