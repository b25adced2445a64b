"""The change feed on AMQP (``[notify] amqp_url``): real RabbitMQ, on SQLite and on PostgreSQL.

Each test declares its own exchange (a uuid), binds an exclusive queue to it before anything is
published, and deletes the exchange at the end. A tiny TCP proxy between the publisher and the
broker stands for a broker that goes away and comes back. Tests needing RabbitMQ are skipped
where 127.0.0.1:5672 does not answer, and fail there under ``CI``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import aio_pika
import aiormq
import orjson
import pytest

from synnefo_ganeti import Change, Settings, metrics
from synnefo_ganeti.config import NotifySettings
from synnefo_ganeti.config._notify import mask_url
from synnefo_ganeti.dispatch import (
    AMQP_CURSOR_NAME,
    CHANGE_ID_HEADER,
    AmqpPublisher,
    Dispatcher,
    DispatcherLock,
)
from synnefo_ganeti.dispatch._amqp import one_per_key
from synnefo_ganeti.errors import ConfigError
from synnefo_ganeti.store import Store
from tests.helpers import eventually
from tests.unit.test_change_feed import _request
from tests.unit.test_dispatcher import running

BROKER = ("127.0.0.1", 5672)
BROKER_URL = "amqp://guest:guest@127.0.0.1:5672/"
PASSWORD = "amqp-pass-never-logged"


@pytest.fixture(scope="session")
def rabbitmq() -> str:
    """RabbitMQ at 127.0.0.1:5672 (guest/guest): its URL; skipped without it, failed in CI."""
    try:
        with socket.create_connection(BROKER, timeout=2):
            pass
    except OSError as exc:
        problem = f"no RabbitMQ at 127.0.0.1:5672 ({exc}); start it with 'rabbitmq-server -detached'"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the AMQP tests: {problem}")
        pytest.skip(problem)
    return BROKER_URL


@dataclass
class Consumer:
    """An exclusive queue bound to the test's exchange: every message, as received."""

    messages: list[aio_pika.abc.AbstractIncomingMessage] = field(default_factory=list)

    def ids(self) -> list[int]:
        return [int(m.message_id or 0) for m in self.messages]

    def first_seen(self) -> list[int]:
        """The ids with duplicates dropped (as a consumer does)."""
        seen: set[int] = set()
        out = []
        for change_id in self.ids():
            if change_id not in seen:
                seen.add(change_id)
                out.append(change_id)
        return out


@contextlib.asynccontextmanager
async def consumer(url: str, exchange_name: str) -> AsyncIterator[Consumer]:
    got = Consumer()
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        exchange = await channel.declare_exchange(exchange_name, aio_pika.ExchangeType.TOPIC, durable=True)
        queue = await channel.declare_queue(exclusive=True, auto_delete=True)
        await queue.bind(exchange, routing_key="#")

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            got.messages.append(message)
            await message.ack()

        await queue.consume(on_message)
        try:
            yield got
        finally:
            await exchange.delete()
    finally:
        await connection.close()


class Proxy:
    """A TCP proxy to the broker that can be stopped (every connection cut) and started again."""

    def __init__(self) -> None:
        with socket.socket() as probe:  # a free port, kept across restarts
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port, reuse_address=True)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()  # no new connections
        # the connections cut first: since Python 3.12 ``wait_closed`` waits for every connection
        # the server accepted to close, so awaited before this it never returns
        for writer in list(self._writers):
            writer.transport.abort()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        if server is not None:
            with contextlib.suppress(TimeoutError):  # (one accepted as it stopped: cut by _serve)
                async with asyncio.timeout(5):
                    await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server = self._server
        try:
            up_reader, up_writer = await asyncio.open_connection(*BROKER)
        except OSError:
            writer.transport.abort()
            return
        if self._server is not server or server is None:  # stopped meanwhile: cut
            writer.transport.abort()
            up_writer.transport.abort()
            return
        self._writers |= {writer, up_writer}
        pipes = [
            asyncio.create_task(self._pipe(reader, up_writer)),
            asyncio.create_task(self._pipe(up_reader, writer)),
        ]
        self._pipes.update(pipes)
        await asyncio.gather(*pipes, return_exceptions=True)
        self._pipes.difference_update(pipes)
        self._writers -= {writer, up_writer}

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.transport.abort()


def _notify(url: str, exchange: str, tmp_path: Path) -> dict[str, Any]:
    url_file = tmp_path / f"amqp-{uuid.uuid4().hex[:6]}.url"
    url_file.write_text(url + "\n")
    url_file.chmod(0o600)
    return {"amqp_url_file": str(url_file), "amqp_exchange": exchange, "timeout": 5, "retry_max": 0.5}


def _settings(db_url: str, notify: dict[str, Any]) -> Settings:
    return Settings(
        database={"url": db_url},
        dispatcher={"status_port": None, "poll_interval": 0.05, "shutdown_timeout": 5.0},
        notify=notify,
    )


def _check_messages(got: Consumer, store_changes: list[Any]) -> None:
    """Each message: the webhook's JSON, its id as message_id and header, persistent, keyed by kind."""
    by_id = {c.id: c for c in store_changes}
    for message in got.messages:
        change = by_id[int(message.message_id or 0)]
        assert orjson.loads(message.body) == change.to_json()
        assert message.headers[CHANGE_ID_HEADER] == change.id
        assert message.content_type == "application/json"
        assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
        assert message.routing_key == f"changes.{change.kind}"
        assert message.timestamp is not None


async def test_every_change_is_published_once_in_order(
    db_url: str, rabbitmq: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    exchange = f"test.changes.{uuid.uuid4().hex}"
    published_before = metrics.REGISTRY.get_sample_value("synnefo_ganeti_amqp_published_total") or 0.0
    async with consumer(rabbitmq, exchange) as got, Store(db_url, poll_interval=0.05) as store:
        settings = _settings(db_url, _notify(rabbitmq, exchange, tmp_path))
        request_id = await _request(store, "first.example")
        async with running(Dispatcher(settings, store=store, status_server=False)) as d:
            await store.add_instance("b1", "first.example")
            for i in range(5):
                await _request(store, f"more{i}.example")
            assert d.amqp is not None and d.webhook is None  # (no url: AMQP alone)
            publisher = d.amqp
            last = await store.last_change_id()
            await eventually(lambda: last in got.ids(), what="every change consumed")
            await eventually(lambda: publisher.cursor >= last, what="the cursor at the last change")
            assert f"{publisher.published} published" in repr(publisher)
            published = metrics.REGISTRY.get_sample_value("synnefo_ganeti_amqp_published_total") or 0.0
            assert published - published_before >= publisher.published >= 7
        cursor = await store.feed.cursor(AMQP_CURSOR_NAME)
        # (the dispatcher's stop writes changes of its own, maybe published, not confirmed)
        changes = await store.list_changes(limit=None)
        # each once, in id order: every one up to the cursor (maybe some more, in flight at the stop)
        assert cursor >= last and got.ids() == [c.id for c in changes][: len(got.ids())]
        assert len(got.ids()) >= len([c for c in changes if c.id <= cursor])
        _check_messages(got, changes)
        assert {m.routing_key for m in got.messages} >= {"changes.request", "changes.instance"}
        assert changes[0].key == request_id
        assert await store.feed.cursor("webhook") == 0  # (its own cursor)
    assert "guest:guest" not in caplog.text and "amqp://guest:***@127.0.0.1:5672/" in caplog.text


async def test_a_broker_away_loses_nothing_and_the_dispatcher_stays_up(
    db_url: str, rabbitmq: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    exchange = f"test.changes.{uuid.uuid4().hex}"
    proxy = Proxy()  # not started: the broker is unreachable when the dispatcher starts
    async with consumer(rabbitmq, exchange) as got, Store(db_url, poll_interval=0.05) as store:
        settings = _settings(db_url, _notify(proxy.url, exchange, tmp_path))
        try:
            async with running(Dispatcher(settings, store=store, status_server=False)) as d:
                publisher = d.amqp
                assert publisher is not None
                for i in range(3):
                    await _request(store, f"early{i}.example")
                await eventually(lambda: publisher.failures >= 2, what="failed connects")
                assert d.supervisor.healthy and await store.feed.cursor(AMQP_CURSOR_NAME) == 0
                assert "failing" in repr(publisher)
                await proxy.start()
                first = await store.last_change_id()
                await eventually(
                    lambda: first in got.ids(), what="the early changes, once the broker answers"
                )
                await proxy.stop()  # the connection cut mid-life, changes written meanwhile
                for i in range(20):
                    await _request(store, f"late{i}.example")
                await eventually(lambda: publisher.failures >= 4, what="failures while cut off")
                assert d.supervisor.healthy
                await proxy.start()
                last = await store.last_change_id()
                await eventually(lambda: last in got.ids(), what="every change after the broker came back")
                await eventually(lambda: publisher.cursor >= last, what="the cursor at the last change")
                assert d.supervisor.healthy and "ok" in repr(publisher)
        finally:
            await proxy.stop()
        changes = await store.list_changes(limit=None)
        # none lost, in order (up to the last change awaited: the dispatcher writes changes of its own)
        seen, ids = got.first_seen(), [c.id for c in changes]
        assert seen == ids[: len(seen)] and last in seen
        _check_messages(got, changes)  # (a duplicate carries its change's id)
    assert caplog.text.count("cannot publish after change") == 2  # one warning an outage
    assert "publishing again after" in caplog.text and "guest:guest" not in caplog.text


async def test_a_publisher_stopped_mid_stream_resumes_at_the_cursor(
    db_url: str, rabbitmq: str, tmp_path: Path
) -> None:
    exchange = f"test.changes.{uuid.uuid4().hex}"
    notify = NotifySettings.model_validate(_notify(rabbitmq, exchange, tmp_path))
    async with consumer(rabbitmq, exchange) as got, Store(db_url, poll_interval=0.05) as store:
        for i in range(300):
            await _request(store, f"stream{i}.example")
        first = AmqpPublisher(store, notify)
        task = asyncio.create_task(first.run())
        await eventually(lambda: len(got.messages) >= 100, what="a hundred changes consumed")
        task.cancel()  # (as a kill: mid-batch, confirms outstanding)
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for i in range(10):
            await _request(store, f"after{i}.example")
        # read after those writes: a cursor move the cancelled publisher had handed to the
        # store's writer still commits, after the cancel, and the writer runs its calls in order
        stopped_at = await store.feed.cursor(AMQP_CURSOR_NAME)
        second = AmqpPublisher(store, notify)
        task = asyncio.create_task(second.run())
        try:
            last = await store.last_change_id()
            await eventually(lambda: last in got.ids(), what="every change after the restart")
            await eventually(lambda: second.cursor >= last, what="the second publisher's cursor")
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        changes = await store.list_changes(limit=None)
        assert got.first_seen() == [c.id for c in changes]  # each exactly once after dropping duplicates
        resent = len(got.messages) - len(changes)
        assert 0 <= resent <= 200  # at most the batch in flight when it stopped
        _check_messages(got, changes)
        after = [c for c in changes if c.id > stopped_at]
        assert second.published == len(after)  # the second began at the cursor, not before


async def test_amqp_settings_read_the_url_from_a_file_and_hide_it(tmp_path: Path) -> None:
    url = f"amqps://feed:{PASSWORD}@broker.example.org:5671/prod"
    url_file = tmp_path / "amqp.url"
    url_file.write_text(url + "\n")
    url_file.chmod(0o600)
    notify = NotifySettings(amqp_url_file=url_file)
    assert notify.amqp_enabled and not notify.enabled  # AMQP alone, no webhook
    assert notify.amqp_url_value() == url
    assert notify.amqp_display_url() == "amqps://feed:***@broker.example.org:5671/prod"
    assert notify.amqp_exchange == "synnefo_ganeti.changes" and notify.amqp_routing_prefix == "changes"
    settings = Settings(notify={"amqp_url_file": str(url_file)})
    for shown in (
        repr(notify),
        str(notify),
        repr(settings),
        str(settings.model_dump()),
        notify.model_dump_json(),
    ):
        assert PASSWORD not in shown
    assert mask_url("amqp://127.0.0.1/") == "amqp://127.0.0.1/"
    assert mask_url("amqp://user@host/") == "amqp://user@host/"
    # a relative file, from the config file's folder
    config = tmp_path / "synnefo-ganeti.toml"
    config.write_text('[notify]\namqp_url_file = "amqp.url"\namqp_exchange = "feed"\n')
    loaded = Settings.from_file(config)
    assert loaded.notify.amqp_url_file == url_file and loaded.notify.amqp_exchange == "feed"
    # not both; a bad scheme; a file others may read; no password in any error
    with pytest.raises(ConfigError, match="amqp_url or amqp_url_file, not both") as raised:
        Settings(notify={"amqp_url": url, "amqp_url_file": str(url_file)})
    assert PASSWORD not in str(raised.value)
    with pytest.raises(ConfigError, match=r"amqp:// or amqps://") as raised:
        Settings(notify={"amqp_url": f"http://feed:{PASSWORD}@broker.example.org/"})
    assert PASSWORD not in str(raised.value)
    bad = tmp_path / "bad.url"
    bad.write_text(f"redis://feed:{PASSWORD}@broker/\n")
    bad.chmod(0o600)
    with pytest.raises(
        ConfigError, match=r"amqp_url_file .*bad.url must hold an amqp:// or amqps://"
    ) as raised:
        Settings(notify={"amqp_url_file": str(bad)})
    assert PASSWORD not in str(raised.value)
    url_file.chmod(0o644)
    with pytest.raises(ConfigError, match=r"amqp_url_file .* chmod 600") as raised:
        Settings(notify={"amqp_url_file": str(url_file)})
    assert PASSWORD not in str(raised.value)
    assert not NotifySettings().amqp_enabled


async def test_a_failing_broker_is_logged_without_the_password(
    sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with socket.socket() as probe:  # a closed port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    notify = NotifySettings(amqp_url=f"amqp://feed:{PASSWORD}@127.0.0.1:{port}/", retry_max=0.5)
    async with Store(sqlite_url) as store:
        await _request(store, "logged.example")
        publisher = AmqpPublisher(store, notify)
        task = asyncio.create_task(publisher.run())
        try:
            await eventually(lambda: publisher.failures >= 2, what="two failed connects")
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        assert await store.feed.cursor(AMQP_CURSOR_NAME) == 0  # kept
    assert (
        f"amqp://feed:***@127.0.0.1:{port}/" in caplog.text and "cannot publish after change 0" in caplog.text
    )
    assert PASSWORD not in caplog.text and PASSWORD not in repr(publisher)
    assert caplog.text.count("cannot publish after change") == 1  # once an outage


@contextlib.asynccontextmanager
async def publishing(publisher: AmqpPublisher) -> AsyncIterator[asyncio.Task[None]]:
    """``publisher.run()`` as a task until the block ends (then cancelled)."""
    task = asyncio.create_task(publisher.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_nacked_change_is_published_again_before_its_keys_next_change(
    sqlite_url: str, rabbitmq: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exchange = f"test.changes.{uuid.uuid4().hex}"
    notify = NotifySettings.model_validate(_notify(rabbitmq, exchange, tmp_path))
    real_publish = aiormq.Channel.basic_publish
    nacked: list[str] = []

    async def nack_the_third_once(self: aiormq.Channel, body: bytes, **kwargs: Any) -> Any:
        message_id = kwargs["properties"].message_id
        if message_id == "3" and not nacked:  # (what a nack raises: the broker did not take it)
            nacked.append(message_id)
            raise aiormq.exceptions.DeliveryError(None, aiormq.spec.Basic.Nack(delivery_tag=3))
        return await real_publish(self, body, **kwargs)

    monkeypatch.setattr(aiormq.Channel, "basic_publish", nack_the_third_once)
    async with consumer(rabbitmq, exchange) as got, Store(sqlite_url) as store:
        await _request(store, "r1.example")  # change 1
        await _request(store, "r2.example")  # 2
        instance = await store.add_instance("b1", "i.example")  # 3: BUILD (nacked once)
        await store.update_instance("b1", "i.example", status="ERROR")  # 4: the same key
        await _request(store, "r3.example")  # 5
        changes = await store.list_changes(limit=None)
        assert [c.id for c in changes] == [1, 2, 3, 4, 5] and changes[3].key == instance.id
        publisher = AmqpPublisher(store, notify)
        async with publishing(publisher):
            await eventually(lambda: publisher.cursor >= 5, what="every change confirmed")
        assert nacked == ["3"] and publisher.failures == 1
        # the nacked change again, before the next change of its key (a batch: one change a key)
        assert got.first_seen() == [1, 2, 3, 4, 5]
        _check_messages(got, changes)


async def test_an_error_not_the_brokers_stops_the_publisher(
    sqlite_url: str, rabbitmq: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exchange = f"test.changes.{uuid.uuid4().hex}"
    notify = NotifySettings.model_validate(_notify(rabbitmq, exchange, tmp_path))

    async def buggy(self: aiormq.Channel, body: bytes, **kwargs: Any) -> Any:
        raise KeyError("a bug")

    monkeypatch.setattr(aiormq.Channel, "basic_publish", buggy)
    async with consumer(rabbitmq, exchange), Store(sqlite_url) as store:
        await _request(store, "bug.example")
        publisher = AmqpPublisher(store, notify)
        with pytest.raises(KeyError, match="a bug"):
            await asyncio.wait_for(publisher.run(), 30)  # (up to the supervisor: the process stops)
        assert await store.feed.cursor(AMQP_CURSOR_NAME) == 0 and publisher.failures == 0


async def test_two_publishers_on_postgresql_publish_each_change_once(
    pg_url: str, rabbitmq: str, tmp_path: Path
) -> None:
    exchange = f"test.changes.{uuid.uuid4().hex}"
    notify = NotifySettings.model_validate(_notify(rabbitmq, exchange, tmp_path))
    async with (
        consumer(rabbitmq, exchange) as got,
        Store(pg_url) as store_a,
        Store(pg_url) as store_b,
        contextlib.AsyncExitStack() as stack,
    ):
        locks = [DispatcherLock(store_a, "a"), DispatcherLock(store_b, "b")]
        for lock in locks:
            await lock.acquire()
            stack.push_async_callback(lock.release)
        assert await locks[0].try_deliver() and await locks[1].try_deliver("amqp")  # two locks
        assert not await locks[1].try_deliver() and not await locks[0].try_deliver("amqp")
        await locks[0].done_delivering()
        await locks[1].done_delivering("amqp")
        publishers = [
            AmqpPublisher(store_a, notify, lock=locks[0]),
            AmqpPublisher(store_b, notify, lock=locks[1]),
        ]
        for publisher in publishers:
            await stack.enter_async_context(publishing(publisher))
        for i in range(40):
            await _request(store_a if i % 2 else store_b, f"twice{i}.example")
        ids = [c.id for c in await store_a.list_changes(limit=None)]
        await eventually(lambda: len(got.ids()) >= 40, what="forty changes consumed")
        await eventually(lambda: max(p.cursor for p in publishers) >= ids[-1], what="the cursor written")
        assert await store_a.feed.cursor(AMQP_CURSOR_NAME) == ids[-1]
        assert got.ids() == ids  # each once, in order
        assert sum(p.published for p in publishers) == 40


def test_a_batch_holds_one_change_per_key() -> None:
    at = datetime.now(UTC)
    keys: list[tuple[Literal["request", "instance", "incident"], str]] = [
        ("request", "a"),
        ("instance", "a"),
        ("request", "b"),
        ("request", "a"),
        ("request", "c"),
    ]
    changes = [
        Change(id=i, kind=kind, key=key, status="x", task=None, error=None, at=at)
        for i, (kind, key) in enumerate(keys, 1)
    ]
    assert [c.id for c in one_per_key(changes)] == [1, 2, 3]  # (a request and an instance: two keys)
    assert one_per_key(changes[3:]) == changes[3:] and one_per_key([]) == []


_CHILD = """
import asyncio, sys
from synnefo_ganeti.config import NotifySettings
from synnefo_ganeti.dispatch import AmqpPublisher, _amqp
from synnefo_ganeti.store import Store

_amqp._BATCH = 10  # small batches: the kill comes with most of the 600 still to publish

async def main():
    db_url, url, exchange = sys.argv[1:4]
    async with Store(db_url) as store:
        await AmqpPublisher(store, NotifySettings(amqp_url=url, amqp_exchange=exchange)).run()

asyncio.run(main())
"""


@pytest.mark.slow
async def test_a_publisher_killed_with_sigkill_loses_nothing(db_url: str, rabbitmq: str) -> None:
    exchange = f"test.changes.{uuid.uuid4().hex}"
    notify = NotifySettings(amqp_url=rabbitmq, amqp_exchange=exchange)
    async with consumer(rabbitmq, exchange) as got, Store(db_url) as store:
        for i in range(600):
            await _request(store, f"killed{i}.example")
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _CHILD, db_url, rabbitmq, exchange, cwd=Path(__file__).parents[2]
        )
        try:
            await eventually(lambda: len(got.messages) >= 100, what="the child's first changes consumed")
        finally:
            child.kill()  # SIGKILL: no cleanup, confirms and the cursor's write cut short
            await child.wait()
        stopped_at = await store.feed.cursor(AMQP_CURSOR_NAME)
        publisher = AmqpPublisher(store, notify)
        async with publishing(publisher):
            last = await store.last_change_id()
            await eventually(lambda: publisher.cursor >= last, what="every change confirmed after the kill")
            await eventually(lambda: last in got.ids(), what="the last change consumed")
        changes = await store.list_changes(limit=None)
        assert 0 < stopped_at < last and got.first_seen() == [c.id for c in changes]  # none lost, in order
        _check_messages(got, changes)
