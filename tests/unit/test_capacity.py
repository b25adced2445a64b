"""The capacity count (``allocate/_capacity.py``, issue 30 item 4): hspace's own answers on the
recorded 3-node testbed, flavors and the policy, nodes that take nothing, hosted instances in
the N+1 check, and properties against a trivially correct model of N+1 on empty nodes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synnefo_ganeti.allocate import (
    CapacityNode,
    Flavor,
    FlavorCapacity,
    HostedInstance,
    InstancePolicy,
    capacity_nodes,
    count_capacity,
    hosted_instances,
    policy_refusal,
)
from synnefo_ganeti.errors import InvalidError
from synnefo_ganeti.rapi import ClusterInfo, Instance, Node

FIXTURES = Path(__file__).parent.parent / "fixtures" / "hspace-3.0"
POLICY = InstancePolicy.of({"vcpu-ratio": 4.0, "spindle-ratio": 32.0})


def recorded(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def hspace_count(spec: str, *, n_plus_1: bool) -> tuple[int, str]:
    """``HTS_ALLOC_INSTANCES`` and ``HTS_ALLOC_FAIL_REASON`` of a recorded hspace run."""
    suffix = "" if n_plus_1 else "-no-capacity-checks"
    lines = (FIXTURES / f"hspace-diskless-{spec}{suffix}.txt").read_text().splitlines()
    values = dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))
    return int(values["HTS_ALLOC_INSTANCES"]), values["HTS_ALLOC_FAIL_REASON"]


def lab() -> tuple[tuple[CapacityNode, ...], InstancePolicy]:
    info = ClusterInfo.model_validate(recorded("info.json"))
    nodes = [Node.model_validate(n) for n in recorded("nodes.json")]
    instances = hosted_instances(Instance.model_validate(i) for i in recorded("instances.json"))
    groups = {g["uuid"]: g["name"] for g in recorded("groups.json")}
    return capacity_nodes(nodes, instances, groups=groups), InstancePolicy.of(info.ipolicy)


@pytest.mark.parametrize("spec", ["1024,4096,1", "1024,8192,1", "1024,20000,1", "10240,4096,2", "1024,128,1"])
def test_the_counts_are_hspaces_on_the_recorded_testbed(spec: str) -> None:
    disk, memory, vcpus = (int(x) for x in spec.split(","))
    nodes, policy = lab()
    counted = count_capacity(nodes, policy, Flavor(memory=memory, vcpus=vcpus, disk=disk), "diskless")
    now, why_now = hspace_count(spec, n_plus_1=False)
    n1, why_n1 = hspace_count(spec, n_plus_1=True)
    assert (counted.now, counted.n_plus_1) == (now, n1)
    assert counted.limit_now == {"FAILMEM": "memory", "FAILCPU": "cpu"}[why_now]
    if why_n1 == "FAILN1":
        assert counted.limit_n_plus_1 == "N+1"


def hscan_nodes() -> tuple[CapacityNode, ...]:
    """The nodes and instances of ``hosted-8g-node1.data`` (htools' text format, as ``hscan``
    writes it: ``name|mtotal|mnode|mfree|dtotal|dfree|ctotal|...|cnos|...`` and
    ``name|mem|disk|vcpus|status|auto_balance|pnode|snode|template|...``)."""
    sections = (FIXTURES / "hosted-8g-node1.data").read_text().split("\n\n")
    nodes = []
    for line in sections[1].splitlines():
        f = line.split("|")
        nodes.append(Node(name=f[0], mtotal=int(f[1]), mnode=int(f[2]), mfree=int(f[3]), dtotal=int(f[4]),
                          dfree=int(f[5]), ctotal=int(f[6]), cnos=int(f[13]), **{"group.uuid": f[8]}))  # type: ignore[arg-type]  # fmt: skip
    hosted = []
    for line in sections[2].splitlines():
        f = line.split("|")
        hosted.append(HostedInstance(f[0], f[6], memory=int(f[1]), vcpus=int(f[3]), disk=int(f[2]),
                                     template=f[8], running=f[4] == "running"))  # fmt: skip
    return capacity_nodes(nodes, hosted)


def test_the_counts_are_hspaces_with_an_instance_hosted() -> None:
    """A running 8 GiB diskless instance on node1: its memory counts there although the fake
    hypervisor reports it free (hspace takes the smaller of reported and recorded), and keeping
    N+1 the new ones move off first (Ganeti's order of a node's primaries, the newest first)."""
    nodes = hscan_nodes()
    assert [n.memory_free for n in nodes] == [24105 - 285 - 8192, 23111, 23111]
    lines = (FIXTURES / "hosted-8g-node1.txt").read_text().splitlines()[1:]
    for line in lines:
        spec, now, n1 = line.split()
        disk, memory, vcpus = (int(x) for x in spec.split(","))
        counted = count_capacity(nodes, POLICY, Flavor(memory=memory, vcpus=vcpus, disk=disk), "diskless")
        assert (counted.now, counted.n_plus_1) == (int(now), int(n1)), spec


def test_the_issues_example_15_now_and_10_keeping_n_plus_1() -> None:
    nodes, policy = lab()
    counted = count_capacity(nodes, policy, Flavor(memory=4096, vcpus=1, disk=1024), "diskless")
    assert (counted.now, counted.n_plus_1, counted.limit_now, counted.limit_n_plus_1) == (
        15,
        10,
        "memory",
        "N+1",
    )
    assert {name.split(".")[0]: pair for name, pair in counted.per_node.items()} == {
        "node1": (5, 4), "node2": (5, 3), "node3": (5, 3),
    }  # fmt: skip
    as_json = counted.to_json()
    assert as_json["flavor"] == {"memory": 4096, "vcpus": 1, "disk": 1024}
    assert as_json["per_node"]["node1.ganeti.test"] == {"now": 5, "n_plus_1": 4}


def test_the_recorded_nodes_as_the_count_sees_them() -> None:
    nodes, policy = lab()
    assert [n.name for n in nodes] == [f"node{i}.ganeti.test" for i in (1, 2, 3)]
    assert all(n.usable and n.group == "default" and n.cpus == 2 and n.os_cpus == 2 for n in nodes)
    assert all(n.spindles == 1 and n.vcpus_used == 2 and n.primaries == () for n in nodes)
    assert Flavor.standard(policy) == Flavor(memory=128, vcpus=1, disk=1024, spindles=1)
    assert policy.vcpu_ratio == 4 and policy.spindle_ratio == 32


# -- flavors and the policy --------------------------------------------------------------------


def test_a_flavor_is_parsed() -> None:
    assert Flavor.parse("memory=4096,vcpus=2,disk=10240") == Flavor(4096, 2, 10240)
    assert Flavor.parse(" disk=10G , memory=4G,vcpus=1") == Flavor(4096, 1, 10240)
    assert str(Flavor.parse("memory=512M,vcpus=1,disk=0")) == "memory=512,vcpus=1,disk=0"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("memory=4096,vcpus=2", "missing disk"),
        ("memory=4096,vcpus=2,disk=1,memory=2", "memory given twice"),
        ("memory=lots,vcpus=2,disk=1", "memory must be a whole number"),
        ("memory=4096,cpus=2,disk=1", "expected memory=MiB,vcpus=N,disk=MiB"),
        ("memory=0,vcpus=1,disk=1", "must be above 0"),
        ("memory=1,vcpus=2G,disk=1", "vcpus must be a whole number"),
    ],
)
def test_a_bad_flavor_is_refused_with_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(InvalidError, match=message):
        Flavor.parse(text)


def test_the_policy_bounds_and_templates() -> None:
    _, policy = lab()
    assert policy_refusal(policy, Flavor(4096, 1, 1024), "diskless") is None
    # hspace checks the minimum disk even for diskless: a 0 MiB disk is outside the bounds
    assert "outside the instance policy's bounds" in str(
        policy_refusal(policy, Flavor(4096, 1, 0), "diskless")
    )
    assert "memory-size 128-32768" in str(policy_refusal(policy, Flavor(65536, 1, 1024), "diskless"))
    assert "does not allow disk template plain" in str(policy_refusal(policy, Flavor(4096, 1, 1024), "plain"))
    nodes, _ = lab()
    refused = count_capacity(nodes, policy, Flavor(4096, 9, 1024), "diskless")
    assert (refused.now, refused.n_plus_1, refused.limit_now) == (0, 0, "policy")
    assert refused.note and "cpu-count 1-8" in refused.note


def test_drbd_is_not_counted_and_says_so() -> None:
    nodes, _ = lab()
    counted = count_capacity(nodes, POLICY, Flavor(1024, 1, 1024), "drbd")
    assert counted.now is None and counted.n_plus_1 is None and "drbd" in str(counted.note)
    assert counted.to_json()["now"] is None


# -- nodes --------------------------------------------------------------------------------------


def node(name: str, memory: int = 16384, **kw: Any) -> CapacityNode:
    kw.setdefault("cpus", 64)
    kw.setdefault("disk_free", 1 << 20)
    return CapacityNode(name, "g", memory_free=memory, **kw)


def test_drained_offline_and_not_vm_capable_nodes_take_nothing() -> None:
    raw = [
        Node(name="a", mfree=16384, dfree=1 << 20, ctotal=64, cnos=1, **{"group.uuid": "u1"}),  # type: ignore[arg-type]
        Node(name="b", drained=True, mfree=16384, dfree=1 << 20, ctotal=64, **{"group.uuid": "u1"}),  # type: ignore[arg-type]
        Node(name="c", offline=True, **{"group.uuid": "u1"}),  # type: ignore[arg-type]
        Node(name="d", vm_capable=False, mfree=16384, ctotal=64, **{"group.uuid": "u1"}),  # type: ignore[arg-type]
    ]
    nodes = capacity_nodes(raw, groups={"u1": "default"})
    assert [(n.name, n.usable, n.group) for n in nodes] == [
        ("a", True, "default"), ("b", False, "default"), ("c", False, "default"), ("d", False, "default"),
    ]  # fmt: skip
    counted = count_capacity(nodes, POLICY, Flavor(4096, 1, 0), "diskless")
    # a alone takes 3 (16384 - 3*4096 > 0); nothing can move off it: none keeping N+1
    assert (counted.now, counted.n_plus_1, counted.limit_n_plus_1) == (3, 0, "N+1")
    assert set(counted.per_node) == {"a"}
    nothing = count_capacity(nodes[1:], POLICY, Flavor(4096, 1, 0), "diskless")
    assert (nothing.now, nothing.n_plus_1, nothing.limit_now, nothing.note) == (
        0,
        0,
        "no nodes",
        "no usable node",
    )


def test_free_memory_must_stay_above_zero_as_in_ganeti() -> None:
    exact = count_capacity([node("a", 8192), node("b", 8193)], POLICY, Flavor(4096, 1, 0), "diskless")
    # a takes 1 (8192 - 4096 > 0, not 2), b 2; keeping N+1 b's one would not fit on a once a
    # holds one (4096 left is not above 4096): 1 in all
    assert exact.per_node == {"a": (1, 0), "b": (2, 1)}


def test_cpu_disk_and_spindle_limits() -> None:
    # 4 CPUs, ratio 4, 1 used by the OS: 15 one-CPU instances
    cpu = count_capacity([node("a", 1 << 20, cpus=4)], POLICY, Flavor(128, 1, 0), "diskless")
    assert (cpu.now, cpu.limit_now) == (15, "cpu")
    # plain uses the node's own disk: 10 GiB free takes 9 of 1 GiB (it must stay above 0)
    disk = count_capacity([node("a", 1 << 20, disk_free=10240)], POLICY, Flavor(128, 1, 1024), "plain")
    assert (disk.now, disk.limit_now) == (9, "disk")
    # ... and spindles: ratio 32 on a spindle_count of 1
    spindles = count_capacity([node("a", 1 << 20)], POLICY, Flavor(128, 1, 1024), "plain")
    assert (spindles.now, spindles.limit_now) == (32, "spindles")
    # diskless and sharedfile use no disk of the node
    assert (
        count_capacity([node("a", 1 << 20, disk_free=0)], POLICY, Flavor(128, 1, 1024), "sharedfile").now
        == 64 * 4 - 1
    )


def test_hosted_instances_count_in_cpus_and_must_move_for_n_plus_1() -> None:
    big = HostedInstance("big", "a", memory=12000, vcpus=4)
    nodes = [node("a", 4000, cpus=2, primaries=(big,)), node("b", 13000, cpus=8), node("c", 13000, cpus=8)]
    assert nodes[0].vcpus_used == 5  # its OS's one CPU and the instance's four
    counted = count_capacity(nodes, POLICY, Flavor(4096, 1, 0), "diskless")
    # now: a takes 0 (4000 MiB), b and c 3 each; keeping N+1, "big" (12000) must still fit on b
    # or c: once b has one, c takes none (then neither would have 12000 free); b's go to c
    assert counted.per_node == {"a": (0, 0), "b": (3, 3), "c": (3, 0)}
    assert (counted.now, counted.n_plus_1, counted.limit_n_plus_1) == (6, 3, "N+1")
    offline = HostedInstance("off", "b", memory=1024, vcpus=8, online=False)
    assert node("b", primaries=(offline,)).vcpus_used == 1  # an offline instance's CPUs are not used


def test_groups_are_counted_apart_for_n_plus_1() -> None:
    nodes = [
        CapacityNode("a", "g1", memory_free=8193, cpus=64),
        CapacityNode("b", "g1", memory_free=8193, cpus=64),
        CapacityNode("c", "g2", memory_free=8193, cpus=64),
    ]
    counted = count_capacity(nodes, POLICY, Flavor(4096, 1, 0), "diskless")
    # g1: 4 slots, keep one node's (2) free: 2; g2: one node, nowhere to move: 0
    assert (counted.now, counted.n_plus_1) == (6, 2)


def test_instances_from_rapi_answers() -> None:
    raw = Instance.model_validate(
        {"name": "i1", "pnode": "a", "snodes": ["b"], "disk_template": "drbd", "admin_state": "offline",
         "beparams": {"maxmem": 2048, "vcpus": 2}, "disk.sizes": [1024, 512]}
    )  # fmt: skip
    (hosted,) = hosted_instances([raw])
    assert hosted == HostedInstance("i1", "a", 2048, 2, 1536, "drbd", ("b",), online=False, running=False)
    assert hosted.local_disk


# -- properties ---------------------------------------------------------------------------------


def slots(free: int, size: int) -> int:
    return max(0, (free - 1) // size)


def redundant(frees: list[int], placed: list[int], size: int) -> bool:
    """The trivially correct N+1 of empty nodes, one size: each node's new ones fit in the
    slots the others have left."""
    left = [slots(f - p * size, size) for f, p in zip(frees, placed, strict=True)]
    return all(p <= sum(left) - left[j] for j, p in enumerate(placed))


frees = st.lists(st.integers(min_value=0, max_value=64 * 1024), min_size=1, max_size=7)
sizes = st.sampled_from([512, 1024, 2048, 4096, 8192])


@settings(max_examples=200, deadline=None)
@given(frees=frees, size=sizes, cpus=st.lists(st.integers(min_value=1, max_value=16), min_size=7, max_size=7))
def test_n_plus_1_holds_and_no_node_could_take_one_more(frees: list[int], size: int, cpus: list[int]) -> None:
    nodes = [CapacityNode(f"n{i}", "g", memory_free=f, cpus=cpus[i]) for i, f in enumerate(frees)]
    counted: FlavorCapacity = count_capacity(nodes, POLICY, Flavor(size, 1, 0), "diskless")
    now = [counted.per_node[n.name][0] for n in nodes]
    placed = [counted.per_node[n.name][1] for n in nodes]
    assert counted.now == sum(now) and counted.n_plus_1 == sum(placed)
    assert counted.n_plus_1 is not None and counted.now is not None and counted.n_plus_1 <= counted.now
    assert now == [min(slots(f, size), int(4 * c - 1)) for f, c in zip(frees, cpus, strict=False)]
    assert redundant(frees, placed, size)
    for i in range(len(nodes)):  # maximal: one more anywhere breaks N+1 or does not fit
        if placed[i] < now[i]:
            assert not redundant(frees, [p + (j == i) for j, p in enumerate(placed)], size)


@settings(max_examples=100, deadline=None)
@given(frees=frees, size=sizes, extra=st.integers(min_value=0, max_value=16384), which=st.integers(0, 6))
def test_more_free_memory_never_fits_fewer_now(frees: list[int], size: int, extra: int, which: int) -> None:
    nodes = [CapacityNode(f"n{i}", "g", memory_free=f, cpus=64) for i, f in enumerate(frees)]
    more = list(nodes)
    i = which % len(nodes)
    more[i] = CapacityNode(nodes[i].name, "g", memory_free=nodes[i].memory_free + extra, cpus=64)
    before = count_capacity(nodes, POLICY, Flavor(size, 1, 0), "diskless")
    after = count_capacity(more, POLICY, Flavor(size, 1, 0), "diskless")
    assert before.now is not None and after.now is not None and after.now >= before.now


def test_a_large_backend_is_counted_quickly() -> None:
    hosted = tuple(HostedInstance(f"i{i}", f"n{i % 40}", memory=2048) for i in range(800))
    nodes = [
        CapacityNode(f"n{k}", "g", memory_free=256000 - 20 * 2048, cpus=64,
                     primaries=tuple(h for h in hosted if h.primary == f"n{k}"))
        for k in range(40)
    ]  # fmt: skip
    counted = count_capacity(nodes, POLICY, Flavor(1024, 1, 0), "diskless")
    assert counted.now is not None and counted.n_plus_1 is not None
    assert 0 < counted.n_plus_1 < counted.now


def test_a_drbd_primary_fails_over_to_its_secondary_keeping_n_plus_1() -> None:
    mirrored = HostedInstance("m", "a", memory=8000, template="drbd", secondaries=("b",))
    nodes = [node("a", 16384, primaries=(mirrored,)), node("b", 8193), node("c", 16384)]
    counted = count_capacity(nodes, POLICY, Flavor(4096, 1, 0), "diskless")
    assert counted.now == 3 + 2 + 3
    # b must keep more than 8000 MiB free for m: it takes no new one
    assert counted.per_node["b"][1] == 0 and counted.n_plus_1 is not None and counted.n_plus_1 > 0
    # with b drained, m has nowhere to go: nothing keeps N+1
    drained = [nodes[0], CapacityNode("b", "g", usable=False, memory_free=8193), nodes[2]]
    assert count_capacity(drained, POLICY, Flavor(4096, 1, 0), "diskless").n_plus_1 == 0


def test_movable_primaries_move_newest_first() -> None:
    """The recorded case (``hosted-8g-node1``) in small: a holds an 8 GiB instance; diskless
    ones move in Ganeti's order, the newest first, so a's new ones go before it and leave no room
    one placement sooner than ``file`` ones, re-created largest first: 7 against 8."""

    def count(template: str) -> FlavorCapacity:
        big = HostedInstance("big", "a", memory=8192, template=template)
        nodes = [CapacityNode("a", "g", memory_free=15628, cpus=2, os_cpus=2, primaries=(big,))]
        nodes += [CapacityNode(n, "g", memory_free=23111, cpus=2, os_cpus=2) for n in ("b", "c")]
        return count_capacity(nodes, POLICY, Flavor(4096, 1, 1024), template)

    assert (count("diskless").now, count("diskless").n_plus_1) == (13, 7)
    assert (count("file").now, count("file").n_plus_1) == (13, 8)
