"""The change feed's two outlets side by side (issue 32 item 4): AMQP (RabbitMQ) and the webhook.

    python benchmarks/amqp.py                          # 2,000 changes of backlog, 500 live, SQLite
    python benchmarks/amqp.py --db postgresql          # a scratch PostgreSQL database
    python benchmarks/amqp.py --backlog 200 --live 50  # a small run (the test suite's)

One store; the dispatcher's two outlets running as they do there (``AmqpPublisher`` and
``WebhookDeliverer``, each with its cursor), to a real RabbitMQ at ``--amqp`` (a fresh topic
exchange, an exclusive queue bound to it, both deleted after) and to an in-process aiohttp
receiver answering 204. Two phases, one JSON object on stdout (progress on stderr):

* **backlog**: ``--backlog`` changes written while neither outlet runs, then both started: each
  outlet's ``backlog_per_s`` is the changes over the seconds until its receiver has them all
  (the outbox's throughput: read, publish or POST, confirm or answer, cursor written);
* **live**: ``--live`` changes written one at a time while both run (as requests' ends come):
  ``p50_ms`` / ``p99_ms`` / ``max_ms`` from each change's commit (its ``at``; for a request's
  end, when the job's end was stored) to its receipt by the consumer (AMQP: in the queue, past
  the broker, as its confirm is) or the receiver (webhook: the POST's arrival).

Also ``duplicates`` (messages received twice: 0 without failures) and ``lost`` (changes never
received: 0) per outlet. Figures compare the two outlets within one run; not asserted here.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import aio_pika
import orjson
from aiohttp import web
from aiohttp.test_utils import TestServer

from _databases import database
from synnefo_ganeti.config import NotifySettings
from synnefo_ganeti.dispatch import AmqpPublisher, WebhookDeliverer
from synnefo_ganeti.store import Store

DEADLINE = 300.0
SPEC = {"os": "debootstrap+default", "disk_template": "plain"}


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))], 2)


class Received:
    """Receipt times (``time.time()``) by change id, and how many came twice."""

    def __init__(self) -> None:
        self.at: dict[int, float] = {}
        self.duplicates = 0

    def add(self, change_id: int) -> None:
        if change_id in self.at:
            self.duplicates += 1
        else:
            self.at[change_id] = time.time()


@asynccontextmanager
async def amqp_consumer(url: str, exchange_name: str) -> AsyncIterator[Received]:
    got = Received()
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=1000)
        exchange = await channel.declare_exchange(exchange_name, aio_pika.ExchangeType.TOPIC, durable=True)
        queue = await channel.declare_queue(exclusive=True, auto_delete=True)
        await queue.bind(exchange, routing_key="#")

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            got.add(int(message.message_id or 0))
            await message.ack()

        await queue.consume(on_message)
        try:
            yield got
        finally:
            await exchange.delete()
    finally:
        await connection.close()


@asynccontextmanager
async def webhook_receiver() -> AsyncIterator[tuple[Received, str]]:
    got = Received()

    async def hook(request: web.Request) -> web.Response:
        got.add(orjson.loads(await request.read())["id"])
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", hook)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield got, str(server.make_url("/hook"))
    finally:
        await server.close()


async def until_all(got: Received, ids: list[int], what: str) -> float:
    """Seconds until ``got`` holds every id of ``ids``."""
    start = time.perf_counter()
    wanted = set(ids)
    while not wanted <= got.at.keys():
        if time.perf_counter() - start > DEADLINE:
            raise TimeoutError(f"gave up waiting for {what}: {len(wanted - got.at.keys())} missing")
        await asyncio.sleep(0.005)
    return time.perf_counter() - start


async def run(args: argparse.Namespace, folder: str) -> dict[str, Any]:
    secret = Path(folder) / "webhook.secret"
    secret.write_text("benchmark-hmac-key\n")
    secret.chmod(0o600)
    exchange = f"bench.changes.{uuid.uuid4().hex}"
    async with AsyncExitStack() as stack:
        db_url = await stack.enter_async_context(database(args.db, folder))
        store = await stack.enter_async_context(Store(db_url))
        amqp_got = await stack.enter_async_context(amqp_consumer(args.amqp, exchange))
        hook_got, hook_url = await stack.enter_async_context(webhook_receiver())
        notify = NotifySettings(url=hook_url, secret_file=secret, amqp_url=args.amqp, amqp_exchange=exchange)
        outlets = {
            "amqp": (AmqpPublisher(store, notify), amqp_got),
            "webhook": (WebhookDeliverer(store, notify), hook_got),
        }

        progress(f"writing a backlog of {args.backlog} changes ({args.db})")
        for i in range(args.backlog):
            await store.add_request(SPEC | {"name": f"b{i}.example"}, name=f"b{i}.example")
        backlog_ids = [c.id for c in await store.list_changes(limit=None)]
        tasks = [
            asyncio.create_task(outlet.run(), name=f"bench {name}") for name, (outlet, _) in outlets.items()
        ]
        try:
            drained = await asyncio.gather(
                *(until_all(got, backlog_ids, f"the {name} backlog") for name, (_, got) in outlets.items())
            )
            progress(
                "backlog drained: "
                + ", ".join(f"{n} {s:.2f} s" for n, s in zip(outlets, drained, strict=True))
            )
            progress(f"writing {args.live} changes live")
            before = backlog_ids[-1] if backlog_ids else 0
            for i in range(args.live):
                await store.add_request(SPEC | {"name": f"l{i}.example"}, name=f"l{i}.example")
            live = await store.list_changes(after=before, limit=None)
            await asyncio.gather(
                *(
                    until_all(got, [c.id for c in live], f"the live {name} changes")
                    for name, (_, got) in outlets.items()
                )
            )
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for outlet, _ in outlets.values():
                if isinstance(outlet, AmqpPublisher):
                    await outlet.close()
        every = [c.id for c in await store.list_changes(limit=None)]
        figures: dict[str, Any] = {"db": args.db, "backlog": len(backlog_ids), "live": len(live)}
        for (name, (_, got)), seconds in zip(outlets.items(), drained, strict=True):
            delays = [(got.at[c.id] - c.at.timestamp()) * 1000 for c in live]
            figures[name] = {
                "backlog_per_s": round(len(backlog_ids) / seconds, 1) if seconds else None,
                "p50_ms": quantile(delays, 0.5),
                "p99_ms": quantile(delays, 0.99),
                "max_ms": quantile(delays, 1.0),
                "duplicates": got.duplicates,
                "lost": len(set(every) - got.at.keys()),
            }
        return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--db", default="sqlite", help="sqlite, postgresql (a scratch database) or a URL")
    parser.add_argument(
        "--amqp", default=os.environ.get("SYNNEFO_GANETI_BENCH_AMQP", "amqp://guest:guest@127.0.0.1:5672/")
    )
    parser.add_argument("--backlog", type=int, default=2000, help="changes written before the outlets start")
    parser.add_argument("--live", type=int, default=500, help="changes written one at a time while they run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sg-bench-amqp-") as folder:
        figures = asyncio.run(run(args, folder))
    print(orjson.dumps(figures).decode(), flush=True)


if __name__ == "__main__":
    main()
