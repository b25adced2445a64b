"""A step of the dispatcher's shutdown that fails: the steps after it are taken all the same.

``run()`` raises the failure, after: the status server stopped (its port free), the dispatcher's
lock given back (on PostgreSQL another process sees it gone), the store it opened closed. What a
``Dispatcher`` inside a cloud API's process must leave behind when it stops, however it stops.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.dispatch._liveness import DispatcherLock
from synnefo_ganeti.store import Store
from tests.unit.test_dispatcher import backend, fakes, settings_for


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@pytest.mark.parametrize("failing", ["backends", "status"])
async def test_a_failed_shutdown_step_leaves_nothing_held(
    db_url: str, failing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with fakes(1) as (f1,):
        settings = settings_for(db_url, [backend("f1", f1)], status_port=0)
        d = Dispatcher(settings)  # (its own store: closed by run())
        run = asyncio.create_task(d.run())
        await asyncio.wait_for(d.ready.wait(), 30)
        assert d.status is not None and d._lock is not None
        port = d.status.port
        lock = d._lock
        assert not _port_free(port)

        async def fails(*_args: Any) -> None:
            raise RuntimeError(f"injected: the {failing} would not stop")

        if failing == "backends":  # the followers' stop, in the shutdown's tail
            monkeypatch.setattr(d, "_remove_backend", fails)
        else:  # the status server's stop, one of the last steps
            status, stop_status = d.status, d.status.stop
            monkeypatch.setattr(status, "stop", fails)
        d.stop()
        with pytest.raises(RuntimeError, match=f"injected: the {failing} would not stop"):
            await asyncio.wait_for(run, 30)
        assert d._store is None  # the store it opened: closed
        assert d._lock is None and lock._conn is None and lock._file is None
        if failing == "backends":
            assert d.status is None and _port_free(port)  # the status server stopped
        else:
            await stop_status()  # (the test's: the server whose stop it made fail)
        if db_url.startswith("postgresql"):
            async with Store(db_url) as other:
                looking = DispatcherLock(other, "another")
                await looking.acquire()
                try:
                    assert not await looking.is_alive(d.id)
                finally:
                    await looking.release()
