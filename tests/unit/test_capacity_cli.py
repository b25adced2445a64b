"""``synnefo-ganeti backends capacity`` on the fake Ganeti (issue 30 item 4): the table and
``--json``, the policy's standard size when no flavor is given, a hosted instance counted, a
backend that does not answer (its error, exit 1, the others counted), and what the command
refuses (a bad flavor, an unknown backend, a config without backends)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from click.testing import CliRunner, Result

from synnefo_ganeti.allocate import Flavor
from synnefo_ganeti.cli import main
from synnefo_ganeti.config import Settings
from synnefo_ganeti.control import ControlPlane
from synnefo_ganeti.testing import FakeGaneti
from tests.helpers import spec

# the fake's nodes: 32768 MiB, 1024 of them the node's, 8 CPUs (all 8 its OS's: ``cnos``)


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


async def run(*args: str) -> Result:
    return await asyncio.to_thread(cli, *args)


def write_config(path: Path, fake: FakeGaneti | None, *, dead: bool = False) -> str:
    text = f'[database]\nurl = "sqlite:///{path.parent}/db.sqlite"\n'
    if fake is not None:
        text += (
            f'\n[[backends]]\nname = "f1"\nurl = "{fake.url}"\n'
            f'username = "{fake.username}"\npassword = "{fake.password}"\n'
        )
    if dead:  # nothing answers at a closed port
        text += '\n[[backends]]\nname = "f0"\nurl = "http://127.0.0.1:9"\nusername = "u"\npassword = "p"\ntimeout = 2\n'
    path.write_text(text)
    return str(path)


async def test_capacity_table_and_json(tmp_path: Path) -> None:
    async with FakeGaneti(tls=False, nodes=3) as fake:
        config = write_config(tmp_path / "config.toml", fake)
        shown = await run(
            "backends", "capacity", "--config", config, "--flavor", "memory=4096,vcpus=1,disk=1024",
            "--flavor", "memory=8G,vcpus=1,disk=1G",
        )  # fmt: skip
        assert shown.exit_code == 0, shown.output
        lines = [line for line in shown.output.splitlines() if "memory=" in line]
        # 31744 MiB free a node: 7 of 4 GiB each (21), keeping one node's 7 free: 14; 3 of 8 GiB: 9, 6
        assert len(lines) == 2 and "f1" in lines[0] and "diskless" in lines[0]
        cells = [[cell.strip() for cell in line.split("│")][1:-1] for line in lines]
        assert cells[0][:7] == [
            "f1",
            "memory=4096,vcpus=1,disk=1024",
            "diskless",
            "21",
            "memory",
            "14",
            "N+1",
        ]
        assert cells[1][:7] == ["f1", "memory=8192,vcpus=1,disk=1024", "diskless", "9", "memory", "6", "N+1"]
        out = json.loads((await run("backends", "capacity", "--config", config, "--json", "--flavor",
                                    "memory=4096,vcpus=1,disk=1024", "--flavor", "memory=8192,vcpus=1,disk=1024")).output)  # fmt: skip
        (backend,) = out["backends"]
        assert backend["backend"] == "f1" and backend["error"] is None and backend["template"] == "diskless"
        assert (backend["nodes"], backend["nodes_total"], backend["cluster"]) == (3, 3, "cluster.fake.test")
        counts = [(f["flavor"]["memory"], f["now"], f["n_plus_1"], f["limit_now"], f["limit_n_plus_1"]) for f in backend["flavors"]]  # fmt: skip
        assert counts == [(4096, 21, 14, "memory", "N+1"), (8192, 9, 6, "memory", "N+1")]
        assert set(backend["flavors"][0]["per_node"]) == {f"node{i}.fake.test" for i in (1, 2, 3)}


async def test_the_standard_size_and_a_hosted_instance(tmp_path: Path) -> None:
    async with FakeGaneti(tls=False, nodes=3) as fake:
        config = write_config(tmp_path / "config.toml", fake)
        out = json.loads((await run("backends", "capacity", "--config", config, "--json")).output)
        (standard,) = out["backends"][0]["flavors"]
        settings = Settings.from_file(Path(config))
        async with ControlPlane(settings) as cp:
            client = await cp.client("f1")
            std = (await client.info()).ipolicy["std"]
            assert standard["flavor"] == {
                "memory": std["memory-size"],
                "vcpus": std["cpu-count"],
                "disk": std["disk-size"],
            }
            # an instance of 8 GiB on node1 takes memory there, and must be able to move keeping N+1
            job = await client.create_instance(spec("big.fake.test", memory=8192, pnode="node1.fake.test"))
            await client.wait_for_job(job, timeout=30)
            (answer,) = await cp.capacity([Flavor(4096, 1, 1024)])
        (count,) = answer.flavors
        # node1 has 31744 - 8192 free: 5 of 4 GiB; nodes 2 and 3 still 7
        assert count.now == 19 and count.per_node["node1.fake.test"][0] == 5
        assert count.n_plus_1 is not None and count.n_plus_1 < 14


async def test_a_backend_not_answering_is_reported_and_the_others_counted(tmp_path: Path) -> None:
    async with FakeGaneti(tls=False, nodes=3) as fake:
        config = write_config(tmp_path / "config.toml", fake, dead=True)
        shown = await run("backends", "capacity", "--config", config)
        assert shown.exit_code == 1
        assert "f1" in shown.output and "error: backend f0:" in shown.output
        as_json = await run("backends", "capacity", "--config", config, "--json")
        assert as_json.exit_code == 1
        by_name = {b["backend"]: b for b in json.loads(as_json.stdout)["backends"]}
        assert by_name["f0"]["flavors"] == [] and by_name["f0"]["error"]
        assert by_name["f1"]["error"] is None and by_name["f1"]["flavors"][0]["now"] > 0
        only = json.loads(
            (await run("backends", "capacity", "--config", config, "--json", "--backend", "f1")).output
        )
        assert [b["backend"] for b in only["backends"]] == ["f1"]


async def test_what_the_command_refuses(tmp_path: Path) -> None:
    async with FakeGaneti(tls=False, nodes=3) as fake:
        config = write_config(tmp_path / "config.toml", fake)
        bad = await run("backends", "capacity", "--config", config, "--flavor", "memory=4096,vcpus=1")
        assert bad.exit_code == 2 and "missing disk" in bad.output
        unknown = await run("backends", "capacity", "--config", config, "--backend", "nope")
        assert unknown.exit_code == 1 and "error: unknown backend 'nope'" in unknown.output
        drbd = await run("backends", "capacity", "--config", config, "--disk-template", "drbd")
        assert drbd.exit_code == 0 and "is not counted (DRBD: two nodes)" in drbd.output
        policy = await run(
            "backends", "capacity", "--config", config, "--flavor", "memory=1G,vcpus=99,disk=1G"
        )
        assert policy.exit_code == 0 and "outside the instance policy's bounds" in policy.output
    empty = write_config(tmp_path / "empty.toml", None)
    none = await run("backends", "capacity", "--config", empty)
    assert none.exit_code == 2 and "defines no backends" in none.output
