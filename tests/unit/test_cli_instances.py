"""``synnefo-ganeti instances list|show`` over a real database."""

from __future__ import annotations

import asyncio
import json

from click.testing import CliRunner

from synnefo_ganeti.cli import main
from synnefo_ganeti.store import InstanceAction, InstanceStatus, Store


async def test_instances_list_and_show(tmp_path, db_url) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'[database]\nurl = "{db_url}"\n')
    async with Store(db_url) as store:
        await store.add_instance(
            "b1", "vm2", status=InstanceStatus.STOPPED, beparams={"maxmem": 512, "vcpus": 2}
        )
        await store.add_instance("b1", "vm1", tags=["synnefo-ganeti:owned"])
        await store.record_instance_job("b1", "vm1", 7, InstanceAction.CREATE, start=True)
        await store.add_instance("b2", "vm3", status=InstanceStatus.STARTED)

    def run(*args: str):
        return CliRunner().invoke(main, list(args), catch_exceptions=False)

    listed = await asyncio.to_thread(run, "instances", "list", "--config", str(config), "--json")
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.output)
    assert [(r["backend"], r["name"], r["status"]) for r in rows] == [
        ("b1", "vm1", "BUILD"), ("b1", "vm2", "STOPPED"), ("b2", "vm3", "STARTED"),
    ]  # fmt: skip
    stopped = await asyncio.to_thread(
        run, "instances", "list", "--config", str(config), "--json", "--status", "STOPPED"
    )
    assert [r["name"] for r in json.loads(stopped.output)] == ["vm2"]
    table = await asyncio.to_thread(run, "instances", "list", "--config", str(config), "--backend", "b1")
    assert (
        table.exit_code == 0 and "vm2" in table.output and "vm3" not in table.output and "512" in table.output
    )

    shown = await asyncio.to_thread(run, "instances", "show", "b1", "vm1", "--config", str(config), "--json")
    assert shown.exit_code == 0, shown.output
    one = json.loads(shown.output)
    assert one["status"] == "BUILD" and one["create_job_id"] == 7
    assert [(j["job_id"], j["action"], j["result"]) for j in one["jobs"]] == [(7, "create", None)]
    text = await asyncio.to_thread(run, "instances", "show", "b1", "vm1", "--config", str(config))
    assert text.exit_code == 0 and "create" in text.output
    missing = await asyncio.to_thread(run, "instances", "show", "b1", "nope", "--config", str(config))
    assert missing.exit_code == 1 and "instance nope of backend 'b1' is not in the database" in missing.output
