"""``synnefo-ganeti incidents list [--open] [--backend B] [--json]`` on both databases."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from click.testing import CliRunner, Result

from synnefo_ganeti.cli import main
from synnefo_ganeti.store import IncidentStore, Store


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


async def test_incidents_list(db_url: str) -> None:
    async with Store(db_url) as store:
        empty = await asyncio.to_thread(run, "incidents", "list", "--db", db_url)
        assert empty.exit_code == 0 and empty.output.strip() == "no incidents stored", empty.output
        incidents = IncidentStore(store)
        node = await incidents.open_incident("node-down", "athens", node="n3", detail="down for 130 s")
        await incidents.set_repair(node.id, "fence", job_id=7)
        await incidents.close_incident(node.id, "repaired", detail="fenced; n3 marked offline (job 7)")
        vm = await incidents.open_incident(
            "instance-stopped", "sparta", node="n1", instance="vm1", detail="report only"
        )

    listed = await asyncio.to_thread(run, "incidents", "list", "--db", db_url, "--json")
    assert listed.exit_code == 0, listed.output
    rows: list[dict[str, Any]] = json.loads(listed.output)
    assert [r["id"] for r in rows] == [vm.id, node.id]  # newest first
    first = rows[1]
    assert {k: first[k] for k in ("kind", "backend", "node", "instance", "action", "job", "outcome")} == {
        "kind": "node-down", "backend": "athens", "node": "n3", "instance": None, "action": "fence",
        "job": 7, "outcome": "repaired",
    }  # fmt: skip
    assert first["opened"] and first["closed"]

    only_open = json.loads(
        (await asyncio.to_thread(run, "incidents", "list", "--db", db_url, "--open", "--json")).output
    )
    assert [r["id"] for r in only_open] == [vm.id]
    athens = json.loads(
        (
            await asyncio.to_thread(run, "incidents", "list", "--db", db_url, "--backend", "athens", "--json")
        ).output
    )
    assert [r["id"] for r in athens] == [node.id]

    table = await asyncio.to_thread(run, "incidents", "list", "--db", db_url)
    assert table.exit_code == 0
    for text in ("node-down", "instance-stopped", "fence", "repaired", "open", "fenced; n3 marked offline"):
        assert text in table.output, table.output
    none = await asyncio.to_thread(run, "incidents", "list", "--db", db_url, "--open", "--backend", "athens")
    assert none.output.strip() == "no open incidents stored for backend athens"
