"""The daemon's building blocks: /metrics, /healthz, /readyz, and sd_notify over a real unix socket."""

from __future__ import annotations

import socket

import aiohttp
import pytest

from synnefo_ganeti import metrics
from synnefo_ganeti.daemon import StatusServer, SystemdNotifier


async def test_metrics_health_and_readiness() -> None:
    ready = {"database": None, "backends": "no backend is up"}

    async def database() -> str | None:
        return ready["database"]

    async def backends() -> str | None:
        return ready["backends"]

    async def broken() -> str | None:
        raise RuntimeError("check bug")

    metrics.STORE_EVENTS.inc(0)
    async with (
        StatusServer(port=0, checks={"database": database, "backends": backends}) as server,
        aiohttp.ClientSession() as session,
    ):
        assert server.port != 0 and str(server.port) in repr(server)
        async with session.get(server.url + "/metrics") as response:
            text = await response.text()
            assert response.status == 200 and response.content_type.startswith("text/plain")
        assert "synnefo_ganeti_store_events_total" in text and "synnefo_ganeti_watch_bad_files" in text
        async with session.get(server.url + "/healthz") as response:
            assert response.status == 200 and (await response.json()) == {"status": "ok"}
        async with session.get(server.url + "/readyz") as response:
            body = await response.json()
            assert response.status == 503 and body["failing"] == {"backends": "no backend is up"}
        ready["backends"] = None
        async with session.get(server.url + "/readyz") as response:
            assert response.status == 200 and (await response.json())["status"] == "ready"
        server.checks["broken"] = broken
        async with session.get(server.url + "/readyz") as response:
            body = await response.json()
            assert response.status == 503 and body["failing"] == {"broken": "RuntimeError: check bug"}


async def test_a_busy_port_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot serve /metrics on 127.0.0.1:{port}"):
            await StatusServer(port=port).start()


def test_sd_notify_over_a_unix_datagram_socket(tmp_path, monkeypatch) -> None:
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as systemd:
        systemd.bind(path)
        systemd.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        notifier = SystemdNotifier()
        assert notifier.enabled
        assert notifier.ready("watching 2 backends")
        assert systemd.recv(1024) == b"READY=1\nSTATUS=watching 2 backends"
        assert notifier.watchdog() and systemd.recv(1024) == b"WATCHDOG=1"
        assert notifier.stopping() and systemd.recv(1024) == b"STOPPING=1"
        assert notifier.status("draining") and systemd.recv(1024) == b"STATUS=draining"
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert notifier.watchdog_interval() == 15.0
    monkeypatch.setenv("WATCHDOG_PID", "1")
    assert notifier.watchdog_interval() is None
    assert not SystemdNotifier(str(tmp_path / "gone")).ready()  # logged, not raised


def test_without_systemd_nothing_is_sent(monkeypatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    notifier = SystemdNotifier()
    assert not notifier.enabled and not notifier.ready() and not notifier.watchdog()
    assert SystemdNotifier("@abstract").address == "\0abstract"
