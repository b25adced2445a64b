"""Creates still queued on a node that went down are canceled and placed again elsewhere (issue
27, items 3 and 9), on both databases: no request fails for the node, none waits for the dead
node's queue to fail one create at a time."""

from __future__ import annotations

from synnefo_ganeti import ControlPlane
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.jobs import JobStatus
from synnefo_ganeti.store import RequestStatus, Store
from tests.helpers import eventually, spec
from tests.unit.test_dispatcher import backend, fakes, finished, running, settings_for
from tests.unit.test_node_placement_dispatcher import create_nodes

#: creates long enough that a burst queues several behind each node's lock
SLOW = {"OP_INSTANCE_CREATE": 1.0, "OP_INSTANCE_STARTUP": 0.01}


async def test_creates_queued_on_a_node_that_died_are_canceled_and_placed_elsewhere(db_url: str) -> None:
    async with fakes(1, nodes=3, op_times=SLOW) as (fake,):
        settings = settings_for(
            db_url, [backend("b", fake)], node_placement="pnode", health_interval=0.2, stats_interval=3600
        )
        async with (
            Store(db_url) as store,
            ControlPlane(settings, store=store) as cp,
            running(Dispatcher(settings, store=store, status_server=False)) as d,
        ):
            ids = [await cp.request_instance(spec(f"q{i}.example")) for i in range(12)]
            # every create submitted: one runs on each node, the others wait for its lock
            await eventually(
                lambda: len(create_nodes(fake)) == 12, what="twelve creates in Ganeti", timeout=30
            )
            victim = next(n for n in create_nodes(fake) if not fake.cluster.nodes[n].master)
            # each RPC to the dead node takes 2 s to fail, as Ganeti's (5 s on the lab): the create
            # running there fails only then, and the next one queued there takes as long again, so
            # creates are still queued there when the dispatcher learns the node is down
            fake.rpc_timeout = 2.0
            fake.crash_node(victim)
            done = [await finished(cp, rid, timeout=90) for rid in ids]
            assert [r.status for r in done] == [RequestStatus.SUCCEEDED] * 12, [r.error for r in done]
            assert d.stats.moved >= 1 and d.stats.failed == 0
            moved = [r for r in done if any(e.get("moved") for e in r.attempt_errors or ())]
            assert len(moved) == d.stats.moved
            for request in moved:
                (entry,) = [e for e in request.attempt_errors if e.get("moved")]
                assert entry["node"] == victim and victim in entry["error"]
                assert fake.cluster.instances[request.instance].pnode != victim
            canceled = [j for j in fake.cluster.jobs.values() if j.status is JobStatus.CANCELED]
            assert len(canceled) == d.stats.moved
            # on the dead node: at most the create that was running there when it died
            on_victim = [i for i in fake.cluster.instances.values() if i.pnode == victim]
            assert len(on_victim) <= 1
