"""Live pages: one reader of the store per process, its news fanned out to every viewer.

Design. A page left open must cost the database nothing per viewer, so viewers never
poll and never read on their own: each open page holds one server-sent-events stream
(``GET /events?topics=...``) fed by the one :class:`Hub` of the process. The hub

* follows the store's change feed (``store.changes()``: every request and instance
  change, from any process, in commit order) and the job events
  (``store.events(since=now)``: every job-file version the watcher or a tracker stored);
* marks what changed as *dirty* (a request, an instance, a job, the overview), and
  every ``interval`` (0.3 s) renders each dirty thing **once**, only for the topics some
  viewer holds open (``requests``, ``request:<id>``, ``jobs``, ``job:<backend>:<id>``,
  ``overview``, ...), reading it once from the store;
* hands each rendered :class:`Fragment` to the queue of every subscriber of its topic.

So a burst of 200 changes costs one read per thing changed per 0.3 s, whatever the
number of viewers, and an idle page costs nothing but the stream's keep-alive pings.
A viewer too slow to take its fragments (a full queue, 256) gets a ``reload`` event
instead of a growing queue. A page is rendered before its stream opens, so what changed in
between would be missed: a new viewer's subscription marks again what its page shows (the
thing of a detail page, the overview) and what changed in the last ``recent`` seconds (the
rows of a list), and the next render brings the page up to date. The readers are root tasks of the console's app: started
on startup, cancelled on cleanup.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from synnefo_ganeti.errors import GanetiError
from synnefo_ganeti.store import Store

__all__ = ["CLOSED", "Dirty", "Fragment", "Hub", "Subscriber"]

log = logging.getLogger("synnefo_ganeti.console")

#: what changed: ("request", id), ("instance", id), ("job", "backend:job_id"), ("overview", "")
Dirty = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Fragment:
    """HTML for one element of the pages that hold ``topic``: replaces the element with id
    ``target``, or, when the page has none, goes first into the element ``into``."""

    topic: str
    target: str
    html: str
    into: str | None = None

    def to_json(self) -> dict[str, str | None]:
        return {"target": self.target, "html": self.html, "into": self.into}


#: the kind of thing whose rows each list topic shows
_LISTS = {"request": "requests", "instance": "instances", "job": "jobs"}

#: put in every stream when the console stops: the stream ends
CLOSED = Fragment("", "", "")

#: renders what is dirty for the topics held open: (dirty things, topics) -> fragments
Renderer = Callable[[set[Dirty], frozenset[str]], Awaitable[list[Fragment]]]


class Subscriber:
    """One open page's stream: the topics it shows and the fragments waiting for it."""

    def __init__(self, topics: Iterable[str], *, size: int = 256) -> None:
        self.topics = frozenset(topics)
        self.queue: asyncio.Queue[Fragment | None] = asyncio.Queue(size)
        self.overflowed = False

    def __repr__(self) -> str:
        return f"<Subscriber topics={sorted(self.topics)} queued={self.queue.qsize()}>"

    def offer(self, fragment: Fragment) -> None:
        if self.overflowed:
            return
        try:
            self.queue.put_nowait(fragment)
        except asyncio.QueueFull:
            self.overflowed = True  # the page reloads instead (see Hub docstring)
            with contextlib.suppress(asyncio.QueueEmpty):
                self.queue.get_nowait()
            self.queue.put_nowait(None)

    async def next(self) -> Fragment | None:
        """The next fragment; None: too far behind, reload the page."""
        return await self.queue.get()


class Hub:
    """``await hub.start()``; ``async with hub.subscribe(topics) as sub``; ``await hub.stop()``."""

    def __init__(
        self,
        store: Callable[[], Store],
        render: Renderer,
        *,
        interval: float = 0.3,
        recent: float = 5.0,
    ) -> None:
        self._store = store
        self._render = render
        self.interval = interval
        self.recent = recent
        # what was marked lately, (monotonic time, dirty), oldest first: a new viewer's page may
        # have been rendered before these changes and its stream opened after them
        self._marked: deque[tuple[float, Dirty]] = deque(maxlen=1024)
        self._subscribers: set[Subscriber] = set()
        self._dirty: set[Dirty] = set()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        # where the readers are: taken when the hub starts (so that nothing committed after start()
        # returns is missed, however late the readers' tasks first run) and kept across a retry
        self._change_cursor: int | None = None
        self._event_cursor: int | datetime = datetime.now(UTC)
        self.retry_pause = 2.0  # after a failed read of the feed
        self.renders = 0  # how many times a batch was rendered (tests read it)
        self.changes_seen = 0
        self.events_seen = 0

    def __repr__(self) -> str:
        return (
            f"<Hub {len(self._subscribers)} viewers, {len(self._dirty)} dirty, "
            f"{self.changes_seen} changes and {self.events_seen} job events seen>"
        )

    @property
    def viewers(self) -> int:
        return len(self._subscribers)

    def topics(self) -> frozenset[str]:
        return frozenset(topic for sub in self._subscribers for topic in sub.topics)

    async def start(self) -> None:
        """Take the feeds' positions now, then follow them: every change and job event committed
        after this returns is marked (a database that cannot answer: from when it can)."""
        if self._tasks:
            return
        self._event_cursor = datetime.now(UTC)
        try:
            self._change_cursor = await self._store().last_change_id()
        except GanetiError as exc:
            log.warning(
                "console: reading the change feed's position failed (%s); following it from later", exc
            )
        self._tasks = [
            asyncio.create_task(self._follow_changes(), name="console changes"),
            asyncio.create_task(self._follow_events(), name="console job events"),
            asyncio.create_task(self._flush_loop(), name="console fan-out"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        for sub in list(self._subscribers):
            sub.overflowed = False
            with contextlib.suppress(asyncio.QueueFull):
                sub.queue.put_nowait(CLOSED)  # wakes the stream, which then ends
        self._subscribers.clear()

    def mark(self, *dirty: Dirty) -> None:
        """Something changed (the readers, or an action of this console): render it soon."""
        self._dirty.update(dirty)
        self._dirty.add(("overview", ""))
        now = time.monotonic()
        self._marked.extend((now, d) for d in dirty)
        self._wake.set()

    def _catch_up(self, sub: Subscriber) -> None:
        """Mark again what ``sub``'s page shows and what changed just before it subscribed."""
        since = time.monotonic() - self.recent
        while self._marked and self._marked[0][0] < since:
            self._marked.popleft()
        lists = {kind for kind, topic in _LISTS.items() if topic in sub.topics}
        again: set[Dirty] = {d for _, d in self._marked if d[0] in lists}
        for topic in sub.topics:
            kind, _, key = topic.partition(":")
            if key and kind in ("request", "instance", "job"):
                again.add((kind, key))
            elif topic == "drift":
                again.add(("drift", ""))
        self._dirty.update(again)
        self._dirty.add(("overview", ""))
        self._wake.set()

    @contextlib.asynccontextmanager
    async def subscribe(self, topics: Iterable[str]) -> AsyncIterator[Subscriber]:
        sub = Subscriber(topics)
        self._subscribers.add(sub)
        self._catch_up(sub)
        try:
            yield sub
        finally:
            self._subscribers.discard(sub)

    async def _follow_changes(self) -> None:
        while True:  # after a failure, on from the last change seen: none is lost
            try:
                async with contextlib.aclosing(self._store().changes(self._change_cursor)) as feed:
                    async for change in feed:
                        self._change_cursor = change.id
                        self.changes_seen += 1
                        self.mark((change.kind, change.key))
            except GanetiError as exc:  # the database could not: try again, the pages stay as they are
                log.warning(
                    "console: reading the change feed failed (%s); trying again in %s s",
                    exc,
                    self.retry_pause,
                )
                await asyncio.sleep(self.retry_pause)
            except Exception:  # a bug: logged with its traceback; live updates go on after it
                log.exception(
                    "console: following the change feed failed; trying again in %s s", self.retry_pause
                )
                await asyncio.sleep(self.retry_pause)

    async def _follow_events(self) -> None:
        while True:
            try:
                async for event in self._store().events(self._event_cursor):
                    self._event_cursor = event.id
                    self.events_seen += 1
                    self.mark(("job", f"{event.backend}:{event.job_id}"))
            except GanetiError as exc:
                log.warning(
                    "console: reading the job events failed (%s); trying again in %s s", exc, self.retry_pause
                )
                await asyncio.sleep(self.retry_pause)
            except Exception:
                log.exception(
                    "console: following the job events failed; trying again in %s s", self.retry_pause
                )
                await asyncio.sleep(self.retry_pause)

    async def _flush_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self.flush()
            await asyncio.sleep(self.interval)  # coalesce a burst: at most one render per interval

    async def flush(self) -> None:
        """Render what is dirty for the topics held open, once, and hand it to the viewers."""
        dirty, self._dirty = self._dirty, set()
        topics = self.topics()
        if not dirty or not topics:
            return
        try:
            fragments = await self._render(dirty, topics)
        except GanetiError as exc:
            log.warning("console: rendering live updates failed (%s); the next change tries again", exc)
            return
        except Exception:  # a bug in a template: logged, and the pages keep their last state
            log.exception("console: rendering live updates failed; the next change tries again")
            return
        self.renders += 1
        for fragment in fragments:
            for sub in list(self._subscribers):
                if fragment.topic in sub.topics:
                    sub.offer(fragment)
