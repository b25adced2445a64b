"""A create that failed because of its node is placed again (issue 27): on another node when Ganeti
made no instance, each failure kept in ``Request.attempt_errors``, the node out of placement at
once; the request fails after ``[dispatcher] max_attempts`` failed creates, naming the last."""

from __future__ import annotations

from typing import Any

import pytest

from synnefo_ganeti import ControlPlane
from synnefo_ganeti.allocate import NodeState
from synnefo_ganeti.config import DispatcherSettings
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.store import Request, RequestStatus, Store
from synnefo_ganeti.testing._cluster import OpFailure
from synnefo_ganeti.testing._registry import OPCODES
from tests.helpers import spec
from tests.unit.test_dispatcher import backend, fakes, finished, running, settings_for
from tests.unit.test_node_liveness import N1, N2, N3, Crash, rpc_error
from tests.unit.test_node_placement_dispatcher import create_nodes

#: no node read, health probe or node stats after the start: a node is out only by a job's sign
QUIET = {"node_placement": "pnode", "stats_interval": 3600, "health_interval": 3600}


async def run_one(
    db_url: str, fake: Any, name: str, **dispatcher: Any
) -> tuple[Request, Dispatcher, list[dict[str, Any]], dict[str, NodeState]]:
    """One request through a dispatcher: the request as it ended, the dispatcher, the backend
    events about its nodes the database holds then, and its nodes out of placement then."""
    settings = settings_for(db_url, [backend("b", fake)], **(QUIET | dispatcher))
    async with (
        Store(db_url) as store,
        ControlPlane(settings, store=store) as cp,
        running(Dispatcher(settings, store=store, status_server=False)) as d,
    ):
        request = await finished(cp, await cp.request_instance(spec(name)))
        events = await store.backend_events(backend="b")
        out = d.allocator.node_states("b")
    return request, d, [e for e in events if e["kind"].startswith("node-")], out


async def test_a_create_failing_on_its_dead_node_is_placed_again_elsewhere(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with fakes(1, nodes=3) as (fake,):
        crash = Crash(monkeypatch, fake)
        crash.failing.add(N3)  # its figures still read (stale), its RPC gone: the create tells
        fake.cluster.nodes[N3].mtotal *= 2  # the node with the most room: chosen first
        request, d, events, _ = await run_one(db_url, fake, "moved.example")
        assert request.status is RequestStatus.SUCCEEDED, request.error
        nodes = create_nodes(fake)
        assert nodes[0] == N3 and len(nodes) == 2 and nodes[1] in (N1, N2)
        assert fake.cluster.instances["moved.example"].pnode == nodes[1]
        assert request.attempts == 2 and d.stats.node_retries == 1 and d.stats.failed == 0
        (kept,) = request.attempt_errors
        assert (kept["attempt"], kept["backend"], kept["node"]) == (1, "b", N3)
        assert kept["job_id"] is not None and rpc_error(N3) in kept["error"] and kept["at"]
        # out of placement at once, stored for the others (a backend event with the first sign)
        down = [e for e in events if e["kind"] == "node-down"]
        assert len(down) == 1 and N3 in down[0]["message"] and "Failed to connect" in down[0]["message"]


async def test_after_max_attempts_failed_creates_the_request_fails_with_every_error(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with fakes(1, nodes=3) as (fake,):
        Crash(monkeypatch, fake).failing.update({N1, N2, N3})  # every create fails on its node
        request, d, _, _ = await run_one(db_url, fake, "doomed.example", max_attempts=2)
        assert request.status is RequestStatus.FAILED
        assert len(create_nodes(fake)) == 2 and request.attempts == 2
        errors = request.attempt_errors
        assert [e["attempt"] for e in errors] == [1, 2]
        assert len({e["node"] for e in errors}) == 2  # the second went to another node
        assert all("Failed to connect" in e["error"] for e in errors)
        assert request.error is not None and "failed 2 times (max_attempts 2)" in request.error
        last = errors[-1]
        assert f"job {last['job_id']} on b node {last['node']}" in request.error
        assert rpc_error(last["node"]) in request.error
        assert d.stats.failed == 1 and d.stats.node_retries == 2
        assert request.to_json()["attempt_errors"] == errors


async def test_a_node_failure_after_ganeti_made_the_instance_is_not_placed_again(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # LUInstanceCreate.RunOsScripts fails after cfg.AddInstance: the instance is in Ganeti, so a
    # create elsewhere would make a second one; the node is down all the same
    create = OPCODES["OP_INSTANCE_CREATE"]
    message = f"Could not add os for instance late.example on node {N3}: Error 7: Failed to connect"

    async def instance_create(cluster: Any, job: Any, op: Any) -> None:
        if op.luxid.get("pnode") == N3:
            raise OpFailure("OpExecError", message, prereq=False)
        await create(cluster, job, op)

    monkeypatch.setitem(OPCODES, "OP_INSTANCE_CREATE", instance_create)
    async with fakes(1, nodes=3) as (fake,):
        fake.cluster.nodes[N3].mtotal *= 2
        request, d, _, states = await run_one(db_url, fake, "late.example")
        assert request.status is RequestStatus.FAILED and create_nodes(fake) == [N3]
        assert request.error is not None and message in request.error
        assert [e["node"] for e in request.attempt_errors] == [N3]
        assert d.stats.node_retries == 0
        assert N3 in states and states[N3].state == "down"


async def test_a_create_failing_for_room_counts_an_attempt_too(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every kind of re-placement counts against max_attempts: no room (stale stats) here

    async def no_room(cluster: Any, job: Any, op: Any) -> None:
        node = op.luxid.get("pnode")
        raise OpFailure(
            "OpPrereqError",
            f"Not enough memory on node {node} for creating instance x: needed 256 MiB, available 0 MiB",
            "insufficient_resources",
        )

    monkeypatch.setitem(OPCODES, "OP_INSTANCE_CREATE", no_room)
    async with fakes(1, nodes=3) as (fake,):
        request, d, _, _ = await run_one(db_url, fake, "full.example", max_attempts=2)
        assert request.status is RequestStatus.FAILED
        assert len(create_nodes(fake)) == 2 and len(request.attempt_errors) == 2
        assert request.error is not None and "max_attempts 2" in request.error
        assert d.stats.capacity_retries == 2


def test_max_attempts_defaults_to_3() -> None:
    assert DispatcherSettings().max_attempts == 3
    with pytest.raises(ValueError, match="max_attempts"):
        DispatcherSettings(max_attempts=0)
