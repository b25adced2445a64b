"""``ControlPlane.evacuate_node`` and ``failover_node`` on the real 3-node Ganeti 3.0 testbed (issue 30).

Evacuate (targets by our node placement, then by Ganeti's hail): instances made on node2 through the ControlPlane (a running and a stopped ``diskless``, a
running ``sharedfile``: the templates that move on the lab, ../shared/ganeti/multi/NOTES.md) and an
operator's VM made through RAPI (not ours); ``evacuate_node`` is refused while node2 is not drained;
node2 drained with ``gnt-node modify --drained yes``; then every instance is on node1 or node3, the
running ones running (migrated), the stopped one stopped (failed over), the operator's VM moved and
reported not ours, and the store's ``pnode`` of each of ours is Ganeti's.

Failover: instances made on node3 (running and stopped), ``failover_node`` refused while Ganeti still
reaches node3 (nothing changed); node3 crashed (``crash-node-multi.sh node3``): Ganeti reads its live
figures null; ``failover_node(yes=True)`` marks it offline and fails each instance over with
``ignore_consistency``: node3 offline, the running instance running on node1 or node2, the store
agreeing. Node3 is brought back (``up-multi.sh``) and set online, node2 undrained, and every instance
removed, whatever happens.
"""

from __future__ import annotations

import uuid

import pytest

from synnefo_ganeti import ConflictError, ControlPlane, InstanceSpec, RapiClient
from synnefo_ganeti.control._node_plan import MoveAction, MoveOutcome
from synnefo_ganeti.store import InstanceStatus, Store
from tests.conftest import IN_CI
from tests.helpers import eventually
from tests.integration._testbed import BACKEND, ns30, spec
from tests.integration.test_control_real import remove_everywhere, run
from tests.integration.test_dispatcher_real import dispatching, settings
from tests.integration.test_node_crash_real import CRASHED, MULTI, _bring_back, _run

pytestmark = [pytest.mark.ganeti3, pytest.mark.timeout(900)]

N1, N2, N3 = "node1.ganeti.test", "node2.ganeti.test", "node3.ganeti.test"
DEADLINE = 180.0


async def _drained(node: str, drained: bool) -> None:
    code, out, err = await run(*ns30("gnt-node", "modify", "--drained", "yes" if drained else "no", node))
    assert code == 0, f"gnt-node modify --drained {drained} {node}: exit {code}\n{out}\n{err}"


async def _settled(store: Store, names: dict[str, InstanceStatus], node: str | None = None) -> None:
    async def ready() -> bool:
        for instance, status in names.items():
            row = await store.get_instance(BACKEND, instance)
            if row is None or row.status is not status or row.task is not None:
                return False
            if node is not None and row.pnode != node:
                return False
        return True

    await eventually(ready, timeout=DEADLINE, interval=0.5, what=f"{sorted(names)} settled")


async def _operators_vm(rapi: RapiClient, bed, instance: str, node: str) -> None:
    vm = InstanceSpec(name=instance, disk_template="diskless", os="noop", pnode=node, hypervisor="fake",
                      beparams={"memory": 128}, name_check=False, ip_check=False)  # fmt: skip
    job = await rapi.wait_for_job(await rapi.create_instance(vm), timeout=DEADLINE)
    assert job.status.value == "success", job.failure


async def _cleanup(rapi: RapiClient, prefix: str) -> None:
    """Every instance of ``prefix`` removed, once the jobs still in flight for them ended (a create
    sent just before a step failed would make its instance after a removal that found none)."""
    for job in await rapi.list_jobs():
        if job.status.is_final or not any(
            str(op.get("instance_name", "")).startswith(prefix) for op in job.ops
        ):
            continue
        await rapi.wait_for_job(job.id, timeout=DEADLINE)
    names = [i.name for i in await rapi.list_instances() if i.name.startswith(prefix)]
    await remove_everywhere(rapi, names)


@pytest.mark.parametrize("iallocator", [None, "hail"], ids=["our-placement", "hail"])
async def test_evacuate_a_drained_node(testbed3, pg_url, iallocator) -> None:
    bed = testbed3.bed
    config = settings(bed, pg_url, watched=True)
    prefix = f"sg-ev{uuid.uuid4().hex[:6]}-"
    running, stopped, shared, theirs = (f"{prefix}{k}.ganeti.test" for k in ("run", "down", "shf", "op"))
    drained = False
    async with (
        Store(pg_url) as store,
        RapiClient(bed.url, username=bed.username, password=bed.password, ca_file=bed.ca_file) as rapi,
    ):
        try:
            async with ControlPlane(config, store=store) as cp, dispatching(config, store):
                await cp.create_instance(spec(bed, running, pnode=N2), backend=BACKEND)
                await cp.create_instance(spec(bed, stopped, pnode=N2, start=False), backend=BACKEND)
                shf = spec(bed, shared, pnode=N2, disk_template="sharedfile", disks=[{"size": 1024}])
                await cp.create_instance(shf, backend=BACKEND)
                await _operators_vm(rapi, bed, theirs, N2)
                want = {running: InstanceStatus.STARTED, stopped: InstanceStatus.STOPPED,
                        shared: InstanceStatus.STARTED}  # fmt: skip
                await _settled(store, want, N2)

                with pytest.raises(ConflictError, match="not drained: drain it first"):
                    await cp.evacuate_node(BACKEND, N2)
                drained = True
                await _drained(N2, True)
                seen: list[int] = []
                report = await cp.evacuate_node(
                    BACKEND, N2, iallocator=iallocator, progress=lambda done, total, move: seen.append(done)
                )
                print("\nevacuate report:", report.to_json())
                assert report.ok and report.iallocator == iallocator, report.to_json()
                moves = {m.name: m for m in report.moves}
                ours = {running, stopped, shared}
                assert ours | {theirs} <= set(moves), sorted(moves)
                assert seen == list(range(len(report.moves) + 1))
                assert (
                    moves[running].action is MoveAction.MIGRATE and moves[shared].action is MoveAction.MIGRATE
                )
                assert moves[stopped].action is MoveAction.FAILOVER
                assert (moves[theirs].owned, moves[theirs].outcome) == (False, MoveOutcome.MOVED)
                found = {i.name: i for i in await rapi.list_instances() if i.name.startswith(prefix)}
                for instance in [*ours, theirs]:
                    assert (
                        found[instance].pnode in (N1, N3) and found[instance].pnode == moves[instance].target
                    )
                assert (
                    found[running].oper_state and found[shared].oper_state and not found[stopped].oper_state
                )
                await _settled(store, want)
                for instance in ours:
                    row = await store.get_instance(BACKEND, instance)
                    assert row is not None and row.pnode == found[instance].pnode, row
                assert await store.get_instance(BACKEND, theirs) is None  # not ours: not stored
        finally:
            try:
                if drained:
                    await _drained(N2, False)
            finally:
                await _cleanup(rapi, prefix)


async def test_failover_a_crashed_node(testbed3, pg_url) -> None:
    if not (MULTI / "crash-node-multi.sh").exists():
        problem = f"no lab scripts at {MULTI} (set SYNNEFO_GANETI_TEST_MULTI)"
        if IN_CI:
            pytest.fail(problem)
        pytest.skip(problem)
    assert CRASHED == N3 and N3 in testbed3.nodes
    bed = testbed3.bed
    config = settings(bed, pg_url, watched=True)
    prefix = f"sg-fo{uuid.uuid4().hex[:6]}-"
    running, stopped, theirs = (f"{prefix}{k}.ganeti.test" for k in ("run", "down", "op"))
    crashed = False
    async with (
        Store(pg_url) as store,
        RapiClient(bed.url, username=bed.username, password=bed.password, ca_file=bed.ca_file) as rapi,
    ):
        try:
            async with ControlPlane(config, store=store) as cp, dispatching(config, store):
                await cp.create_instance(spec(bed, running, pnode=N3), backend=BACKEND)
                await cp.create_instance(spec(bed, stopped, pnode=N3, start=False), backend=BACKEND)
                await _operators_vm(rapi, bed, theirs, N3)
                want = {running: InstanceStatus.STARTED, stopped: InstanceStatus.STOPPED}
                await _settled(store, want, N3)

                # Ganeti reaches node3: refused, nothing changed
                with pytest.raises(ConflictError, match=r"still answers Ganeti .* pass --yes"):
                    await cp.failover_node(BACKEND, N3)
                assert not (await rapi.get_node(N3)).offline
                assert (await rapi.get_instance(running)).pnode == N3

                crashed = True
                await _run(str(MULTI / "crash-node-multi.sh"), "node3", timeout=60)

                async def figures_gone() -> bool:
                    return (await rapi.get_node(N3)).mfree is None

                await eventually(figures_gone, timeout=120, interval=1, what="node3's live figures null")
                report = await cp.failover_node(BACKEND, N3, yes=True)
                print("\nfailover report:", report.to_json())
                assert report.ok and report.marked_offline, report.to_json()
                moves = {m.name: m for m in report.moves}
                assert {running, stopped, theirs} <= set(moves), sorted(moves)
                assert all(m.action is MoveAction.FAILOVER for m in report.moves)
                assert not moves[theirs].owned
                assert (await rapi.get_node(N3)).offline
                found = {i.name: i for i in await rapi.list_instances() if i.name.startswith(prefix)}
                for instance in (running, stopped, theirs):
                    assert (
                        found[instance].pnode in (N1, N2) and found[instance].pnode == moves[instance].target
                    )
                assert (
                    found[running].oper_state and found[theirs].oper_state and not found[stopped].oper_state
                )
                await _settled(store, want)
                for instance in (running, stopped):
                    row = await store.get_instance(BACKEND, instance)
                    assert row is not None and row.pnode == found[instance].pnode, row
        finally:
            try:
                if crashed:
                    await _bring_back(rapi)
                    assert not (await rapi.get_node(N3)).offline
            finally:
                await _cleanup(rapi, prefix)
