"""The plan of a rolling maintenance (``allocate/_maintenance.py``, after hroller): pure."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from synnefo_ganeti.allocate import (
    MaintenanceInstance,
    MaintenanceNode,
    MaintenancePlan,
    maintenance_inputs,
    plan_maintenance,
)
from synnefo_ganeti.rapi import Instance, Node


def nodes(*names: str, free: int = 8192, master: str | None = None) -> list[MaintenanceNode]:
    return [MaintenanceNode(n, memory_free=free, master=n == master) for n in names]


def test_empty_nodes_go_down_together_and_the_master_alone_last() -> None:
    plan = plan_maintenance(nodes("n1", "n2", "n3", master="n1"), [])
    assert plan.node_groups == [["n2", "n3"], ["n1"]]
    assert plan.master == "n1" and plan.groups[-1].master and not plan.problems


def test_the_two_nodes_of_a_drbd_instance_never_go_down_together() -> None:
    instances = [MaintenanceInstance("vm", "n2", 1024, "drbd", ("n3",))]
    plan = plan_maintenance(nodes("n1", "n2", "n3", "n4", master="n1"), instances)
    groups = plan.node_groups
    assert not any({"n2", "n3"} <= set(g) for g in groups)
    assert groups[-1] == ["n1"] and sorted(n for g in groups for n in g) == ["n1", "n2", "n3", "n4"]
    moved = [m for g in plan.groups for m in g.moves]
    assert moved[0].instance == "vm" and {moved[0].source, moved[0].target} == {"n2", "n3"}


def test_a_group_splits_when_what_moves_does_not_fit_outside_it() -> None:
    # n2 and n3 each hold 6 GiB; only n1 (8 GiB free) is left when both go down: one at a time
    instances = [
        MaintenanceInstance("a", "n2", 6144, "sharedfile"),
        MaintenanceInstance("b", "n3", 6144, "sharedfile"),
    ]
    plan = plan_maintenance(nodes("n1", "n2", "n3", master="n1"), instances)
    assert plan.node_groups == [["n2"], ["n3"], ["n1"]]
    assert not plan.problems
    # a goes to n1, b to n2 (back empty, the most memory); the master's turn moves a to n3
    assert [[(m.instance, m.target) for m in g.moves] for g in plan.groups] == [
        [("a", "n1")],
        [("b", "n2")],
        [("a", "n3")],
    ]


def test_what_cannot_stay_up_is_a_problem() -> None:
    instances = [
        MaintenanceInstance("local", "n2", 512, "plain"),
        MaintenanceInstance("stopped", "n2", 512, "plain", up=False),
        MaintenanceInstance("huge", "n3", 1 << 20, "sharedfile"),
    ]
    plan = plan_maintenance(nodes("n1", "n2", "n3", master="n1"), instances)
    assert len(plan.problems) == 2
    assert "local on n2" in plan.problems[0] and "would stop" in plan.problems[0]
    assert any("huge on n3" in p for p in plan.problems)


def test_offline_and_drained_nodes() -> None:
    plan_nodes = [
        MaintenanceNode("n1", 8192, master=True),
        MaintenanceNode("n2", 8192, usable=False),  # drained: maintained, not a target
        MaintenanceNode("n3", 8192),
        MaintenanceNode("n4", 8192, offline=True, usable=False),
    ]
    instances = [MaintenanceInstance("a", "n3", 6000, "sharedfile")]
    plan = plan_maintenance(plan_nodes, instances)
    assert plan.skipped == ("n4",)
    assert next(m.target for g in plan.groups for m in g.moves) == "n1"


def test_the_plan_from_ganeti_reads_and_back_from_json() -> None:
    ganeti_nodes = [
        Node(name="node1", role="M", mfree=4000),
        Node(name="node2", role="C", mfree=4000),
        Node(name="node3", role="D", drained=True, mfree=4000),
    ]
    ganeti_instances = [
        Instance(name="vm1", pnode="node2", disk_template="sharedfile", admin_state="up",
                 beparams={"maxmem": 1024}),
    ]  # fmt: skip
    plan_nodes, plan_instances = maintenance_inputs(ganeti_nodes, ganeti_instances)
    assert [n.master for n in plan_nodes] == [True, False, False]
    assert [n.usable for n in plan_nodes] == [True, True, False]
    assert plan_instances[0].memory == 1024 and plan_instances[0].up
    plan = plan_maintenance(plan_nodes, plan_instances)
    assert MaintenancePlan.from_json(plan.to_json()) == plan


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[MaintenanceNode], list[MaintenanceInstance]]:
    count = draw(st.integers(2, 7))
    names = [f"n{i}" for i in range(count)]
    plan_nodes = [
        MaintenanceNode(name, memory_free=draw(st.integers(0, 16384)), master=i == 0)
        for i, name in enumerate(names)
    ]
    instances = []
    for i in range(draw(st.integers(0, 12))):
        primary = draw(st.sampled_from(names))
        template = draw(st.sampled_from(["drbd", "sharedfile", "diskless", "plain"]))
        secondaries: tuple[str, ...] = ()
        if template == "drbd":
            secondaries = (draw(st.sampled_from([n for n in names if n != primary])),)
        memory = draw(st.integers(128, 8192))
        instances.append(
            MaintenanceInstance(f"vm{i}", primary, memory, template, secondaries, draw(st.booleans()))
        )
    return plan_nodes, instances


@settings(max_examples=200, deadline=None)
@given(clusters())
def test_every_node_once_no_group_holds_two_nodes_of_an_instance_and_what_moves_fits(
    cluster: tuple[list[MaintenanceNode], list[MaintenanceInstance]],
) -> None:
    plan_nodes, instances = cluster
    plan = plan_maintenance(plan_nodes, instances)
    flat = [n for g in plan.node_groups for n in g]
    assert sorted(flat) == sorted(n.name for n in plan_nodes)
    assert plan.node_groups[-1] == ["n0"] and plan.master == "n0"
    for group in plan.node_groups:
        for inst in instances:
            assert len({inst.primary, *inst.secondaries} & set(group)) <= 1, (group, inst)
    # replay the moves group by group: every target is outside its group and keeps memory >= 0
    free = {n.name: n.memory_free for n in plan_nodes}
    by_name = {i.name: i for i in instances}
    primary = {i.name: i.primary for i in instances}
    for group in plan.groups:
        for move in group.moves:
            assert move.target not in group.nodes and move.source in group.nodes
            assert primary[move.instance] == move.source
            need = by_name[move.instance].memory if by_name[move.instance].up else 0
            free[move.target] -= need
            free[move.source] += need
            primary[move.instance] = move.target
            assert free[move.target] >= 0
        if not plan.problems:  # everything up on the group's nodes moved away
            assert not [i for i in instances if i.up and primary[i.name] in group.nodes], group
