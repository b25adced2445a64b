"""Nothing is placed on a drained node, also one an operator drained behind the dispatcher's back
(issue 30, item 1): the creates Ganeti refuses there ("Cannot use drained primary node") are
placed again elsewhere and no request fails; on both databases."""

from __future__ import annotations

from collections import Counter

from synnefo_ganeti import ControlPlane, InstanceSpec, RapiClient
from synnefo_ganeti.allocate import Allocator, BackendView
from synnefo_ganeti.allocate._liveness import usability_changes
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.jobs import JobStatus
from synnefo_ganeti.rapi import Node
from synnefo_ganeti.store import RequestStatus, Store, node_fault
from synnefo_ganeti.testing import FakeGaneti
from tests.helpers import eventually, spec
from tests.unit.test_dispatcher import backend, fakes, finished, running, settings_for
from tests.unit.test_node_placement_dispatcher import create_nodes

N2 = "node2.fake.test"
PAUSED = [["opcode", ["=", "OP_ID", "OP_INSTANCE_CREATE"]]]


async def test_a_node_drained_behind_our_back_mid_burst_fails_no_request(db_url: str) -> None:
    async with fakes(1, nodes=3) as (fake,):
        # stale node stats (an hour), as on the lab where they were 30 s old: only Ganeti's
        # refusal tells the dispatcher the node is drained
        settings = settings_for(
            db_url, [backend("b", fake)], node_placement="pnode", health_interval=0.2, stats_interval=3600
        )
        async with (
            RapiClient(fake.url, username=fake.username, password=fake.password) as rapi,
            Store(db_url) as store,
            ControlPlane(settings, store=store) as cp,
            running(Dispatcher(settings, store=store, status_server=False)) as d,
        ):
            rule = await rapi.add_filter(predicates=PAUSED, action="PAUSE")
            ids = [await cp.request_instance(spec(f"burst{i}.example")) for i in range(9)]
            await eventually(lambda: len(create_nodes(fake)) == 9, what="nine creates in Ganeti", timeout=30)
            victim = next(n for n in create_nodes(fake) if not fake.cluster.nodes[n].master)
            queued_there = create_nodes(fake).count(victim)
            # the operator drains it (gnt-node modify --drained yes): not through this library
            job = await rapi.modify_node(victim, drained=True)
            assert (await rapi.wait_for_job(job, timeout=10)).status is JobStatus.SUCCESS
            await rapi.delete_filter(rule)
            done = [await finished(cp, rid, timeout=60) for rid in ids]
            assert [r.status for r in done] == [RequestStatus.SUCCEEDED] * 9, [r.error for r in done]
            refused = [r for r in done if r.attempts > 1]
            assert len(refused) == queued_there
            # a second burst: nothing goes to the drained node, though the stats still say it is usable
            sent = len(create_nodes(fake))
            more = [await cp.request_instance(spec(f"after{i}.example")) for i in range(6)]
            later = [await finished(cp, rid, timeout=60) for rid in more]
            assert [r.status for r in later] == [RequestStatus.SUCCEEDED] * 6, [r.error for r in later]
            assert victim not in create_nodes(fake)[sent:]
            assert d.stats.failed == 0
        assert all(i.pnode != victim for i in fake.cluster.instances.values())
        assert Counter(create_nodes(fake))[victim] == queued_there


async def test_a_node_drained_behind_our_back_leaves_placement_at_the_next_node_read(db_url: str) -> None:
    async with fakes(1, nodes=3) as (fake,):
        settings = settings_for(
            db_url, [backend("b", fake)], node_placement="pnode", health_interval=0.2, stats_interval=3600
        )
        async with (
            RapiClient(fake.url, username=fake.username, password=fake.password) as rapi,
            Store(db_url) as store,
            ControlPlane(settings, store=store) as cp,
            running(Dispatcher(settings, store=store, status_server=False)) as d,
        ):
            victim = N2
            assert victim in {n.name for n in d.allocator.view("b").usable_nodes}
            job = await rapi.modify_node(victim, drained=True)
            assert (await rapi.wait_for_job(job, timeout=10)).status is JobStatus.SUCCESS
            # the node reads (every health_interval), not the whole stats (an hour away), tell it
            await eventually(
                lambda: victim not in {n.name for n in d.allocator.view("b").usable_nodes},
                what="the drained node out of placement",
            )
            ids = [await cp.request_instance(spec(f"after{i}.example")) for i in range(6)]
            done = [await finished(cp, rid, timeout=60) for rid in ids]
            assert [(r.status, r.attempts) for r in done] == [(RequestStatus.SUCCEEDED, 1)] * 6
            assert victim not in create_nodes(fake)
            # undrained: back in placement at the next stats read (a node read tells it too)
            job = await rapi.modify_node(victim, drained=False)
            assert (await rapi.wait_for_job(job, timeout=10)).status is JobStatus.SUCCESS
            await eventually(
                lambda: victim in {n.name for n in d.allocator.view("b").usable_nodes},
                what="the undrained node back in placement",
            )


def test_a_node_read_showing_a_node_drained_since_the_stats_takes_it_out_of_node_choice() -> None:
    usable = [Node(name=n, mtotal=4096, mfree=4096, dtotal=10_000, dfree=10_000) for n in ("n1", "n2")]
    allocator = Allocator()
    allocator.update(BackendView(name="b", nodes=usable, stats_at=0.0))
    drained = [usable[0], usable[1].model_copy(update={"drained": True})]
    assert usability_changes(usable, drained) == ({"n2"}, set())
    assert usability_changes(drained, usable) == (set(), {"n2"})
    allocator.nodes_seen("b", drained, read_at=1.0, now=1.0)
    assert allocator.full_nodes("b") == {"n2"} and allocator.due_for_refresh(interval=3600, now=1.0) == ["b"]
    placed = [allocator.place(spec(f"vm{i}.example", memory=128), nodes=True).node for i in range(3)]
    assert placed == ["n1"] * 3
    # the stats read after it say so themselves; the node leaves the full set
    allocator.update(BackendView(name="b", nodes=drained, stats_at=2.0))
    assert allocator.full_nodes("b") == set() and allocator.due_for_refresh(interval=3600, now=2.0) == []
    allocator.nodes_seen("b", drained, read_at=3.0, now=3.0)  # read again: nothing new
    assert allocator.full_nodes("b") == set() and allocator.due_for_refresh(interval=3600, now=3.0) == []
    allocator.nodes_seen("b", usable, read_at=4.0, now=4.0)  # undrained: due for stats
    assert allocator.due_for_refresh(interval=3600, now=4.0) == ["b"]


async def test_the_fake_refuses_a_drained_offline_or_non_vm_capable_node_as_ganeti_does() -> None:
    # LUInstanceCreate.CheckPrereq (cmdlib/instance_create.py) for the primary; CheckNodeOnline,
    # CheckNodeNotDrained, CheckNodeVmCapable (cmdlib/common.py, instance_utils.py) for the mirror
    async with FakeGaneti(tls=False, nodes=3, disk_templates=("diskless", "drbd")) as fake:
        n1, n2, n3 = sorted(fake.cluster.nodes)
        async with RapiClient(fake.url, username=fake.username, password=fake.password) as rapi:

            async def refusal(instance: InstanceSpec) -> str | None:
                job = await rapi.wait_for_job(await rapi.create_instance(instance), timeout=10)
                failure = job.failure
                return None if failure is None else failure.message

            nodes = fake.cluster.nodes
            nodes[n2].drained = True
            assert await refusal(spec("a.example", pnode=n2)) == f"Cannot use drained primary node '{n2}'"
            mirrored = {"disk_template": "drbd", "disks": [{"size": 1024}]}
            assert (
                await refusal(spec("b.example", pnode=n1, snode=n2, **mirrored))
                == f"Can't use drained node {n2}"
            )
            nodes[n2].drained, nodes[n3].offline = False, True
            assert await refusal(spec("c.example", pnode=n3)) == f"Cannot use offline primary node '{n3}'"
            assert (
                await refusal(spec("d.example", pnode=n1, snode=n3, **mirrored))
                == f"Can't use offline node: {n3}"
            )
            nodes[n3].offline, nodes[n3].vm_capable = False, False
            assert (
                await refusal(spec("e.example", pnode=n3)) == f"Cannot use non-vm_capable primary node '{n3}'"
            )
            assert await refusal(spec("f.example", pnode=n1, snode=n3, **mirrored)) == (
                f"Can't use non-vm_capable node {nodes[n3].uuid}"
            )
            assert await refusal(spec("g.example", pnode=n1, snode=n2, **mirrored)) is None
            # each refusal is one the dispatcher reads as its node's (placed again elsewhere)
            for message in (f"Cannot use drained primary node '{n2}'", f"Can't use drained node {n2}"):
                fault = node_fault(f"OpPrereqError: {message}")
                assert fault is not None and (fault.node, fault.kind) == (n2, "drained")
