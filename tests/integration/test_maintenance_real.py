"""A rolling maintenance of the real 3-node Ganeti 3.0 lab (issue 30 item 3): every node crashed
hard and brought back, group after group, while the instances keep running.

Three instances (diskless on node1 and node3, sharedfile on node2; both templates migrate) are
made through the facade, a dispatcher following every job through RAPI (which moves with the
master). The plan is compared with Ganeti's own ``hroller -L`` (ours puts the
master in a group of its own, last; hroller puts it last in its last group). Then
``RollingMaintenance.run`` with the lab's commands: each node's turn crashes it
(``crash-node-multi.sh nodeN``: every process killed, its network gone) and brings it back
(``up-multi.sh``); the master's turn hands the role to a candidate first and back at the end
(``ns-multi.sh nodeN gnt-cluster master-failover``). Before and after every crash, every instance
runs (Ganeti's ``oper_state``) and none is on the node about to go down. Whatever happens, the
lab is left healthy: every node up and undrained, node1 the master, the instances removed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from synnefo_ganeti import ControlPlane, RapiClient
from synnefo_ganeti.control._maintenance import (
    CommandResult,
    MaintenanceOptions,
    RollingMaintenance,
    shell_command,
)
from synnefo_ganeti.store import InstanceStatus, StatusStore, Store
from tests.conftest import IN_CI
from tests.helpers import eventually
from tests.integration._testbed import BACKEND, TESTBED, ns30, spec
from tests.integration.test_control_real import remove_everywhere
from tests.integration.test_dispatcher_real import dispatching, settings
from tests.integration.test_node_crash_real import _patient_grep

pytestmark = [pytest.mark.ganeti3, pytest.mark.timeout(1800)]

MULTI = Path(
    os.environ.get("SYNNEFO_GANETI_TEST_MULTI", Path(__file__).parents[3] / "shared" / "ganeti" / "multi")
)
MASTER = "node1.ganeti.test"
#: ``{node}`` is the node's full name; the lab's scripts take its short one (node1..3). up-multi.sh
#: now and then fails on a SIGPIPE of its own (a node in the cluster taken for one that is not, then
#: "already in the cluster": seen in CI, and by test_node_crash_real.py; three tries in three failed
#: in a CI rehearsal of 2026-11-30): it runs with patient greps (``_patient_grep``), and again, up
#: to 3 times


def _up() -> str:
    """up-multi.sh as a shell command, its greps given all of their input first."""
    return f'PATH={_patient_grep()}:"$PATH" {MULTI}/up-multi.sh </dev/null'


def _reboot() -> str:
    up = _up()
    return (
        f'n={{node}}; {MULTI}/crash-node-multi.sh "${{n%%.*}}" && '
        f"{{ {up} || {{ sleep 3; {up}; }} || {{ sleep 5; {up}; }}; }}"
    )


FAILOVER = f'n={{node}}; {MULTI}/ns-multi.sh "${{n%%.*}}" gnt-cluster master-failover'


async def _sh(command: str, timeout: float = 300) -> CommandResult:
    return await shell_command(command, timeout)


async def _master(rapi: RapiClient) -> str | None:
    try:
        return next((n.name for n in await rapi.list_nodes() if n.role == "M"), None)
    except Exception:
        return None


async def _heal(rapi: RapiClient) -> None:
    """Every node up (up-multi.sh, run again if it failed), node1 the master, none drained."""
    for _ in range(3):
        if (await _sh(_up())).returncode == 0:
            break
    if await _master(rapi) != MASTER:
        await _sh(f"{MULTI}/ns-multi.sh node1 gnt-cluster master-failover")
        await _sh(_up())
    await eventually(lambda: _master(rapi), timeout=180, interval=2, what="a master RAPI answers")
    for node in await rapi.list_nodes():
        if node.drained or node.offline:
            await rapi.wait_for_job(
                await rapi.modify_node(node.name, drained=False, offline=False), timeout=120
            )

    async def healthy() -> bool:
        proc = await asyncio.create_subprocess_exec(str(TESTBED), "status")
        if await proc.wait() != 0:
            return False
        nodes = await rapi.list_nodes()
        return all(n.mfree is not None and not n.offline for n in nodes) and await _master(rapi) == MASTER

    await eventually(healthy, timeout=180, interval=2, what="the lab healthy, node1 the master")


async def test_a_rolling_maintenance_of_every_node_keeps_the_instances_running(
    testbed3, pg_url, caplog
) -> None:
    caplog.set_level(logging.INFO, logger="synnefo_ganeti")
    if not (MULTI / "crash-node-multi.sh").exists():
        problem = f"no lab scripts at {MULTI} (set SYNNEFO_GANETI_TEST_MULTI)"
        if IN_CI:
            pytest.fail(problem)
        pytest.skip(problem)
    bed = testbed3.bed
    config = settings(bed, pg_url, watched=False)
    config.backends[0].timeout = 60.0  # RAPI answers slowly while a node is dead or the master moves
    prefix = f"sg-mt{uuid.uuid4().hex[:6]}-"
    placed = {
        f"{prefix}a.ganeti.test": ("node1.ganeti.test", "diskless"),
        f"{prefix}b.ganeti.test": ("node2.ganeti.test", "sharedfile"),
        f"{prefix}c.ganeti.test": ("node3.ganeti.test", "diskless"),
    }
    checks: list[dict[str, Any]] = []
    async with (
        Store(pg_url) as store,
        RapiClient(bed.url, username=bed.username, password=bed.password, ca_file=bed.ca_file) as rapi,
    ):
        try:
            await _heal(rapi)  # a test before may have left a node offline or the master elsewhere
            # the dispatcher follows every job through RAPI (it moves with the master), so the
            # database learns the creates' ends and the instances are free for their moves
            async with ControlPlane(config, store=store) as cp, dispatching(config, store):
                for name, (node, template) in placed.items():
                    extra = {"disks": [{"size": 1024}]} if template == "sharedfile" else {}
                    await cp.create_instance(spec(bed, name, pnode=node, disk_template=template, **extra),
                                             backend=BACKEND)  # fmt: skip

                async def started() -> bool:
                    rows = [await store.get_instance(BACKEND, n) for n in placed]
                    return all(r is not None and r.status is InstanceStatus.STARTED for r in rows)

                await eventually(started, timeout=180, interval=1, what="the three instances started")

                async def running(down: str | None, when: str) -> None:
                    found = {i.name: i for i in await rapi.list_instances() if i.name in placed}
                    state = {n: (i.pnode, i.oper_state) for n, i in found.items()}
                    checks.append({"when": when, "node": down, "instances": state})
                    assert set(found) == set(placed), state
                    assert all(i.oper_state for i in found.values()), f"{when}: not all running: {state}"
                    assert all(i.pnode != down for i in found.values()), (
                        f"{when}: one still on {down}: {state}"
                    )

                async def lab(command: str, timeout: float) -> CommandResult:
                    if "crash-node-multi.sh" not in command:
                        return await shell_command(command, timeout)
                    node = command.split(";")[0].removeprefix("n=")
                    await running(node, "before the crash")
                    result = await shell_command(command, timeout)
                    await eventually(lambda: _all_read(rapi), timeout=180, interval=2, what="every node read")
                    await running(node, "after the node came back")
                    return result

                maint = RollingMaintenance(cp, actor="test@lab", run_command=lab, heartbeat=5)
                plan = await maint.plan(BACKEND)
                proc = await asyncio.create_subprocess_exec(
                    *ns30("hroller", "-L", "--no-headers"), stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.DEVNULL,
                )  # fmt: skip
                out, _ = await proc.communicate()
                hroller = [line.split(",") for line in out.decode().split() if line.strip()]
                # told, not asserted: hroller keeps the master last in its last group, we give it a
                # group of its own (docs/operations.md)
                ours = [sorted(g) for g in plan.node_groups[:-1]]
                theirs = [g for g in ([sorted(n for n in g if n != MASTER) for g in hroller]) if g]
                print(
                    "\nplan:",
                    plan.node_groups,
                    "hroller -L:",
                    hroller,
                    "same but the master:",
                    ours == theirs,
                )
                assert plan.node_groups[-1] == [MASTER] and not plan.problems, plan

                options = MaintenanceOptions(master_failover_command=FAILOVER, wait_timeout=300,
                                             master_timeout=300, poll_interval=1)  # fmt: skip
                steps: list[str] = []
                record = await maint.run(BACKEND, _reboot(), options=options,
                                         progress=lambda d, t, w: steps.append(f"{d}/{t} {w}"))  # fmt: skip
                print("\nsteps:", steps, "\nchecks:", checks)
                assert record.status == "done", record.error
                assert record.steps_done == record.steps_total
                assert len([c for c in checks if c["when"] == "before the crash"]) == 3
                assert await _master(rapi) == MASTER
                nodes = await rapi.list_nodes()
                assert not any(n.drained or n.offline for n in nodes), [(n.name, n.role) for n in nodes]
                await running(None, "at the end")
                # the master's role went to node2 and back; the moves went at Ganeti's low priority
                audit = await StatusStore(store).audit_log(backend=BACKEND, limit=200)
                handed = [
                    a.detail or ""
                    for a in audit
                    if a.action in ("maintenance failover", "maintenance failback")
                ]
                assert any(f"master role to node2.ganeti.test from {MASTER}" in d for d in handed), handed
                assert any(f"master role to {MASTER}" in d for d in handed), handed
                rows = await rapi.query_rows("job", ["summary", "oppriority"])
                moves = [(summary, prio) for summary, prio in rows
                         if summary and prefix in summary[0] and "MIGRATE" in summary[0]]  # fmt: skip
                print("\nmoves and their priorities:", moves)
                assert moves and all(prio == [10] for _, prio in moves), moves
        finally:
            try:
                await _heal(rapi)
            finally:
                existing = [i.name for i in await rapi.list_instances() if i.name.startswith(prefix)]
                await remove_everywhere(rapi, existing)


async def _all_read(rapi: RapiClient) -> bool:
    try:
        nodes = await rapi.list_nodes()
    except Exception:
        return False
    return all(n.mfree is not None and not n.offline for n in nodes)
