"""The console's hub follows the change feed from where it stood when it started, and on after a
failed read from the last change it saw: a change is never lost to the reader's timing.

CI once saw a list page's stream miss a request row: the hub's reader took the feed's position
only when its task first ran, and on a loaded machine that was after the request had changed.
These tests hold the reader back (or make its read fail) at the worst moment, on SQLite and on
PostgreSQL, and wait for the change to reach a subscriber.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from synnefo_ganeti import Change
from synnefo_ganeti.console._live import Dirty, Fragment, Hub, Subscriber
from synnefo_ganeti.errors import StoreError
from synnefo_ganeti.store import Store
from tests.helpers import WAIT

SPEC = {"name": "x", "os": "debootstrap+default", "disk_template": "plain"}


async def _render(dirty: set[Dirty], topics: frozenset[str]) -> list[Fragment]:
    return [Fragment("requests", f"request-{key}", key, "rows") for kind, key in dirty if kind == "request"]


async def _request(store: Store, name: str) -> str:
    request, new = await store.add_request(SPEC | {"name": name}, name=name)
    assert new
    return request.id


async def _rows_until(sub: Subscriber, request_id: str) -> list[str]:
    """The rows ``sub`` gets until the one of ``request_id``."""
    seen: list[str] = []
    async with asyncio.timeout(WAIT):
        while True:
            fragment = await sub.next()
            assert fragment is not None, "the subscriber fell behind"
            seen.append(fragment.target)
            if fragment.target == f"request-{request_id}":
                return seen


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[Store]:
    async with Store(db_url) as store:
        yield store


async def test_a_change_after_start_reaches_a_page_however_late_the_reader_first_runs(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub = Hub(lambda: store, _render, interval=0.01)
    release = asyncio.Event()
    asked: list[str] = []
    feed_last_id = store.feed.last_id

    async def late_last_id() -> int:  # the position, as a reader that runs only now would take it
        asked.append("last_id")
        await release.wait()
        return await feed_last_id()

    await hub.start()
    monkeypatch.setattr(store.feed, "last_id", late_last_id)
    try:
        async with hub.subscribe(["requests"]) as sub:
            request_id = await _request(store, "early.example")
            release.set()
            assert f"request-{request_id}" in await _rows_until(sub, request_id)
        assert asked == [], "the reader took the feed's position after start() had returned"
    finally:
        await hub.stop()


async def test_after_a_failed_read_the_hub_goes_on_from_the_last_change_it_saw(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub = Hub(lambda: store, _render, interval=0.01)
    hub.retry_pause = 0.01
    list_changes = store.feed.list_changes
    armed = asyncio.Event()
    during: list[str] = []
    failed = asyncio.Event()

    async def failing_once(*, after: int, limit: int | None) -> list[Change]:
        if armed.is_set() and not failed.is_set():  # a change is committed while the read fails
            during.append(await _request(store, "during.example"))
            failed.set()
            raise StoreError("the database went away (a test)")
        return await list_changes(after=after, limit=limit)

    await hub.start()
    monkeypatch.setattr(store.feed, "list_changes", failing_once)
    try:
        async with hub.subscribe(["requests"]) as sub:
            first = await _request(store, "first.example")
            await _rows_until(sub, first)
            armed.set()
            await _request(store, "after.example")  # wakes the reader, whose next read fails
            await asyncio.wait_for(failed.wait(), WAIT)
            assert f"request-{during[0]}" in await _rows_until(sub, during[0])
    finally:
        await hub.stop()
