"""A console in a process of its own (``synnefo-ganeti web`` beside ``synnefo-ganeti dispatcher``):
what it knows of the dispatcher comes from the database alone (issue 30 item 5).

The dispatcher and the console each open their own :class:`Store` on one SQLite file, as two
processes do; nothing links them in memory (the console is not served by the dispatcher, no
``on_reconcile`` listener). The console shows the dispatcher alive with its backends, its
reconcile pass's report on the drift page, and, once it stopped, that it stopped."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from synnefo_ganeti.config import Settings
from synnefo_ganeti.console import Console
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.store import StatusStore, Store
from synnefo_ganeti.testing import FakeGaneti
from tests.helpers import eventually
from tests.unit.test_console import login, write_users


async def test_a_console_of_its_own_sees_the_dispatcher_through_the_database(
    tmp_path: Path,
) -> None:
    users, tokens = write_users(tmp_path)
    db_url = f"sqlite:///{tmp_path / 'store.db'}"
    async with FakeGaneti(tls=False, nodes=2) as fake:
        settings = Settings(
            database={"url": db_url},
            backends=[
                {"name": "alpha", "url": fake.url, "username": fake.username, "password": fake.password}
            ],
            dispatcher={"status_port": None, "report_interval": 0.1, "shutdown_timeout": 5.0},
            reconcile={"interval": 3600},
            web={"users_file": str(users), "tokens_file": str(tokens), "secure_cookies": False},
        )
        async with Store(db_url) as dispatcher_store, Store(db_url) as console_store:
            dispatcher = Dispatcher(settings, store=dispatcher_store, status_server=False)
            running = asyncio.create_task(dispatcher.run())
            console = Console(settings, store=console_store, capacity_interval=0.2, live_interval=0.05)
            client: TestClient[Any, Any] = TestClient(TestServer(console.build()))
            await client.start_server()
            try:
                await dispatcher.ready.wait()
                await login(client, "bob")
                status = StatusStore(console_store)

                async def reported() -> bool:
                    found = await status.dispatchers()
                    return bool(found) and found[0].alive() and "alpha" in found[0].state["backends"]

                await eventually(reported, what="the dispatcher's report in the database")
                page = await (await client.get("/")).text()
                card = page.split('id="dispatchers"', 1)[1].split("</section>", 1)[0]
                assert (
                    f'data-id="{dispatcher.id}"' in card and 'data-alive="yes"' in card and ">alive<" in card
                )
                assert "<td>alpha</td>" in card and "open" in card

                drift = await (await client.get("/drift")).text()
                assert "no report yet" in drift  # no pass yet: nothing stored
                report = await dispatcher.reconcile_once()
                assert report is not None
                drift = await (await client.get("/drift")).text()
                section = drift.split('id="drift-alpha"', 1)[1].split("</section>", 1)[0]
                assert "no report yet" not in section and f"by {dispatcher.id}" in section
                assert "clean" in section or "drifts" in section
            finally:
                dispatcher.stop()
                assert await running == 0
            stopped = (await status.dispatchers())[0]
            assert stopped.stopped_at is not None and not stopped.alive() and not stopped.healthy
            page = await (await client.get("/")).text()
            card = page.split('id="dispatchers"', 1)[1].split("</section>", 1)[0]
            assert 'data-alive="no"' in card and "stopped" in card
            await client.close()


async def test_a_dispatcher_that_stops_reporting_is_not_alive_and_the_audit_log(db_url: str) -> None:
    """A report older than three intervals is a dispatcher that is not alive, whatever it said; the
    audit log gives the newest action first (both databases)."""
    async with Store(db_url) as store:
        status = StatusStore(store)
        started = datetime.now(UTC)
        await status.report_dispatcher(
            "d1", host="h", pid=1, started_at=started, interval=1.0, healthy=True, state={"tasks": []}
        )
        (report,) = await status.dispatchers()
        assert report.alive() and report.to_json()["alive"] is True
        later = report.heartbeat_at + timedelta(seconds=3.5)
        assert not report.alive(later) and report.to_json(later)["alive"] is False
        entry = await status.audit("alice", "node-drain", via="console", backend="b", target="n1", job_id=7)
        await status.audit("bob", "node-undrain", via="cli", backend="b", target="n1", outcome="refused")
        log = await status.audit_log()
        assert [r.action for r in log] == ["node-undrain", "node-drain"] and log[1].id == entry
        assert [r.actor for r in await status.audit_log(actor="alice")] == ["alice"]
        assert log[1].to_json()["job_id"] == 7 and log[0].outcome == "refused"
