"""``synnefo-ganeti nodes list|show|drain|undrain`` on the fake Ganeti (issue 30, item 1), on both
databases: tables and ``--json``, a backend that does not answer (listed, exit 1), unknown names
and the master's refusal as ``error: ...`` with exit 1, and no database at all."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from click.testing import CliRunner, Result

from synnefo_ganeti.cli import main
from synnefo_ganeti.store import NodeRow, StatusStore, Store
from synnefo_ganeti.testing import FakeGaneti

N1, N2, N3 = (f"node{i}.fake.test" for i in range(1, 4))


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


async def run(*args: str) -> Result:
    return await asyncio.to_thread(cli, *args)


def write_config(path: Path, db_url: str, fake: FakeGaneti, *, dead: bool = False) -> str:
    text = (
        f'[database]\nurl = "{db_url}"\n\n[[backends]]\nname = "f1"\nurl = "{fake.url}"\n'
        f'username = "{fake.username}"\npassword = "{fake.password}"\n'
    )
    if dead:  # nothing answers at a closed port
        text += '\n[[backends]]\nname = "f0"\nurl = "http://127.0.0.1:9"\nusername = "u"\npassword = "p"\ntimeout = 2\n'
    path.write_text(text)
    return str(path)


async def test_nodes_list_and_show(tmp_path: Path, db_url: str) -> None:
    async with FakeGaneti(tls=False, nodes=3) as fake:
        async with Store(db_url) as store:
            await store.set_backend_nodes("f1", {N3: NodeRow("down", None, "job 4: Error 7")})
        config = write_config(tmp_path / "config.toml", db_url, fake)
        listed = await run("nodes", "list", "--config", config)
        assert listed.exit_code == 0, listed.output
        assert N1 in listed.output and "master" in listed.output and "down since" in listed.output
        as_json = json.loads((await run("nodes", "list", "--config", config, "--json")).output)
        (backend,) = as_json["backends"]
        assert backend["backend"] == "f1" and backend["error"] is None
        by_name = {n["name"]: n for n in backend["nodes"]}
        assert by_name[N1]["role"] == "master" and by_name[N2]["state"] is None
        assert by_name[N3]["state"] == "down" and by_name[N3]["state_detail"] == "job 4: Error 7"
        assert {"memory_total", "memory_used", "memory_free", "disk_total", "disk_used", "disk_free",
                "cpus", "primary_instances", "secondary_instances", "group", "read_at"} <= set(by_name[N1])  # fmt: skip
        shown = await run("nodes", "show", "f1", N3, "--config", config)
        assert shown.exit_code == 0, shown.output
        assert f"node {N3} of backend f1, as of" in shown.output and "down since" in shown.output
        one = json.loads((await run("nodes", "show", "f1", N2, "--config", config, "--json")).output)
        assert one["name"] == N2 and one["backend"] == "f1" and one["group"] == "default"
        only = json.loads(
            (await run("nodes", "list", "--backend", "f1", "--config", config, "--json")).output
        )
        assert [b["backend"] for b in only["backends"]] == ["f1"]


async def test_nodes_errors_and_a_backend_not_answering(tmp_path: Path, db_url: str) -> None:
    async with FakeGaneti(tls=False, nodes=3) as fake:
        config = write_config(tmp_path / "config.toml", db_url, fake, dead=True)
        listed = await run("nodes", "list", "--config", config)
        assert listed.exit_code == 1
        assert N1 in listed.output and "error: backend f0 did not answer" in listed.output
        as_json = await run("nodes", "list", "--config", config, "--json")
        assert as_json.exit_code == 1
        f0 = next(b for b in json.loads(as_json.stdout)["backends"] if b["backend"] == "f0")
        assert f0["nodes"] == [] and f0["error"]
        missing = await run("nodes", "show", "f1", "nope.fake.test", "--config", config)
        assert missing.exit_code == 1 and "error: backend f1 has no node 'nope.fake.test'" in missing.output
        unknown = await run("nodes", "list", "--backend", "nope", "--config", config)
        assert unknown.exit_code == 1 and "error: unknown backend 'nope'" in unknown.output


async def test_nodes_drain_and_undrain(tmp_path: Path, db_url: str) -> None:
    async with Store(db_url):  # the database exists: each action goes to its audit log
        pass
    async with FakeGaneti(tls=False, nodes=3) as fake:
        config = write_config(tmp_path / "config.toml", db_url, fake)
        drained = await run("nodes", "drain", "f1", N2, "--config", config)
        assert drained.exit_code == 0, drained.output
        assert f"node {N2} of backend f1 drained" in drained.output and fake.cluster.nodes[N2].drained
        listed = json.loads((await run("nodes", "list", "--config", config, "--json")).output)
        assert {n["name"]: n["role"] for n in listed["backends"][0]["nodes"]}[N2] == "drained"
        undrained = await run("nodes", "undrain", "f1", N2, "--config", config, "--json")
        assert undrained.exit_code == 0 and json.loads(undrained.output)["drained"] is False
        assert not fake.cluster.nodes[N2].drained
        master = await run("nodes", "drain", "f1", N1, "--config", config)
        assert master.exit_code == 1 and "error: node" in master.output and "master-failover" in master.output
        assert not fake.cluster.nodes[N1].drained
    async with Store(db_url) as store:
        log = await StatusStore(store).audit_log()
    assert [(e.action, e.target, e.via, e.outcome) for e in log] == [
        ("node-drain", N1, "cli", "refused"),
        ("node-undrain", N2, "cli", "ok"),
        ("node-drain", N2, "cli", "ok"),
    ]


async def test_nodes_list_without_a_database(tmp_path: Path) -> None:
    async with FakeGaneti(tls=False, nodes=2) as fake:
        config = write_config(tmp_path / "config.toml", f"sqlite:///{tmp_path / 'none.db'}", fake)
        listed = await run("nodes", "list", "--config", config)
        assert listed.exit_code == 0, listed.output
        assert "not read" in listed.output and not (tmp_path / "none.db").exists()
