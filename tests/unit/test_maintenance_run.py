"""A rolling maintenance (``control/_maintenance.py``) on a 3-node fake Ganeti whose queue the
watcher stores, both databases: every node drained, evacuated, "rebooted" (the fake's
``crash_node``/``restore_node``), read again and undrained, group after group, the master's role
handed over and back, the instances running throughout; the run killed midway and resumed at
its step; a failed wait resumed after the fix; one run per backend; cancel; the audit log."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path
from typing import Any

import pytest

from synnefo_ganeti import ConflictError, ControlPlane, InvalidError
from synnefo_ganeti.control._maintenance import CommandResult, MaintenanceOptions, RollingMaintenance
from synnefo_ganeti.control._maintenance_steps import Steps
from synnefo_ganeti.errors import MaintenanceStepError
from synnefo_ganeti.store import StatusStore
from synnefo_ganeti.testing import FakeGaneti
from tests import helpers
from tests.unit.test_cloud_actions import plane as cloud_plane
from tests.unit.test_node_evacuate import QUICK_NODES, drain, made

N1, N2, N3 = "node1.fake.test", "node2.fake.test", "node3.fake.test"
REBOOT = "reboot {node}"
FAILOVER = "failover {node}"
OPTIONS = MaintenanceOptions(master_failover_command=FAILOVER, poll_interval=0.02, wait_timeout=10)

spec = functools.partial(helpers.spec, disk_template="sharedfile", disks=[{"size": 1024}], vcpus=1)


def plane(tmp_path: Path, db_url: str) -> Any:
    options = {"nodes": 3, "disk_templates": ("sharedfile", "diskless", "file")}
    return cloud_plane(tmp_path, db_url, quick=QUICK_NODES, fake_options=options)


class Lab:
    """The operator's commands on the fake: ``reboot NODE`` crashes the node and brings it back
    on the loop's next turn (unless ``stay_down``); ``failover NODE`` makes NODE the master. Each
    command is recorded with the instances' state at the time."""

    def __init__(self, fake: FakeGaneti) -> None:
        self.fake = fake
        self.commands: list[str] = []
        self.stay_down: set[str] = set()
        self.gate: asyncio.Event | None = None  # a command waits here when set
        self.down_while_running: list[str] = []

    async def __call__(self, command: str, timeout: float) -> CommandResult:
        self.commands.append(command)
        verb, node = command.split()
        if verb == "failover":
            self.fake.master_failover(node)
            return CommandResult(0, f"{node} is the master")
        if self.gate is not None:
            await self.gate.wait()
        hosted = [i.name for i in self.fake.cluster.instances.values() if i.pnode == node and i.oper_state]
        self.down_while_running.extend(hosted)  # an instance still there would go down with it
        self.fake.crash_node(node)
        if node not in self.stay_down:
            asyncio.get_running_loop().call_soon(self.fake.restore_node, node)
        return CommandResult(0, f"{node} rebooted")


def running_everywhere(fake: FakeGaneti) -> dict[str, str | None]:
    return {i.name: i.pnode for i in fake.cluster.instances.values() if i.oper_state}


def master(fake: FakeGaneti) -> str:
    return next(n.name for n in fake.cluster.nodes.values() if n.master)


def drained(fake: FakeGaneti) -> list[str]:
    return sorted(n.name for n in fake.cluster.nodes.values() if n.drained)


async def instances(cp: ControlPlane) -> list[str]:
    return [
        await made(cp, spec("a.fake.test", pnode=N1)),
        await made(cp, spec("b.fake.test", pnode=N2)),
        await made(cp, spec("c.fake.test", pnode=N3)),
    ]


async def test_a_rolling_maintenance_keeps_every_instance_running(tmp_path: Path, db_url: str) -> None:
    async with plane(tmp_path, db_url) as (fake, cp):
        await instances(cp)
        lab = Lab(fake)
        maint = RollingMaintenance(cp, actor="ops@test", run_command=lab, heartbeat=0.05)
        plan = await maint.plan("f1")
        assert plan.node_groups[-1] == [N1] and sorted(plan.node_groups[0]) == [N2, N3]
        seen: list[tuple[int, int, str]] = []
        record = await maint.run(
            "f1", REBOOT, options=OPTIONS, progress=lambda d, t, w: seen.append((d, t, w))
        )
        assert record.status == "done", record.error
        assert record.steps_done == record.steps_total == 2 * 5 + 7
        assert seen[-1] == (17, 17, "done") and seen[0][0] == 0
        # every node rebooted once, the master's role handed to a candidate and back
        assert [c for c in lab.commands if c.startswith("reboot")] == [f"reboot {n}" for n in (N2, N3, N1)]
        assert [c for c in lab.commands if c.startswith("failover")] == [f"failover {N2}", f"failover {N1}"]
        assert lab.down_while_running == []
        assert master(fake) == N1 and drained(fake) == []
        assert sorted(running_everywhere(fake)) == ["a.fake.test", "b.fake.test", "c.fake.test"]
        # the moves' jobs went at Ganeti's low priority
        priorities = [
            op.luxid.get("priority")
            for job in fake.cluster.jobs.values()
            for op in job.ops
            if op.op_id in ("OP_INSTANCE_MIGRATE", "OP_NODE_SET_PARAMS")
        ]
        assert priorities and all(p == 10 for p in priorities), priorities
        audit = await StatusStore(cp.store).audit_log(backend="f1")
        actions = [a.action for a in reversed(audit)]
        assert actions[0] == "maintenance start" and actions[-1] == "maintenance done"
        assert actions.count("maintenance command") == 3 and {a.actor for a in audit} == {"ops@test"}
        assert (await maint.runs("f1"))[0].status == "done"


async def test_killed_midway_it_resumes_at_its_step(tmp_path: Path, db_url: str) -> None:
    async with plane(tmp_path, db_url) as (fake, cp):
        await instances(cp)
        lab = Lab(fake)
        lab.gate = asyncio.Event()
        first = RollingMaintenance(cp, actor="ops@test", run_command=lab, heartbeat=0.05, stale_after=0.3)
        task = asyncio.create_task(first.run("f1", REBOOT, options=OPTIONS))

        async def at_command() -> Any:
            # the step stored and its command called (waiting at the gate): the step is stored
            # before the call, so a kill between the two is another case than this test's
            if not any(c.startswith("reboot ") for c in lab.commands):
                return None
            runs = await first.runs("f1")
            return runs[0] if runs and runs[0].position.get("phase") == "command" else None

        held = await helpers.eventually(at_command, what="the run at its first command")
        task.cancel()  # killed: nothing more written
        with pytest.raises(asyncio.CancelledError):
            await task
        assert drained(fake) == sorted(held.plan["groups"][0]["nodes"])
        # another process may not start a run nor take it while its heartbeat is fresh
        second = RollingMaintenance(cp, actor="ops2@test", run_command=lab, stale_after=60)
        with pytest.raises(ConflictError, match=rf"held by maintenance run {held.id}"):
            await second.run("f1", REBOOT, options=OPTIONS)
        with pytest.raises(ConflictError, match="unfinished maintenance run"):
            await second.run("f1", "other {node}")
        # once its heartbeat is old, run again resumes it where it was: the same plan, same step
        lab.gate = None
        resumer = RollingMaintenance(cp, actor="ops2@test", run_command=lab, stale_after=0.0)
        migrations_before = _count(fake, "OP_INSTANCE_MIGRATE")
        record = await resumer.run("f1")
        assert record.id == held.id and record.status == "done", record.error
        assert record.plan == held.plan
        # the group's drain and evacuation were not done again; its first command ran again
        assert _count(fake, "OP_INSTANCE_MIGRATE") - migrations_before == 3  # c and b back, a off N1
        assert lab.commands.count(f"reboot {held.plan['groups'][0]['nodes'][0]}") == 2
        assert master(fake) == N1 and drained(fake) == [] and lab.down_while_running == []
        assert len(running_everywhere(fake)) == 3
        audit = [a.action for a in await StatusStore(cp.store).audit_log(backend="f1")]
        assert "maintenance resume" in audit


async def test_a_node_not_back_fails_the_run_clearly_and_resumes_after_the_fix(
    tmp_path: Path, db_url: str
) -> None:
    async with plane(tmp_path, db_url) as (fake, cp):
        await made(cp, spec("b.fake.test", pnode=N2))
        lab = Lab(fake)
        lab.stay_down.add(N2)
        maint = RollingMaintenance(cp, actor="ops@test", run_command=lab)
        options = MaintenanceOptions(master_failover_command=FAILOVER, poll_interval=0.02, wait_timeout=0.3)
        record = await maint.run("f1", REBOOT, options=options)
        assert record.status == "failed"
        assert record.position["phase"] == "wait" and record.position["node"] == N2
        assert f"Ganeti did not read node {N2} of backend f1 again within 0.3 s" in (record.error or "")
        assert "maintenance run f1" in (record.error or "")
        fake.restore_node(N2)
        again = await maint.run("f1")
        assert again.id == record.id and again.status == "done", again.error
        assert drained(fake) == [] and master(fake) == N1


async def test_refusals_and_cancel(tmp_path: Path, db_url: str) -> None:
    async with plane(tmp_path, db_url) as (fake, cp):
        await made(cp, spec("local.fake.test", pnode=N2, disk_template="file"))
        lab = Lab(fake)
        maint = RollingMaintenance(cp, actor="ops@test", run_command=lab)
        with pytest.raises(
            ConflictError, match=r"local\.fake\.test on node2\.fake\.test: disk template file"
        ):
            await maint.run("f1", REBOOT, options=OPTIONS)
        with pytest.raises(InvalidError, match="no maintenance run to resume"):
            await maint.run("f1")
        with pytest.raises(InvalidError, match="must name the node"):
            await maint.run("f1", "reboot")
        await (await cp.client("f1")).wait_for_job(
            await (await cp.client("f1")).delete_instance("local.fake.test"), timeout=30
        )
        lab.stay_down.add(N2)
        options = MaintenanceOptions(master_failover_command=FAILOVER, poll_interval=0.02, wait_timeout=0.1)
        failed = await maint.run("f1", REBOOT, options=options)
        assert failed.status == "failed"
        canceled = await maint.cancel("f1")
        assert canceled.id == failed.id and canceled.status == "canceled"
        assert canceled.error == "canceled by ops@test"
        fake.restore_node(N2)
        # a new run may start now, with a new plan
        lab.stay_down.clear()
        record = await maint.run("f1", REBOOT, options=OPTIONS)
        assert record.id != failed.id and record.status == "done", record.error
        assert [r.status for r in await maint.runs("f1")] == ["done", "canceled"]


def _count(fake: FakeGaneti, op_id: str) -> int:
    return sum(1 for job in fake.cluster.jobs.values() for op in job.ops if op.op_id == op_id)


async def test_the_masters_turn_needs_a_candidate_and_skips_what_is_done(tmp_path: Path, db_url: str) -> None:
    async with plane(tmp_path, db_url) as (fake, cp):
        lab = Lab(fake)
        steps = Steps(cp, "f1", REBOOT, OPTIONS, lab)
        assert await steps.run("failback", N1) == f"{N1} is the master already"
        assert await steps.run("undrain", N2) == "not drained"
        await drain(fake, cp, N2)
        await drain(fake, cp, N3)
        with pytest.raises(MaintenanceStepError, match=rf"no master candidate of backend f1 .* from {N1}"):
            await steps.run("failover", N1)
        assert lab.commands == [] and master(fake) == N1
        await drain(fake, cp, N3, False)
        assert (await steps.run("failover", N1)).startswith(f"master role to {N3} from {N1}")
        assert master(fake) == N3 and lab.commands == [f"failover {N3}"]
        assert "not the master any more" in await steps.run("failover", N1)
        with pytest.raises(MaintenanceStepError, match="unknown maintenance phase"):
            await steps.run("dance", N1)
