"""``[dispatcher] node_placement`` end to end on the fake Ganeti: what each mode puts in the create,
the request's own choice winning, unusable nodes never chosen, a burst spread over the nodes, a
pnode without room placed again elsewhere, and a create failing with ``ECODE_TEMP_NORES`` placed
again rather than failed."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from synnefo_ganeti import ControlPlane
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.store import RequestStatus, Store
from synnefo_ganeti.testing import FakeGaneti, _engine
from synnefo_ganeti.testing._cluster import OpFailure
from synnefo_ganeti.testing._registry import OPCODES
from tests.helpers import eventually, spec
from tests.unit.test_dispatcher import backend, fakes, finished, running, settings_for

N1, N2, N3, N4 = (f"node{i}.fake.test" for i in range(1, 5))


def sqlite(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store.db'}"


def create_params(fake: FakeGaneti) -> dict[str, dict[str, Any]]:
    """Instance name -> the luxid input of its last create job, as the fake received it."""
    out: dict[str, dict[str, Any]] = {}
    for job in sorted(fake.cluster.jobs.values(), key=lambda j: j.id):
        for op in job.ops:
            if op.op_id == "OP_INSTANCE_CREATE":
                out[str(op.luxid["instance_name"])] = op.luxid
    return out


def create_nodes(fake: FakeGaneti) -> list[str | None]:
    """The ``pnode`` of every create job the fake received, in order."""
    return [
        op.luxid.get("pnode")
        for job in sorted(fake.cluster.jobs.values(), key=lambda j: j.id)
        for op in job.ops
        if op.op_id == "OP_INSTANCE_CREATE"
    ]


async def run_requests(
    tmp_path: Path, fake: FakeGaneti, specs: list[Any], *, hold: bool = False, **dispatcher: Any
) -> tuple[list[Any], Dispatcher]:
    """Run ``specs`` through a dispatcher; ``hold``: every create stays queued in Ganeti (a PAUSE
    filter rule) until all of them were sent, so each placement sees all the others in flight."""
    db_url = sqlite(tmp_path)
    settings = settings_for(db_url, [backend("b", fake)], **dispatcher)
    async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
        daemon = Dispatcher(settings, store=store, status_server=False)
        client = await cp.client("b")
        paused = ["opcode", ["=", "OP_ID", "OP_INSTANCE_CREATE"]]
        rule = await client.add_filter(predicates=[paused], action="PAUSE") if hold else None
        async with running(daemon) as d:
            ids = [await cp.request_instance(s) for s in specs]
            if rule is not None:

                async def all_sent() -> bool:
                    return len(create_nodes(fake)) == len(specs)

                await eventually(all_sent, what="every create sent")
                await client.delete_filter(rule)
            done = [await finished(cp, rid) for rid in ids]
    return done, d


@pytest.mark.parametrize("mode", ["pnode", "opportunistic", "ganeti"])
async def test_what_each_mode_puts_in_the_create(tmp_path: Path, mode: str) -> None:
    async with fakes(1, nodes=3) as (fake,):
        fake.cluster.nodes[N2].mtotal *= 2  # the node with the most room
        done, _ = await run_requests(tmp_path, fake, [spec("vm1.example")], node_placement=mode)
        assert done[0].status is RequestStatus.SUCCEEDED, done[0].error
        sent = create_params(fake)["vm1.example"]
        assert not sent.get("iallocator")
        if mode == "pnode":
            assert sent["pnode"] == N2 and not sent.get("opportunistic_locking")
        elif mode == "opportunistic":
            assert sent["opportunistic_locking"] is True and not sent.get("pnode")
        else:
            assert not sent.get("pnode") and not sent.get("opportunistic_locking")


@pytest.mark.parametrize("mode", ["pnode", "opportunistic"])
async def test_the_requests_own_pnode_wins(tmp_path: Path, mode: str) -> None:
    async with fakes(1, nodes=3) as (fake,):
        fake.cluster.nodes[N2].mtotal *= 2
        done, _ = await run_requests(tmp_path, fake, [spec("own.example", pnode=N3)], node_placement=mode)
        assert done[0].status is RequestStatus.SUCCEEDED, done[0].error
        sent = create_params(fake)["own.example"]
        assert sent["pnode"] == N3 and not sent.get("opportunistic_locking")
        assert fake.cluster.instances["own.example"].pnode == N3


async def test_drained_offline_and_non_vm_capable_nodes_are_never_chosen(tmp_path: Path) -> None:
    async with fakes(1, nodes=4) as (fake,):
        nodes = fake.cluster.nodes
        for name in (N1, N2, N3):
            nodes[name].mtotal *= 4  # far more room than N4
        nodes[N1].drained, nodes[N2].offline, nodes[N3].vm_capable = True, True, False
        specs = [spec(f"vm{i}.example") for i in range(6)]
        done, _ = await run_requests(tmp_path, fake, specs, node_placement="pnode")
        assert all(r.status is RequestStatus.SUCCEEDED for r in done), [r.error for r in done]
        assert create_nodes(fake) == [N4] * 6


async def test_a_burst_is_spread_over_the_nodes_by_creates_in_flight(tmp_path: Path) -> None:
    # one node with far more memory: without in-flight accounting every create would go there
    async with fakes(1, nodes=3, op_times={"OP_INSTANCE_CREATE": 0.5}) as (fake,):
        fake.cluster.nodes[N1].mtotal *= 4
        specs = [spec(f"burst{i}.example") for i in range(9)]
        # held queued in Ganeti until all are sent: however slowly the test runs, no create ends
        # (and frees its node's room) before the last one is placed (4/3/2 once under load)
        done, d = await run_requests(
            tmp_path, fake, specs, hold=True, node_placement="pnode", stats_interval=3600
        )
        assert all(r.status is RequestStatus.SUCCEEDED for r in done), [r.error for r in done]
        assert Counter(create_nodes(fake)) == {N1: 3, N2: 3, N3: 3}
        assert d.stats.capacity_retries == 0


async def test_a_pnode_without_room_after_all_is_placed_again_elsewhere(tmp_path: Path) -> None:
    async with fakes(1, nodes=2) as (fake,):
        nodes = fake.cluster.nodes
        nodes[N1].mtotal *= 2
        db_url = sqlite(tmp_path)
        settings = settings_for(db_url, [backend("b", fake)], node_placement="pnode", stats_interval=3600)
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            dispatcher = Dispatcher(settings, store=store, status_server=False)
            async with running(dispatcher) as d:
                # the dispatcher's stats say N1 has the most room; it has none any more
                nodes[N1].mtotal = nodes[N1].mnode + 100
                request = await finished(cp, await cp.request_instance(spec("moved.example", memory=512)))
        assert request.status is RequestStatus.SUCCEEDED, request.error
        assert request.attempts == 2
        assert create_nodes(fake) == [N1, N2]
        assert fake.cluster.instances["moved.example"].pnode == N2
        assert d.stats.capacity_retries == 1 and d.stats.failed == 0


async def test_a_create_failing_with_temp_nores_is_placed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ganeti 3.0's mcpu retries such an op itself with all locks (PrepareRetry), as the fake does;
    # a Ganeti before 2.16 (or an LU without PrepareRetry) fails the job with the code instead:
    # the fake made to do that here
    monkeypatch.setattr(_engine, "TEMP_NORES", "no retry within the job")
    create = OPCODES["OP_INSTANCE_CREATE"]
    failed: list[int] = []

    async def once_out_of_resources(cluster: Any, job: Any, op: Any) -> None:
        if not failed:  # Ganeti's LUInstanceCreate._RunAllocator on opportunistic locks, once
            failed.append(job.id)
            raise OpFailure(
                "OpPrereqError",
                "Can't compute nodes using iallocator 'hail': Request failed: no node among the locked",
                "temp_insufficient_resources",
            )
        await create(cluster, job, op)

    monkeypatch.setitem(OPCODES, "OP_INSTANCE_CREATE", once_out_of_resources)
    async with fakes(1, nodes=2) as (fake,):
        done, d = await run_requests(tmp_path, fake, [spec("temp.example")], node_placement="opportunistic")
        request = done[0]
        assert request.status is RequestStatus.SUCCEEDED, request.error
        assert request.attempts == 2 and len(failed) == 1
        jobs = [job for job in fake.cluster.jobs.values() if job.ops[0].op_id == "OP_INSTANCE_CREATE"]
        assert len(jobs) == 2 and all(job.ops[0].luxid["opportunistic_locking"] for job in jobs)
        assert d.stats.capacity_retries == 1 and d.stats.failed == 0
