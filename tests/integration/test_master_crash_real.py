"""The master crashes under load on the real 3-node testbed (issue 27, item 6): nothing lost or doubled.

A Dispatcher (one backend followed through RAPI ``/wait``: the forwarder on 127.0.0.1:5080 follows
the cluster IP to whichever node is master; ``health_interval`` 2 s, client timeout 30 s,
PostgreSQL store) takes 8 durable requests for diskless instances on node2 and node3; once 3
creates are submitted node1, the master, is crashed hard (``crash-node-multi.sh node1``). 10 s
later an operator runs ``gnt-cluster master-failover --no-voting --yes-do-it`` on node2. What
Ganeti does meanwhile is in ``tests/fixtures/ganeti-3.0-masterfail/README.md``: the jobs node1 had
queued run again on node2; the ones it had started end ``error`` "detected death of job N" when
node2's luxid looks (within 307 s), and their requests are placed again unless the instance
exists. Then, from Ganeti's own state: every request succeeded, none has more than one
successful create job or more than one instance, and every create job's end is stored (once:
a job is one row) with Ganeti's status. Whatever happened, the lab is rebuilt as it was (node1 the master, no
instance of the test: ``scripts/ganeti-testbed down --purge`` + ``up --nodes 3``, about 30 s; see :func:`_restore`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import pytest

from synnefo_ganeti import ControlPlane, RapiClient
from synnefo_ganeti.store import RequestStatus, Store, request_tag
from tests.conftest import IN_CI
from tests.helpers import eventually
from tests.integration._testbed import BACKEND, TESTBED, spec
from tests.integration.test_control_real import remove_everywhere
from tests.integration.test_dispatcher_real import dispatching, settings
from tests.integration.test_node_crash_real import MULTI, _run

pytestmark = [pytest.mark.ganeti3, pytest.mark.timeout(1500)]

REQUESTS = 8
MASTER = "node1.ganeti.test"
NEW_MASTER = "node2"
OPERATOR_DELAY = 10.0  # seconds between the crash and the operator's failover


async def _answers(rapi: RapiClient) -> bool:
    try:
        await rapi._get("/2/info", None)
    except Exception:
        return False
    return True


async def _master(rapi: RapiClient) -> str | None:
    try:
        return str((await rapi._get("/2/info", None))["master"])
    except Exception:
        return None


async def _restore(bed, figures: dict[str, object]) -> None:
    """The lab as it was: 3 nodes, node1 the master, none of the test's instances. Rebuilt
    (``scripts/ganeti-testbed down --purge`` + ``up --nodes 3``): failing back to node1 once it is up again makes
    its luxid load its own copy of the queue, stale since the crash, and run again every job it had
    queued (the lab, see the fixture's README); a real cluster re-adds such a node
    (``gnt-node add --readd``). The rebuilt cluster has a new RAPI certificate: a new client."""
    since = time.monotonic()
    # the project's own testbed, as CI brought it up (its users, OSes and settings), not the lab's
    # scripts: the tests after this one find the cluster they expect
    await _run(str(TESTBED), "down", "--purge", timeout=120)
    await _run(str(TESTBED), "up", "--nodes", "3", timeout=600)

    async def status() -> bool:
        proc = await asyncio.create_subprocess_exec(str(TESTBED), "status")
        return await proc.wait() == 0

    await eventually(status, timeout=120, interval=1, what="scripts/ganeti-testbed status")
    async with RapiClient(bed.url, username=bed.username, password=bed.password, ca_file=bed.ca_file) as rapi:
        await eventually(lambda: _answers(rapi), timeout=120, interval=1, what="RAPI after the rebuild")
        assert await _master(rapi) == MASTER, await _master(rapi)
    figures["restore_s"] = round(time.monotonic() - since, 1)


async def test_a_master_crash_under_load_loses_and_doubles_nothing(testbed3, pg_url, caplog) -> None:
    caplog.set_level(logging.INFO, logger="synnefo_ganeti")
    if not (MULTI / "crash-node-multi.sh").exists():
        problem = f"no lab scripts at {MULTI} (set SYNNEFO_GANETI_TEST_MULTI)"
        if IN_CI:
            pytest.fail(problem)
        pytest.skip(problem)
    bed = testbed3.bed
    config = settings(bed, pg_url, watched=False)  # followed through RAPI /wait: it follows the master
    config.backends[0].timeout = 30.0
    nodes = ["node2.ganeti.test", "node3.ganeti.test"]
    prefix = f"sg-mc{uuid.uuid4().hex[:6]}-"
    names = [f"{prefix}r{i}.ganeti.test" for i in range(REQUESTS)]
    figures: dict[str, object] = {}
    crashed_at: float | None = None
    async with (
        Store(pg_url) as store,
        RapiClient(bed.url, username=bed.username, password=bed.password, ca_file=bed.ca_file) as rapi,
    ):
        assert await _master(rapi) == MASTER, "the lab's master must be node1"
        try:
            async with ControlPlane(config, store=store) as cp, dispatching(config, store) as dispatcher:
                started = time.time()
                ids = [
                    await cp.request_instance(spec(bed, n, pnode=nodes[i % 2])) for i, n in enumerate(names)
                ]
                dispatcher.wake()

                # node1, the master, crashes once 3 creates are submitted and Ganeti runs one
                # (the new master ends such a job "detected death of job N"; queued ones run again)
                await eventually(lambda: dispatcher.stats.submitted >= 3, timeout=60, interval=0.01,
                                 what="3 creates submitted")  # fmt: skip

                async def one_running() -> list[int]:
                    return [j.id for j in await rapi.list_jobs() if j.status.value in ("running", "waiting")
                            and any(s.startswith(f"INSTANCE_CREATE({prefix}") for s in j.summary)]  # fmt: skip

                figures["started_at_crash"] = await eventually(
                    one_running, timeout=60, interval=0.1, what="a create running in Ganeti"
                )
                figures["submitted_before_crash"] = dispatcher.stats.submitted
                crashed_at = time.time()
                await _run(str(MULTI / "crash-node-multi.sh"), "node1", timeout=60)
                await asyncio.sleep(OPERATOR_DELAY)
                failing_over = time.time()
                out = await _run(
                    str(MULTI / "ns-multi.sh"), NEW_MASTER, "gnt-cluster", "master-failover",
                    "--no-voting", "--yes-do-it", timeout=240,
                )  # fmt: skip
                figures["failover_s"] = round(time.time() - failing_over, 1)
                figures["failover_output"] = out.strip()[-300:]
                await eventually(
                    lambda: _answers(rapi), timeout=120, interval=0.5, what="RAPI on the new master"
                )
                figures["rapi_down_s"] = round(time.time() - crashed_at, 1)

                async def all_final() -> list:
                    requests = [await store.get_request(i) for i in ids]
                    # (what is still open, printed with the figures if the wait gives up)
                    figures["not_final"] = [
                        (r.instance, r.status.value, r.job_id, r.attempts)
                        for r in requests
                        if not r.status.is_final
                    ]
                    return requests if all(r.status.is_final for r in requests) else []

                # the dead master's started jobs end when the new luxid looks: up to 307 s after it
                # starts; then the creates queued behind their locks run. Seen once in CI (2026-11-28,
                # the machine loaded by other tests) still open after 600 s, with no log line of ours
                # in between: 900 s, and the open requests in the figures to tell what waited
                requests = await eventually(all_final, timeout=900, interval=1, what="every request final")
                figures["makespan_s"] = round(max(r.finished_at.timestamp() for r in requests) - started, 1)
                figures["attempts"] = sorted(r.attempts for r in requests)
                figures["attempt_errors"] = [e["error"] for r in requests for e in r.attempt_errors]
                figures["dispatcher"] = {
                    "submitted": dispatcher.stats.submitted,
                    "resubmitted": dispatcher.stats.resubmitted,
                    "recovered": dispatcher.stats.recovered,
                    "failed": dispatcher.stats.failed,
                }

            # Ganeti's own state
            jobs = await rapi.list_jobs()
            instances = {i.name: i for i in await rapi.list_instances() if i.name.startswith(prefix)}
            ganeti_jobs = []
            for request in requests:
                creates = [j for j in jobs if f"synnefo-ganeti:{request.id}" in j.request_ids
                           and j.ops and j.ops[0].get("OP_ID") == "OP_INSTANCE_CREATE"]  # fmt: skip
                ok = [j.id for j in creates if j.status.value == "success"]
                tagged = [n for n, i in instances.items() if request_tag(request.id) in i.tags]
                assert request.status is RequestStatus.SUCCEEDED, request.to_json()
                # one create made it: a successful job, or (a job that died with the master after
                # making the instance: "detected death of job N") none, the instance there with its tag
                died = [j.id for j in creates if j.status.value == "error"]
                assert len(ok) == 1 or (not ok and died), (
                    request.id,
                    [(j.id, j.status.value) for j in creates],
                )
                assert tagged == [request.instance], (request.id, tagged)
                ganeti_jobs += [(j.id, j.status.value) for j in creates]
            figures["create_jobs"] = sorted(ganeti_jobs)
            for job_id, status in ganeti_jobs:  # every end stored, as Ganeti has it
                stored = await store.get_job(BACKEND, job_id)
                assert stored is not None and stored.status.value == status, (job_id, status, stored)
            print("\nmaster crash figures:", figures)
        finally:
            print("\nmaster crash figures (so far):", figures)
            if crashed_at is not None:
                await _restore(bed, figures)  # nothing of the test is left
            else:
                existing = [i.name for i in await rapi.list_instances() if i.name.startswith(prefix)]
                await remove_everywhere(rapi, existing)
            print("\nmaster crash figures (restored):", figures)
