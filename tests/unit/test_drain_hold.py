"""A drain (or offline, or removal) seen in Ganeti's queue holds its node out of node choice at
once, before the job runs: no create is sent there while the drain waits for the node's lock and
none after it (the real lab's drain-during-a-burst test saw two sent 0.2 s after the drain's end,
placed before the dispatcher's next node read). The pure parts, and a dispatcher following a fake's
queue on both databases."""

from __future__ import annotations

from pathlib import Path

import pytest

from synnefo_ganeti import ControlPlane, RapiClient
from synnefo_ganeti.allocate import Allocator, BackendView
from synnefo_ganeti.allocate._backend_state import HOLD_SECONDS
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.jobs import JobStatus, node_taken_out
from synnefo_ganeti.rapi import Node
from synnefo_ganeti.store import RequestStatus, Store
from tests.helpers import eventually, spec
from tests.unit.test_dispatcher import backend, fakes, finished, running, settings_for
from tests.unit.test_node_placement_dispatcher import create_nodes

N2, N3 = "node2.fake.test", "node3.fake.test"
PAUSE_NODE_OPS = [["opcode", ["=", "OP_ID", "OP_NODE_SET_PARAMS"]]]


@pytest.mark.parametrize(
    ("op_id", "op_input", "node"),
    [
        ("OP_NODE_SET_PARAMS", {"node_name": "n2", "drained": True}, "n2"),
        ("OP_NODE_SET_PARAMS", {"node_name": "n2", "offline": True}, "n2"),
        ("OP_NODE_SET_PARAMS", {"node_name": "n2", "vm_capable": False}, "n2"),
        ("OP_NODE_REMOVE", {"node_name": "n2"}, "n2"),
        ("OP_NODE_SET_PARAMS", {"node_name": "n2", "drained": False}, None),  # an undrain
        ("OP_NODE_SET_PARAMS", {"node_name": "n2", "drained": None, "offline": None}, None),
        ("OP_NODE_SET_PARAMS", {"node_name": "n2", "master_candidate": False}, None),
        ("OP_NODE_SET_PARAMS", {"drained": True}, None),  # (no node named: nothing to hold)
        ("OP_INSTANCE_CREATE", {"instance_name": "a", "pnode": "n2"}, None),
    ],
)
def test_which_opcodes_take_a_node_out(op_id: str, op_input: dict[str, object], node: str | None) -> None:
    assert node_taken_out(op_id, op_input) == node


def _allocator() -> Allocator:
    nodes = [Node(name=n, mtotal=4096, mfree=4096, dtotal=10_000, dfree=10_000) for n in ("n1", "n2")]
    allocator = Allocator()
    allocator.update(BackendView(name="b", nodes=nodes, stats_at=0.0))
    return allocator


def _placed(allocator: Allocator, count: int, now: float) -> list[str | None]:
    return [
        allocator.place(spec(f"vm{i}.example", memory=64), nodes=True, now=now).node for i in range(count)
    ]


def test_a_held_node_is_out_of_node_choice_until_its_job_ends_then_until_stats_read_after() -> None:
    allocator = _allocator()
    assert set(_placed(allocator, 4, now=1.0)) == {"n1", "n2"}
    allocator.hold_node("b", "n2", 7, now=2.0)
    allocator.hold_node("b", "n2", 7, now=3.0)  # each version of the job: one hold
    assert allocator.held_nodes("b") == {"n2"}
    assert _placed(allocator, 3, now=3.0) == ["n1"] * 3
    # stats read meanwhile (the node not drained yet) do not end the hold
    allocator.update(BackendView(name="b", nodes=allocator.view("b").nodes, stats_at=4.0))
    assert _placed(allocator, 2, now=4.0) == ["n1"] * 2
    allocator.job_ended("b", "n2", 7, ok=True, now=5.0)
    assert allocator.held_nodes("b") == set() and allocator.full_nodes("b") == {"n2"}
    assert allocator.due_for_refresh(interval=3600, now=5.0) == ["b"]
    assert _placed(allocator, 1, now=5.0) == ["n1"]
    allocator.update(BackendView(name="b", nodes=allocator.view("b").nodes, stats_at=4.5))  # begun before
    assert allocator.full_nodes("b") == {"n2"}


def test_a_hold_ends_with_a_job_that_failed_and_after_hold_seconds_without_an_end() -> None:
    allocator = _allocator()
    allocator.hold_node("b", "n2", 7, now=1.0)
    allocator.job_ended("b", "n2", 7, ok=False, now=2.0)  # refused (the master), canceled: no change
    assert allocator.held_nodes("b") == set() and allocator.full_nodes("b") == set()
    assert "n2" in _placed(allocator, 4, now=2.0)
    allocator.hold_node("b", "n2", 8, now=10.0)
    assert "n2" not in _placed(allocator, 4, now=10.0 + HOLD_SECONDS)
    # its end never seen (its file lost): the node reads and stats rule again after HOLD_SECONDS
    assert "n2" in _placed(allocator, 4, now=10.0 + HOLD_SECONDS + 1)
    assert allocator.held_nodes("b") == set()
    allocator.hold_node("nowhere", "n2", 9)  # an unknown backend: nothing
    allocator.job_ended("nowhere", "n2", 9, ok=True)
    assert allocator.held_nodes("nowhere") == set()


async def test_a_drain_in_the_queue_holds_its_node_before_it_runs(db_url: str, tmp_path: Path) -> None:
    queue = tmp_path / "queue"
    async with fakes(1, nodes=3, queue_dir=queue) as (fake,):
        # node stats an hour apart and node reads 0.2 s apart: only the queue says "drain" first
        settings = settings_for(
            db_url, [backend("b", fake, queue_dir=str(queue))], node_placement="pnode", stats_interval=3600
        )
        async with (
            RapiClient(fake.url, username=fake.username, password=fake.password) as rapi,
            Store(db_url) as store,
            ControlPlane(settings, store=store) as cp,
            running(Dispatcher(settings, store=store, status_server=False)) as d,
        ):
            assert d._backends["b"].watcher is not None
            rule = await rapi.add_filter(predicates=PAUSE_NODE_OPS, action="PAUSE")
            drain = await rapi.modify_node(N2, drained=True)  # queued behind the filter, as behind a lock
            await eventually(lambda: N2 in d.allocator.held_nodes("b"), what="node2 held by the queued drain")
            assert fake.cluster.jobs[drain].status is JobStatus.QUEUED
            ids = [await cp.request_instance(spec(f"during{i}.example")) for i in range(6)]
            done = [await finished(cp, rid, timeout=60) for rid in ids]
            assert [(r.status, r.attempts) for r in done] == [(RequestStatus.SUCCEEDED, 1)] * 6
            assert N2 not in create_nodes(fake) and len(set(create_nodes(fake))) == 2

            # another drain, canceled while queued: its node comes back at once
            canceled = await rapi.modify_node(N3, drained=True)
            await eventually(lambda: N3 in d.allocator.held_nodes("b"), what="node3 held")
            await rapi.cancel_job(canceled)
            await eventually(lambda: N3 not in d.allocator.held_nodes("b"), what="node3's hold gone")
            assert N3 not in d.allocator.full_nodes("b")

            await rapi.delete_filter(rule)
            assert (await rapi.wait_for_job(drain, timeout=10)).status is JobStatus.SUCCESS
            await eventually(lambda: N2 not in d.allocator.held_nodes("b"), what="node2's hold ended")
            # out until stats read after the drain's end, which say it is drained
            await eventually(
                lambda: N2 not in {n.name for n in d.allocator.view("b").usable_nodes},
                what="the stats showing node2 drained",
            )
            sent = len(create_nodes(fake))
            more = [await cp.request_instance(spec(f"after{i}.example")) for i in range(4)]
            later = [await finished(cp, rid, timeout=60) for rid in more]
            assert [(r.status, r.attempts) for r in later] == [(RequestStatus.SUCCEEDED, 1)] * 4
            assert N2 not in create_nodes(fake)[sent:]
            assert d.stats.failed == 0
