"""A request waiting for room carries the reason (issue 28 item 5): ``Request.waiting_reason``
written by the dispatcher when no backend takes it now, cleared when it is placed or ends; in
the change feed (a change of it alone is a request change row, written by the triggers of
migration 0012), in ``to_json`` and in the gauge ``synnefo_ganeti_requests_waiting{reason}``.
On SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from synnefo_ganeti import ControlPlane, metrics
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.dispatch._waiting import WaitingReasons, waiting_kind
from synnefo_ganeti.store import Change, Request, RequestStatus, Store, normalize_url
from tests.helpers import eventually, spec
from tests.unit.test_dispatcher import backend, fakes, finished, running, settings_for
from tests.unit.test_store_migrations import _command, _run

WAITING = "synnefo_ganeti_requests_waiting"


def gauge(kind: str) -> float:
    return metrics.REGISTRY.get_sample_value(WAITING, {"reason": kind}) or 0.0


async def changes_of(store: Store, request_id: str) -> list[Change]:
    return [c for c in await store.list_changes(limit=None) if c.key == request_id]


async def waiting(cp: ControlPlane, request_id: str) -> Request | None:
    request = await cp.get_request(request_id)
    return request if request.waiting_reason else None


# -- the dispatcher writes it, placement clears it ---------------------------------------------------


async def test_a_request_on_a_drained_backend_says_so_until_it_is_placed(db_url: str) -> None:
    async with fakes(1, nodes=1) as (f1,):
        settings = settings_for(db_url, [backend("f1", f1)])
        async with (
            Store(db_url) as store,
            ControlPlane(settings, store=store) as cp,
            running(Dispatcher(settings, store=store, status_server=False)) as d,
        ):
            assert await store.set_backend_drained("f1", True)
            await eventually(lambda: d.allocator.view("f1").drained, what="the drain seen by the dispatcher")
            before = gauge("drained")
            rid = await cp.request_instance(spec("drained.example.org"))
            found = await eventually(lambda: waiting(cp, rid), what="the waiting reason")
            assert found.status is RequestStatus.PENDING and found.backend is None
            assert found.waiting_reason is not None and "f1: drained" in found.waiting_reason
            assert found.to_json()["waiting_reason"] == found.waiting_reason
            # (the gauge follows the write: the reason may be read a moment before it moves)
            await eventually(lambda: gauge("drained") == before + 1, what="the drained gauge")
            feed = await changes_of(store, rid)
            assert [(c.status, c.waiting_reason) for c in feed] == [
                ("pending", None),
                ("pending", found.waiting_reason),
            ]
            assert feed[-1].to_json()["waiting_reason"] == found.waiting_reason
            assert "1 drained" in repr(d._waiting)

            assert await store.set_backend_drained("f1", False)
            done = await finished(cp, rid)
            assert done.status is RequestStatus.SUCCEEDED and done.waiting_reason is None
            assert gauge("drained") == before
            reasons = [c.waiting_reason for c in await changes_of(store, rid)]
            # written once (the same reason again writes nothing), cleared once, with the placement
            assert reasons.count(found.waiting_reason) == 1
            assert reasons[reasons.index(found.waiting_reason) + 1] is None
            assert all(r is None for r in reasons[reasons.index(found.waiting_reason) + 1 :])


async def test_a_request_with_no_room_says_why_and_a_cancel_clears_it(db_url: str) -> None:
    # one node of 4096 MiB (3072 free at most): a second instance of 3000 MiB waits for room
    async with fakes(1, nodes=1, node_memory=4096) as (f1,):
        settings = settings_for(db_url, [backend("f1", f1)])
        async with (
            Store(db_url) as store,
            ControlPlane(settings, store=store) as cp,
            running(Dispatcher(settings, store=store, status_server=False)),
        ):
            first = await cp.request_instance(spec("first.example.org", memory=3000))
            assert (await finished(cp, first)).status is RequestStatus.SUCCEEDED
            assert (await cp.get_request(first)).waiting_reason is None
            before = gauge("no_room")
            second = await cp.request_instance(spec("second.example.org", memory=3000))
            found = await eventually(lambda: waiting(cp, second), what="the waiting reason")
            assert found.waiting_reason is not None
            # "no node has 3000 MiB free" or, before the node stats show the first, "no room for
            # 3000 MiB memory: ... pending"
            assert "f1: no " in found.waiting_reason and "3000 MiB" in found.waiting_reason
            await eventually(lambda: gauge("no_room") == before + 1, what="the no_room gauge")
            await cp.cancel_request(second)
            ended = await finished(cp, second)
            assert ended.status is RequestStatus.CANCELED and ended.waiting_reason is None
            await eventually(lambda: gauge("no_room") == before, what="the gauge back")
            last = (await changes_of(store, second))[-1]
            assert (last.status, last.waiting_reason) == ("canceled", None)


# -- the store: only the holder writes it, the same twice makes one change ---------------------------


async def test_only_the_holder_writes_a_reason_and_the_same_one_once(db_url: str) -> None:
    async with Store(db_url) as store:
        request, _ = await store.add_request(spec("r.example.org").model_dump(), name="r.example.org")
        assert not await store.set_waiting_reason(request.id, "d1", "no room")  # not claimed
        (held,) = await store.claim_requests("d1")
        assert held.id == request.id and held.waiting_reason is None
        assert not await store.set_waiting_reason(request.id, "d2", "no room")  # not its holder
        assert await store.set_waiting_reason(request.id, "d1", "f1: no room")
        assert not await store.set_waiting_reason(request.id, "d1", "f1: no room")  # the same
        assert (await store.get_request(request.id)).waiting_reason == "f1: no room"  # type: ignore[union-attr]
        assert [c.waiting_reason for c in await changes_of(store, request.id)] == [None, "f1: no room"]
        # giving it back (the dispatcher stops): nobody places it now, no reason
        assert await store.release_requests("d1") == 1
        assert (await store.get_request(request.id)).waiting_reason is None  # type: ignore[union-attr]
        assert [c.waiting_reason for c in await changes_of(store, request.id)][-1] is None


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(normalize_url(db_url))
    try:
        yield engine
    finally:
        await engine.dispose()


async def test_0012_downgrade_writes_the_request_triggers_of_0011_back(
    db_url: str, engine: AsyncEngine
) -> None:
    async with Store(db_url) as store:
        request, _ = await store.add_request(spec("m.example.org").model_dump(), name="m.example.org")
    await _run(engine, _command, "downgrade", "0011")

    def columns(connection: Any, table: str) -> set[str]:
        from sqlalchemy import inspect

        return {column["name"] for column in inspect(connection).get_columns(table)}

    assert "waiting_reason" not in await _run(engine, columns, "requests")
    assert "waiting_reason" not in await _run(engine, columns, "changes")
    async with engine.begin() as conn:  # 0011's triggers: a change of status is still a change row
        await conn.execute(text("UPDATE requests SET status = 'canceled' WHERE id = :i"), {"i": request.id})
        count = await conn.execute(text("SELECT count(*) FROM changes WHERE key = :i"), {"i": request.id})
        assert count.scalar_one() == 2
    await _run(engine, _command, "upgrade", "head")
    async with engine.begin() as conn:  # 0012's again: a change of the reason alone is one
        await conn.execute(
            text("UPDATE requests SET waiting_reason = 'why' WHERE id = :i"), {"i": request.id}
        )
        rows = await conn.execute(
            text("SELECT status, waiting_reason FROM changes WHERE key = :i ORDER BY id"), {"i": request.id}
        )
        assert [tuple(row) for row in rows] == [("pending", None), ("canceled", None), ("canceled", "why")]


# -- the kinds and how often a reason is written -----------------------------------------------------


def test_the_kind_is_the_most_hopeful_any_backend_gives() -> None:
    assert waiting_kind({"a": "drained"}) == "drained"
    assert (
        waiting_kind({"a": "drained", "b": "no room for 512 MiB memory: 100 MiB free, 0 MiB pending"})
        == "no_room"
    )
    assert waiting_kind({"a": "failing health checks", "b": "drained"}) == "backend_down"
    assert waiting_kind({"a": "refusing submissions (503) for 3 s more"}) == "backend_down"
    assert waiting_kind({"a": "OS debian not offered", "b": "drained"}) == "drained"
    assert waiting_kind({"a": "OS debian not offered"}) == "not_offered"
    assert waiting_kind({"a": "no node can ever free 40000 MiB memory (at most 31744)"}) == "not_offered"
    assert waiting_kind({"a": "the create failed there already"}) == "failed_there"
    assert (
        waiting_kind(
            {"a": "no usable node (offline, drained, not vm_capable, or full since the last node stats)"}
        )
        == "no_room"
    )
    assert (
        waiting_kind(
            {"a": "network net1 has no free address: 0 free, 0 taken by creates in flight, 1 needed"}
        )
        == "no_room"
    )
    assert waiting_kind({}) == "backend_down"  # no backend at all


class _Store:
    def __init__(self) -> None:
        self.written: list[tuple[str, str, str | None]] = []

    async def set_waiting_reason(self, request_id: str, dispatcher: str, reason: str | None) -> bool:
        self.written.append((request_id, dispatcher, reason))
        return True


async def test_a_reason_is_written_again_for_a_new_kind_or_after_a_while() -> None:
    store: Any = _Store()
    reasons = WaitingReasons(rewrite_after=3600.0)
    before = gauge("no_room"), gauge("drained")
    assert await reasons.note(store, "r1", "d", "no_room", "f1: no room, 100 MiB free")
    assert not await reasons.note(store, "r1", "d", "no_room", "f1: no room, 50 MiB free")  # same kind, soon
    assert await reasons.note(store, "r1", "d", "drained", "f1: drained")  # another kind: at once
    assert (gauge("no_room"), gauge("drained")) == (before[0], before[1] + 1)
    assert len(reasons) == 1 and "1 drained" in repr(reasons)
    reasons.rewrite_after = 0.0
    assert await reasons.note(store, "r1", "d", "drained", "f1: drained; f2: drained")
    assert not await reasons.note(store, "r1", "d", "drained", "f1: drained; f2: drained")  # the same words
    reasons.forget("r1")
    reasons.forget("r1")  # (twice: no harm)
    assert (gauge("no_room"), gauge("drained")) == before and repr(reasons) == "<WaitingReasons none waiting>"
    assert [w[2] for w in store.written] == [
        "f1: no room, 100 MiB free",
        "f1: drained",
        "f1: drained; f2: drained",
    ]


# -- the CLI and the console show it -----------------------------------------------------------------


async def test_the_cli_shows_why_a_request_waits(db_url: str) -> None:
    from tests.unit.test_cli_store import arun

    async with Store(db_url) as store:
        waits, _ = await store.add_request(spec("w.example.org").model_dump(), name="w.example.org")
        await store.add_request(spec("x.example.org").model_dump(), name="x.example.org")
        await store.claim_requests("d1")
        assert await store.set_waiting_reason(waits.id, "d1", "no backend can take it: f1: drained")
    listed = orjson.loads((await arun("requests", "list", "--db", db_url, "--json")).stdout)
    assert {r["instance"]: r["waiting_reason"] for r in listed} == {
        "w.example.org": "no backend can take it: f1: drained",
        "x.example.org": None,
    }
    table = (await arun("requests", "list", "--db", db_url)).stdout
    assert "waiting" in table and "f1: drained" in table
    shown = (await arun("requests", "show", waits.id, "--db", db_url)).stdout
    assert "waiting_reason" in shown and "f1: drained" in shown


async def test_the_console_shows_why_a_request_waits(tmp_path: Any) -> None:
    from tests.unit.test_console import login, world

    async with asynccontextmanager(world.__wrapped__)(tmp_path) as w:  # type: ignore[attr-defined]
        await login(w.client, "bob")
        assert await w.store.set_backend_drained("alpha", True)
        await eventually(lambda: w.dispatcher.allocator.view("alpha").drained, what="the drain seen")
        rid = await w.cp.request_instance(spec("waits.example"))
        found = await eventually(lambda: waiting(w.cp, rid), what="the waiting reason")
        listing = await (await w.client.get("/requests")).text()
        assert "waiting: " in listing and "alpha: drained" in listing
        detail = await (await w.client.get(f"/requests/{rid}")).text()
        assert '<dd id="waiting">' in detail and "alpha: drained" in detail
        assert found.waiting_reason is not None
        assert await w.store.set_backend_drained("alpha", False)
        assert (await w.cp.wait_request(rid, timeout=20)).waiting_reason is None
        detail = await (await w.client.get(f"/requests/{rid}")).text()
        assert '<dd id="waiting">—</dd>' in detail
