"""The console's maintenance page (issue 30 item 5): the runs the CLI stored, with their progress,
where each is, a killed run told apart; one run's plan group by group; both databases."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from synnefo_ganeti.config import Settings
from synnefo_ganeti.console import Console
from synnefo_ganeti.store import Store
from synnefo_ganeti.store.operations._maintenance import MaintenanceStore
from tests.unit.test_console import login, write_users

PLAN = {
    "groups": [
        {"nodes": ["n2", "n3"], "master": False, "moves": [{"instance": "vm1", "from": "n2", "to": "n1"}]},
        {"nodes": ["n1"], "master": True, "moves": []},
    ],
    "master": "n1", "skipped": [], "problems": [], "options": {},
}  # fmt: skip


async def test_the_maintenance_page_shows_runs_and_their_progress(tmp_path: Path, db_url: str) -> None:
    users, tokens = write_users(tmp_path)
    settings = Settings(
        database={"url": db_url},
        backends=[
            {"name": b, "url": "http://127.0.0.1:9", "username": "u", "password": "p"}
            for b in ("alpha", "beta")
        ],
        web={"users_file": str(users), "tokens_file": str(tokens), "secure_cookies": False},
    )
    async with Store(db_url) as store:
        runs = MaintenanceStore(store)
        position = {
            "group": 0,
            "phase": "command",
            "node": "n3",
            "done": [],
            "steps_done": 7,
            "steps_total": 17,
        }
        alive, _ = await runs.begin("alpha", owner="me", started_by="alice@host", stale_after=60,
                                    new=("reboot {node}", PLAN, position))  # fmt: skip
        killed, _ = await runs.begin("beta", owner="gone", started_by="bob@host", stale_after=60,
                                     new=("upgrade {node}", PLAN, {**position, "steps_done": 3}))  # fmt: skip
        await store.call(lambda conn: conn.exec_driver_sql(
            "UPDATE maintenance_runs SET heartbeat_at = started_at - interval '1 hour' WHERE backend = 'beta'"
            if store.dialect == "postgresql" else
            "UPDATE maintenance_runs SET heartbeat_at = datetime(started_at, '-1 hour') WHERE backend = 'beta'"
        ))  # fmt: skip
        console = Console(settings, store=store)
        client: TestClient[Any, Any] = TestClient(TestServer(console.build()))
        await client.start_server()
        try:
            await login(client, "bob")  # a viewer reads it
            text = await (await client.get("/maintenance")).text()
            assert 'href="/maintenance" aria-current="page">Maintenance</a>' in text
            assert f'data-run="{alive.id}"' in text and f'data-run="{killed.id}"' in text
            assert '<progress max="100" value="41">' in text and "7/17" in text
            assert "group 1: command n3" in text and "reboot {node}" in text
            assert text.count("not running (killed?)") == 1
            one = await (await client.get(f"/maintenance/{alive.id}")).text()
            assert "Maintenance of alpha" in one and "vm1 n2 → n1" in one
            assert "n1 <small>(master: handed over first)</small>" in one
            assert '<tr class="group-now"><td>1</td><td>n2, n3' in one
            assert (await client.get("/maintenance/nope")).status == 404
        finally:
            await client.close()
