"""A dead node leaves placement (issue 27): which failed ops blame a node (read from Ganeti 3.0's
messages), the allocator's node liveness (pure), and the dispatcher on the fake Ganeti: a node
whose live figures go null is out of placement once the dispatcher has read it so, its instances
and ``backend_nodes`` marked, and back when Ganeti reads it again."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from synnefo_ganeti import ControlPlane
from synnefo_ganeti.allocate import Allocator, BackendView, NodeLiveness, NodeState
from synnefo_ganeti.allocate._liveness import NO_FIGURES, OFFLINE, NodeChange, read_state
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.rapi import Node
from synnefo_ganeti.store import NodeRow, RequestStatus, Store, is_node_error, node_fault
from synnefo_ganeti.testing import FakeGaneti
from synnefo_ganeti.testing._cluster import OpFailure
from synnefo_ganeti.testing._registry import OPCODES
from tests.helpers import FIXTURES, eventually, spec
from tests.unit.test_dispatcher import backend, fakes, finished, running, settings_for
from tests.unit.test_node_placement_dispatcher import create_nodes
from tests.unit.test_operations_catalog import config_file, run

N1, N2, N3 = (f"node{i}.fake.test" for i in (1, 2, 3))

#: the fields of /2/nodes?bulk=1 Ganeti 3.0 gives as null for a node that does not answer
#: (tests/fixtures/ganeti-3.0-nodefail/nodes_bulk_dead.json)
LIVE_FIELDS = ("dtotal", "dfree", "sptotal", "spfree", "mtotal", "mnode", "mfree", "ctotal", "cnos",
               "cnodes", "csockets")  # fmt: skip


def rpc_error(node: str) -> str:
    """What Ganeti 3.0's ``CheckHVParams`` says of a create placed on a node that does not answer
    (``RpcResult.Raise`` with pycurl's error)."""
    return (
        f"Hypervisor parameter validation failed on node {node}: Error 7: Failed to connect to "
        "198.51.100.13 port 1811: No route to host"
    )


class Crash:
    """Nodes of a fake made to look dead as Ganeti 3.0 shows one (recorded in
    tests/fixtures/ganeti-3.0-nodefail): listed in ``/2/nodes?bulk=1`` with every live figure
    null (``dead``), and creates placed there failing with the RPC error that names them
    (``dead``, or ``failing`` alone: a node whose figures Ganeti still has)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fake: FakeGaneti) -> None:
        self.dead: set[str] = set()
        self.failing: set[str] = set()
        self.refused: list[str] = []
        views = fake.cluster.node_views

        def node_views() -> list[dict[str, Any]]:
            out = views()
            for view in out:
                if view["name"] in self.dead:
                    view.update(dict.fromkeys(LIVE_FIELDS))
            return out

        monkeypatch.setattr(fake.cluster, "node_views", node_views)
        create = OPCODES["OP_INSTANCE_CREATE"]

        async def instance_create(cluster: Any, job: Any, op: Any) -> None:
            node = op.luxid.get("pnode")
            if node in self.dead or node in self.failing:  # CheckHVParams in CheckPrereq
                self.refused.append(str(node))
                raise OpFailure("OpExecError", rpc_error(str(node)))
            await create(cluster, job, op)

        monkeypatch.setitem(OPCODES, "OP_INSTANCE_CREATE", instance_create)


# -- which messages blame a node ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "node", "kind", "replace"),
    [
        (f"OpExecError: {rpc_error('node3.g.test')}", "node3.g.test", "down", True),
        ("OpExecError: Hypervisor parameter validation failed on node n3.g.test: Failed to connect",
         "n3.g.test", "down", True),
        ("OpPrereqError: Cannot use offline primary node 'n3.g.test'", "n3.g.test", "offline", True),
        ("OpPrereqError: Cannot use drained primary node 'n3.g.test'", "n3.g.test", "drained", True),
        ("OpPrereqError: Can't use offline node: n2.g.test", "n2.g.test", "offline", True),
        ("OpExecError: OS Parameters validation failed on node n1.g.test: Node is marked offline",
         "n1.g.test", "offline", True),
        ("OpPrereqError: Can't get data from node n3.g.test: Error 28: Connection timed out after 10001 ms",
         "n3.g.test", "down", True),
        # an iallocator's input: every node not offline must answer (IAllocator._ComputeDynamicNodeData)
        ("OpExecError: Can't get data for node n3.g.test: Error 28: Failed to connect to 198.51.100.13 "
         "port 1811 after 5000 ms: Timeout was reached", "n3.g.test", "down", True),
        # after Ganeti added the instance: the node is down, but the create is not placed again
        ("OpExecError: Could not add os for instance vm1 on node n3.g.test: Error 7: Failed to connect",
         "n3.g.test", "down", False),
        ("OpExecError: Call 'instance_reboot' to node 'n2.g.test' has failed: Error 56: Recv failure",
         "n2.g.test", "down", False),
    ],
)  # fmt: skip
def test_a_failed_op_that_blames_its_node(message: str, node: str, kind: str, replace: bool) -> None:
    fault = node_fault(message)
    assert fault is not None and (fault.node, fault.kind, fault.before_instance) == (node, kind, replace)
    assert is_node_error(message) == (node if replace else None)


@pytest.mark.parametrize(
    "message",
    [
        None,
        "OpExecError: Could not start instance: Error 7: Failed to connect",  # no node named
        # the OS missing there: a reason of the backend (is_backend_error), not of the node
        "OpExecError: OS Parameters validation failed on node n1.g.test: Directory for OS x not found",
        "OpExecError: Hypervisor parameter validation failed on node n1.g.test: Parameter 'kernel_path' fails",
        "OpPrereqError: Not enough memory on node n1.g.test for creating instance x (insufficient_resources)",
        "OpPrereqError: Instance 'vm1' is already in the cluster",
    ],
)
def test_a_failed_op_that_does_not_blame_a_node(message: str | None) -> None:
    assert node_fault(message) is None and is_node_error(message) is None


# -- the allocator's node liveness (pure) ---------------------------------------------------------------


def node(name: str, **fields: Any) -> Node:
    figures = {"mtotal": 8192, "mnode": 512, "mfree": 4096, "dtotal": 100_000, "dfree": 50_000, "ctotal": 4}
    return Node.model_validate({"name": name, "vm_capable": True, **figures, **fields})


def dead(name: str) -> Node:
    return node(name, **dict.fromkeys(LIVE_FIELDS))


def test_the_recorded_dead_node_reads_down_and_the_healthy_ones_up() -> None:
    recorded = FIXTURES / "ganeti-3.0-nodefail"
    dead_nodes = [Node.model_validate(n) for n in json.loads((recorded / "nodes_bulk_dead.json").read_text())]
    assert {n.name: read_state(n)[0] for n in dead_nodes} == {
        "node1.ganeti.test": None, "node2.ganeti.test": None, "node3.ganeti.test": "down",
    }  # fmt: skip
    healthy = [Node.model_validate(n) for n in json.loads((recorded / "nodes_bulk_healthy.json").read_text())]
    assert all(read_state(n) == (None, None) for n in healthy)


def test_liveness_down_offline_and_back_only_after_a_read_begun_after_the_last_sign() -> None:
    live = NodeLiveness("b")
    (change,) = live.seen([node(N1), dead(N2), node(N3, offline=True)][:2], read_at=1.0, now=2.0, wall=100.0)
    assert (change.node, change.state, change.detail, change.at) == (N2, "down", NO_FIGURES, 100.0)
    # a create failing on N1 (RPC): out at once; a read begun before that sign does not clear it
    sign = live.failed(N1, "down", "job 7: Failed to connect", now=3.0, wall=101.0)
    assert sign is not None and sign.state == "down" and live.out == {N1, N2}
    assert live.seen([node(N1), dead(N2)], read_at=2.5, now=4.0) == []
    assert live.states[N1].detail == "job 7: Failed to connect"  # the first sign stays
    # offline beats down; a failure to reach an offline node leaves it offline
    (offline,) = live.seen([node(N1), node(N2, offline=True)], read_at=2.9, now=5.0)
    assert (offline.node, offline.state) == (N2, "offline")
    assert live.failed(N2, "down", "again", now=6.0) is None and live.states[N2].state == "offline"
    # a read begun after the signs: N1 back; N2 is gone from the cluster: forgotten
    back = live.seen([node(N1)], read_at=7.0, now=8.0)
    assert [(c.node, c.state) for c in back] == [(N1, None), (N2, None)] and live.out == frozenset()


def test_a_read_begun_before_the_one_that_showed_a_node_up_does_not_put_it_down_again() -> None:
    live = NodeLiveness("b")
    (down,) = live.seen([node(N1), dead(N2)], read_at=1.0, now=1.5)
    assert (down.node, down.state) == (N2, "down")
    # node2 comes back: a read begun at 3.0 shows it; one begun at 2.0, before it came back,
    # answers last (the stats read and the node read overlap): it says nothing against node2
    (back,) = live.seen([node(N1), node(N2)], read_at=3.0, now=4.0)
    assert (back.node, back.state) == (N2, None)
    assert live.seen([node(N1), dead(N2), node(N3, offline=True)], read_at=2.0, now=5.0) == [
        NodeChange("b", N3, "offline", OFFLINE, live.states[N3].since)
    ] and live.out == {N3}
    # a read begun later that shows it without figures puts it down again
    (again,) = live.seen([node(N1), dead(N2), node(N3, offline=True)], read_at=6.0, now=7.0)
    assert (again.node, again.state) == (N2, "down") and live.out == {N2, N3}


def test_a_node_down_is_out_of_the_allocators_capacity_and_node_choice() -> None:
    alloc = Allocator()
    nodes = [node(N1), node(N2, mfree=7000)]
    alloc.update(BackendView(name="b", nodes=nodes, stats_at=1.0))
    assert alloc.view("b").free_memory == 4096 + 7000
    assert alloc.place(spec("a.example", memory=1024), nodes=True, now=2.0).node == N2
    change = alloc.node_failed("b", N2, "down", "job 1: Failed to connect", now=3.0)
    assert change is not None and alloc.view("b").out_nodes == {N2}
    assert alloc.view("b").free_memory == 4096  # capacity leaves it out
    assert alloc.place(spec("b.example", memory=1024), nodes=True, now=4.0).node == N1
    # a view given by a caller keeps what the allocator knows of its nodes
    alloc.update(BackendView(name="b", nodes=nodes, stats_at=5.0))
    assert alloc.view("b").out_nodes == {N2}
    alloc.node_failed("b", N1, "down", "job 2", now=6.0)
    assert "down or offline: node1.fake.test, node2.fake.test" in alloc.rejected(spec("c.example"))["b"]
    # back once read with its figures: the backend is due for whole stats until read after that
    assert alloc.due_for_refresh(interval=3600, now=9.0) == []
    changes = alloc.nodes_seen("b", nodes, read_at=7.0, now=8.0)
    assert {c.node for c in changes} == {N1, N2} and alloc.view("b").out_nodes == frozenset()
    assert alloc.due_for_refresh(interval=3600, now=9.0) == ["b"]
    alloc.update(BackendView(name="b", nodes=nodes, stats_at=7.5))
    assert alloc.due_for_refresh(interval=3600, now=9.0) == []


# -- the dispatcher -----------------------------------------------------------------------------------------


def placed_since(fake: FakeGaneti, count: int) -> list[str | None]:
    """The ``pnode`` of every create the fake received after the first ``count``."""
    return create_nodes(fake)[count:]


async def test_a_node_whose_figures_go_null_leaves_placement_and_comes_back(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with fakes(1, nodes=3) as (fake,):
        crash = Crash(monkeypatch, fake)
        fake.cluster.nodes[N3].mtotal *= 2  # the node with the most room: chosen while it is up
        # node stats seldom: only the dispatcher's node reads (every health_interval) tell
        settings = settings_for(db_url, [backend("b", fake)], node_placement="pnode", stats_interval=3600)
        async with (
            Store(db_url) as store,
            ControlPlane(settings, store=store) as cp,
            running(Dispatcher(settings, store=store, status_server=False)) as d,
        ):
            first = await finished(cp, await cp.request_instance(spec("before.example")))
            assert first.status is RequestStatus.SUCCEEDED and create_nodes(fake) == [N3]
            await eventually(lambda: _pnode(store, "before.example", N3), what="Ganeti's pnode stored")
            crash.dead.add(N3)

            def states() -> dict[str, NodeState]:
                return d.allocator.node_states("b")

            await eventually(lambda: N3 in states(), what="the dispatcher to read node3 down")
            assert states()[N3].state == "down" and states()[N3].detail == NO_FIGURES
            sent = len(create_nodes(fake))
            ids = [await cp.request_instance(spec(f"after{i}.example")) for i in range(4)]
            done = [await finished(cp, rid) for rid in ids]
            assert all(r.status is RequestStatus.SUCCEEDED for r in done), [r.error for r in done]
            assert N3 not in placed_since(fake, sent) and crash.refused == []
            # other processes see it: backend_nodes, and its instances marked down
            rows = await eventually(lambda: _node_row(store, N3, "down"), what="node3 stored down")
            assert rows["detail"] == NO_FIGURES and rows["since"] is not None
            marked = await eventually(lambda: _marked(store, "before.example", "down"), what="marked")
            assert marked.node_state_since is not None

            crash.dead.discard(N3)  # Ganeti reads it again

            def back() -> bool:
                view = {n.name: n for n in d.allocator.view("b").nodes}
                return N3 not in states() and view[N3].mfree is not None  # and fresh stats

            await eventually(back, what="node3 back in placement with its figures")
            seen = {
                n.name: (n.mfree, n.dfree) for n in d.allocator.view("b").nodes
            }  # (for a failure's message)
            again = await finished(cp, await cp.request_instance(spec("back.example")))
            assert again.status is RequestStatus.SUCCEEDED, again.error
            # (once in a CI rehearsal, 2026-12-01, on uvloop: placed on node1; the figures say why next time)
            assert create_nodes(fake)[-1] == N3, (create_nodes(fake), seen, states())
            await eventually(lambda: _node_row(store, N3, "up"), what="node3 stored up")
            await eventually(lambda: _marked(store, "before.example", None), what="unmarked")
            events = await store.backend_events(backend="b")
            kinds = [e["kind"] for e in events if "node3" in e["message"]]
            assert kinds[:2] == ["node-up", "node-down"]  # newest first


async def test_stats_read_before_those_in_place_are_not_put_in_their_place(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with fakes(1, nodes=3) as (fake,):
        settings = settings_for(db_url, [backend("b", fake)], node_placement="pnode", stats_interval=3600)
        async with (
            Store(db_url) as store,
            running(Dispatcher(settings, store=store, status_server=False)) as d,
        ):
            await eventually(lambda: d.allocator.view("b").stats_at is not None, what="the first stats")
            in_place = d.allocator.view("b")
            read = await d._read_stats("b")
            assert read is not None and in_place.stats_at is not None
            stats, _ = read
            # a read that began before the stats in place (a reload's overlapping the loop's), node3
            # dead in it: it answers last, and says nothing the stats in place do not say better
            older = dataclasses.replace(
                stats,
                nodes=[
                    n if n.name != N3 else n.model_copy(update=dict.fromkeys(LIVE_FIELDS))
                    for n in stats.nodes
                ],
            )

            async def read_older(name: str) -> tuple[Any, float]:
                return older, in_place.stats_at - 1.0

            monkeypatch.setattr(d, "_read_stats", read_older)
            await d._refresh_one("b")
            assert d.allocator.view("b").stats_at == in_place.stats_at
            assert {n.name: n.mfree for n in d.allocator.view("b").nodes}[N3] is not None
            assert N3 not in d.allocator.node_states("b")


async def _pnode(store: Store, name: str, pnode: str) -> bool:
    found = await store.get_instance("b", name)
    return found is not None and found.pnode == pnode


async def _node_row(store: Store, name: str, state: str) -> dict[str, Any] | None:
    rows = {row["name"]: row for row in (await store.backend_nodes("b")).get("b", [])}
    row = rows.get(name)
    return row if row is not None and row["state"] == state else None


async def _marked(store: Store, name: str, state: str | None) -> Any:
    found = await store.get_instance("b", name)
    return found if found is not None and found.node_state == state else None


async def test_backends_show_lists_a_node_down_with_since_and_why(tmp_path: Path, db_url: str) -> None:
    async with FakeGaneti(tls=False) as fake:
        config = config_file(tmp_path, db_url, fake)
        async with Store(db_url) as store:
            changed = await store.set_backend_nodes(
                "f1", {N1: NodeRow("up"), N3: NodeRow("down", detail=NO_FIGURES)}, complete=True
            )
            assert changed == {N3: "down"}
        shown = await asyncio.to_thread(run, "backends", "show", "f1", "--config", str(config), "--json")
        assert shown.exit_code == 0, shown.output
        nodes = {n["name"]: n for n in json.loads(shown.output)["nodes"]}
        assert nodes[N1]["state"] == "up" and nodes[N1]["detail"] is None
        assert (nodes[N3]["state"], nodes[N3]["detail"]) == ("down", NO_FIGURES)
        assert nodes[N3]["since"] and nodes[N3]["seen_at"]
        table = await asyncio.to_thread(run, "backends", "show", "f1", "--config", str(config))
        assert table.exit_code == 0, table.output
        assert f"node {N3} is down since" in table.output and "live figures" in table.output
        assert f"node {N1} is" not in table.output


@pytest.mark.parametrize(
    ("message", "again"),
    [
        # a network of the spec missing on that backend, not connected there, or its pool full:
        # Ganeti 3.0's words (the fake's, testing/_ops_networks.py); placed again elsewhere
        ("OpPrereqError: Network 'solo' not found (unknown_entity)", True),
        ("OpPrereqError: No netparams found for the network solo, probably not connected", True),
        ("OpPrereqError: Unable to get a free IP for NIC 0 from the address pool (wrong_state)", True),
        ("OpPrereqError: Instance 'vm1' is already in the cluster", False),
        ("OpExecError: Could not do it", False),
    ],
)
def test_a_create_refused_for_a_network_of_its_backend_is_placed_again(message: str, again: bool) -> None:
    from synnefo_ganeti.store import is_backend_error

    assert is_backend_error(message) is again
