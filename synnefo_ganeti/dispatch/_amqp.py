"""The change feed on AMQP: every change published to ``[notify] amqp_exchange``, confirmed, in order.

Design. The same outbox as the webhook (:mod:`._webhook`): the feed is the ``changes``
table, and how far publishing got is the ``feed_cursors`` row ``"amqp"``. The publisher
reads up to 200 changes after the cursor, keeps the head of them with one change per key
(:func:`one_per_key`), and publishes those on one channel in publisher
confirm mode, in id order, without waiting between them (AMQP keeps a channel's
messages in order; the publishes are queued on the channel's lock in that order), then
awaits every confirm and moves the cursor to the end of the confirmed prefix: past a
change only once the broker confirmed it and every change before it. Anything else (a
nack, a confirm that does not come within ``[notify] timeout``, a lost connection, a
broker down) closes the connection; after a backoff (0.5 s, doubling up to ``retry_max``)
the publisher connects again and publishes from the cursor: the same changes again, in
order, nothing behind a failed change overtaking it (a nack in the middle of a batch lets the
broker route the changes after it, but those are other keys': per key the order holds). A
change confirmed but not yet
written to the cursor (a failure later in its batch, a dispatcher killed) is published
again: delivery is *at least once*, every message carries its change id (``message_id``
and the header ``x-change-id``), and consumers drop the ids they have seen.

Messages: the body is the webhook's JSON (:meth:`~synnefo_ganeti.store.Change.to_json`),
``application/json``, persistent, routing key ``<amqp_routing_prefix>.<kind>``
(``changes.request``, ``changes.instance``, ``changes.incident``), ``timestamp`` the
change's time. The exchange is a durable topic exchange the publisher declares; it is not
published ``mandatory``: a change routed to no queue is dropped by the broker (and counts
as confirmed), so consumers bind a durable queue before they rely on the feed.

Several dispatchers on one PostgreSQL database: each batch is published holding the
advisory lock ``amqp`` (:meth:`~synnefo_ganeti.dispatch.DispatcherLock.try_deliver`), not
the webhook's: the two outlets go side by side. Waking: the store's
:class:`~synnefo_ganeti.store.ChangeWaiter`, as the webhook.

Failures of the broker are expected and retried forever (one warning when an outage
starts, one when it ends); an error that is neither the broker's nor the database's is a
bug and goes up to the supervisor, which stops the dispatcher. The URL's password is never
logged: log lines and the ``repr`` show the URL with ``***`` for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Protocol

import aio_pika
import aiormq
import orjson
import pamqp.exceptions

from synnefo_ganeti import metrics
from synnefo_ganeti._backoff import Backoff
from synnefo_ganeti.config import NotifySettings
from synnefo_ganeti.errors import GanetiError
from synnefo_ganeti.store import Change, Store

if TYPE_CHECKING:
    from aio_pika.abc import AbstractChannel, AbstractConnection

__all__ = ["AMQP_CURSOR_NAME", "CHANGE_ID_HEADER", "AmqpPublisher", "amqp_message", "one_per_key"]

log = logging.getLogger("synnefo_ganeti.dispatch.amqp")

#: the ``feed_cursors`` row (and the advisory lock) of the AMQP publisher
AMQP_CURSOR_NAME = "amqp"
#: the header that carries the change id (an int; ``message_id`` carries it as a string)
CHANGE_ID_HEADER = "x-change-id"
#: changes read and published (confirms awaited together) under one hold of the lock
_BATCH = 200
#: seconds between tries for the lock while another dispatcher publishes
_LOCKED_OUT_RETRY = 5.0
#: what the broker (or the way to it) does wrong: retried; anything else is a bug
_BROKER_ERRORS = (
    aiormq.exceptions.AMQPError,
    # a publish on a channel the broker closed under it: a graceful broker stop sends
    # Connection.Close (320 CONNECTION_FORCED) and the publishes of the batch queued behind the
    # one in flight find the channel closed (aiormq raises this RuntimeError, not an AMQPError)
    aiormq.exceptions.ChannelInvalidStateError,
    ConnectionError,
    OSError,
    TimeoutError,
    pamqp.exceptions.PAMQPException,
)


async def open_channel(url: str, exchange: str, timeout: float) -> tuple[AbstractConnection, AbstractChannel]:
    """A connection and its channel in publisher-confirm mode, the durable topic ``exchange``
    declared on it (the connection closed again if the channel or the exchange fails)."""
    connection = await aio_pika.connect(url, timeout=timeout)
    try:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_exchange(exchange, aio_pika.ExchangeType.TOPIC, durable=True, timeout=timeout)
    except BaseException:
        await connection.close()
        raise
    return connection, channel


async def close_quietly(connection: AbstractConnection | None, what: str) -> None:
    """Close ``connection`` (if any); a dead one has nothing to close (logged at debug)."""
    if connection is None:
        return
    try:
        await connection.close()
    except _BROKER_ERRORS as exc:
        log.debug("%s: closing: %s", what, exc)


class BrokerLink:
    """A connection to the broker and its confirm-mode channel, ``exchange`` declared: opened
    when first needed and again after it was lost or closed (both publishers' link)."""

    def __init__(self, url: str, exchange: str, timeout: float, what: str) -> None:
        self._url = url
        self.exchange = exchange
        self.timeout = timeout
        self.what = what  # (its logs' prefix: the URL without its password)
        self._connection: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None

    @property
    def connected(self) -> bool:
        return self._channel is not None

    async def channel(self) -> AbstractChannel:
        """The channel, connecting first if need be."""
        if self._channel is not None and not self._channel.is_closed:
            return self._channel
        await self.close()
        self._connection, self._channel = await open_channel(self._url, self.exchange, self.timeout)
        log.info("%s: connected; publishing to exchange %s", self.what, self.exchange)
        return self._channel

    async def close(self) -> None:
        """Close the connection (if any); the next publish connects again."""
        connection, self._connection, self._channel = self._connection, None, None
        await close_quietly(connection, self.what)


class _Lock(Protocol):
    async def try_deliver(self, name: str = ...) -> bool: ...
    async def done_delivering(self, name: str = ...) -> None: ...


class _BrokerFailed(Exception):
    """A publish was not confirmed (nacked, timed out, the connection lost): reconnect, retry."""


def amqp_message(change: Change) -> aio_pika.Message:
    """The message of ``change``: the webhook's JSON body, its id as ``message_id`` and header."""
    return aio_pika.Message(
        orjson.dumps(change.to_json()),
        content_type="application/json",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        message_id=str(change.id),
        headers={CHANGE_ID_HEADER: change.id},
        timestamp=change.at,
    )


def one_per_key(changes: list[Change]) -> list[Change]:
    """The longest head of ``changes`` with at most one change of each key (kind and key).

    A batch holds one change per key, so that even a nack in its middle (the broker took the
    changes after it) cannot put a key's changes out of order: the nacked change comes again
    after other keys' changes, never after a later change of its own key.
    """
    keys: set[tuple[str, str]] = set()
    for index, change in enumerate(changes):
        key = (change.kind, change.key)
        if key in keys:
            return changes[:index]
        keys.add(key)
    return changes


class AmqpPublisher:
    """``await AmqpPublisher(store, settings.notify, lock=...).run()``: publish, forever."""

    def __init__(self, store: Store, settings: NotifySettings, *, lock: _Lock | None = None) -> None:
        if not settings.amqp_enabled:
            raise ValueError("the AMQP publisher needs [notify] amqp_url or amqp_url_file")
        self.store = store
        self._url = settings.amqp_url_value()
        self.display_url = settings.amqp_display_url()
        self.exchange_name = settings.amqp_exchange
        self.routing_prefix = settings.amqp_routing_prefix
        self.timeout = settings.timeout
        self.retry_max = settings.retry_max
        self._lock = lock
        self._link = BrokerLink(self._url, self.exchange_name, self.timeout, f"amqp {self.display_url}")
        #: the last change id known confirmed (by this publisher or another)
        self.cursor = 0
        self.published = 0  # changes confirmed by the broker (a change again after a failure counts again)
        self.failures = 0  # failed connects and batches (each retried)
        self.failing_since: float | None = None

    def __repr__(self) -> str:
        state = "failing" if self.failing_since is not None else "ok"
        link = "connected" if self._link.connected else "not connected"
        return (
            f"<AmqpPublisher {self.display_url} exchange {self.exchange_name} after change {self.cursor}: "
            f"{self.published} published, {self.failures} failures, {link}, {state}>"
        )

    def routing_key(self, change: Change) -> str:
        return f"{self.routing_prefix}.{change.kind}"

    async def run(self) -> None:
        """Publish every change after the cursor, then each new one as it comes; never returns."""
        backoff = Backoff(initial=0.5, maximum=self.retry_max, jitter=True)
        try:
            async with self.store.feed.waiter() as waiter:
                while True:
                    waiter.arm()
                    try:
                        more, locked_out = await self.publish_pending()
                    except GanetiError as exc:  # the database cannot now: try again later
                        delay = backoff.next()
                        log.warning(
                            "amqp: cannot read the change feed (%s); trying again in %.1f s", exc, delay
                        )
                        await asyncio.sleep(delay)
                        continue
                    except (_BrokerFailed, *_BROKER_ERRORS) as exc:
                        await self._failed(exc, backoff)
                        continue
                    backoff.reset()
                    if not more:
                        await waiter.wait(_LOCKED_OUT_RETRY if locked_out else None)
        finally:
            await self.close()

    async def _failed(self, exc: BaseException, backoff: Backoff) -> None:
        """Drop the connection, say so (once an outage), wait the backoff's delay."""
        await self.close()
        self.failures += 1
        metrics.AMQP_FAILURES.inc()
        delay = backoff.next()
        problem = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        problem = problem.replace(self._url, self.display_url)  # (a client may quote the URL)
        if self.failing_since is None:
            self.failing_since = time.monotonic()
            log.warning(
                "amqp %s: cannot publish after change %d (%s); trying again from there, "
                "every %.1f s up to %g s, until the broker confirms",
                self.display_url,
                self.cursor,
                problem,
                delay,
                self.retry_max,
            )
        else:
            log.debug("amqp %s: still failing (%s); again in %.1f s", self.display_url, problem, delay)
        # (the failure counted and the state "failing" before this first await: never seen apart)
        with contextlib.suppress(GanetiError):  # (the lag as the outage starts and grows)
            metrics.AMQP_LAG.set(max(0, await self.store.last_change_id() - self.cursor))
        await asyncio.sleep(delay)

    async def publish_pending(self) -> tuple[bool, bool]:
        """Publish up to one batch; (a full batch: more may wait, another dispatcher publishes)."""
        if not await self.store.list_changes(after=self.cursor, limit=1):
            return False, False  # (the cursor in the database is at least ours)
        channel = await self._open()
        if self._lock is not None and not await self._lock.try_deliver(AMQP_CURSOR_NAME):
            return False, True
        try:
            self.cursor = max(self.cursor, await self.store.feed.cursor(AMQP_CURSOR_NAME))
            read = await self.store.list_changes(after=self.cursor, limit=_BATCH)
            changes = one_per_key(read)
            if changes:
                await self._publish(channel, changes)
                metrics.AMQP_LAG.set(max(0, await self.store.last_change_id() - self.cursor))
            return len(read) == _BATCH or len(changes) < len(read), False
        finally:
            if self._lock is not None:
                await self._lock.done_delivering(AMQP_CURSOR_NAME)

    async def _publish(self, channel: AbstractChannel, changes: list[Change]) -> None:
        """Publish ``changes`` back to back, await their confirms, advance over the confirmed prefix."""
        underlay = await channel.get_underlay_channel()
        # Created in id order, each task runs to the channel's (FIFO) lock in that order, so the
        # frames go out in id order; the confirms are awaited together.
        confirms = [
            asyncio.create_task(
                underlay.basic_publish(
                    message.body,
                    exchange=self.exchange_name,
                    routing_key=self.routing_key(change),
                    properties=message.properties,
                    timeout=self.timeout,
                ),
                name=f"amqp publish {change.id}",
            )
            for change in changes
            for message in (amqp_message(change),)
        ]
        results = await asyncio.gather(*confirms, return_exceptions=True)
        count = 0  # the confirmed prefix's length
        for result in results:
            if isinstance(result, BaseException):
                break
            count += 1
        if count:
            self.cursor = await self.store.feed.advance(AMQP_CURSOR_NAME, changes[count - 1].id)
            self.published += count
            metrics.AMQP_PUBLISHED.inc(count)
            if self.failing_since is not None:
                log.warning(
                    "amqp %s: publishing again after %.0f s of failures",
                    self.display_url,
                    time.monotonic() - self.failing_since,
                )
                self.failing_since = None
        if count < len(changes):
            failure = results[count]
            assert isinstance(failure, BaseException)
            if not isinstance(failure, (*_BROKER_ERRORS, asyncio.CancelledError)):
                raise failure  # a bug: up to the supervisor
            # (a lost channel cancels its pending confirms: CancelledError in a result)
            problem = f"{type(failure).__name__}: {failure}" if str(failure) else type(failure).__name__
            raise _BrokerFailed(f"change {changes[count].id} not confirmed ({problem})")

    async def _open(self) -> AbstractChannel:
        """The channel (in confirm mode, the exchange declared), connecting first if need be."""
        return await self._link.channel()

    async def close(self) -> None:
        """Close the connection (if any); the next publish connects again."""
        await self._link.close()
