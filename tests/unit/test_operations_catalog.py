"""What a backend offers (``cp.catalog(backend)``, ``synnefo-ganeti backends show``), and Ganeti's
values stored after the operations when the dispatcher follows them (its observer); the pure
part of what an operation's end changes (store/instances/_outcomes.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from synnefo_ganeti import ConfigError, ControlPlane, RapiClient
from synnefo_ganeti.allocate import BackendCatalog, OsOffer
from synnefo_ganeti.allocate._offers import os_offers
from synnefo_ganeti.cli import main
from synnefo_ganeti.config import Settings
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.store import InstanceAction, InstanceStatus, Store, StoredInstance
from synnefo_ganeti.store.instances._outcomes import CHANGING_ACTIONS, changes_after
from synnefo_ganeti.testing import FakeGaneti
from tests.helpers import eventually, spec
from tests.unit.test_dispatcher import QUICK, backend, running, settings_for

OSES = ("noop", "debootstrap+default", "debootstrap+minimal")


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


async def with_network(fake: FakeGaneti) -> None:
    """A network on the fake, connected to its one group."""
    async with RapiClient(fake.url, username=fake.username, password=fake.password) as client:
        await client.wait_for_job(await client.create_network("net1", "10.1.0.0/24", gateway="10.1.0.1"))
        await client.wait_for_job(await client.connect_network("net1", "default", "bridged", "br1"))


def config_file(tmp_path: Path, db_url: str, fake: FakeGaneti) -> Path:
    config = tmp_path / "config.toml"
    config.write_text(
        f'[database]\nurl = "{db_url}"\n\n[[backends]]\nname = "f1"\nurl = "{fake.url}"\n'
        f'username = "{fake.username}"\npassword = "{fake.password}"\n'
    )
    return config


async def test_the_catalog_tells_what_a_backend_offers(tmp_path: Path, sqlite_url: str) -> None:
    async with FakeGaneti(tls=False, oses=OSES, ipolicy={"memory-size": (128, 4096)}) as fake:
        await with_network(fake)
        settings = Settings(
            database={"url": sqlite_url},
            backends=[{"name": "f1", "url": fake.url, "username": fake.username, "password": fake.password}],
        )
        async with ControlPlane(settings) as cp:
            catalog = await cp.catalog("f1")
            assert isinstance(catalog, BackendCatalog) and catalog.backend == "f1"
            assert catalog.cluster == "cluster.fake.test"
            assert catalog.oses == (OsOffer("debootstrap", ("default", "minimal")), OsOffer("noop"))
            assert catalog.os_choices() == ("debootstrap+default", "debootstrap+minimal", "noop")
            assert set(catalog.disk_templates) == {"diskless", "file"}
            bounds = catalog.policy.minmax[0]
            assert (bounds["min"]["memory-size"], bounds["max"]["memory-size"]) == (128, 4096)
            assert [group.name for group in catalog.groups] == ["default"]
            assert len(catalog.groups[0].nodes) == 3 and catalog.groups[0].networks == ("net1",)
            (net,) = catalog.networks
            assert (net.name, net.subnet, net.gateway) == ("net1", "10.1.0.0/24", "10.1.0.1")
            assert [(link.group, link.mode, link.link) for link in net.groups] == [
                ("default", "bridged", "br1")
            ]
            assert net.free_count is not None and net.free_count > 200
            assert [node.name for node in catalog.nodes] == [f"node{i}.fake.test" for i in (1, 2, 3)]
            assert all(node.usable and node.group == "default" for node in catalog.nodes)
            assert catalog.memory_free == sum(node.memory_free or 0 for node in catalog.nodes) > 0
            # refreshed with the node stats: an instance's memory is gone from the next one
            await cp.create_instance(spec("vm1.fake.test", memory=1024), backend="f1")

            async def less_free() -> BackendCatalog | None:
                again = await cp.catalog("f1")
                return again if again.memory_free <= catalog.memory_free - 1024 else None

            await eventually(less_free, what="the instance's memory gone from the catalog's node stats")
            as_json = catalog.to_json()
            assert as_json["oses"][0] == {"name": "debootstrap", "variants": ["default", "minimal"]}
            assert as_json["memory_free"] == catalog.memory_free and as_json["networks"][0]["name"] == "net1"
            with pytest.raises(ConfigError, match="nope"):
                await cp.catalog("nope")


async def test_backends_show(tmp_path: Path, sqlite_url: str) -> None:
    async with FakeGaneti(tls=False, oses=OSES) as fake:
        await with_network(fake)
        config = config_file(tmp_path, sqlite_url, fake)
        async with Store(sqlite_url) as store:  # the database tells drain and health
            await store.set_backend_drained("f1", True)
            await store.set_backend_health("f1", True)
        shown = await asyncio.to_thread(run, "backends", "show", "f1", "--config", str(config), "--json")
        assert shown.exit_code == 0, shown.output
        row = json.loads(shown.output)
        assert (row["name"], row["drained"], row["reachable"], row["health"]) == ("f1", True, True, "up")
        catalog = row["catalog"]
        assert row["ganeti_version"] == catalog["ganeti_version"] == "3.0.2"  # the fake's default, 3.0's
        assert [n["name"] for n in catalog["nodes"]] == [f"node{i}.fake.test" for i in (1, 2, 3)]
        assert {"name": "debootstrap", "variants": ["default", "minimal"]} in catalog["oses"]
        assert catalog["networks"][0]["groups"][0] == {
            "group": "default",
            "mode": "bridged",
            "link": "br1",
            "vlan": None,
        }
        table = await asyncio.to_thread(run, "backends", "show", "f1", "--config", str(config))
        assert table.exit_code == 0, table.output
        for text in ("node1.fake.test", "debootstrap (default, minimal)", "net1", "10.1.0.0/24", "drained yes", "(Ganeti 3.0.2)",
                     "memory-size", "default"):  # fmt: skip
            assert text in table.output, text
        unknown = await asyncio.to_thread(run, "backends", "show", "nope", "--config", str(config))
        assert unknown.exit_code == 2 and "nope" in unknown.output


async def test_backends_show_without_a_database_and_an_unreachable_backend(tmp_path: Path) -> None:
    async with FakeGaneti(tls=False) as fake:
        config = config_file(tmp_path, f"sqlite:///{tmp_path / 'none.db'}", fake)
        shown = await asyncio.to_thread(run, "backends", "show", "f1", "--config", str(config), "--json")
        assert shown.exit_code == 0, shown.output
        assert json.loads(shown.output)["health"] == "unknown"
        assert not (tmp_path / "none.db").exists()  # not created
        url = fake.url
    # the fake is gone: not reachable, exit status 1
    down = await asyncio.to_thread(run, "backends", "show", "f1", "--config", str(config), "--json")
    assert down.exit_code == 1
    row = json.loads(down.output)
    assert row["reachable"] is False and row["catalog"] is None and row["error"] and url


async def test_ganeti_values_are_stored_after_the_operations_end(tmp_path: Path, db_url: str) -> None:
    """With the dispatcher following the jobs through RAPI, its observer stores what Ganeti made:
    the new NIC's MAC, the node an allocator chose for a migration."""
    async with FakeGaneti(tls=False, op_times=QUICK) as fake, Store(db_url) as store:
        await with_network(fake)
        settings = settings_for(db_url, [backend("f1", fake)])
        async with (
            running(Dispatcher(settings, store=store, status_server=False)),
            ControlPlane(settings, store=store) as cp,
        ):
            created, _ = await cp.create_instance(
                spec("vm1.fake.test", pnode="node1.fake.test"), backend="f1"
            )

            async def state(check: Any) -> StoredInstance | None:
                instance = await cp.get_instance(created.id)
                return (
                    instance if instance is not None and instance.task is None and check(instance) else None
                )

            await eventually(lambda: state(lambda i: i.status is InstanceStatus.STARTED), what="started")
            await cp.attach_nic(created.id, network="net1", ip="pool")
            with_nic = await eventually(
                lambda: state(lambda i: len(i.nics or []) == 2 and i.nics[1].get("mac")),
                what="the new NIC's MAC",
            )
            nic = with_nic.nics[1]  # type: ignore[index]
            assert nic["network"] == "net1" and nic["ip"].startswith("10.1.0.")
            assert nic["mac"] == fake.cluster.instances["vm1.fake.test"].nics[1]["mac"]
            await cp.migrate_instance(created.id)  # no target: the allocator picks
            moved = await eventually(
                lambda: state(lambda i: i.pnode not in (None, "node1.fake.test")), what="the node chosen"
            )
            assert moved.pnode == fake.cluster.instances["vm1.fake.test"].pnode
            await cp.detach_nic(created.id, index=1)
            await eventually(lambda: state(lambda i: len(i.nics or []) == 1), what="the NIC gone")


def test_what_an_operation_end_changes() -> None:
    row: dict[str, Any] = {
        "beparams": {"maxmem": 256, "minmem": 256},
        "nics": [{"mac": "aa:00:00:00:00:01"}],
        "disks": [{"size": 1024, "uuid": "d0"}],
        "tags": ["synnefo-ganeti:owned"],
    }
    resized = changes_after("resize", {"maxmem": 512, "minmem": 512, "vcpus": 2}, row)
    assert resized == {"beparams": {"maxmem": 512, "minmem": 512, "vcpus": 2}, "memory": 512, "vcpus": 2}
    assert changes_after("grow_disk", {"disk": 0, "amount": 512}, row) == {
        "disks": [{"size": 1536, "uuid": "d0"}]
    }
    assert changes_after("grow_disk", {"disk": 3, "amount": 512}, row) == {}  # not known here: observed later
    assert changes_after("attach_nic", {"nic": {"network": "n"}}, row)["nics"][1] == {"network": "n"}
    assert changes_after("detach_nic", {"index": 0}, row) == {"nics": []}
    assert changes_after("detach_disk", {"index": 5}, row) == {}
    assert changes_after("attach_disk", {"disk": {"size": 1}}, row)["disks"][1] == {"size": 1}
    assert changes_after("rename", {"new_name": "b"}, row) == {"name": "b"}
    assert changes_after("reinstall", {"os": None, "start": True}, row) == {}
    assert changes_after("reinstall", {"os": "debian", "start": True}, row) == {"os": "debian"}
    assert changes_after("migrate", {"target_node": None}, row) == {}
    assert changes_after("failover", {"target_node": "n2"}, row) == {"pnode": "n2"}
    added = changes_after("add_tags", {"tags": ["synnefo-ganeti:a"]}, row)
    assert added == {"tags": ["synnefo-ganeti:a", "synnefo-ganeti:owned"]}
    assert changes_after("remove_tags", {"tags": ["synnefo-ganeti:owned"]}, row) == {"tags": []}
    assert os_offers(["a+x", "b", "a+y", "a+x"]) == (OsOffer("a", ("x", "y")), OsOffer("b"))
    power = {"create", "startup", "shutdown", "reboot", "remove"}
    assert {action.value for action in InstanceAction} - power == CHANGING_ACTIONS
    assert all(len(action.value) <= 16 for action in InstanceAction)  # the action and task columns


def test_a_rename_whose_end_is_not_stored_yet_is_no_drift() -> None:
    """Ganeti renamed ``a`` to ``b``; the database still holds the job as running (its end, which
    renames the row, not applied): neither ``a`` stale nor ``b`` an orphan to delete."""
    from synnefo_ganeti.jobs import JobStatus
    from synnefo_ganeti.reconcile import plan
    from tests.unit.test_reconcile_plan import gnt, job, row, snapshots, stored_job

    renamed = job(9, JobStatus.SUCCESS, instance="a", op="OP_INSTANCE_RENAME")
    renamed.ops[0]["new_name"] = "b"
    db, g = snapshots([row("a", InstanceStatus.STOPPED)], [gnt("b", admin="down", running=False)],
                      db_jobs=[stored_job(9, instance="a")], jobs=[renamed])  # fmt: skip
    # the job's missed end is the one drift (its fix applies the end, which renames the row)
    assert [(d.kind.value, d.instance) for d in plan(db, g)] == [("job", "a")]
    running = job(9, JobStatus.RUNNING, instance="a", op="OP_INSTANCE_RENAME")
    running.ops[0]["new_name"] = "b"
    db, g = snapshots(
        [row("a", InstanceStatus.STOPPED)], [gnt("b", admin="down", running=False)], jobs=[running]
    )
    assert plan(db, g) == []
