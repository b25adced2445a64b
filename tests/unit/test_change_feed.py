"""The change feed (``cp.changes``) and its webhook, on SQLite and on PostgreSQL.

The feed: request and instance changes in id order, resumable from an id, seen by a second
store (another process), a PostgreSQL reader woken by NOTIFY. The webhook, against a real
local aiohttp server: the body and its signature (checked with ``hmac.compare_digest``),
retries after a 500, a dispatcher restart resuming from the cursor with nothing lost, one
deliverer at a time on PostgreSQL, and the secret never in a log line or a repr.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from synnefo_ganeti import Change, ControlPlane, Settings
from synnefo_ganeti.config import NotifySettings
from synnefo_ganeti.dispatch import SIGNATURE_HEADER, Dispatcher, DispatcherLock, WebhookDeliverer
from synnefo_ganeti.errors import ConfigError
from synnefo_ganeti.store import Store
from synnefo_ganeti.store.changes import _changes
from tests.helpers import WAIT, eventually
from tests.unit.test_dispatcher import running

SECRET = "s3cret-hmac-key-never-logged"
SPEC = {"name": "x", "os": "debootstrap+default", "disk_template": "plain"}


async def _collect(
    changes: AsyncIterator[Change], count: int, into: list[Change] | None = None
) -> list[Change]:
    got = into if into is not None else []
    async for change in changes:
        got.append(change)
        if len(got) >= count:
            break
    return got


async def _request(store: Store, name: str) -> str:
    request, new = await store.add_request(SPEC | {"name": name}, name=name)
    assert new
    return request.id


# -- the feed ----------------------------------------------------------------------------------------


async def test_request_and_instance_changes_come_in_order_and_resume(db_url: str) -> None:
    settings = Settings(database={"url": db_url})
    async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
        start = await store.last_change_id()
        async with contextlib.aclosing(cp.changes(since=start)) as changes:
            task = asyncio.create_task(_collect(changes, 4))
            request_id = await _request(store, "one.example")
            instance = await store.add_instance("b1", "one.example")
            await store.update_instance("b1", "one.example", status="ERROR")
            await store.finish_request(request_id, "failed", error="no room")
            got = await asyncio.wait_for(task, WAIT)
        assert [(c.kind, c.key, c.status, c.error) for c in got] == [
            ("request", request_id, "pending", None),
            ("instance", instance.id, "BUILD", None),
            ("instance", instance.id, "ERROR", None),
            ("request", request_id, "failed", "no room"),
        ]
        assert [c.id for c in got] == sorted(c.id for c in got) and got[0].id > start
        assert all(c.at.tzinfo is UTC and abs((datetime.now(UTC) - c.at).total_seconds()) < 60 for c in got)
        # resumable: after an id (exclusive), the same changes again
        async with contextlib.aclosing(cp.changes(since=got[1].id)) as again:
            assert await asyncio.wait_for(_collect(again, 2), WAIT) == got[2:]
        assert await store.list_changes(after=got[0].id, limit=2) == got[1:3]


async def test_since_none_yields_only_what_happens_from_then_on(db_url: str) -> None:
    settings = Settings(database={"url": db_url}, dispatcher={"poll_interval": 0.05})
    async with Store(db_url, poll_interval=0.05) as store, ControlPlane(settings, store=store) as cp:
        before = await _request(store, "before.example")
        async with contextlib.aclosing(cp.changes()) as changes:
            first = asyncio.create_task(anext(changes))
            later: list[str] = []

            async def delivered() -> bool:  # (when the iterator started is not observable: write until)
                if not first.done():
                    later.append(await _request(store, f"later{len(later)}.example"))
                return first.done()

            await eventually(delivered, what="the first change after the start")
            change = first.result()
        assert change.kind == "request" and change.key in later and change.key != before


async def test_a_second_store_sees_the_changes(db_url: str) -> None:
    """Another process's writes (a second Store on the same database) are in the feed."""
    poll = 0.05 if db_url.startswith("sqlite") else 60  # PostgreSQL: NOTIFY, no polling to speak of
    async with Store(db_url) as writer, Store(db_url, poll_interval=poll) as reader:
        start = await reader.last_change_id()
        async with contextlib.aclosing(reader.changes(since=start)) as changes:
            task = asyncio.create_task(_collect(changes, 2))
            request_id = await _request(writer, "other.example")
            instance = await writer.add_instance("b1", "other.example")
            got = await asyncio.wait_for(task, WAIT)
        assert [(c.kind, c.key) for c in got] == [("request", request_id), ("instance", instance.id)]
        assert reader.stats.batches == 0  # it never wrote


async def test_changes_committed_while_the_reader_lingers_come_in_one_read(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Woken, the feed waits ``FOLLOW_LINGER`` before it reads: what is committed meanwhile
    comes in that one read (here the linger is held open until three more are written)."""
    lingering, release = asyncio.Event(), asyncio.Event()

    async def pause(seconds: float) -> None:
        assert seconds == _changes.FOLLOW_LINGER
        lingering.set()
        await release.wait()

    monkeypatch.setattr(_changes, "_pause", pause)
    poll = 0.05 if db_url.startswith("sqlite") else 60
    async with Store(db_url) as writer, Store(db_url, poll_interval=poll) as reader:
        reads = 0
        read_once = asyncio.Event()
        list_changes = reader._changes.list_changes

        async def counted(**kwargs: Any) -> Any:
            nonlocal reads
            reads += 1
            found = await list_changes(**kwargs)
            read_once.set()
            return found

        reader._changes.list_changes = counted  # type: ignore[method-assign]
        start = await reader.last_change_id()
        async with contextlib.aclosing(reader.changes(since=start)) as changes:
            task = asyncio.create_task(_collect(changes, 4))
            # its first read done (PostgreSQL: it LISTENs from before it), then the first commit
            await asyncio.wait_for(read_once.wait(), WAIT)
            first = await _request(writer, "first.example")
            await asyncio.wait_for(lingering.wait(), WAIT)  # woken (SQLite: its poll), lingering
            later = [await _request(writer, f"later{n}.example") for n in range(3)]
            release.set()
            got = await asyncio.wait_for(task, WAIT)
    assert [c.key for c in got] == [first, *later]
    assert reads == 2  # before the wake, then all four at once


async def test_notify_wakes_a_postgresql_reader(pg_url: str) -> None:
    async with Store(pg_url) as writer, Store(pg_url, poll_interval=60) as reader:
        async with contextlib.aclosing(reader.changes(since=0)) as changes:
            task = asyncio.create_task(_collect(changes, 1))
            admin = await asyncpg.connect(pg_url, timeout=5)
            try:  # the reader is listening (then waits on its 30 s safety poll)
                await eventually(
                    lambda: admin.fetchval(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND query LIKE 'LISTEN %synnefo_ganeti_changes%'"
                    ),
                    what="the reader's LISTEN",
                )
            finally:
                await admin.close()
            assert not task.done()
            request_id = await _request(writer, "notified.example")
            got = await asyncio.wait_for(task, 10)  # well under the safety poll
        assert [(c.kind, c.key) for c in got] == [("request", request_id)]


# -- the webhook -------------------------------------------------------------------------------------


@dataclass
class Receiver:
    """A webhook receiver: answers ``status`` (a 500 makes the deliverer retry), records each POST."""

    status: int = 200
    posts: list[tuple[dict[str, Any], bool, int]] = field(default_factory=list)  # (body, signed ok, answer)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        signed = hmac.compare_digest(request.headers.get(SIGNATURE_HEADER, ""), expected)
        status = self.status
        self.posts.append((orjson.loads(body), signed, status))
        self.changed.set()
        return web.Response(status=status)

    def delivered(self) -> list[int]:
        return [body["id"] for body, _, status in self.posts if status == 200]


@contextlib.asynccontextmanager
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    recv = Receiver()
    app = web.Application()
    app.router.add_post("/hook", recv.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield recv, str(server.make_url("/hook"))
    finally:
        await server.close()


def _secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "webhook.secret"
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    return path


def _settings(db_url: str, url: str, tmp_path: Path) -> Settings:
    return Settings(
        database={"url": db_url},
        dispatcher={"status_port": None, "poll_interval": 0.05, "shutdown_timeout": 5.0},
        notify={"url": url, "secret_file": str(_secret_file(tmp_path)), "timeout": 5, "retry_max": 0.5},
    )


async def test_the_webhook_posts_signed_changes_and_retries_after_a_500(
    db_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with receiver() as (recv, url), Store(db_url, poll_interval=0.05) as store:
        settings = _settings(db_url, url, tmp_path)
        recv.status = 500
        request_id = await _request(store, "hooked.example")
        async with running(Dispatcher(settings, store=store, status_server=False)) as d:
            await eventually(lambda: len(recv.posts) >= 2, what="a retry after the 500")
            assert await store.feed.cursor("webhook") == 0  # not delivered: kept
            recv.status = 200
            assert d.webhook is not None
            webhook = d.webhook
            await eventually(lambda: webhook.delivered >= 1, what="the delivery (then the cursor moved)")
            assert f"{webhook.delivered} delivered" in repr(webhook) and recv.delivered()
        (first, _, first_status), *_ = recv.posts
        assert first_status == 500 and all(signed for _, signed, _ in recv.posts)
        # (then the request's waiting reason: no backend is configured here; its own changes)
        change = (await store.list_changes(limit=1))[0]
        assert first == {
            "id": change.id,
            "kind": "request",
            "key": request_id,
            "status": "pending",
            "task": None,
            "error": None,
            "at": change.at.isoformat(),
            "waiting_reason": None,  # (a request's change carries it)
        }
        assert await store.feed.cursor("webhook") >= change.id
        assert recv.delivered()[0] == change.id
        assert "not delivered (answered 500" in caplog.text
    assert SECRET not in caplog.text
    assert SECRET not in repr(settings) and SECRET not in str(settings.model_dump())
    assert SECRET not in repr(d.webhook)


async def test_a_dispatcher_restart_resumes_from_the_cursor(db_url: str, tmp_path: Path) -> None:
    # (no backend is configured: each request also says why it waits, a change of its own)
    async with receiver() as (recv, url), Store(db_url, poll_interval=0.05) as store:
        settings = _settings(db_url, url, tmp_path)
        names = [f"r{i}.example" for i in range(6)]
        async with running(Dispatcher(settings, store=store, status_server=False)) as d:
            for name in names[:3]:
                await _request(store, name)
            webhook = d.webhook
            assert webhook is not None
            await eventually(lambda: webhook.delivered >= 3, what="the first three delivered")
            recv.status = 503  # the receiver fails: the next ones stay in the database
            for name in names[3:5]:
                await _request(store, name)
            await eventually(lambda: any(status == 503 for *_, status in recv.posts), what="a failing POST")
        delivered_before = await store.feed.cursor("webhook")
        await _request(store, names[5])  # written while no dispatcher runs
        recv.status = 200

        async def all_delivered() -> list[int] | None:
            ids = [c.id for c in await store.list_changes(limit=None)]
            return ids if len(ids) >= 6 and set(ids) <= set(recv.delivered()) else None

        async with running(Dispatcher(settings, store=store, status_server=False)):
            seen = await eventually(all_delivered, what="every change delivered")
        assert sorted(set(recv.delivered()))[: len(seen)] == seen  # none lost
        assert recv.delivered() == sorted(recv.delivered())  # in order (a change again only after a crash)
        changes = await store.list_changes(limit=None)
        assert len({c.key for c in changes}) == 6 and delivered_before >= changes[2].id
        assert await store.feed.cursor("webhook") >= seen[-1]


async def test_two_deliverers_on_postgresql_deliver_each_change_once(pg_url: str, tmp_path: Path) -> None:
    async with receiver() as (recv, url), Store(pg_url) as store_a, Store(pg_url) as store_b:
        notify = _settings(pg_url, url, tmp_path).notify
        locks = [DispatcherLock(store_a, "a"), DispatcherLock(store_b, "b")]
        for lock in locks:
            await lock.acquire()
        deliverers = [
            WebhookDeliverer(store_a, notify, lock=locks[0]),
            WebhookDeliverer(store_b, notify, lock=locks[1]),
        ]
        tasks = [asyncio.create_task(d.run()) for d in deliverers]
        try:
            for i in range(20):
                await _request(store_a if i % 2 else store_b, f"twice{i}.example")
            await eventually(lambda: len(recv.delivered()) >= 20, what="twenty deliveries")
            ids = [c.id for c in await store_a.list_changes(limit=None)]
            await eventually(lambda: store_a.feed.cursor("webhook"), what="the cursor written")
            assert recv.delivered() == ids  # each once, in order
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for lock in locks:
                await lock.release()


def test_notify_settings_need_a_secret_and_hide_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="secret_file"):
        Settings(notify={"url": "https://api.example.org/hook"})
    loose = tmp_path / "loose.secret"
    loose.write_text(SECRET)
    loose.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600") as raised:
        Settings(notify={"url": "https://api.example.org/hook", "secret_file": str(loose)})
    assert SECRET not in str(raised.value)
    with pytest.raises(ConfigError, match="http"):
        Settings(notify={"url": "ftp://x", "secret_file": str(_secret_file(tmp_path))})
    notify = NotifySettings(url="https://api.example.org/hook", secret_file=_secret_file(tmp_path))
    assert notify.enabled and notify.secret_bytes() == SECRET.encode()
    assert SECRET not in repr(notify) and SECRET not in str(notify.model_dump())
    assert not NotifySettings().enabled  # no url: no webhook


def test_a_relative_secret_file_is_read_from_the_config_files_folder(tmp_path: Path) -> None:
    _secret_file(tmp_path)
    config = tmp_path / "synnefo-ganeti.toml"
    config.write_text('[notify]\nurl = "https://api.example.org/hook"\nsecret_file = "webhook.secret"\n')
    settings = Settings.from_file(config)
    assert settings.notify.secret_file == tmp_path / "webhook.secret"
    assert settings.notify.secret_bytes() == SECRET.encode()
