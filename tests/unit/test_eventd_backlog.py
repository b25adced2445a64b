"""``watch --eventd-compat`` under a long broker outage, its metrics, and a publisher that dies.

The memory bound (``max_pending``): real job files renamed into a temp queue directory,
the real watcher (inotify) made as the CLI makes it (``wants=publisher.accepting``, the
publisher's ``on_drained`` rescanning the queue), real RabbitMQ behind test_amqp_feed.py's
TCP proxy, which is stopped to cut the broker. Each test publishes to its own uuid
exchange, deleted at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aio_pika
import orjson
import pytest
from click.testing import CliRunner

from synnefo_ganeti import metrics
from synnefo_ganeti.cli import main
from synnefo_ganeti.dispatch import EventdPublisher, MasterCheck, _eventd_publish
from synnefo_ganeti.watch import QueueWatcher
from tests.helpers import eventually
from tests.unit import test_amqp_feed
from tests.unit.test_amqp_feed import Proxy, consumer
from tests.unit.test_eventd_messages import CLUSTER
from tests.unit.test_eventd_publish import (
    LIFECYCLES,
    NODE,
    StubRapi,
    _ssconf,
    _versions,
    as_pairs,
    expected,
    received,
    write_like_ganeti,
)

#: the RabbitMQ fixture of test_amqp_feed.py
rabbitmq = test_amqp_feed.rabbitmq


class PeakPublisher(EventdPublisher):
    """An EventdPublisher that remembers the most versions and messages it ever held."""

    peak = 0

    async def put(self, version: Any) -> None:
        await super().put(version)
        self.peak = max(self.peak, self.pending)

    async def _convert(self) -> None:
        await super()._convert()
        self.peak = max(self.peak, self.pending)


@contextlib.asynccontextmanager
async def bounded(
    queue: Path, url: str, exchange: str, master: MasterCheck, max_pending: int
) -> AsyncIterator[tuple[PeakPublisher, QueueWatcher]]:
    """The watcher and the publisher wired as ``run_eventd`` wires them."""
    publisher = PeakPublisher(
        url,
        cluster=CLUSTER,
        master=master.is_master,
        rapi=StubRapi(),
        exchange=exchange,
        timeout=5.0,
        retry_max=0.3,
        check_interval=0.1,
        max_pending=max_pending,
    )
    watcher = QueueWatcher(
        queue, publisher, "c1", retry_interval=0.1, archive=False, wants=publisher.accepting
    )
    publisher.on_master = publisher.on_drained = watcher.resume
    tasks = [asyncio.create_task(watcher.run()), asyncio.create_task(publisher.run())]
    await watcher.ready.wait()
    try:
        yield publisher, watcher
    finally:
        failed = [t.exception() for t in tasks if t.done() and not t.cancelled()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert not failed, failed


async def feed(
    queue: Path,
    publisher: EventdPublisher,
    watcher: QueueWatcher,
    paths: Sequence[Path],
    *,
    published: bool = False,
) -> None:
    """Write each version; wait until it was taken, deferred, or dropped unread (not accepting);
    with ``published``, until its messages are published too (the next version is then never
    deferred: each is read and published on its own, whatever the machine's load)."""
    for serial, path in enumerate(paths):
        before = publisher.read + watcher.stats.paused
        write_like_ganeti(queue, path, serial)
        await eventually(
            lambda b=before: publisher.read + watcher.stats.paused > b,  # type: ignore[misc]
            what=f"{path.name} handled",
        )
        if published:
            await eventually(
                lambda: not publisher.pending and not publisher.full,
                what=f"{path.name} published",
            )


def _sample(name: str) -> float:
    return metrics.REGISTRY.get_sample_value(name) or 0.0


async def test_a_long_outage_holds_at_most_max_pending_and_the_rescan_loses_nothing(
    rabbitmq: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    queue = tmp_path / "queue"
    queue.mkdir()
    master = MasterCheck(_ssconf(tmp_path, NODE), node_name=NODE)
    exchange = f"test.eventd.{uuid.uuid4().hex}"
    first = _versions(LIFECYCLES[0])
    during = [p for folder in LIFECYCLES[1:] for p in _versions(folder)]
    bound = 2
    deferred_before = _sample("synnefo_ganeti_eventd_deferred_total")
    proxy = Proxy()
    await proxy.start()
    try:
        async with (
            consumer(rabbitmq, exchange) as got,
            bounded(queue, proxy.url, exchange, master, bound) as (
                publisher,
                watcher,
            ),
        ):
            # each version of job 20 published before the next is written: with the bound of 2 a
            # loaded machine could defer one, and the rescan after the drain reads only the latest
            # file (seen in a CI rehearsal), so the prefix below would lack its messages
            await feed(queue, publisher, watcher, first, published=True)
            assert publisher.deferred + watcher.stats.paused == 0
            await eventually(
                lambda: publisher.published > 0 and not publisher.pending and not publisher.full,
                what="job 20 published",  # (the bound may be hit even now: then drained)
            )
            rescans = publisher.rescans
            await proxy.stop()  # the broker goes away for long
            await feed(queue, publisher, watcher, during)
            await eventually(lambda: publisher.failures >= 1, what="a failure seen")
            # the bound held: every later job-file event left unread or not taken
            assert publisher.full and "full at 2" in repr(publisher)
            assert publisher.deferred + watcher.stats.paused > 0
            assert publisher.peak <= bound + 2  # (one version's messages past the bound, at most)
            assert publisher.rescans == rescans
            await proxy.start()  # back: the backlog drains, then the queue is read again
            await eventually(
                lambda: publisher.rescans > rescans and not publisher.full and not publisher.pending,
                what=f"drained and rescanned ({publisher!r})",
            )
            finals = [_versions(folder)[-1] for folder in LIFECYCLES]
            want_last = as_pairs([m for path in finals for m in expected([path])])
            await eventually(
                lambda: all(pair in received(got) for pair in want_last),
                what="every job's final statuses published",
            )
            assert publisher.peak <= bound + 2
        # at least once, in order per job: with the repeats of a resent tail dropped, each job's
        # statuses never go back
        firsts: list[tuple[str, Any]] = []
        for pair in received(got):
            if pair not in firsts:
                firsts.append(pair)
        for job_id in {body["jobId"] for _, body in firsts}:
            statuses = [body["status"] for _, body in firsts if body["jobId"] == job_id]
            order = ["queued", "waiting", "running", "success", "error", "canceled"]
            ranks = [order.index(s) for s in statuses if s in order]
            assert ranks == sorted(ranks), (job_id, statuses)
        # the prefix published before the outage is exactly job 20's messages
        assert received(got)[: len(expected(first))] == as_pairs(expected(first))
    finally:
        await proxy.stop()
    assert "max_pending 2" in caplog.text and "reading the queue directory again" in caplog.text
    assert "guest:guest" not in caplog.text
    assert _sample("synnefo_ganeti_eventd_deferred_total") >= deferred_before + publisher.deferred


async def test_the_metrics_follow_the_publisher(rabbitmq: str, tmp_path: Path) -> None:
    queue = tmp_path / "queue"
    queue.mkdir()
    master = MasterCheck(_ssconf(tmp_path, NODE), node_name=NODE)
    exchange = f"test.eventd.{uuid.uuid4().hex}"
    paths = _versions(LIFECYCLES[1])
    published = _sample("synnefo_ganeti_eventd_published_total")
    failures = _sample("synnefo_ganeti_eventd_failures_total")
    proxy = Proxy()
    await proxy.start()
    try:
        async with (
            consumer(rabbitmq, exchange) as got,
            bounded(queue, proxy.url, exchange, master, 1000) as (
                publisher,
                watcher,
            ),
        ):
            assert _sample("synnefo_ganeti_eventd_master") == 1
            await feed(queue, publisher, watcher, paths[:2])
            await eventually(lambda: not publisher.pending and publisher.published)
            assert _sample("synnefo_ganeti_eventd_published_total") == published + publisher.published
            stamp = _sample("synnefo_ganeti_eventd_last_publish_timestamp_seconds")
            assert stamp == publisher.last_published and stamp > 0
            assert _sample("synnefo_ganeti_eventd_pending") == 0
            await proxy.stop()
            await feed(queue, publisher, watcher, paths[2:])
            await eventually(lambda: publisher.failures >= 1 and publisher.pending)
            assert _sample("synnefo_ganeti_eventd_failures_total") >= failures + 1
            assert _sample("synnefo_ganeti_eventd_pending") == publisher.pending > 0
            await proxy.start()
            try:
                await eventually(
                    lambda: not publisher.pending and len(got.messages) >= len(expected(paths)), timeout=20
                )
            except AssertionError as exc:
                raise AssertionError(f"{exc}: {publisher!r}, {len(got.messages)} received") from None
            assert _sample("synnefo_ganeti_eventd_pending") == 0
            assert _sample("synnefo_ganeti_eventd_last_publish_timestamp_seconds") > stamp
    finally:
        await proxy.stop()


def test_a_publisher_whose_loop_dies_takes_the_command_down_with_status_1(
    rabbitmq: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in the publisher's loop (here: turning a job into messages raises) stops the
    watcher too, is logged with its traceback, and ``watch --eventd-compat`` exits 1."""

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug in eventd_messages")

    monkeypatch.setattr(_eventd_publish, "eventd_messages", broken)
    queue = tmp_path / "queue"
    queue.mkdir()
    write_like_ganeti(queue, _versions(LIFECYCLES[1])[-1], 0)  # read by the scan at start
    ssconf = _ssconf(tmp_path, NODE)
    exchange = f"test.eventd.{uuid.uuid4().hex}"
    try:
        result = CliRunner().invoke(
            main,
            ["--log-format", "json", "watch", "--queue-dir", str(queue), "--eventd-compat", "--amqp", rabbitmq,
             "--exchange", exchange, "--ssconf-dir", str(ssconf), "--node-name", NODE],
            catch_exceptions=False,
        )  # fmt: skip
    finally:  # (the publisher declared it; no consumer here deletes it)
        asyncio.run(_delete_exchange(rabbitmq, exchange))
    assert result.exit_code == 1, result.output
    lines = [orjson.loads(line) for line in result.output.splitlines() if line.strip()]
    events = [line["event"] for line in lines]  # every line a JSON log line
    assert any("the eventd publisher stopped" in e and "a bug in eventd_messages" in e for e in events)
    assert any(e.startswith("stopped after") for e in events)
    assert "guest:guest" not in result.output


async def _delete_exchange(url: str, name: str) -> None:
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        await channel.exchange_delete(name)
    finally:
        await connection.close()
