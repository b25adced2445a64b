"""``synnefo-ganeti backends drain|undrain``: the database remembers, the facade refuses new instances."""

from __future__ import annotations

import asyncio
import json

import pytest
from click.testing import CliRunner

from synnefo_ganeti import ControlPlane, GanetiError, InstanceSpec
from synnefo_ganeti.cli import main
from synnefo_ganeti.config import Settings
from synnefo_ganeti.store import Store
from synnefo_ganeti.testing import FakeGaneti


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


async def test_drain_and_undrain(tmp_path, db_url) -> None:
    async with FakeGaneti(tls=False) as fake:
        config = tmp_path / "config.toml"
        config.write_text(
            f'[database]\nurl = "{db_url}"\n\n[[backends]]\nname = "f1"\nurl = "{fake.url}"\n'
            f'username = "{fake.username}"\npassword = "{fake.password}"\n'
        )
        drained = await asyncio.to_thread(run, "backends", "drain", "f1", "--config", str(config), "--json")
        assert drained.exit_code == 0, drained.output
        assert json.loads(drained.output) == {"backend": "f1", "drained": True, "changed": True}
        again = await asyncio.to_thread(run, "backends", "drain", "f1", "--config", str(config))
        assert again.exit_code == 0 and "was already drained" in again.output
        listed = await asyncio.to_thread(run, "backends", "list", "--config", str(config), "--json")
        assert json.loads(listed.output)["backends"][0]["drained"] is True

        settings = Settings.from_file(config)
        async with ControlPlane(settings) as cp:
            spec = InstanceSpec(name="vm1.fake.test", disk_template="diskless", os="noop")
            with pytest.raises(GanetiError, match="drained by an operator"):
                await cp.create_instance(spec, backend="f1")
            assert await cp.list_instances() == []

        undrained = await asyncio.to_thread(run, "backends", "undrain", "f1", "--config", str(config))
        assert undrained.exit_code == 0 and "takes new instances again" in undrained.output
        async with ControlPlane(settings) as cp:
            instance, job_id = await cp.create_instance(spec, backend="f1")
            assert job_id > 0 and instance.name == "vm1.fake.test"
        async with Store(db_url) as store:
            assert await store.drained_backends() == set()

        unknown = await asyncio.to_thread(run, "backends", "drain", "nope", "--config", str(config))
        assert unknown.exit_code == 2 and "unknown backend 'nope'" in unknown.output
