"""``ControlPlane.evacuate_node`` and ``failover_node`` on a 3-node fake Ganeti whose queue the
watcher stores, both databases: what moves where (never to a drained, offline or dead node), what
cannot move and why, an operator's VM moved and reported not ours, the store's ``pnode`` and
task after each move, the refusals; and the pure plan (``control/_node_plan.py``)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from synnefo_ganeti import ConflictError, ControlPlane, InstanceSpec, NotFoundError
from synnefo_ganeti.control._node_plan import MoveAction, MoveOutcome, NodeMoveReport, plan_moves
from synnefo_ganeti.rapi import Instance, Node
from synnefo_ganeti.store import InstanceStatus
from synnefo_ganeti.testing import FakeGaneti
from tests import helpers
from tests.unit.test_cloud_actions import plane as cloud_plane
from tests.unit.test_operations import QUICK, settled

N1, N2, N3 = "node1.fake.test", "node2.fake.test", "node3.fake.test"
QUICK_NODES = {**QUICK, "OP_NODE_SET_PARAMS": 0.01}

spec = functools.partial(helpers.spec, pnode=N2, vcpus=1)


def plane(tmp_path: Path, db_url: str) -> Any:
    return cloud_plane(tmp_path, db_url, quick=QUICK_NODES, fake_options={"nodes": 3})


async def drain(fake: FakeGaneti, cp: ControlPlane, node: str, drained: bool = True) -> None:
    client = await cp.client("f1")
    job = await client.wait_for_job(await client.modify_node(node, drained=drained), timeout=30)
    assert job.status.value == "success", job.failure


async def made(cp: ControlPlane, spec_: InstanceSpec, status: InstanceStatus = InstanceStatus.STARTED) -> str:
    instance, _ = await cp.create_instance(spec_, backend="f1")
    await settled(cp, instance.id, status)
    return instance.id


async def operators_vm(cp: ControlPlane, name: str, node: str) -> None:
    """A VM made behind our back (no row in the store: not ours)."""
    client = await cp.client("f1")
    vm = InstanceSpec(name=name, disk_template="diskless", os="noop", pnode=node, beparams={"memory": 128})
    job = await client.wait_for_job(await client.create_instance(vm), timeout=30)
    assert job.status.value == "success", job.failure


async def ganeti_pnodes(cp: ControlPlane) -> dict[str, str | None]:
    return {i.name: i.pnode for i in await (await cp.client("f1")).list_instances()}


async def test_evacuate_refuses_a_node_not_drained_unknown_master_or_dead(
    tmp_path: Path, db_url: str
) -> None:
    async with plane(tmp_path, db_url) as (fake, cp):
        await made(cp, spec("a.fake.test"))
        with pytest.raises(ConflictError, match=rf"not drained: drain it first .*nodes drain f1 {N2}"):
            await cp.evacuate_node("f1", N2)
        with pytest.raises(NotFoundError, match=r"has no node node9\.fake\.test; its nodes: node1"):
            await cp.evacuate_node("f1", "node9.fake.test")
        with pytest.raises(ConflictError, match="is the master of backend f1"):
            await cp.evacuate_node("f1", N1)
        await drain(fake, cp, N2)
        fake.crash_node(N2)
        with pytest.raises(ConflictError, match=r"does not answer Ganeti .*nodes failover f1"):
            await cp.evacuate_node("f1", N2)
        assert (await ganeti_pnodes(cp))["a.fake.test"] == N2  # nothing sent


async def test_evacuate_moves_every_primary_never_to_a_drained_node(tmp_path: Path, db_url: str) -> None:
    async with plane(tmp_path, db_url) as (fake, cp):
        running = await made(cp, spec("run.fake.test"))
        down = await made(cp, spec("down.fake.test", start=False), InstanceStatus.STOPPED)
        await made(cp, spec("file.fake.test", disk_template="file", disks=[{"size": 1024}]))
        await made(cp, spec("elsewhere.fake.test", pnode=N3))
        await operators_vm(cp, "theirs.fake.test", N2)
        await drain(fake, cp, N2)
        await drain(fake, cp, N3)  # the only target left: node1
        seen: list[tuple[int, int, str | None]] = []
        report = await cp.evacuate_node(
            "f1", N2, progress=lambda done, total, move: seen.append((done, total, move and move.name))
        )
        assert isinstance(report, NodeMoveReport) and report.operation == "evacuate"
        moves = {m.name: m for m in report.moves}
        assert sorted(moves) == ["down.fake.test", "file.fake.test", "run.fake.test", "theirs.fake.test"]
        assert (moves["run.fake.test"].action, moves["run.fake.test"].outcome) == (
            MoveAction.MIGRATE,
            MoveOutcome.MOVED,
        )
        assert (moves["down.fake.test"].action, moves["down.fake.test"].outcome) == (
            MoveAction.FAILOVER,
            MoveOutcome.MOVED,
        )
        assert (
            moves["file.fake.test"].outcome is MoveOutcome.SKIPPED and moves["file.fake.test"].job_id is None
        )
        assert "file does not allow migrations or failovers" in str(moves["file.fake.test"].error)
        theirs = moves["theirs.fake.test"]
        assert (theirs.owned, theirs.outcome, theirs.target) == (False, MoveOutcome.MOVED, N1)
        assert all(m.target == N1 for m in report.moves if m.outcome is MoveOutcome.MOVED)
        assert not report.ok and report.counts == {"moved": 3, "failed": 0, "skipped": 1}
        assert seen == [(0, 4, None)] + [(i + 1, 4, m.name) for i, m in enumerate(report.moves)]

        pnodes = await ganeti_pnodes(cp)
        assert pnodes == {"run.fake.test": N1, "down.fake.test": N1, "file.fake.test": N2,
                          "elsewhere.fake.test": N3, "theirs.fake.test": N1}  # fmt: skip
        for instance_id, status in ((running, InstanceStatus.STARTED), (down, InstanceStatus.STOPPED)):
            row = await settled(cp, instance_id, status)
            assert row.pnode == N1 and row.last_error is None, row
        assert await cp.get_instance("theirs.fake.test", backend="f1") is None  # not ours: not stored
        as_json = report.to_json()
        assert as_json["counts"]["moved"] == 3 and as_json["moves"][0]["name"] == "down.fake.test"
        assert "evacuate f1/node2.fake.test: 3 moved, 0 failed, 1 skipped" in repr(report)

        again = await cp.evacuate_node("f1", N2)  # what is left: the file instance alone
        assert [(m.name, m.outcome) for m in again.moves] == [("file.fake.test", MoveOutcome.SKIPPED)]


async def test_evacuate_with_an_iallocator_stores_where_ganeti_put_them(tmp_path: Path, db_url: str) -> None:
    async with plane(tmp_path, db_url) as (fake, cp):
        ids = [await made(cp, spec(f"v{i}.fake.test")) for i in range(3)]
        await drain(fake, cp, N2)
        report = await cp.evacuate_node("f1", N2, iallocator="hail")
        assert report.ok and report.iallocator == "hail", report.to_json()
        pnodes = await ganeti_pnodes(cp)
        for move, instance_id in zip(report.moves, ids, strict=True):
            assert move.target in (N1, N3) and pnodes[move.name] == move.target
            client = await cp.client("f1")
            job = await client.get_job(int(move.job_id or 0))
            assert job.ops[0]["iallocator"] == "hail" and job.ops[0].get("target_node") is None
            assert (await settled(cp, instance_id, InstanceStatus.STARTED)).pnode == move.target


async def test_failover_node_refuses_a_node_that_answers_then_recovers_a_dead_one(
    tmp_path: Path, db_url: str
) -> None:
    async with plane(tmp_path, db_url) as (fake, cp):
        running = await made(cp, spec("run.fake.test", pnode=N3))
        down = await made(cp, spec("down.fake.test", pnode=N3, start=False), InstanceStatus.STOPPED)
        await operators_vm(cp, "theirs.fake.test", N3)
        with pytest.raises(
            ConflictError, match=r"still answers Ganeti .* pass --yes .* really dead or fenced"
        ):
            await cp.failover_node("f1", N3)
        with pytest.raises(ConflictError, match="is the master"):
            await cp.failover_node("f1", N1, yes=True)
        client = await cp.client("f1")
        assert not (await client.get_node(N3)).offline  # nothing done

        fake.crash_node(N3)
        seen: list[int] = []
        report = await cp.failover_node("f1", N3, progress=lambda done, total, move: seen.append(done))
        assert report.ok and report.marked_offline and report.operation == "failover", report.to_json()
        assert seen == [0, 1, 2, 3]
        assert {m.action for m in report.moves} == {MoveAction.FAILOVER}
        assert (await client.get_node(N3)).offline
        for move in report.moves:
            job = await client.get_job(int(move.job_id or 0))
            assert job.ops[0]["ignore_consistency"] is True and move.target in (N1, N2)
        pnodes = await ganeti_pnodes(cp)
        assert all(pnodes[m.name] == m.target for m in report.moves)
        assert (await client.get_instance("run.fake.test")).oper_state is True  # running again elsewhere
        for instance_id, status in ((running, InstanceStatus.STARTED), (down, InstanceStatus.STOPPED)):
            row = await settled(cp, instance_id, status)
            assert row.pnode in (N1, N2) and row.pnode == pnodes[row.name], row

        again = await cp.failover_node("f1", N3)  # offline already: not marked again, nothing left
        assert again.moves == () and not again.marked_offline and again.ok
        with pytest.raises(ConflictError, match=r"is offline: .*nodes failover f1"):
            await cp.evacuate_node("f1", N3)


async def test_failover_node_with_yes_takes_a_node_that_still_answers(tmp_path: Path, db_url: str) -> None:
    async with plane(tmp_path, db_url) as (_fake, cp):
        running = await made(cp, spec("run.fake.test", pnode=N3))
        report = await cp.failover_node("f1", N3, yes=True)
        assert report.ok and report.marked_offline
        row = await settled(cp, running, InstanceStatus.STARTED)
        assert row.pnode == report.moves[0].target != N3


# -- the plan, pure ------------------------------------------------------------------------------------------------


def _node(name: str, mfree: int | None = 4096, **kwargs: Any) -> Node:
    return Node.model_validate({"name": name, "mfree": mfree, **kwargs})


def _inst(name: str, template: str, pnode: str = N2, **kwargs: Any) -> Instance:
    fields = {"name": name, "disk_template": template, "pnode": pnode, "oper_state": True,
              "beparams": {"maxmem": 1024}} | kwargs  # fmt: skip
    return Instance.model_validate(fields)


def test_the_plan_follows_what_ganeti_allows_per_disk_template() -> None:
    nodes = [_node(N1, 2048), _node(N2), _node(N3, 1500), _node("n4", None), _node("n5", 9999, drained=True)]
    instances = [
        _inst("a-drbd", "drbd", snodes=[N3]),
        _inst("b-drbd", "drbd", snodes=["n5"]),
        _inst("c-plain", "plain"),
        _inst("d-shared", "sharedfile"),
        _inst("e-diskless", "diskless", oper_state=False),
        _inst("f-rbd", "rbd"),
        _inst("g-other", "diskless", pnode=N1),
    ]
    plan = {p.name: p for p in plan_moves(N2, instances, nodes, ours={"a-drbd", "d-shared"})}
    assert sorted(plan) == ["a-drbd", "b-drbd", "c-plain", "d-shared", "e-diskless", "f-rbd"]
    assert (plan["a-drbd"].action, plan["a-drbd"].target, plan["a-drbd"].owned) == (
        MoveAction.MIGRATE,
        N3,
        True,
    )
    assert plan["b-drbd"].action is MoveAction.NONE and "node n5 is drained" in str(plan["b-drbd"].why)
    assert plan["c-plain"].action is MoveAction.NONE and not plan["c-plain"].owned
    # placement: the most memory left first (node1 2048), then node3 (1500) as node1 has 1024 left
    assert (plan["d-shared"].action, plan["d-shared"].target) == (MoveAction.MIGRATE, N1)
    assert (plan["e-diskless"].action, plan["e-diskless"].target) == (MoveAction.FAILOVER, N3)
    assert plan["f-rbd"].target == N1  # 1024 left on node1, 476 on node3
    assert plan_moves(N2, [_inst("x", "rbd")], nodes, ours=(), iallocator="hail")[0].target is None
    failover = plan_moves(N2, instances, nodes, ours=(), failover=True)
    assert {p.action for p in failover} == {MoveAction.FAILOVER, MoveAction.NONE}
    full = plan_moves(N2, [_inst("big", "sharedfile", beparams={"maxmem": 99999})], nodes, ours=())
    assert full[0].action is MoveAction.NONE and "no target: no node has room" in str(full[0].why)


async def test_the_fake_refuses_as_the_lab_did(tmp_path: Path, db_url: str) -> None:
    """What the real lab answered (Ganeti 3.0.2, 2026-11-28): a migration of a stopped instance and
    a move to a drained node are refused in CheckPrereq with these messages."""
    async with plane(tmp_path, db_url) as (fake, cp):
        await made(cp, spec("down.fake.test", start=False), InstanceStatus.STOPPED)
        await made(cp, spec("run.fake.test"))
        client = await cp.client("f1")
        job = await client.wait_for_job(await client.migrate_instance("down.fake.test", target_node=N1))
        assert job.failure is not None and (job.failure.type, job.failure.ecode) == (
            "OpPrereqError",
            "wrong_state",
        )
        assert (
            job.failure.message
            == "Can't migrate, please use failover: Instance down.fake.test is not running"
        )
        await drain(fake, cp, N3)
        for call in (client.migrate_instance, client.failover_instance):
            job = await client.wait_for_job(await call("run.fake.test", target_node=N3))
            assert job.failure is not None and job.failure.ecode == "wrong_state"
            assert job.failure.message == f"Can't use drained node {N3}"
        job = await client.wait_for_job(await client.migrate_instance("run.fake.test", iallocator="hail"))
        assert job.status.value == "success" and (await client.get_instance("run.fake.test")).pnode == N1


async def test_an_instance_busy_with_another_action_is_reported_failed_and_left_alone(
    tmp_path: Path, db_url: str
) -> None:
    async with cloud_plane(
        tmp_path, db_url, quick=QUICK_NODES, fake_options={"nodes": 3}, OP_INSTANCE_REBOOT=30.0
    ) as (fake, cp):
        busy = await made(cp, spec("busy.fake.test"))
        await made(cp, spec("free.fake.test"))
        reboot = await cp.reboot_instance(busy)
        await drain(fake, cp, N2)
        report = await cp.evacuate_node("f1", N2)
        moves = {m.name: m for m in report.moves}
        assert moves["free.fake.test"].outcome is MoveOutcome.MOVED
        stuck = moves["busy.fake.test"]
        assert (stuck.outcome, stuck.job_id) == (MoveOutcome.FAILED, None) and "reboot" in str(stuck.error)
        assert (await ganeti_pnodes(cp))["busy.fake.test"] == N2
        row = await cp.get_instance(busy)
        assert row is not None and row.task_job_id == reboot  # its own action untouched
        await (await cp.client("f1")).cancel_job(reboot)
