from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synnefo_ganeti.allocate import (
    Allocator,
    BackendView,
    NoCapacityError,
    Pending,
    Requirement,
    Reservation,
)
from synnefo_ganeti.errors import GanetiError
from synnefo_ganeti.rapi import InstanceSpec, Node
from tests import helpers

GIB = 1024


def spec(
    memory: int = 1024, *, disk: int = 0, template: str = "plain", vcpus: int | None = None
) -> InstanceSpec:
    """An instance of a size (the allocator reads nothing else)."""
    disks = [{"size": disk}] if disk else []
    return helpers.spec(memory=memory, vcpus=vcpus, disk_template=template, os="debian", disks=disks)


def node(name: str, mfree: int, *, dfree: int = 100 * GIB, ctotal: int = 8, **kw: bool) -> Node:
    return Node(name=name, mfree=mfree, mtotal=mfree, dfree=dfree, dtotal=dfree, ctotal=ctotal, **kw)


def view(name: str, *mfree: int, **kw: object) -> BackendView:
    nodes = [node(f"{name}-n{i}", m) for i, m in enumerate(mfree)]
    return BackendView(name=name, nodes=nodes, stats_at=0.0, **kw)  # type: ignore[arg-type]


def allocator(*views: BackendView, strategy: str = "credits") -> Allocator:
    alloc = Allocator(strategy)  # type: ignore[arg-type]
    for v in views:
        alloc.update(v)
    return alloc


# -- Requirement ------------------------------------------------------------------------------


def test_requirement_memory_prefers_maxmem_then_memory_then_default() -> None:
    base = {"name": "vm", "disk_template": "diskless", "os": "debian"}
    assert Requirement.of(InstanceSpec(**base, beparams={"maxmem": 2048, "memory": 512})).memory == 2048
    assert Requirement.of(InstanceSpec(**base, beparams={"memory": 512})).memory == 512
    req = Requirement.of(InstanceSpec(**base))
    assert (req.memory, req.vcpus, req.disk) == (128, 1, 0)
    assert Requirement.of(InstanceSpec(**base, beparams={"vcpus": 4})).vcpus == 4


def test_requirement_disk_sums_doubles_for_drbd_and_is_zero_for_diskless() -> None:
    disks = [{"size": 1000}, {"size": 500}]
    plain = Requirement.of(InstanceSpec(name="vm", disk_template="plain", os="d", disks=disks))
    drbd = Requirement.of(InstanceSpec(name="vm", disk_template="drbd", os="d", disks=disks))
    diskless = Requirement.of(InstanceSpec(name="vm", disk_template="diskless", os="d", disks=disks))
    assert plain.disk == 1500
    assert (drbd.disk, drbd.disk_per_node) == (3000, 1500)
    assert diskless.disk == 0
    assert drbd.disk_template == "drbd"


def test_view_counts_only_usable_nodes() -> None:
    v = BackendView(
        name="a",
        nodes=[
            node("ok", 1000, ctotal=4),
            node("off", 5000, offline=True),
            node("dr", 5000, drained=True),
            node("nvm", 5000, vm_capable=False),
            Node(name="unknown"),
        ],
    )
    assert [n.name for n in v.usable_nodes] == ["ok", "unknown"]
    assert (v.free_memory, v.largest_free_memory, v.max_vcpus) == (1000, 1000, 4)
    assert v.free_disk == 100 * GIB


# -- exclusions -------------------------------------------------------------------------------


def test_each_exclusion_has_a_clear_reason() -> None:
    alloc = allocator(
        view("drained", 8192, drained=True),
        view("sick", 8192, healthy=False),
        view("busy", 8192, refusing_until=112.0),
        view("small", 2048, 1024),
        BackendView(name="tmpl", nodes=[node("t", 8192)], disk_templates=frozenset({"file", "diskless"})),
        BackendView(name="cpus", nodes=[node("c", 8192, ctotal=2)]),
        BackendView(name="empty", nodes=[node("o", 8192, offline=True)]),
        view("good", 8192),
    )
    reasons = alloc.rejected(spec(4096, vcpus=4), now=100.0)
    assert reasons == {
        "drained": "drained",
        "sick": "failing health checks",
        "busy": "refusing submissions (503) for 12 s more",
        "small": "no node has 4096 MiB free (largest 2048)",
        "tmpl": "disk template plain not enabled (enabled: diskless, file)",
        "cpus": "needs 4 vcpus, nodes have at most 2",
        "empty": "no usable node (all offline, drained or not vm_capable)",
    }
    assert alloc.candidates(spec(4096, vcpus=4), now=100.0) == [("good", 2)]


def test_refusal_expires() -> None:
    alloc = allocator(view("busy", 8192, refusing_until=112.0))
    assert alloc.place(spec(), now=112.0).name == "busy"


def test_disk_shortage_and_unknown_templates_accept_any() -> None:
    alloc = allocator(BackendView(name="a", nodes=[node("n", 8192, dfree=1000)]))
    assert alloc.rejected(spec(disk=2000)) == {"a": "no node has 2000 MiB disk free (largest 1000)"}
    assert alloc.candidates(spec(disk=400, template="sharedfile")) == [("a", 2)]


def test_drbd_needs_two_nodes() -> None:
    alloc = allocator(view("one", 8192), view("two", 8192, 8192))
    assert alloc.rejected(spec(disk=100, template="drbd")) == {"one": "drbd needs 2 usable nodes, there is 1"}


def test_pending_exhaustion_is_explained() -> None:
    alloc = allocator(view("a", 4096, 4096))
    alloc.place(spec(4096))
    alloc.place(spec(4096))
    assert alloc.rejected(spec(4096)) == {"a": "no room for 4096 MiB memory: 8192 MiB free, 8192 MiB pending"}


def test_no_capacity_error_lists_every_backend() -> None:
    alloc = allocator(view("a", 1024, drained=True), view("b", 1024, healthy=False), view("c", 1024))
    with pytest.raises(NoCapacityError) as info:
        alloc.place(spec(2048))
    err = info.value
    assert isinstance(err, GanetiError)
    assert set(err.reasons) == {"a", "b", "c"}
    for text in ("a: drained", "b: failing health checks", "c: no node has 2048 MiB free (largest 1024)"):
        assert text in str(err)
    with pytest.raises(NoCapacityError, match="no backends are known"):
        Allocator().place(spec())


# -- credits ----------------------------------------------------------------------------------


def test_most_free_wins_and_pending_shifts_later_placements() -> None:
    alloc = allocator(view("small", 10 * GIB), view("mid", 20 * GIB), view("big", 30 * GIB))
    assert alloc.candidates(spec(GIB)) == [("big", 30), ("mid", 20), ("small", 10)]
    placed = Counter(alloc.place(spec(GIB)).name for _ in range(60))
    assert placed == {"big": 30, "mid": 20, "small": 10}
    for name in ("small", "mid", "big"):
        assert alloc.pending(name).memory <= alloc.view(name).free_memory
    with pytest.raises(NoCapacityError):
        alloc.place(spec(GIB))


def test_partial_fill_levels_the_free_capacity_from_the_top() -> None:
    # Creates that end at once leave no queue: every choice is a tie on the finish time,
    # so the credits decide, as before the drain rate was weighed.
    alloc = allocator(view("small", 10 * GIB), view("mid", 20 * GIB), view("big", 30 * GIB))
    placed: Counter[str] = Counter()
    for _ in range(33):
        res = alloc.place(spec(GIB))
        alloc.finished(res, 1.0)
        placed[res.name] += 1
    # big alone down to mid's 20, both down to small's 10, then all three take turns.
    assert placed == {"big": 21, "mid": 11, "small": 1}
    assert [c for _, c in alloc.candidates(spec(GIB))] == [9, 9, 9]


def test_equal_backends_with_creates_in_flight_share_by_queue() -> None:
    # Changed with the drain-rate weighing: a queue is a cost even where memory abounds
    # (one node each, so each placement is a wave of its own).
    alloc = allocator(view("small", 10 * GIB), view("mid", 20 * GIB), view("big", 30 * GIB))
    placed = Counter(alloc.place(spec(GIB)).name for _ in range(30))
    assert placed == {"big": 10, "mid": 10, "small": 10}
    assert alloc.rejected(spec(GIB)) == {
        "small": "no room for 1024 MiB memory: 10240 MiB free, 10240 MiB pending"
    }


def test_ties_alternate() -> None:
    alloc = allocator(view("a", 8 * GIB), view("b", 8 * GIB))
    names = [alloc.place(spec(GIB)).name for _ in range(6)]
    assert names == ["a", "b", "a", "b", "a", "b"]


def test_round_robin_cycles_ignoring_credits() -> None:
    alloc = allocator(view("a", 2 * GIB), view("b", 50 * GIB), view("c", 50 * GIB), strategy="round_robin")
    names = [alloc.place(spec(GIB)).name for _ in range(7)]
    assert names == ["a", "b", "c", "a", "b", "c", "b"]  # a is full after two


def test_unknown_strategy_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown strategy"):
        Allocator("weighted")  # type: ignore[arg-type]


def test_release_gives_capacity_back() -> None:
    alloc = allocator(view("a", 2 * GIB))
    first = alloc.place(spec(GIB))
    alloc.place(spec(GIB))
    with pytest.raises(NoCapacityError):
        alloc.place(spec(GIB))
    assert alloc.release(first) is True
    assert alloc.release(first) is False
    assert alloc.pending("a").count == 1
    assert alloc.place(spec(GIB)).name == "a"


def test_accounted_then_fresh_update_keeps_totals_right() -> None:
    alloc = allocator(view("a", 4 * GIB))
    res = alloc.place(spec(GIB), now=10.0)
    alloc.place(spec(GIB), now=10.0)
    alloc.accounted(res, now=20.0)
    assert alloc.due_for_refresh(interval=60.0, now=21.0) == ["a"]
    # Stats read before the job ran do not include it: the reservation stays.
    alloc.update(BackendView(name="a", nodes=[node("n", 4 * GIB)], stats_at=15.0))
    assert alloc.pending("a") == Pending(2 * GIB, 0, 2)
    # Fresh stats include the started instance: the reservation goes, totals stay right.
    alloc.update(BackendView(name="a", nodes=[node("n", 3 * GIB)], stats_at=25.0))
    assert alloc.pending("a") == Pending(GIB, 0, 1)
    assert alloc.candidates(spec(GIB)) == [("a", 2)]
    assert alloc.due_for_refresh(interval=60.0, now=30.0) == []
    assert alloc.due_for_refresh(interval=60.0, now=90.0) == ["a"]


def test_place_many_is_all_or_nothing_and_forget_drops_a_backend() -> None:
    alloc = allocator(view("a", 2 * GIB), view("b", 2 * GIB))
    with pytest.raises(NoCapacityError):
        alloc.place_many([spec(GIB)] * 5)
    assert alloc.pending("a").count == alloc.pending("b").count == 0
    assert [r.name for r in alloc.place_many([spec(GIB)] * 2)] == ["a", "b"]
    alloc.forget("a")
    assert alloc.backends == ["b"]


# -- drain rate ------------------------------------------------------------------------------


def nodes_view(name: str, count: int, mfree: int) -> BackendView:
    return view(name, *([mfree] * count))


def test_more_nodes_drain_faster_and_get_more() -> None:
    # Same memory in all; 8 nodes finish creates 4 times as fast as 2.
    alloc = allocator(nodes_view("s", 2, 32 * GIB), nodes_view("m", 4, 16 * GIB), nodes_view("l", 8, 8 * GIB))
    placed = Counter(alloc.place(spec(GIB)).name for _ in range(70))
    assert placed == {"l": 40, "m": 20, "s": 10}
    assert alloc.in_flight("l") == 40
    assert alloc.drain_rate("l") == pytest.approx(4 * alloc.drain_rate("s"))
    # the finish times are level: the next one goes where the wave is shortest
    assert alloc.expected_finish("l") == alloc.expected_finish("m") == alloc.expected_finish("s")


def test_a_full_fast_backend_gets_none() -> None:
    alloc = allocator(nodes_view("fast", 8, GIB), nodes_view("slow", 1, 64 * GIB))
    placed = Counter(alloc.place(spec(GIB)).name for _ in range(20))
    assert placed == {"fast": 8, "slow": 12}
    assert "fast" in alloc.rejected(spec(GIB))
    assert alloc.pending("fast").memory <= alloc.view("fast").free_memory


def test_learned_create_time_changes_the_choice() -> None:
    alloc = allocator(nodes_view("a", 2, 64 * GIB), nodes_view("b", 2, 64 * GIB))
    assert alloc.create_seconds("a") == alloc.create_seconds("b") == 30.0
    # b's creates take 10 s, a's 2 s: a drains 5 times as fast
    first = [alloc.place(spec(GIB)) for _ in range(2)]
    assert [r.name for r in first] == ["a", "b"]  # first wave: a tie, then least recently chosen
    alloc.finished(first[0], 2.0)
    alloc.finished(first[1], 10.0)
    assert alloc.create_seconds("a") == 2.0 and alloc.create_seconds("b") == 10.0
    placed = Counter(alloc.place(spec(GIB)).name for _ in range(12))
    assert placed == {"a": 10, "b": 2}
    assert alloc.drain_rate("a") == pytest.approx(1.0)


def test_time_in_ganeti_is_corrected_for_the_queue_ahead() -> None:
    alloc = allocator(nodes_view("a", 2, 64 * GIB))
    held = [alloc.place(spec(GIB)) for _ in range(6)]  # 0..5 ahead
    alloc.finished(held[5], 3.0)  # 5 ahead on 2 nodes: 3 waves of 1 s
    assert alloc.create_seconds("a") == pytest.approx(1.0)
    alloc.finished(held[0], 2.0)  # none ahead: all of it was its own
    assert alloc.create_seconds("a") == pytest.approx(1.0 + 0.2 * (2.0 - 1.0))
    # failures teach nothing and give the room back
    assert alloc.in_flight("a") == 4
    alloc.finished(held[1], 0.01, ok=False)
    assert alloc.create_seconds("a") == pytest.approx(1.2)
    assert alloc.pending("a").count == 5 and alloc.in_flight("a") == 3
    # a finished create is accounted: its reservation goes with the next fresh stats
    alloc.update(BackendView(name="a", nodes=alloc.view("a").nodes, stats_at=time.monotonic() + 1))
    assert alloc.pending("a").count == 3


def test_submitted_counts_only_the_creates_ganeti_has_ahead() -> None:
    alloc = allocator(nodes_view("a", 2, 64 * GIB))
    held = [alloc.place(spec(GIB)) for _ in range(8)]  # 7 placed before the last
    for res in held[:3]:
        alloc.submitted(res)
    alloc.finished(held[0], 1.0)
    alloc.submitted(held[7])  # Ganeti has 2 ahead of it (held[1], held[2])
    alloc.submitted(held[7])  # said twice: no change
    alloc.finished(held[7], 3.0)  # 2 ahead on 2 nodes: (2 + 1) / 2 waves of 2 s (7 placed: 0.75 s)
    assert alloc.create_seconds("a") == pytest.approx(1.0 + 0.2 * (2.0 - 1.0))
    assert alloc.in_flight("a") == 6


def test_unmeasured_backends_borrow_the_mean_of_the_others() -> None:
    alloc = allocator(
        nodes_view("a", 1, 64 * GIB), nodes_view("b", 1, 64 * GIB), nodes_view("c", 1, 64 * GIB)
    )
    alloc.finished(alloc.place(spec(GIB)), 2.0)
    alloc.finished(alloc.place(spec(GIB)), 4.0)
    assert alloc.create_seconds("c") == 3.0  # not the default 30 s: it would never be chosen
    with pytest.raises(ValueError, match="create_seconds"):
        Allocator(create_seconds=0)
    with pytest.raises(ValueError, match="smoothing"):
        Allocator(smoothing=0)


def test_round_robin_ignores_the_drain_rate_and_repr_tells_the_state() -> None:
    alloc = allocator(nodes_view("s", 1, 8 * GIB), nodes_view("l", 8, 8 * GIB), strategy="round_robin")
    names = [alloc.place(spec(GIB)).name for _ in range(4)]
    assert names == ["s", "l", "s", "l"]
    assert repr(alloc) == "<Allocator round_robin 2 backends, 4 in flight, 4 reserved>"


# -- property ---------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    frees=st.lists(st.lists(st.integers(0, 16 * GIB), min_size=1, max_size=3), min_size=1, max_size=4),
    ops=st.lists(
        st.one_of(st.integers(1, 8 * GIB), st.just(-1), st.just(-2)),
        max_size=60,
    ),
    strategy=st.sampled_from(["credits", "round_robin"]),
)
def test_never_reserves_more_memory_than_free(frees: list[list[int]], ops: list[int], strategy: str) -> None:
    alloc = allocator(*(view(f"b{i}", *f) for i, f in enumerate(frees)), strategy=strategy)
    held: list[Reservation] = []
    for op in ops:
        if op == -1:
            if held:
                alloc.release(held.pop(0))
            continue
        if op == -2:
            if held:
                alloc.finished(held.pop(0), 0.5)  # accounted: stays reserved until fresh stats
            continue
        with contextlib.suppress(NoCapacityError):
            held.append(alloc.place(spec(op)))
        for name in alloc.backends:
            assert alloc.pending(name).memory <= alloc.view(name).free_memory


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.one_of(st.integers(1, 2 * GIB), st.just(-1), st.just(-2), st.just(-3)),
        max_size=80,
    ),
    nodes=st.booleans(),
)
def test_the_pending_totals_kept_are_the_reservations_sums(ops: list[int], nodes: bool) -> None:
    # Allocator.pending keeps running totals (every placement reads them): after any sequence of
    # placements, releases, ends and fresh stats they equal a sum over the reservations kept
    alloc = allocator(view("b", 16 * GIB, 16 * GIB))
    held: list[Reservation] = []
    now = 0.0
    for op in ops:
        now += 1.0
        if op == -1 and held:
            alloc.release(held.pop(0))
        elif op == -2 and held:
            alloc.finished(held.pop(0), 0.5, now=now)
        elif op == -3:  # fresh stats: the accounted ones go
            alloc.update(dataclasses.replace(alloc.view("b"), stats_at=now))
        elif op > 0:
            with contextlib.suppress(NoCapacityError):
                held.append(alloc.place(spec(op, disk=op // 4), nodes=nodes, now=now))
        kept = alloc._backends["b"].reservations.values()
        expected = (sum(r.requirement.memory for r in kept), sum(r.requirement.disk for r in kept), len(kept))
        pending = alloc.pending("b")
        assert (pending.memory, pending.disk, pending.count) == expected
