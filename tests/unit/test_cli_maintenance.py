"""``synnefo-ganeti maintenance plan|run|list|show|cancel`` on a 3-node fake Ganeti, both
databases: the plan as a table and ``--json``, a run through a real shell (its master failover
command asks the test to move the fake's master role: RAPI has no call for it), the stored runs,
the refusals as ``error:`` lines."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from synnefo_ganeti.store import StatusStore
from synnefo_ganeti.testing import FakeGaneti
from tests.helpers import eventually
from tests.unit.test_cli_node_moves import cli, config_for
from tests.unit.test_maintenance_run import N1, N2, N3, plane, spec
from tests.unit.test_node_evacuate import made


@asynccontextmanager
async def failovers(fake: FakeGaneti, folder: Path) -> AsyncIterator[str]:
    """A master failover command for the CLI (it writes the new master's name in a file) and the
    test's side of it (the fake's master moves there)."""
    await asyncio.to_thread(folder.mkdir)

    async def serve() -> None:
        while True:
            asked = await eventually(
                lambda: sorted(folder.glob("*.node")), what="a failover asked", timeout=3600
            )
            for request in asked:
                fake.master_failover(request.read_text().strip())
                request.unlink()

    task = asyncio.create_task(serve())
    try:
        yield f"echo {{node}} > {folder}/$$.tmp && mv {folder}/$$.tmp {folder}/$$.node"
    finally:
        task.cancel()


async def test_maintenance_plan_run_list_show_cancel(tmp_path: Path, db_url: str) -> None:
    async with plane(tmp_path, db_url) as (fake, cp), failovers(fake, tmp_path / "asked") as failover:
        config = str(config_for(tmp_path, fake, db_url))
        await made(cp, spec("a.fake.test", pnode=N2))

        table = await cli("maintenance", "plan", "f1", "--config", config)
        assert table.exit_code == 0, table.output
        assert "node1.fake.test (master: handed over first)" in table.output
        assert "a.fake.test node2.fake.test->" in table.output
        plan = json.loads((await cli("maintenance", "plan", "f1", "--config", config, "--json")).output)
        assert [g["nodes"] for g in plan["groups"]] == [[N2, N3], [N1]] and plan["master"] == N1

        nothing = await cli("maintenance", "cancel", "f1", "--config", config)
        assert nothing.exit_code == 1 and "no maintenance run to cancel" in nothing.output
        resume = await cli("maintenance", "run", "f1", "--config", config)
        assert resume.exit_code == 1 and "give the command (--command)" in resume.output

        done = await cli(
            "maintenance", "run", "f1", "--command", "echo rebooting {node}", "--config", config,
            "--master-failover-command", failover, "--json",
        )  # fmt: skip
        assert done.exit_code == 0, done.output
        run = json.loads(done.stdout)
        assert run["status"] == "done" and run["steps_done"] == run["steps_total"] == 17
        assert run["command"] == "echo rebooting {node}"
        assert next(n for n in fake.cluster.nodes.values() if n.master).name == N1
        assert not any(n.drained for n in fake.cluster.nodes.values())
        audit = await StatusStore(cp.store).audit_log(backend="f1", limit=200)
        assert {a.via for a in audit if a.action.startswith("maintenance")} == {"cli"}

        listed = await cli("maintenance", "list", "--config", config)
        assert listed.exit_code == 0 and run["id"] in listed.output and "17/17" in listed.output
        shown = await cli("maintenance", "show", run["id"], "--config", config)
        assert (
            shown.exit_code == 0
            and f"{N1} (master)" in shown.output
            and ": done, 17/17 steps" in shown.output
        )
        unknown = await cli("maintenance", "show", "nope", "--config", config)
        assert unknown.exit_code == 1 and "no maintenance run nope" in unknown.output


async def test_a_failed_run_exits_1_and_says_how_to_resume(tmp_path: Path, db_url: str) -> None:
    async with plane(tmp_path, db_url) as (fake, _cp):
        config = str(config_for(tmp_path, fake, db_url))
        failed = await cli("maintenance", "run", "f1", "--command", "exit 3 # {node}", "--config", config)
        assert failed.exit_code == 1, failed.output
        assert "failed" in failed.output and "exited 3" in failed.output
        assert "synnefo-ganeti maintenance run f1" in failed.output
        canceled = await cli("maintenance", "cancel", "f1", "--config", config, "--json")
        assert canceled.exit_code == 0 and json.loads(canceled.stdout)["status"] == "canceled"
