"""Health checks: the state machine, and probes of fake Ganetis with faults, a dead port and a webhook."""

from __future__ import annotations

import logging
import socket

import pytest
from aiohttp import web

from synnefo_ganeti import RapiClient, RetryPolicy
from synnefo_ganeti.health import HealthChange, HealthMonitor, HealthTracker
from synnefo_ganeti.testing import FakeGaneti


def test_down_after_k_failures_up_after_m_successes() -> None:
    tracker = HealthTracker(fail_after=3, recover_after=2)
    assert tracker.is_up("b")
    assert tracker.record("b", False, "boom") is None
    assert tracker.record("b", False, "boom") is None
    assert tracker.record("b", True) is None  # a success resets the count
    assert tracker.record("b", False, "boom") is None
    assert tracker.record("b", False, "boom") is None
    down = tracker.record("b", False, "still boom", now=100.0)
    assert down == HealthChange("b", False, "still boom", 100.0)
    assert not tracker.is_up("b") and tracker.state("b").last_error == "still boom"
    assert tracker.record("b", False, "x") is None  # already down: no second change
    assert tracker.record("b", True) is None
    up = tracker.record("b", True, now=200.0)
    assert up == HealthChange("b", True, None, 200.0)
    assert tracker.is_up("b") and tracker.state("b").changed_at == 200.0
    assert up.to_json() == {"backend": "b", "state": "up", "error": None, "at": 200.0}
    with pytest.raises(ValueError, match="at least 1"):
        HealthTracker(fail_after=0)


def _dead_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def test_monitor_marks_a_failing_backend_down_and_back_up(caplog) -> None:
    received: list[dict[str, object]] = []

    async def hook(request: web.Request) -> web.Response:
        received.append(await request.json())
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    changes: list[HealthChange] = []
    try:
        async with (
            FakeGaneti(tls=False) as good,
            FakeGaneti(tls=False) as sick,
            RapiClient(good.url, username=good.username, password=good.password) as good_client,
            RapiClient(
                sick.url, username=sick.username, password=sick.password, retry=RetryPolicy(attempts=1)
            ) as sick_client,
            RapiClient(_dead_url(), username="x", password="y", retry=RetryPolicy(attempts=1)) as dead_client,
        ):
            monitor = HealthMonitor(
                {"good": good_client, "sick": sick_client, "dead": dead_client},
                timeout=2.0, fail_after=2, recover_after=2, webhook=f"http://127.0.0.1:{port}/hook",
            )  # fmt: skip
            monitor.on_change.append(changes.append)
            sick.inject_fault("503", path="/version")
            with caplog.at_level(logging.WARNING, logger="synnefo_ganeti.health"):
                assert await monitor.run_once() == []
                second = await monitor.run_once()
            assert sorted((c.backend, c.up) for c in second) == [("dead", False), ("sick", False)]
            assert monitor.tracker.is_up("good") and monitor.tracker.state("good").cluster
            assert "backend sick is down" in caplog.text and "503" in (
                monitor.tracker.state("sick").last_error or ""
            )
            assert "down: ['sick', 'dead']" in repr(monitor) or "down: ['dead', 'sick']" in repr(monitor)
            sick.clear_faults()
            assert await monitor.run_once() == []
            (back,) = await monitor.run_once()
            assert (back.backend, back.up) == ("sick", True)
            assert not monitor.tracker.is_up("dead")
    finally:
        await runner.cleanup()
    assert [(c.backend, c.up) for c in changes] == [(c["backend"], c["state"] == "up") for c in received]
    assert sorted(c["backend"] for c in received if c["state"] == "down") == ["dead", "sick"]
    assert [c["backend"] for c in received if c["state"] == "up"] == ["sick"]


async def test_a_broken_webhook_and_listener_do_not_stop_health_checks(caplog) -> None:
    async with RapiClient(_dead_url(), username="x", password="y", retry=RetryPolicy(attempts=1)) as dead:
        monitor = HealthMonitor({"dead": dead}, timeout=1.0, fail_after=1, webhook=_dead_url() + "/hook")

        def broken(change: HealthChange) -> None:
            raise RuntimeError("listener bug")

        monitor.on_change.append(broken)
        with caplog.at_level(logging.WARNING, logger="synnefo_ganeti.health"):
            (change,) = await monitor.run_once()
        assert not change.up
        assert "a health listener failed" in caplog.text and "health webhook failed for dead" in caplog.text
