"""``synnefo-ganeti dispatchers`` and ``synnefo-ganeti audit`` read what the dispatchers and the
operators left in the database (both databases): tables, ``--json``, empty listings said on a
line, exit status 1 when no dispatcher is alive."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

from click.testing import CliRunner, Result

from synnefo_ganeti.cli import main
from synnefo_ganeti.cli._status import audit_cli, cli_actor
from synnefo_ganeti.store import StatusStore, Store


async def arun(*args: str) -> Result:
    return await asyncio.to_thread(lambda: CliRunner().invoke(main, list(args), catch_exceptions=False))


async def test_dispatchers_and_audit_from_the_database(db_url: str) -> None:
    async with Store(db_url) as store:
        empty = await arun("dispatchers", "--db", db_url)
        assert empty.exit_code == 1 and "no dispatcher has reported" in empty.output
        assert "no operator action stored" in (await arun("audit", "--db", db_url)).output
        status = StatusStore(store)
        state = {
            "tasks": ["dispatch submitter"],
            "claims": 2,
            "backends": {"b1": {"in_flight": 3, "pending": 4}},
        }
        now = datetime.now(UTC)
        await status.report_dispatcher(
            "d-live", host="h1", pid=11, started_at=now, interval=60, healthy=True, state=state
        )
        await status.report_dispatcher(
            "d-gone", host="h2", pid=12, started_at=now, interval=60, healthy=False, state={}, stopped=True
        )
        await audit_cli(store, "node-drain", backend="b1", target="node2", job_id=42)
        await audit_cli(store, "node-undrain", backend="b1", target="node2", outcome="refused", detail="no")
    listed = await arun("dispatchers", "--db", db_url)
    assert listed.exit_code == 0, listed.output
    assert (
        "d-live" in listed.output
        and "alive" in listed.output
        and "b1: 3 in flight, 4 pending" in listed.output
    )
    assert "d-gone" in listed.output and "stopped" in listed.output
    found = json.loads((await arun("dispatchers", "--db", db_url, "--json")).output)
    assert {d["id"]: d["alive"] for d in found} == {"d-live": True, "d-gone": False}
    log = json.loads((await arun("audit", "--db", db_url, "--json")).output)
    assert [(e["action"], e["via"], e["actor"], e["job_id"], e["outcome"]) for e in log] == [
        ("node-undrain", "cli", cli_actor(), None, "refused"),
        ("node-drain", "cli", cli_actor(), 42, "ok"),
    ]
    table = (await arun("audit", "--db", db_url, "--backend", "b1", "--limit", "1")).output
    assert "node-undrain" in table and "node-drain" not in table
    assert (
        "no operator action stored matching" in (await arun("audit", "--db", db_url, "--actor", "x")).output
    )
