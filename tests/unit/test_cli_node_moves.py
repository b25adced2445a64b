"""``synnefo-ganeti nodes evacuate|failover`` on a 3-node fake Ganeti, both databases: the report
as a table and as ``--json``, the refusals as ``error:`` lines and exit status 1."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from click.testing import CliRunner, Result

from synnefo_ganeti.cli import main
from synnefo_ganeti.store import InstanceStatus, StatusStore
from synnefo_ganeti.testing import FakeGaneti
from tests.unit.test_node_evacuate import N2, N3, drain, made, plane, spec


def config_for(tmp_path: Path, fake: FakeGaneti, db_url: str) -> Path:
    config = tmp_path / "config.toml"
    config.write_text(
        f'[database]\nurl = "{db_url}"\n\n[[backends]]\nname = "f1"\nurl = "{fake.url}"\n'
        f'username = "{fake.username}"\npassword = "{fake.password}"\n'
    )
    return config


async def cli(*args: str) -> Result:
    return await asyncio.to_thread(CliRunner().invoke, main, list(args), catch_exceptions=False)


async def test_nodes_evacuate(tmp_path: Path, db_url: str) -> None:
    async with plane(tmp_path, db_url) as (fake, cp):
        config = str(config_for(tmp_path, fake, db_url))
        ids = [await made(cp, spec(f"v{i}.fake.test")) for i in range(2)]
        refused = await cli("nodes", "evacuate", "f1", N2, "--config", config)
        assert refused.exit_code == 1 and "not drained: drain it first" in refused.output, refused.output

        await drain(fake, cp, N2)
        done = await cli("nodes", "evacuate", "f1", N2, "--config", config, "--json")
        assert done.exit_code == 0, done.output
        report = json.loads(done.output)
        assert (report["operation"], report["ok"], report["counts"]["moved"]) == ("evacuate", True, 2)
        assert [m["name"] for m in report["moves"]] == ["v0.fake.test", "v1.fake.test"]
        assert all(m["action"] == "migrate" and m["target"] != N2 and m["job_id"] for m in report["moves"])
        for instance_id in ids:
            row = await cp.get_instance(instance_id)
            assert row is not None and row.pnode != N2 and row.status is InstanceStatus.STARTED

        empty = await cli("nodes", "evacuate", "f1", N2, "--config", config)
        assert empty.exit_code == 0 and "0 moved, 0 failed, 0 skipped" in empty.output
        assert "no primary instances on the node" in empty.output
        log = await StatusStore(cp.store).audit_log()
        assert [(e.action, e.outcome, e.via, e.detail) for e in log] == [
            ("node-evacuate", "ok", "cli", "nothing to move"),
            ("node-evacuate-start", "ok", "cli", None),
            ("node-evacuate", "ok", "cli", "2 moved"),
            ("node-evacuate-start", "ok", "cli", None),
            ("node-evacuate", "refused", "cli", log[4].detail),
            ("node-evacuate-start", "ok", "cli", None),
        ]
        assert log[4].detail is not None and "not drained" in log[4].detail


async def test_nodes_failover(tmp_path: Path, db_url: str) -> None:
    async with plane(tmp_path, db_url) as (fake, cp):
        config = str(config_for(tmp_path, fake, db_url))
        await made(cp, spec("a.fake.test", pnode=N3))
        await made(cp, spec("f.fake.test", pnode=N3, disk_template="file", disks=[{"size": 1024}]))
        refused = await cli("nodes", "failover", "f1", N3, "--config", config)
        assert refused.exit_code == 1 and "pass --yes" in refused.output, refused.output

        fake.crash_node(N3)
        done = await cli("nodes", "failover", "f1", N3, "--config", config)
        assert done.exit_code == 1, done.output  # the file instance cannot move: not every one moved
        assert (
            "failover of node node3.fake.test of backend f1: 1 moved, 0 failed, 1 skipped; marked offline"
            in done.output
        )
        assert "a.fake.test" in done.output and "file does not allow migrations" in done.output
        assert (await (await cp.client("f1")).get_node(N3)).offline

        unknown = await cli("nodes", "failover", "nope", N3, "--config", config)
        assert unknown.exit_code == 2 and "unknown backend 'nope'" in unknown.output
