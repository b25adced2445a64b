"""The network drifts in the reconciler's pass and in ``synnefo-ganeti reconcile``: found beside
the instances' drifts, in the report and its JSON, fixed only when asked (both databases)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from synnefo_ganeti.cli import main
from synnefo_ganeti.config import Settings
from synnefo_ganeti.control import ControlPlane
from synnefo_ganeti.reconcile import Reconciler
from synnefo_ganeti.testing import FakeGaneti
from tests import helpers

B = "athens"
OWNED = "synnefo-ganeti:owned"
QUICK = {name: 0.01 for name in ("OP_NETWORK_ADD", "OP_NETWORK_CONNECT", "OP_NETWORK_DISCONNECT",
                                 "OP_NETWORK_REMOVE", "OP_NETWORK_SET_PARAMS")}  # fmt: skip


def write_config(tmp_path: Path, db_url: str, fake: FakeGaneti) -> Path:
    path = tmp_path / "synnefo-ganeti.toml"
    path.write_text(
        f'[database]\nurl = "{db_url}"\n\n[[backends]]\nname = "{B}"\nurl = "{fake.url}"\n'
        f'username = "{fake.username}"\npassword = "{fake.password}"\n'
    )
    return path


async def cli(*args: str) -> Any:
    return await asyncio.to_thread(CliRunner().invoke, main, list(args), catch_exceptions=False)


def network_kinds(data: dict[str, Any]) -> list[tuple[str, str, bool]]:
    return [(d["kind"], d["network"], d["fixed"]) for d in data["backends"][0]["networks"]]


async def test_network_drifts_in_the_pass_and_the_cli(db_url: str, tmp_path: Path) -> None:
    async with FakeGaneti(tls=False, op_times=QUICK) as fake, helpers.fake_client(fake) as client:
        config = write_config(tmp_path, db_url, fake)
        settings = Settings.from_file(config)
        async with ControlPlane(settings) as cp:
            await cp.create_network("cnet-lost", subnet="10.3.0.0/29", gateway="10.3.0.1")
        # behind the control plane's back: ours removed from Ganeti, one of ours Ganeti alone has
        await client.wait_for_job(await client.disconnect_network("cnet-lost", "default"))
        await client.wait_for_job(await client.delete_network("cnet-lost"))
        await client.wait_for_job(await client.create_network("cnet-extra", "10.4.0.0/29", tags=[OWNED]))

        async with Reconciler(settings) as reconciler:
            report = await reconciler.run_once()
        (backend,) = report.backends
        assert backend.ok and backend.drifts == [], backend.error
        assert [(d.kind.value, d.network, d.fixed) for d in backend.networks] == [
            ("network_orphan", "cnet-extra", False),
            ("network_stale", "cnet-lost", False),
        ]
        assert not report.clean and report.summary() == f"{B}: 2 drifts, 0 fixed"
        assert "cnet-lost" not in fake.cluster.model.networks  # report-only

        found = await cli("reconcile", "--config", str(config), "--json")
        assert found.exit_code == 1, found.output
        assert network_kinds(json.loads(found.stdout)) == [
            ("network_orphan", "cnet-extra", False),
            ("network_stale", "cnet-lost", False),
        ]
        table = await cli("reconcile", "--config", str(config))
        assert table.exit_code == 1 and "network drifts" in table.output and "cnet-lost" in table.output

        # one kind asked for: only that one is fixed (the network is made again in Ganeti)
        stale = await cli("reconcile", "--config", str(config), "--json", "--fix-network-stale")
        assert network_kinds(json.loads(stale.stdout)) == [
            ("network_orphan", "cnet-extra", False),
            ("network_stale", "cnet-lost", True),
        ]
        assert "cnet-lost" in fake.cluster.model.networks and "cnet-extra" in fake.cluster.model.networks

        fixed = await cli("reconcile", "--config", str(config), "--json", "--fix-all", "--delete-orphans")
        assert network_kinds(json.loads(fixed.stdout)) == [("network_orphan", "cnet-extra", True)]
        clean = await cli("reconcile", "--config", str(config), "--json")
        assert clean.exit_code == 0, clean.output
        assert json.loads(clean.stdout)["backends"][0]["networks"] == []
        assert sorted(fake.cluster.model.networks) == ["cnet-lost"]
