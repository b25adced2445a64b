"""The change feed survives a real RabbitMQ restart: a graceful stop and a SIGKILL, mid-stream.

test_amqp_feed.py cuts the way to the shared broker with a TCP proxy; here the broker itself
goes down: a private node (:mod:`tests.unit._private_rabbitmq`, its own ports and data folder,
never the shared ``rabbit@localhost``) is stopped, or killed, while a dispatcher publishes and
changes keep being written, then started again on the same port and data. A durable queue,
bound before anything is published, collects the messages across the restart (persistent
messages in a durable queue outlive it) and is read at the end: every change is there (0
lost), in order per key, a duplicate only as a change published again with its own id, and
the dispatcher ran through it (healthy, its failures counted). On SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aio_pika
import pytest

from synnefo_ganeti import metrics
from synnefo_ganeti.dispatch import AMQP_CURSOR_NAME, Dispatcher
from synnefo_ganeti.store import InstanceStatus, Store
from tests.helpers import eventually
from tests.unit._private_rabbitmq import PrivateRabbitMQ, require_private_rabbitmq
from tests.unit.test_amqp_feed import Consumer, _check_messages, _notify, _settings
from tests.unit.test_change_feed import _request
from tests.unit.test_dispatcher import running

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

#: instances whose changes come again and again: the keys whose order is checked
_INSTANCES = ("k0.example", "k1.example", "k2.example")
#: changes written at most while the broker goes down and boots (a few seconds); then 200 more
_MAX_WRITES = 1500


@pytest.fixture
async def broker() -> AsyncIterator[PrivateRabbitMQ]:
    """A private RabbitMQ node, started; killed and removed after the test."""
    server = require_private_rabbitmq()
    async with PrivateRabbitMQ(server) as node:
        yield node


async def _durable_queue(url: str, exchange: str) -> str:
    """A durable queue bound (``#``) to the durable topic ``exchange``: it keeps what the broker
    confirmed across the broker's restart, read once everything is published."""
    name = f"test.restart.{uuid.uuid4().hex}"
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        topic = await channel.declare_exchange(exchange, aio_pika.ExchangeType.TOPIC, durable=True)
        queue = await channel.declare_queue(name, durable=True)
        await queue.bind(topic, routing_key="#")
    finally:
        await connection.close()
    return name


async def _read_queue(url: str, name: str) -> Consumer:
    """Every message in the queue, in its order (acknowledged as read)."""
    got = Consumer()
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(name, durable=True, passive=True)
        while (message := await queue.get(no_ack=True, fail=False)) is not None:
            got.messages.append(message)
    finally:
        await connection.close()
    return got


class _Writer:
    """Writes changes: new requests (a key each), and every fifth a status change of one of a
    few instances (keys with many changes)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.written = 0
        self.stop = asyncio.Event()

    async def write(self, count: int) -> None:
        """Up to ``count`` changes, fewer if told to :attr:`stop` first."""
        statuses = (InstanceStatus.STARTED, InstanceStatus.STOPPED)
        for _ in range(count):
            if self.stop.is_set():
                return
            if self.written % 5 == 4:
                turn = self.written // 5
                name = _INSTANCES[turn % len(_INSTANCES)]
                status = statuses[(turn // len(_INSTANCES)) % 2]
                await self.store.update_instance("b1", name, status=status)
            else:
                await _request(self.store, f"restart{self.written}.example")
            self.written += 1


def _failures_metric() -> float:
    return metrics.REGISTRY.get_sample_value("synnefo_ganeti_amqp_failures_total") or 0.0


async def _publish_through_a_restart(
    db_url: str, broker: PrivateRabbitMQ, tmp_path: Path, caplog: pytest.LogCaptureFixture, *, crash: bool
) -> None:
    caplog.set_level(logging.INFO)
    exchange = f"test.changes.{uuid.uuid4().hex}"
    queue = await _durable_queue(broker.url, exchange)
    failures_before = _failures_metric()
    async with Store(db_url, poll_interval=0.05) as store:
        for name in _INSTANCES:
            await store.add_instance("b1", name)
        settings = _settings(db_url, _notify(broker.url, exchange, tmp_path))
        async with running(Dispatcher(settings, store=store, status_server=False)) as d:
            publisher = d.amqp
            assert publisher is not None
            writer = _Writer(store)
            writing = asyncio.create_task(writer.write(_MAX_WRITES), name="test writer")
            try:
                await eventually(lambda: publisher.published >= 50, what="the first changes confirmed")
                written_at_stop = writer.written
                if crash:
                    await broker.kill()  # SIGKILL: nothing flushed, every connection cut
                else:
                    await broker.stop()  # graceful: the broker closes the connection (320)
                assert not broker.running
                await eventually(
                    lambda: publisher.failures >= 1 or not d.supervisor.healthy, what="the publisher noticing"
                )
                # (a graceful stop's Connection.Close once made the publisher raise a channel error it
                # took for a bug: the dispatcher stopped)
                assert d.supervisor.healthy, d.supervisor
                assert "failing" in repr(publisher)
                cursor_while_down = publisher.cursor
                await broker.start()  # the same port and data: the durable queue comes back
                assert writer.written > written_at_stop, "no change written while the broker was down"
            finally:
                writer.stop.set()
                await writing
            writer.stop.clear()
            await writer.write(200)  # (and more as it catches up)
            await eventually(
                lambda: publisher.cursor > cursor_while_down + 50, what="publishing after the restart"
            )
            last = await store.last_change_id()
            await eventually(lambda: publisher.cursor >= last, timeout=60, what="every change confirmed")
            assert d.supervisor.healthy and "ok" in repr(publisher)
            assert publisher.failures >= 1 and _failures_metric() - failures_before >= publisher.failures
        assert await store.feed.cursor(AMQP_CURSOR_NAME) >= last
        # (the dispatcher's stop writes changes of its own: the check stops at ``last``)
        changes = [c for c in await store.list_changes(limit=None) if c.id <= last]
    got = await _read_queue(broker.url, queue)
    ids = [c.id for c in changes]
    seen = [i for i in got.first_seen() if i <= last]
    assert sorted(seen) == ids, f"lost: {sorted(set(ids) - set(seen))[:20]}"  # 0 lost, nothing else
    _check_messages(got, changes)  # each message its change's (a duplicate carries its change's id)
    by_key: dict[tuple[str, str], list[int]] = {}
    for change_id in seen:
        change = changes[ids.index(change_id)]
        by_key.setdefault((change.kind, change.key), []).append(change_id)
    assert all(key_ids == sorted(key_ids) for key_ids in by_key.values())  # in order per key
    assert max(len(key_ids) for key_ids in by_key.values()) > 5  # (keys with many changes)
    duplicates = len([i for i in got.ids() if i <= last]) - len(seen)
    assert 0 <= duplicates <= 200  # at most the batch in flight when the broker went
    assert caplog.text.count("cannot publish after change") == 1  # one warning an outage
    assert "publishing again after" in caplog.text


async def test_the_feed_survives_a_broker_stopped_and_started(
    db_url: str, broker: PrivateRabbitMQ, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await _publish_through_a_restart(db_url, broker, tmp_path, caplog, crash=False)
    assert broker.starts == 2


async def test_the_feed_survives_a_broker_killed_and_started(
    db_url: str, broker: PrivateRabbitMQ, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await _publish_through_a_restart(db_url, broker, tmp_path, caplog, crash=True)
    assert broker.starts == 2
