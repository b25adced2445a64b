"""The dispatcher as operators see it: backend health (events, webhook, placement), the status
server, reload (SIGHUP), one dispatcher per SQLite database, the reconcile loop and its locks."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from synnefo_ganeti import ConfigError, ControlPlane
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.store import InstanceStatus, RequestStatus, Store
from tests.helpers import eventually, spec
from tests.unit.test_dispatcher import (
    backend,
    creates,
    fakes,
    finished,
    running,
    settings_for,
    sqlite_url,
)


@asynccontextmanager
async def webhook_receiver() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A tiny HTTP server that keeps the JSON bodies POSTed to it."""
    received: list[dict[str, Any]] = []

    async def hook(request: web.Request) -> web.Response:
        received.append(await request.json())
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/hook", received
    finally:
        await runner.cleanup()


# -- health ------------------------------------------------------------------------------------------


async def test_a_backend_that_stops_answering_goes_down_and_out_of_placement(db_url: str) -> None:
    async with webhook_receiver() as (hook, received), fakes(2) as (f1, f2):
        settings = settings_for(
            db_url, [backend("f1", f1), backend("f2", f2)], health_interval=0.05, fail_after=2, webhook=hook
        )
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            async with running(Dispatcher(settings, store=store, status_server=False)) as d:

                def health(expected: dict[str, str]) -> Callable[[], Awaitable[bool]]:
                    async def check() -> bool:
                        states = await store.backend_states()
                        return {name: state["health"] for name, state in states.items()} == expected

                    return check

                await eventually(health({"f1": "up", "f2": "up"}), what="both up")
                await f1.stop()  # the cluster's RAPI is gone
                await eventually(health({"f1": "down", "f2": "up"}), what="f1 down")
                assert d.health is not None and not d.health.tracker.is_up("f1")
                assert d.health.tracker.states["f1"].failures >= 2
                events = await store.backend_events(backend="f1")
                assert [e["kind"] for e in events] == ["down"]
                assert events[0]["message"].startswith("health checks failed: ")
                await eventually(lambda: received, what="the webhook called")
                assert received[0]["backend"] == "f1" and received[0]["state"] == "down"
                assert received[0]["error"]

                ids = [await cp.request_instance(spec(f"after{i}.example")) for i in range(5)]
                done = [await finished(cp, rid) for rid in ids]
            assert [(r.status, r.backend) for r in done] == [(RequestStatus.SUCCEEDED, "f2")] * 5
            assert sorted(f2.cluster.instances) == sorted(r.instance for r in done)
            assert (await store.backend_states())["f1"]["health_detail"]


async def test_the_status_server_reports_readiness_and_metrics(tmp_path: Path) -> None:
    db_url = sqlite_url(tmp_path)
    async with fakes(1) as (f1,), aiohttp.ClientSession() as http:
        settings = settings_for(
            db_url, [backend("f1", f1)], status_port=0, health_interval=0.05, fail_after=1
        )
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            async with running(Dispatcher(settings, store=store)) as d:
                assert d.status is not None and d.status.port != 0
                request = await finished(cp, await cp.request_instance(spec("m.example")))
                assert request.status is RequestStatus.SUCCEEDED
                async with http.get(d.status.url + "/readyz") as answer:
                    assert answer.status == 200
                    body = await answer.json()
                assert body == {"status": "ready", "failing": {}, "checks": ["backends", "database", "tasks"]}
                async with http.get(d.status.url + "/metrics") as answer:
                    assert answer.status == 200
                    metrics = await answer.text()
                assert 'synnefo_ganeti_requests_total{status="succeeded"}' in metrics

                await f1.stop()
                await eventually(lambda: not d.health.tracker.is_up("f1"), what="f1 down")  # type: ignore[union-attr]
                async with http.get(d.status.url + "/readyz") as answer:
                    assert answer.status == 503
                    body = await answer.json()
                assert body["status"] == "not ready"
                assert body["failing"] == {"backends": "every backend is down"}
            assert d.status is None  # stopped with the dispatcher


# -- reload ------------------------------------------------------------------------------------------


async def test_reload_adds_drains_and_removes_backends(tmp_path: Path) -> None:
    db_url = sqlite_url(tmp_path)
    async with fakes(2) as (f1, f2):
        before = settings_for(db_url, [backend("f1", f1)], placement_timeout=0.5)
        async with Store(db_url) as store, ControlPlane(before, store=store) as cp:
            async with running(Dispatcher(before, store=store, status_server=False)) as d:
                first = await finished(cp, await cp.request_instance(spec("one.example")))
                assert first.backend == "f1"

                # f2 added, f1 drained: new requests go to f2 only
                both = settings_for(
                    db_url, [backend("f1", f1, drained=True), backend("f2", f2)], placement_timeout=0.5
                )
                assert await d.reload(both) == ["drained f1", "added f2"]
                assert "f2" in repr(d)
                cp.settings = both
                done = [
                    await finished(cp, await cp.request_instance(spec(f"two{i}.example"))) for i in range(4)
                ]
                assert [(r.status, r.backend) for r in done] == [(RequestStatus.SUCCEEDED, "f2")] * 4

                # f2 removed, f1 undrained: back to f1; a request pinned to f2 finds no such backend
                assert await d.reload(before) == ["removed f2", "undrained f1"]
                again = await finished(cp, await cp.request_instance(spec("three.example")))
                assert (again.status, again.backend) == (RequestStatus.SUCCEEDED, "f1")
                pinned, _ = await store.add_request(
                    spec("pinned.example").model_dump(mode="json"), name="pinned.example", backend="f2"
                )
                failed = await finished(cp, pinned.id)
            assert failed.status is RequestStatus.FAILED and failed.error is not None
            assert "f2: not a backend of this dispatcher's configuration" in failed.error
            assert sorted(f1.cluster.instances) == ["one.example", "three.example"]
            assert sorted(f2.cluster.instances) == [f"two{i}.example" for i in range(4)]
            assert creates(f1, f2) == 6


async def test_a_backend_drained_by_an_operator_takes_no_more_requests(tmp_path: Path) -> None:
    """`backends drain` (or the console) writes the drain in the database: the dispatcher reads
    it with the node stats and places nothing more there; undrained, the backend is back."""
    db_url = sqlite_url(tmp_path)
    async with fakes(2) as (f1, f2):
        settings = settings_for(db_url, [backend("f1", f1), backend("f2", f2)])
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            async with running(Dispatcher(settings, store=store, status_server=False)) as d:
                assert await store.set_backend_drained("f1", True)
                await eventually(lambda: d.allocator.view("f1").drained, what="f1 seen drained")
                done = [
                    await finished(cp, await cp.request_instance(spec(f"d{i}.example"))) for i in range(4)
                ]
                assert [(r.status, r.backend) for r in done] == [(RequestStatus.SUCCEEDED, "f2")] * 4
                assert await store.set_backend_drained("f1", False)
                await eventually(lambda: not d.allocator.view("f1").drained, what="f1 seen undrained")
            assert sorted(f2.cluster.instances) == [f"d{i}.example" for i in range(4)]
            assert not f1.cluster.instances


async def test_a_second_dispatcher_on_one_sqlite_database_is_refused(tmp_path: Path) -> None:
    db_url = sqlite_url(tmp_path)
    async with fakes(1) as (f1,):
        settings = settings_for(db_url, [backend("f1", f1)])
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            async with running(Dispatcher(settings, store=store, status_server=False, dispatcher_id="first")):
                second = Dispatcher(settings, status_server=False, dispatcher_id="second")
                with pytest.raises(
                    ConfigError, match=r"another dispatcher \(first\) runs on the SQLite database"
                ):
                    await second.run()
                # the first one is unharmed
                request = await finished(cp, await cp.request_instance(spec("still.example")))
                assert request.status is RequestStatus.SUCCEEDED
            # once the first is gone, another may start
            async with running(Dispatcher(settings, store=store, status_server=False, dispatcher_id="third")):
                pass


# -- the reconcile loop ------------------------------------------------------------------------------


async def test_the_reconcile_loop_fixes_drift(db_url: str) -> None:
    async with fakes(1) as (f1,):
        settings = settings_for(db_url, [backend("f1", f1)])
        settings = settings.model_copy(
            update={"reconcile": settings.reconcile.model_copy(update={"interval": 0.2})}
        )
        async with (
            Store(db_url) as store,
            ControlPlane(settings, store=store) as cp,
            running(Dispatcher(settings, store=store, status_server=False)) as d,
        ):
            request = await finished(cp, await cp.request_instance(spec("drift.example")))
            assert request.status is RequestStatus.SUCCEEDED
            # shut down behind the control plane's back: no job the dispatcher would see
            f1.cluster.instances["drift.example"].admin_state = "down"
            f1.cluster.instances["drift.example"].oper_state = False

            async def stopped() -> bool:
                instance = await store.get_instance("f1", "drift.example")
                return instance is not None and instance.status is InstanceStatus.STOPPED

            await eventually(stopped, what="the drift fixed")
            # the pass is counted when it ends, after its fixes are written (and its network check)
            await eventually(lambda: d.stats.reconcile_passes >= 1, what="the reconcile pass counted")


async def test_a_backend_is_reconciled_by_one_dispatcher_at_a_time(pg_url: str) -> None:
    async with fakes(1) as (f1,):
        settings = settings_for(pg_url, [backend("f1", f1)])  # reconcile interval: 300 s, by hand here
        d1 = Dispatcher(settings, dispatcher_id="one", status_server=False)
        d2 = Dispatcher(settings, dispatcher_id="two", status_server=False)
        async with running(d1), running(d2):
            assert d1._lock is not None and d2._lock is not None
            assert await d1._lock.is_alive("two") and await d2._lock.is_alive("one")
            assert await d1._lock.try_reconcile("f1")  # d1 is reconciling f1 ...
            assert not await d2._lock.try_reconcile("f1")
            assert await d2.reconcile_once() is None  # ... so d2 leaves it alone
            assert d2.stats.reconcile_passes == 0
            await d1._lock.done_reconciling("f1")
            assert await d2.reconcile_once() is not None
            assert d2.stats.reconcile_passes == 1
            assert await d1._lock.try_reconcile("f1")  # d2 let go after its pass
            await d1._lock.done_reconciling("f1")
        async with running(Dispatcher(settings, dispatcher_id="three", status_server=False)) as d3:
            assert d3._lock is not None
            assert not await d3._lock.is_alive("one") and not await d3._lock.is_alive("two")
