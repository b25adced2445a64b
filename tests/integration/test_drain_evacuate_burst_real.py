"""Drain and evacuate node2 of the real 3-node Ganeti 3.0 testbed while a burst of creates runs
(issue 30 item 6): no request fails, nothing is placed on node2 once it is drained, and its
instances run on node1 and node3 afterwards, the store agreeing with Ganeti.

Two instances of ours run on node2 first (one diskless, one ``sharedfile``: both migrate on the
lab). A dispatcher (``node_placement`` "pnode", the master's queue followed, PostgreSQL) takes a
burst of durable requests; once two creates are submitted, the operator's calls run as
``synnefo-ganeti nodes drain`` and ``nodes evacuate`` run them (``ControlPlane.drain_node``, then
``evacuate_node``) while the rest of the burst comes. Then, from Ganeti's own job list: every
request succeeded with one successful create, and no create with ``pnode`` node2 was sent (its
POST's stamp in the reason trail) after the drain's job ended. node2 is undrained and every
instance removed, whatever happens.
"""

from __future__ import annotations

import time
import uuid

import pytest

from synnefo_ganeti import ControlPlane
from synnefo_ganeti.store import InstanceStatus, RequestStatus, Store
from tests.helpers import eventually
from tests.integration._testbed import BACKEND, spec
from tests.integration.test_dispatcher_real import dispatching, settings
from tests.integration.test_node_moves_real import _cleanup
from tests.integration.test_nodes_real import _posted

pytestmark = [pytest.mark.ganeti3, pytest.mark.timeout(900)]

N1, N2, N3 = "node1.ganeti.test", "node2.ganeti.test", "node3.ganeti.test"
REQUESTS = 12


async def test_drain_and_evacuate_node2_during_a_burst(testbed3, pg_url) -> None:
    bed = testbed3.bed
    config = settings(bed, pg_url, watched=True)
    prefix = f"sg-de{uuid.uuid4().hex[:6]}-"
    residents = [f"{prefix}d.ganeti.test", f"{prefix}s.ganeti.test"]
    names = [f"{prefix}r{i}.ganeti.test" for i in range(REQUESTS)]
    figures: dict[str, object] = {}
    async with Store(pg_url) as store, ControlPlane(config, store=store) as cp:
        rapi = await cp.client(BACKEND)
        drained = False
        try:
            async with dispatching(config, store) as dispatcher:
                await cp.create_instance(spec(bed, residents[0], pnode=N2), backend=BACKEND)
                shared = spec(bed, residents[1], pnode=N2, disk_template="sharedfile", disks=[{"size": 1024}])
                await cp.create_instance(shared, backend=BACKEND)

                async def running_on_node2() -> bool:
                    rows = [await store.get_instance(BACKEND, n) for n in residents]
                    return all(
                        r is not None and r.status is InstanceStatus.STARTED and r.task is None for r in rows
                    )

                await eventually(running_on_node2, timeout=120, what="the residents of node2 running")
                started = time.time()
                first, second = names[: REQUESTS // 2], names[REQUESTS // 2 :]
                ids = [await cp.request_instance(spec(bed, n, pnode=None)) for n in first]
                dispatcher.wake()
                await eventually(lambda: dispatcher.stats.submitted >= 2, timeout=60, interval=0.01,
                                 what="2 creates submitted")  # fmt: skip
                drained = True
                await cp.drain_node(BACKEND, N2)  # (its job followed to its end)
                drained_at = time.time()
                ids += [await cp.request_instance(spec(bed, n, pnode=None)) for n in second]
                dispatcher.wake()
                report = await cp.evacuate_node(BACKEND, N2)
                figures["evacuate"] = report.to_json()
                assert report.ok, report.to_json()

                async def all_final() -> list:
                    requests = [await store.get_request(i) for i in ids]
                    return requests if all(r.status.is_final for r in requests) else []

                requests = await eventually(all_final, timeout=300, interval=1, what="every request final")
                figures["makespan_s"] = round(max(r.finished_at.timestamp() for r in requests) - started, 1)
                figures["dispatcher"] = {"submitted": dispatcher.stats.submitted, "failed": dispatcher.stats.failed,
                                         "node_retries": dispatcher.stats.node_retries}  # fmt: skip
            assert [r.status for r in requests] == [RequestStatus.SUCCEEDED] * REQUESTS, [
                r.error for r in requests
            ]
            jobs = await rapi.list_jobs()
            after = []
            for request in requests:
                creates = [j for j in jobs if f"synnefo-ganeti:{request.id}" in j.request_ids
                           and j.ops and j.ops[0].get("OP_ID") == "OP_INSTANCE_CREATE"]  # fmt: skip
                assert len([j for j in creates if j.status.value == "success"]) == 1, request.id
                for job in creates:
                    posted = _posted(job, drained_at)
                    if job.ops[0].get("pnode") == N2 and posted is not None and posted > 0:
                        after.append((job.id, posted, job.status.value))
            figures["sent_to_node2_after_the_drain"] = after
            assert after == [], f"creates sent to drained {N2} after its drain: {after}"
            found = {i.name: i for i in await rapi.list_instances() if i.name.startswith(prefix)}
            for name in residents:
                assert found[name].pnode in (N1, N3) and found[name].oper_state, found[name]
                row = await store.get_instance(BACKEND, name)
                assert (
                    row is not None
                    and row.pnode == found[name].pnode
                    and row.status is InstanceStatus.STARTED
                )
            assert not [n for n, i in found.items() if n in names and i.pnode == N2]
        finally:
            print("\ndrain and evacuate figures:", figures)
            try:
                if drained:
                    await cp.undrain_node(BACKEND, N2)
            finally:
                await _cleanup(rapi, prefix)
