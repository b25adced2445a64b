"""Node choice inside a backend (``node_placement = "pnode"``), pure: which node, the second one for
drbd, the in-flight accounting that spreads a burst, nodes marked full after a capacity failure,
and what each mode sends."""

from __future__ import annotations

import contextlib
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synnefo_ganeti.allocate import (
    Allocator,
    BackendView,
    NoCapacityError,
    Requirement,
    Reservation,
    choose_nodes,
    chooses_nodes,
    placed_spec,
)
from synnefo_ganeti.config import Settings
from synnefo_ganeti.rapi import InstanceSpec, Node
from tests import helpers

GIB = 1024


def node(name: str, mfree: int = 8 * GIB, *, dfree: int = 100 * GIB, **kw: object) -> Node:
    return Node(name=name, mfree=mfree, mtotal=mfree, dfree=dfree, dtotal=dfree, ctotal=8, **kw)


def backend(name: str, *nodes: Node) -> BackendView:
    return BackendView(name=name, nodes=list(nodes), stats_at=0.0)


def req(memory: int = 1024, disk: int = 0, template: str = "diskless") -> Requirement:
    return Requirement(memory=memory, disk=disk, vcpus=1, disk_template=template)


def spec(**kw: object) -> InstanceSpec:
    return helpers.spec("vm1.example", memory=1024, **kw)  # type: ignore[arg-type]


# -- choose_nodes ------------------------------------------------------------------------------------


def test_the_node_with_most_room_among_the_least_busy() -> None:
    view = backend("b", node("n1", 2 * GIB), node("n2", 6 * GIB), node("n3", 4 * GIB))
    assert choose_nodes(view, req(), {}) == ("n2", None)


@pytest.mark.parametrize("flag", [{"drained": True}, {"offline": True}, {"vm_capable": False}])
def test_drained_offline_and_non_vm_capable_nodes_are_never_chosen(flag: dict[str, bool]) -> None:
    view = backend("b", node("big", 60 * GIB, **flag), node("small", 2 * GIB))
    alloc = Allocator()
    alloc.update(view)
    picked = {alloc.place(req(512), nodes=True).node for _ in range(3)}
    assert picked == {"small"}
    only_bad = backend("b", node("big", 60 * GIB, **flag))
    assert isinstance(choose_nodes(only_bad, req(), {}), str)


def test_memory_and_disk_in_flight_on_a_node_count_against_it() -> None:
    view = backend("b", node("n1", 3 * GIB, dfree=10 * GIB), node("n2", 2 * GIB, dfree=10 * GIB))
    alloc = Allocator()
    alloc.update(view)
    # 1 GiB each: n1 takes 3, n2 takes 2, then no node has room (memory less what is in flight)
    placed = Counter(alloc.place(req(GIB), nodes=True).node for _ in range(5))
    assert placed == {"n1": 3, "n2": 2}
    with pytest.raises(NoCapacityError, match="no room"):
        alloc.place(req(GIB), nodes=True)
    disk_view = backend("d", node("n1", dfree=5 * GIB), node("n2", dfree=3 * GIB))
    alloc.update(disk_view)
    placed = Counter(alloc.place(req(0, 2 * GIB, "plain"), only="d", nodes=True).node for _ in range(3))
    assert placed == {"n1": 2, "n2": 1}


def test_a_burst_spreads_over_the_nodes_by_creates_in_flight() -> None:
    # one node far bigger than the others: a burst still goes one create per node at a time,
    # as each create takes its primary node's lock
    view = backend("b", node("n1", 60 * GIB), node("n2", 8 * GIB), node("n3", 8 * GIB))
    alloc = Allocator()
    alloc.update(view)
    burst = [alloc.place(req(), nodes=True) for _ in range(9)]
    assert Counter(r.node for r in burst) == {"n1": 3, "n2": 3, "n3": 3}
    assert [r.node for r in burst[:3]] == ["n1", "n2", "n3"]
    loads = alloc.node_loads("b")
    assert {name: load.creates for name, load in loads.items()} == {"n1": 3, "n2": 3, "n3": 3}
    # the creates on n2 end: the next ones go there first
    for reservation in burst:
        if reservation.node == "n2":
            alloc.finished(reservation, 1.0)
    assert alloc.place(req(), nodes=True).node == "n2"


def test_drbd_takes_a_second_node_in_the_same_group_with_room_for_the_disk() -> None:
    view = backend(
        "b",
        node("n1", 8 * GIB, dfree=50 * GIB, **{"group.uuid": "g1"}),
        node("n2", 8 * GIB, dfree=1 * GIB, **{"group.uuid": "g1"}),  # too little disk
        node("n3", 8 * GIB, dfree=50 * GIB, **{"group.uuid": "g2"}),  # another group
        node("n4", 4 * GIB, dfree=50 * GIB, **{"group.uuid": "g1"}),
    )
    mirrored = req(1024, 2 * 10 * GIB, "drbd")  # 10 GiB on each of two nodes
    assert choose_nodes(view, mirrored, {}) == ("n1", "n4")
    lone = backend("b", node("n1", dfree=50 * GIB), node("n2", dfree=GIB))
    assert "no two nodes" in str(choose_nodes(lone, mirrored, {}))
    alloc = Allocator()
    alloc.update(view)
    first, second = alloc.place(mirrored, nodes=True), alloc.place(mirrored, nodes=True)
    assert (first.node, first.snode) == ("n1", "n4")
    # n2 lacks the disk and n3 has no partner in its group: n1 and n4 again (n1 has more memory left)
    assert (second.node, second.snode) == ("n1", "n4")
    assert first.nodes == ("n1", "n4")


def test_a_backend_where_no_node_fits_is_passed_over() -> None:
    alloc = Allocator()
    alloc.update(backend("a", *(node(f"a{i}", 6 * GIB) for i in range(3))))
    alloc.update(backend("b", node("b1", 5 * GIB)))
    assert [alloc.place(req(4 * GIB), only="a", nodes=True).node for _ in range(3)] == ["a0", "a1", "a2"]
    # 6 GiB left on "a" in all, but 2 GiB on each node: enough for the backend, not for a node
    assert "a" in dict(alloc.candidates(req(4 * GIB)))
    with pytest.raises(NoCapacityError, match="no node has room"):
        alloc.place(req(4 * GIB), only="a", nodes=True)
    reservation = alloc.place(req(4 * GIB), nodes=True)
    assert (reservation.name, reservation.node) == ("b", "b1")


def test_a_node_that_failed_for_room_is_out_until_stats_read_after_the_failure() -> None:
    alloc = Allocator()
    alloc.update(backend("b", node("n1", 8 * GIB), node("n2", 4 * GIB)))
    first = alloc.place(req(), nodes=True, now=1.0)
    assert first.node == "n1"
    alloc.node_full(first, now=5.0)
    alloc.finished(first, 0.1, ok=False)
    assert alloc.full_nodes("b") == {"n1"}
    assert alloc.due_for_refresh(interval=3600, now=5.0) == ["b"]
    assert alloc.place(req(), nodes=True).node == "n2"
    alloc.update(BackendView(name="b", nodes=alloc.view("b").nodes, stats_at=4.0))  # read before it
    assert alloc.full_nodes("b") == {"n1"}
    alloc.update(BackendView(name="b", nodes=alloc.view("b").nodes, stats_at=5.5))
    assert alloc.full_nodes("b") == set()


# -- what each mode sends ----------------------------------------------------------------------------


def reservation(node: str | None = None, snode: str | None = None) -> Reservation:
    return Reservation(name="b", requirement=req(), id=1, node=node, snode=snode)


def test_pnode_mode_sends_the_chosen_nodes() -> None:
    assert chooses_nodes(spec(), "pnode")
    sent = placed_spec(spec(), reservation("n2"), "pnode").to_rapi_body()
    assert sent["pnode"] == "n2" and "snode" not in sent and "iallocator" not in sent
    assert "opportunistic_locking" not in sent
    mirrored = placed_spec(spec(), reservation("n2", "n3"), "pnode").to_rapi_body()
    assert (mirrored["pnode"], mirrored["snode"]) == ("n2", "n3")


def test_opportunistic_mode_sends_opportunistic_locking_and_no_node() -> None:
    assert not chooses_nodes(spec(), "opportunistic")
    sent = placed_spec(spec(), reservation(), "opportunistic").to_rapi_body()
    assert sent["opportunistic_locking"] is True and "pnode" not in sent and "iallocator" not in sent
    own = placed_spec(spec(iallocator="hail"), reservation(), "opportunistic").to_rapi_body()
    assert own["iallocator"] == "hail" and own["opportunistic_locking"] is True


def test_ganeti_mode_sends_neither() -> None:
    assert not chooses_nodes(spec(), "ganeti")
    sent = placed_spec(spec(), reservation(), "ganeti").to_rapi_body()
    assert not {"pnode", "snode", "iallocator", "opportunistic_locking"} & set(sent)


@pytest.mark.parametrize("mode", ["pnode", "opportunistic", "ganeti"])
def test_the_requests_own_pnode_or_iallocator_wins(mode: str) -> None:
    own_node = spec(pnode="n9")
    assert not chooses_nodes(own_node, mode)
    sent = placed_spec(own_node, reservation(), mode).to_rapi_body()
    assert sent["pnode"] == "n9" and "opportunistic_locking" not in sent  # Ganeti: iallocator only
    own_allocator = spec(iallocator="hail")
    assert not chooses_nodes(own_allocator, mode)
    sent = placed_spec(own_allocator, reservation(), mode).to_rapi_body()
    assert sent["iallocator"] == "hail" and "pnode" not in sent
    assert not chooses_nodes(spec(opportunistic_locking=True), mode)


def test_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings(backends=[]).dispatcher.node_placement == "pnode"
    assert (
        Settings(backends=[], dispatcher={"node_placement": "ganeti"}).dispatcher.node_placement == "ganeti"
    )
    monkeypatch.setenv("SYNNEFO_GANETI__DISPATCHER__NODE_PLACEMENT", "opportunistic")
    assert Settings(backends=[]).dispatcher.node_placement == "opportunistic"
    monkeypatch.setenv("SYNNEFO_GANETI__DISPATCHER__NODE_PLACEMENT", "hail")
    with pytest.raises(Exception, match="node_placement"):
        Settings(backends=[])


# -- the loads kept with the reservations --------------------------------------------------------------

_OPS = st.lists(
    st.tuples(
        st.sampled_from(["place", "release", "submitted", "finished", "failed", "stats"]), st.integers(0, 50)
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(ops=_OPS)
def test_the_loads_kept_are_the_loads_summed_after_any_sequence(ops: list[tuple[str, int]]) -> None:
    """The allocator keeps each node's load as reservations come and go (summing them all at each
    placement was quadratic in a burst): after any sequence of placements, releases, submissions,
    ends and stats reads, what it keeps is what summing its reservations gives."""
    from synnefo_ganeti.allocate._nodes import node_loads

    alloc = Allocator()
    alloc.update(backend("b", node("n1", 64 * GIB), node("n2", 48 * GIB), node("n3", 32 * GIB)))
    placed: list[Reservation] = []
    clock = 0.0
    for op, pick in ops:
        clock += 1.0
        if op == "place":
            template = "drbd" if pick % 3 == 0 else "plain"
            with contextlib.suppress(NoCapacityError):
                placed.append(alloc.place(req(512 + pick, 1024, template), nodes=True))
        elif op == "stats":
            alloc.update(BackendView(name="b", nodes=alloc.view("b").nodes, stats_at=clock - pick % 3))
        elif placed:
            reservation = placed[pick % len(placed)]
            if op == "release":
                alloc.release(reservation)
            elif op == "submitted":
                alloc.submitted(reservation)
            else:
                alloc.finished(reservation, 1.0, ok=op == "finished", now=clock)
        kept = alloc._backends["b"]
        assert alloc.node_loads("b") == node_loads(kept.reservations.values(), kept.queue)
