"""Repair by policy on the real 3-node Ganeti 3.0 testbed (issue 30 item 2).

Two instances of ours are made on node3 (``diskless``: it fails over on the lab,
../shared/ganeti/multi/NOTES.md), each tagged ``ganeti:watcher:autorepair:failover`` (harep's tag
that allows a failover). A Dispatcher runs with ``[repair] allow = ["failover"]``,
``node_down_after`` 5 s and a ``fence_command`` that is a small script recording the node it was
called with (node3 is crashed already: the script only says so). node3 is crashed
(``crash-node-multi.sh node3``). Then: a ``node-down`` incident opens, the script is called once
with node3's name, node3 is marked offline and the incident closes ``repaired``; each instance's
``instance-error`` incident closes ``repaired`` by a ``failover`` job (``ignore_consistency``), and
each instance runs on node1 or node2. node3 is brought back (``up-multi.sh``), set online again, and
every instance removed, whatever happened.
"""

from __future__ import annotations

import asyncio
import stat
import uuid
from pathlib import Path

import pytest

from synnefo_ganeti import ControlPlane, RapiClient
from synnefo_ganeti.store import Incident, IncidentStore, InstanceStatus, Store
from tests.conftest import IN_CI
from tests.helpers import eventually
from tests.integration._testbed import BACKEND, spec
from tests.integration.test_dispatcher_real import dispatching, settings
from tests.integration.test_node_crash_real import CRASHED, MULTI, _bring_back, _run
from tests.integration.test_node_moves_real import DEADLINE, _cleanup, _settled

pytestmark = [pytest.mark.ganeti3, pytest.mark.timeout(900)]

N1, N2, N3 = "node1.ganeti.test", "node2.ganeti.test", "node3.ganeti.test"
FAILOVER_TAG = "ganeti:watcher:autorepair:failover"


def _fence_script(tmp_path: Path) -> tuple[str, Path]:
    log = tmp_path / "fenced.log"
    script = tmp_path / "fence.sh"
    script.write_text(f'#!/bin/sh\necho "$1" >> {log}\necho "already crashed: $1"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return f"{script} {{node}}", log


async def _restore(rapi: RapiClient) -> None:
    """node3 back and online (``_bring_back``); its ``up-multi.sh`` now and then fails several times
    in a row on its own ``gnt-node add`` check (seen here: "already in the cluster" three times, the
    next run a few seconds later fine): up to three more tries, each after a growing pause."""
    for attempt in range(4):
        try:
            await _bring_back(rapi)
            return
        except AssertionError:
            if attempt == 3:
                raise
            await asyncio.sleep(5.0 * (attempt + 1))  # a backoff between tries of a flaky script


async def _incident(
    incidents: IncidentStore, kind: str, instance: str | None = None, *, closed: bool = True
) -> Incident:
    async def found() -> Incident | None:
        for i in await incidents.incidents(backend=BACKEND):
            if i.kind == kind and i.instance == instance and (not closed or not i.open):
                return i
        return None

    return await eventually(found, timeout=DEADLINE, interval=1, what=f"{kind} {instance or ''} closed")


async def test_a_crashed_node_is_fenced_and_its_instances_fail_over(testbed3, pg_url, tmp_path) -> None:
    if not (MULTI / "crash-node-multi.sh").exists():
        problem = f"no lab scripts at {MULTI} (set SYNNEFO_GANETI_TEST_MULTI)"
        if IN_CI:
            pytest.fail(problem)
        pytest.skip(problem)
    assert CRASHED == N3 and N3 in testbed3.nodes
    bed = testbed3.bed
    command, fenced = _fence_script(tmp_path)
    config = settings(bed, pg_url, watched=True)
    config = config.model_copy(
        update={
            "repair": config.repair.model_copy(
                update={
                    "allow": ["failover"],
                    "node_down_after": 5.0,
                    "fence_command": command,
                    "interval": 2.0,
                }
            )
        }
    )
    prefix = f"sg-rp{uuid.uuid4().hex[:6]}-"
    names = [f"{prefix}{i}.ganeti.test" for i in range(2)]
    crashed = False
    async with (
        Store(pg_url) as store,
        RapiClient(bed.url, username=bed.username, password=bed.password, ca_file=bed.ca_file) as rapi,
    ):
        incidents = IncidentStore(store)
        try:
            async with ControlPlane(config, store=store) as cp, dispatching(config, store):
                for name in names:
                    await cp.create_instance(spec(bed, name, pnode=N3), backend=BACKEND)
                await _settled(store, dict.fromkeys(names, InstanceStatus.STARTED), N3)
                for name in names:
                    job = await rapi.wait_for_job(
                        await rapi.add_instance_tags(name, [FAILOVER_TAG]), timeout=60
                    )
                    assert job.status.value == "success", job.failure
                crashed = True
                await _run(str(MULTI / "crash-node-multi.sh"), "node3", timeout=60)

                node = await _incident(incidents, "node-down")
                print("\nnode incident:", node.to_json())
                assert (node.node, node.action, node.outcome) == (N3, "fence", "repaired"), node
                assert fenced.read_text().split() == [N3]  # once, with node3's name
                assert (await rapi.get_node(N3)).offline
                for name in names:
                    moved = await _incident(incidents, "instance-error", name)
                    print("instance incident:", moved.to_json())
                    assert (moved.action, moved.outcome, moved.node) == ("failover", "repaired", N3), moved
                    job = await rapi.get_job(int(moved.job_id or 0))
                    assert job.ops[0].get("ignore_consistency") is True
                await _settled(store, dict.fromkeys(names, InstanceStatus.STARTED))
                found = {i.name: i for i in await rapi.list_instances() if i.name.startswith(prefix)}
                for name in names:
                    assert found[name].pnode in (N1, N2) and found[name].oper_state, found[name]
                    row = await store.get_instance(BACKEND, name)
                    assert row is not None and row.pnode == found[name].pnode, row
                still_open = [i.to_json() for i in await incidents.incidents(open_only=True, backend=BACKEND)]
                assert still_open == [], still_open
        finally:
            try:
                if crashed:
                    await _restore(rapi)
                    assert not (await rapi.get_node(N3)).offline
            finally:
                await _cleanup(rapi, prefix)
