"""Repair by policy, the pure part (``allocate/_repair.py``): harep's tags as Ganeti's harep reads
them, and each rule: what opens an incident, which repair is sent, what closes it."""

from __future__ import annotations

from typing import Any

import pytest

from synnefo_ganeti.allocate._repair import (
    BackendFacts,
    InstanceFacts,
    NodeFacts,
    OpenFacts,
    harep_allows,
    harep_policy,
    plan_repairs,
)
from synnefo_ganeti.config import Settings

P = "ganeti:watcher:autorepair:"
NOW = 1_000_000.0


def test_harep_policy_takes_the_least_type_and_suspensions() -> None:
    assert harep_policy([], NOW) is None
    assert harep_policy(["other", P + "failover"], NOW) == "failover"
    assert harep_policy([P + "failover", P + "migrate"], NOW) == "migrate"  # the least wins
    assert harep_policy([P + "bogus"], NOW) is None
    assert harep_policy([P + "failover", P + "suspend:"], NOW) == "suspended"
    assert harep_policy([P + "suspend"], NOW) == "suspended"  # the bare tag: taken as one too
    assert harep_policy([P + "failover", P + f"suspend:{NOW + 60:.0f}"], NOW) == "suspended"
    assert harep_policy([P + "failover", P + f"suspend:{NOW - 60:.0f}"], NOW) == "failover"  # past


@pytest.mark.parametrize(
    ("level", "allowed"),
    [("fix-storage", {"start"}), ("migrate", {"start", "migrate"}),
     ("failover", {"start", "migrate", "failover"}), ("reinstall", {"start", "migrate", "failover"})],
)  # fmt: skip
def test_a_tag_allows_its_level_and_those_below(level: str, allowed: set[str]) -> None:
    for repair in ("start", "migrate", "failover"):
        ok = harep_allows(repair, instance_tags=[], group_tags=[], cluster_tags=[P + level], now=NOW)
        assert ok is (repair in allowed), repair


def test_the_instance_level_wins_over_the_group_then_the_cluster() -> None:
    def allows(instance: list[str], group: list[str], cluster: list[str]) -> bool:
        return harep_allows(
            "failover", instance_tags=instance, group_tags=group, cluster_tags=cluster, now=NOW
        )

    assert allows([], [], [P + "failover"])
    assert not allows([], [P + "suspend:"], [P + "failover"])  # the group suspends
    assert not allows([P + "migrate"], [], [P + "failover"])  # the instance allows less
    assert allows([P + "failover"], [P + "suspend:"], [])  # the instance's own policy wins
    assert not allows([], [], [])  # no tag anywhere: not enabled


def facts(**changes: Any) -> BackendFacts:
    values: dict[str, Any] = {
        "backend": "b",
        "now": NOW,
        "node_down_after": 60.0,
        "allowed": ("start", "migrate", "failover"),
        "can_fence": True,
        "cluster_tags": (P + "failover",),
        "nodes": {n: NodeFacts(n) for n in ("n1", "n2", "n3")},
    }
    return BackendFacts(**(values | changes))


def inst(name: str = "vm", status: str = "running", pnode: str = "n3", **kw: Any) -> InstanceFacts:
    return InstanceFacts(name, status, pnode, "drbd", **kw)


def test_a_node_down_long_enough_opens_an_incident_and_is_fenced_when_failover_is_allowed() -> None:
    nodes = {"n1": NodeFacts("n1"), "n3": NodeFacts("n3", down_since=NOW - 30)}
    assert plan_repairs(facts(nodes=nodes)).problems == ()  # not yet: node_down_after
    nodes["n3"] = NodeFacts("n3", down_since=NOW - 61)
    (problem,) = plan_repairs(facts(nodes=nodes)).problems
    assert (problem.kind, problem.node, problem.action) == ("node-down", "n3", "fence")
    (problem,) = plan_repairs(facts(nodes=nodes, can_fence=False)).problems
    assert problem.action is None and "fence_command" in problem.detail
    (problem,) = plan_repairs(facts(nodes=nodes, allowed=("start",))).problems
    assert problem.action is None and "report only" in problem.detail


def test_an_instance_on_a_dead_node_fails_over_only_once_the_node_is_offline() -> None:
    down = {"n1": NodeFacts("n1"), "n3": NodeFacts("n3", down_since=NOW - 61)}
    plan = plan_repairs(facts(nodes=down, instances=(inst(status="ERROR_nodedown"),)))
    by_kind = {p.kind: p for p in plan.problems}
    assert by_kind["instance-error"].action is None  # never while the node may still run it
    assert "waiting for the node to be offline" in by_kind["instance-error"].detail
    offline = {"n1": NodeFacts("n1"), "n3": NodeFacts("n3", offline=True)}
    (problem,) = plan_repairs(facts(nodes=offline, instances=(inst(status="ERROR_nodeoffline"),))).problems
    assert (problem.kind, problem.instance, problem.action) == ("instance-error", "vm", "failover")
    # policy: the config, the tags, the template
    for changes, why in (
        ({"allowed": ("start",)}, "[repair] allow"),
        ({"cluster_tags": (P + "migrate",)}, "harep's tags"),
    ):
        (problem,) = plan_repairs(
            facts(nodes=offline, instances=(inst(status="ERROR_nodeoffline"),), **changes)
        ).problems
        assert problem.action is None and why in problem.detail
    plain = InstanceFacts("vm", "ERROR_nodeoffline", "n3", "plain")
    (problem,) = plan_repairs(facts(nodes=offline, instances=(plain,))).problems
    assert problem.action is None and "cannot fail over" in problem.detail


def test_a_stopped_instance_that_should_run_is_started_and_one_a_user_stopped_is_not() -> None:
    plan = plan_repairs(facts(instances=(inst(status="ERROR_down"), inst("u", "ADMIN_down"),
                                         inst("s", "ERROR_down", row_status="STOPPED"),
                                         inst("busy", "ERROR_down", busy=True))))  # fmt: skip
    (problem,) = plan.problems
    assert (problem.kind, problem.instance, problem.action) == ("instance-stopped", "vm", "start")
    none = facts(instances=(inst(status="ERROR_down"),), cluster_tags=())
    assert plan_repairs(none).problems[0].action is None  # no harep tag


def test_a_migration_that_left_it_stopped_is_started_only_while_every_node_is_up() -> None:
    stopped = inst(status="ERROR_down", pnode="n1", migration_failed=True)
    (problem,) = plan_repairs(facts(instances=(stopped,))).problems
    assert (problem.kind, problem.action) == ("migration-stopped", "start")
    nodes = {"n1": NodeFacts("n1"), "n3": NodeFacts("n3", down_since=NOW - 5)}
    (problem,) = plan_repairs(facts(nodes=nodes, instances=(stopped,))).problems
    assert problem.action is None and "n3 may run it" in problem.detail
    (problem,) = plan_repairs(facts(instances=(inst(status="ERROR_wrongnode", pnode="n1"),))).problems
    assert (problem.kind, problem.action) == ("migration-stopped", "migrate")


def test_incidents_close_when_repaired_failed_or_gone_and_a_running_repair_is_not_sent_twice() -> None:
    offline = {"n1": NodeFacts("n1"), "n3": NodeFacts("n3", offline=True)}
    lost = (inst(status="ERROR_nodeoffline"),)
    running = OpenFacts(1, "instance-error", "n3", "vm", "failover", 7, None)
    plan = plan_repairs(facts(nodes=offline, instances=lost, open=(running,)))
    assert plan.closes == () and plan.problems[0].action is None
    done = OpenFacts(1, "instance-error", "n3", "vm", "failover", 7, "success")
    assert [(c.id, c.outcome) for c in plan_repairs(facts(open=(done,))).closes] == [(1, "repaired")]
    bad = OpenFacts(1, "instance-error", "n3", "vm", "failover", 7, "error")
    assert [c.outcome for c in plan_repairs(facts(open=(bad,))).closes] == ["failed"]
    gone = OpenFacts(2, "instance-stopped", "n1", "vm", None, None, None)
    assert [(c.id, c.outcome) for c in plan_repairs(facts(open=(gone,))).closes] == [(2, "resolved")]
    node = OpenFacts(3, "node-down", "n3", None, None, None, None)
    assert [c.outcome for c in plan_repairs(facts(nodes=offline, open=(node,))).closes] == ["resolved"]
    # a repair that failed lately is not sent again
    again = facts(nodes=offline, instances=lost, failed=frozenset({("instance-error", "n3", "vm")}))
    (problem,) = plan_repairs(again).problems
    assert problem.action is None and "not repeated" in problem.detail


def test_repair_settings() -> None:
    settings = Settings(
        backends=[{"name": "a", "url": "http://a:5080", "username": "u", "password": "p"},
                  {"name": "b", "url": "http://b:5080", "username": "u", "password": "p",
                   "repair_allow": []}],
        repair={"allow": ["failover", "start"], "fence_command": "/usr/bin/fence --node '{node}'"},
    )  # fmt: skip
    assert settings.repair.allowed(settings.backend("a")) == ("start", "failover")
    assert settings.repair.allowed(settings.backend("b")) == ()  # its own setting wins
    assert settings.repair.fence_argv("n3") == ["/usr/bin/fence", "--node", "n3"]
    assert Settings().repair.allow == [] and Settings().repair.node_down_after == 120
    with pytest.raises(Exception, match="fence_command must name the node"):
        Settings(repair={"fence_command": "poweroff"})
    with pytest.raises(Exception, match=r"repair\.allow"):
        Settings(repair={"allow": ["reinstall"]})
