"""The change-feed webhook: every change POSTed to ``[notify] url``, at least once, in order.

Design. The feed is the ``changes`` table (written by triggers, in commit order); how far
the webhook got is the ``feed_cursors`` row named ``"webhook"``. The deliverer reads the
changes after the cursor and POSTs them one at a time, in id order, each as JSON
(:meth:`~synnefo_ganeti.store.Change.to_json`) with the header
``X-Synnefo-Ganeti-Signature: sha256=<hex HMAC-SHA256 of the body>``; the cursor moves
past a change only after a 2xx answer. A failed POST (an error, a timeout, any other
status) is retried with exponential backoff, the same change again, so that nothing
behind it overtakes it: per key (and overall) the receiver sees the changes in order.
A dispatcher that dies between a 2xx and the cursor's write sends that change again on
restart: delivery is *at least once*; receivers deduplicate by ``id``.

Several dispatchers on one PostgreSQL database: each batch is delivered while holding the
advisory lock ``webhook`` on the dispatcher's liveness connection
(:meth:`~synnefo_ganeti.dispatch.DispatcherLock.try_deliver`); the others find it taken and
wait, and read the cursor again when they get it. SQLite takes one dispatcher per database.

Waking: the store's :class:`~synnefo_ganeti.store.ChangeWaiter` (LISTEN on PostgreSQL, this
process's commits, else a poll), so a change is POSTed within milliseconds of its commit.
The secret is never logged: log lines name the URL, the change id and what went wrong.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
from typing import Protocol

import aiohttp
import orjson

from synnefo_ganeti._backoff import Backoff
from synnefo_ganeti.config import NotifySettings
from synnefo_ganeti.errors import GanetiError
from synnefo_ganeti.store import Change, Store

__all__ = ["CURSOR_NAME", "SIGNATURE_HEADER", "WebhookDeliverer", "sign"]

log = logging.getLogger("synnefo_ganeti.dispatch.webhook")

#: the ``feed_cursors`` row of the webhook
CURSOR_NAME = "webhook"
SIGNATURE_HEADER = "X-Synnefo-Ganeti-Signature"
#: changes read (and delivered under one hold of the lock) at a time
_BATCH = 200
#: seconds between tries for the lock while another dispatcher delivers
_LOCKED_OUT_RETRY = 5.0


class _Lock(Protocol):
    async def try_deliver(self) -> bool: ...
    async def done_delivering(self) -> None: ...


def sign(secret: bytes, body: bytes) -> str:
    """The signature header's value: ``sha256=`` and the hex HMAC-SHA256 of ``body``."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


class WebhookDeliverer:
    """``await WebhookDeliverer(store, settings.notify, lock=...).run()``: deliver, forever.

    ``session`` may be given (tests); otherwise one is made with ``[notify] timeout``.
    """

    def __init__(
        self,
        store: Store,
        settings: NotifySettings,
        *,
        lock: _Lock | None = None,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        if settings.url is None:
            raise ValueError("the webhook needs [notify] url")
        self.store = store
        self.url = settings.url
        self._secret = settings.secret_bytes()
        self.timeout = settings.timeout
        self.retry_max = settings.retry_max
        self._lock = lock
        self._session = session
        #: the last change id known delivered (by this deliverer or another)
        self.cursor = 0
        self.delivered = 0
        self.failures = 0  # failed POSTs (each retried)
        self.failing_since: float | None = None

    def __repr__(self) -> str:
        state = "failing" if self.failing_since is not None else "ok"
        return (
            f"<WebhookDeliverer {self.url} after change {self.cursor}: {self.delivered} delivered, "
            f"{self.failures} failed POSTs, {state}>"
        )

    async def run(self) -> None:
        """Deliver every change after the cursor, then each new one as it comes; never returns."""
        own = self._session is None
        session = self._session or aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.timeout),
            connector=aiohttp.TCPConnector(limit=1),
        )
        backoff = Backoff(initial=0.5, maximum=self.retry_max, jitter=True)
        try:
            async with self.store.feed.waiter() as waiter:
                while True:
                    waiter.arm()
                    try:
                        more, locked_out = await self.deliver_pending(session)
                    except GanetiError as exc:  # the database cannot now: try again later
                        delay = backoff.next()
                        log.warning(
                            "webhook: cannot read the change feed (%s); trying again in %.1f s", exc, delay
                        )
                        await asyncio.sleep(delay)
                        continue
                    backoff.reset()
                    if not more:
                        await waiter.wait(_LOCKED_OUT_RETRY if locked_out else None)
        finally:
            if own:
                await session.close()

    async def deliver_pending(self, session: aiohttp.ClientSession) -> tuple[bool, bool]:
        """Deliver up to one batch; (a full batch: more may wait, another dispatcher delivers)."""
        if not await self.store.list_changes(after=self.cursor, limit=1):
            return False, False  # (the cursor in the database is at least ours)
        if self._lock is not None and not await self._lock.try_deliver():
            return False, True
        try:
            self.cursor = max(self.cursor, await self.store.feed.cursor(CURSOR_NAME))
            changes = await self.store.list_changes(after=self.cursor, limit=_BATCH)
            for change in changes:
                await self._deliver(session, change)
                self.cursor = await self.store.feed.advance(CURSOR_NAME, change.id)
                self.delivered += 1
            return len(changes) == _BATCH, False
        finally:
            if self._lock is not None:
                await self._lock.done_delivering()

    async def _deliver(self, session: aiohttp.ClientSession, change: Change) -> None:
        """POST ``change`` until an answer is 2xx."""
        body = orjson.dumps(change.to_json())
        headers = {"Content-Type": "application/json", SIGNATURE_HEADER: sign(self._secret, body)}
        backoff = Backoff(initial=0.5, maximum=self.retry_max, jitter=True)
        while True:
            try:
                async with session.post(self.url, data=body, headers=headers) as answer:
                    if 200 <= answer.status < 300:
                        if self.failing_since is not None:
                            log.warning(
                                "webhook %s: delivering again after %.0f s of failures",
                                self.url,
                                time.monotonic() - self.failing_since,
                            )
                            self.failing_since = None
                        return
                    problem = f"answered {answer.status} {answer.reason or ''}".rstrip()
            except (aiohttp.ClientError, TimeoutError) as exc:
                problem = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            self.failures += 1
            if self.failing_since is None:
                self.failing_since = time.monotonic()
            delay = backoff.next()
            log.warning(
                "webhook %s: change %d not delivered (%s); the same change again in %.1f s",
                self.url,
                change.id,
                problem,
                delay,
            )
            await asyncio.sleep(delay)
