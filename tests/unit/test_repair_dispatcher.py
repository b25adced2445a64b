"""Repair by policy end to end: the dispatcher's ``dispatch repair`` task on a 3-node fake Ganeti
whose queue the watcher stores, on both databases. A node that dies: incidents opened, the node
fenced by ``fence_command`` and marked offline, its instances failed over, incidents closed; report
only by default (nothing sent, incidents closed when the problem goes away); an instance that
should run started, one a user stopped left alone; harep's tags gate each repair."""

from __future__ import annotations

import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from synnefo_ganeti import ControlPlane, Instance, RapiClient
from synnefo_ganeti.allocate._repair import plan_repairs
from synnefo_ganeti.config import Settings
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.store import Incident, IncidentStore, InstanceStatus, Store
from synnefo_ganeti.testing import FakeGaneti
from tests import helpers
from tests.unit.test_dispatcher import running
from tests.unit.test_operations import QUICK, settled

N1, N2, N3 = "node1.fake.test", "node2.fake.test", "node3.fake.test"
OPS = {**QUICK, "OP_NODE_SET_PARAMS": 0.01}
FAILOVER_TAG = "ganeti:watcher:autorepair:failover"


def fence_script(tmp_path: Path) -> tuple[str, Path]:
    """A fence command that records the node it was called with (the fake's node is crashed)."""
    log = tmp_path / "fenced.log"
    script = tmp_path / "fence.sh"
    script.write_text(f'#!/bin/sh\necho "$1" >> {log}\necho "powered off $1"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return f"{script} {{node}}", log


@asynccontextmanager
async def lab(
    tmp_path: Path, db_url: str, **repair: Any
) -> AsyncIterator[tuple[FakeGaneti, ControlPlane, Dispatcher, RapiClient]]:
    queue = tmp_path / "queue"
    async with FakeGaneti(tls=False, queue_dir=queue, nodes=3, op_times=OPS) as fake:
        settings = Settings(
            database={"url": db_url},
            backends=[{"name": "f1", "url": fake.url, "username": fake.username,
                       "password": fake.password, "queue_dir": str(queue)}],
            dispatcher={"status_port": None, "poll_interval": 0.05, "health_interval": 0.2,
                        "stats_interval": 0.5, "shutdown_timeout": 5.0},
            repair={"node_down_after": 0.5, "interval": 0.1, **repair},
        )  # fmt: skip
        async with (
            Store(db_url, poll_interval=0.05) as store,
            ControlPlane(settings, store=store) as cp,
            running(Dispatcher(settings, store=store, status_server=False)) as d,
        ):
            yield fake, cp, d, await cp.client("f1")


async def made(cp: ControlPlane, name: str, node: str, *, start: bool = True) -> str:
    instance, _ = await cp.create_instance(helpers.spec(name, pnode=node, start=start), backend="f1")
    await settled(cp, instance.id, InstanceStatus.STARTED if start else InstanceStatus.STOPPED)
    return instance.id


async def incident(
    store: IncidentStore, kind: str, *, closed: bool | None = None, instance: str | None = None
) -> Incident:
    async def found() -> Incident | None:
        for i in await store.incidents():
            ours = i.kind == kind and (instance is None or i.instance == instance)
            if ours and (closed is None or closed is not i.open):
                return i
        return None

    what = f"a {kind} incident{' closed' if closed else ''}{f' of {instance}' if instance else ''}"
    return await helpers.eventually(found, what=what, timeout=30)


async def test_a_dead_node_is_fenced_and_its_instances_fail_over(tmp_path: Path, db_url: str) -> None:
    command, fenced = fence_script(tmp_path)
    async with lab(tmp_path, db_url, allow=["failover"], fence_command=command) as (fake, cp, d, client):
        vm = await made(cp, "vm.fake.test", N3)
        await made(cp, "untagged.fake.test", N3)
        await client.wait_for_job(await client.add_cluster_tags([FAILOVER_TAG]))
        await client.wait_for_job(
            await client.add_instance_tags("untagged.fake.test", ["ganeti:watcher:autorepair:suspend:"])
        )
        incidents = IncidentStore(cp.store)
        fake.crash_node(N3)
        node = await incident(incidents, "node-down", closed=True)
        assert (node.node, node.action, node.outcome) == (N3, "fence", "repaired"), node
        assert fenced.read_text().split() == [N3]  # called once, with the node's name
        assert (await client.get_node(N3)).offline
        moved = await incident(incidents, "instance-error", closed=True, instance="vm.fake.test")
        assert (moved.action, moved.outcome, moved.node) == ("failover", "repaired", N3), moved
        assert moved.job_id is not None
        job = await client.get_job(moved.job_id)
        assert job.ops[0]["ignore_consistency"] is True
        ganeti_node = (await client.get_instance("vm.fake.test")).pnode
        assert ganeti_node in (N1, N2)

        async def stored_node() -> bool:
            return (await settled(cp, vm, InstanceStatus.STARTED)).pnode == ganeti_node

        await helpers.eventually(stored_node, what="the store's pnode after the failover")
        assert (await client.get_instance("vm.fake.test")).oper_state is True

        # the suspended one: an incident, report only, nothing sent
        async def held() -> Incident | None:
            found = await incident(incidents, "instance-error", instance="untagged.fake.test")
            return found if "harep's tags" in (found.detail or "") else None

        kept = await helpers.eventually(held, what="the suspended instance's incident, report only")
        assert kept.open and kept.action is None
        assert (await client.get_instance("untagged.fake.test")).pnode == N3
        assert d.repairer is not None and "repairs sent" in repr(d.repairer)


async def test_report_only_by_default_then_a_start_where_allowed(tmp_path: Path, db_url: str) -> None:
    async with lab(tmp_path, db_url) as (fake, cp, _d, client):
        await made(cp, "vm.fake.test", N3)
        incidents = IncidentStore(cp.store)
        fake.crash_node(N3)
        node = await incident(incidents, "node-down")
        lost = await incident(incidents, "instance-error", instance="vm.fake.test")
        assert node.action is None and lost.action is None
        assert "waiting for the node to be offline" in (lost.detail or "")
        assert not (await client.get_node(N3)).offline  # nothing sent
        fake.restore_node(N3)  # back: its instance stopped (ERROR_down), should run
        assert (await incident(incidents, "node-down", closed=True)).outcome == "resolved"
        assert (await incident(incidents, "instance-error", closed=True)).outcome == "resolved"
        stopped = await incident(incidents, "instance-stopped", instance="vm.fake.test")
        assert stopped.open and stopped.action is None and "report only" in (stopped.detail or "")
        assert (await client.get_instance("vm.fake.test")).status == "ERROR_down"


async def test_an_instance_that_should_run_is_started_and_one_a_user_stopped_is_not(
    tmp_path: Path, db_url: str
) -> None:
    async with lab(tmp_path, db_url, allow=["start"]) as (fake, cp, _d, client):
        vm = await made(cp, "vm.fake.test", N2)
        await made(cp, "off.fake.test", N2, start=False)  # a user's stop: STOPPED
        await client.wait_for_job(await client.add_cluster_tags(["ganeti:watcher:autorepair:fix-storage"]))
        incidents = IncidentStore(cp.store)
        fake.crash_node(N2)
        fake.restore_node(N2)
        started = await incident(incidents, "instance-stopped", closed=True, instance="vm.fake.test")
        assert (started.action, started.outcome) == ("start", "repaired"), started
        await settled(cp, vm, InstanceStatus.STARTED)
        assert (await client.get_instance("vm.fake.test")).status == "running"
        assert all(i.instance != "off.fake.test" for i in await incidents.incidents())
        assert (await client.get_instance("off.fake.test")).status == "ADMIN_down"


async def test_a_fence_that_fails_marks_nothing_offline_and_is_not_repeated(
    tmp_path: Path, db_url: str
) -> None:
    script = tmp_path / "fence.sh"
    script.write_text('#!/bin/sh\necho "no power switch for $1"\nexit 3\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    async with lab(tmp_path, db_url, allow=["failover"], fence_command=f"{script} {{node}}") as (
        fake, cp, _d, client
    ):  # fmt: skip
        await made(cp, "vm.fake.test", N3)
        await client.wait_for_job(await client.add_cluster_tags([FAILOVER_TAG]))
        incidents = IncidentStore(cp.store)
        fake.crash_node(N3)
        failed = await incident(incidents, "node-down", closed=True)
        assert (failed.action, failed.outcome) == ("fence", "failed")
        assert "exited 3: no power switch for node3.fake.test" in (failed.detail or "")

        async def held() -> Incident | None:
            for i in await incidents.incidents(open_only=True):
                if i.kind == "node-down" and "not repeated" in (i.detail or ""):
                    return i
            return None

        again = await helpers.eventually(held, what="a new node-down incident, report only")
        assert again.action is None
        assert not (await client.get_node(N3)).offline  # never marked offline without the fence
        lost = await incident(incidents, "instance-error", instance="vm.fake.test")
        assert lost.open and lost.action is None
        assert (await client.get_instance("vm.fake.test")).pnode == N3


async def test_a_create_ending_between_the_reads_opens_no_incident(tmp_path: Path, db_url: str) -> None:
    """The rows are read before Ganeti: a row still BUILD when the pass read it is not "should run",
    whatever Ganeti says after; read the other way round, a create that ended between the two reads
    paired its new STARTED row with Ganeti's view of the instance being made (``ERROR_down``), an
    incident for nothing (seen in benchmarks/placement.py's dispatcher run)."""
    async with lab(tmp_path, db_url) as (_fake, cp, d, rapi):
        assert d.repairer is not None
        await cp.store.add_instance("f1", "mid.example", status=InstanceStatus.BUILD, owned=True)
        real = rapi.list_instances

        async def read_while_the_create_ends(*args: Any, **kwargs: Any) -> Any:
            found = await real(*args, **kwargs)
            # the create ends now: its row STARTED; Ganeti's answer was of an instance being made
            await cp.store.update_instance("f1", "mid.example", status=InstanceStatus.STARTED)
            made_now = Instance(name="mid.example", admin_state="up", oper_state=False, status="ERROR_down",
                                pnode=N2, disk_template="diskless")  # fmt: skip
            return [*found, made_now]

        rapi.list_instances = read_while_the_create_ends  # type: ignore[method-assign]
        try:
            facts = await d.repairer.facts("f1", rapi)
        finally:
            del rapi.list_instances
        (mid,) = [i for i in facts.instances if i.name == "mid.example"]
        assert mid.row_status == InstanceStatus.BUILD.value  # as the row was before Ganeti's read
        assert [p for p in plan_repairs(facts).problems if p.instance == "mid.example"] == []
