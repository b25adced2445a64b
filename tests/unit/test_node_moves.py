"""Creates still queued on a node that went down are canceled and placed again elsewhere (issue
27, items 3 and 9), on both databases: no request fails for the node, none waits for the dead
node's queue to fail one create at a time."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from synnefo_ganeti import ControlPlane, RapiClient
from synnefo_ganeti.dispatch import Dispatcher, _base
from synnefo_ganeti.jobs import JobStatus
from synnefo_ganeti.store import RequestStatus, Store
from synnefo_ganeti.testing import FakeGaneti
from tests.helpers import WAIT, eventually, spec
from tests.unit.test_dispatcher import backend, fakes, finished, running, settings_for
from tests.unit.test_node_placement_dispatcher import create_nodes

PAUSED = [["opcode", ["=", "OP_ID", "OP_INSTANCE_CREATE"]]]


@contextlib.asynccontextmanager
async def _paused(
    db_url: str, *, drain_master: bool = False, **client: Any
) -> AsyncIterator[tuple[FakeGaneti, RapiClient, int, ControlPlane, Dispatcher]]:
    """A 3-node fake whose creates stay queued (a PAUSE filter rule, as behind a busy node's lock),
    and a dispatcher placing on nodes that reads them every 0.2 s: (fake, client, rule, cp, d);
    ``client``: the backend's other settings (``timeout``); ``drain_master``: the master drained
    before the dispatcher reads the nodes, so that every create goes to a node that can be crashed."""
    async with fakes(1, nodes=3) as (fake,):
        if drain_master:
            next(node for node in fake.cluster.nodes.values() if node.master).drained = True
        settings = settings_for(
            db_url, [backend("b", fake, **client)], node_placement="pnode", health_interval=0.2,
            stats_interval=3600,
        )  # fmt: skip
        async with (
            RapiClient(fake.url, username=fake.username, password=fake.password) as rapi,
            Store(db_url) as store,
            ControlPlane(settings, store=store) as cp,
            running(Dispatcher(settings, store=store, status_server=False)) as d,
        ):
            rule = await rapi.add_filter(predicates=PAUSED, action="PAUSE")
            yield fake, rapi, rule, cp, d


async def test_creates_queued_on_a_node_that_died_are_canceled_and_placed_elsewhere(db_url: str) -> None:
    async with _paused(db_url) as (fake, rapi, rule, cp, d):
        ids = [await cp.request_instance(spec(f"q{i}.example")) for i in range(9)]
        await eventually(lambda: len(create_nodes(fake)) == 9, what="nine creates in Ganeti", timeout=30)
        await eventually(lambda: len(d._job_requests) == 9, what="nine creates followed")
        victim = next(n for n in create_nodes(fake) if not fake.cluster.nodes[n].master)
        queued_there = create_nodes(fake).count(victim)
        assert queued_there >= 1
        fake.crash_node(victim)
        # seen down by a node read; what is queued there canceled and placed elsewhere
        await eventually(lambda: d.stats.moved == queued_there, what="the creates moved off", timeout=30)
        await rapi.delete_filter(rule)
        done = [await finished(cp, rid, timeout=60) for rid in ids]
        assert [r.status for r in done] == [RequestStatus.SUCCEEDED] * 9, [r.error for r in done]
        assert d.stats.failed == 0 and d.stats.node_retries == 0
        moved = [r for r in done if any(e.get("moved") for e in r.attempt_errors or ())]
        assert len(moved) == queued_there
        for request in moved:
            (entry,) = [e for e in request.attempt_errors if e.get("moved")]
            assert entry["node"] == victim and victim in entry["error"]
            assert request.attempts == 2
        canceled = [j for j in fake.cluster.jobs.values() if j.status is JobStatus.CANCELED]
        assert len(canceled) == queued_there
        # nothing on the dead node: what was queued there was moved before it ran
        assert all(i.pnode != victim for i in fake.cluster.instances.values())


async def test_a_create_answered_after_its_node_left_placement_is_moved_too(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ganeti answers a create's POST late (the real 3-node lab: with a node dead, the master takes
    15-30 s and more to turn a POST into a job) and the node dies meanwhile: the move off that node
    ran before the job id came back, so the create is moved once its id is recorded (a rehearsal saw
    one sit queued in Ganeti until the node came back)."""
    answered, release = asyncio.Event(), asyncio.Event()
    create_instance = RapiClient.create_instance

    async def late(self: RapiClient, *args: Any, **kwargs: Any) -> int:
        job_id = await create_instance(self, *args, **kwargs)  # Ganeti has the job ...
        answered.set()
        await release.wait()  # ... and its answer comes later
        return job_id

    async with _paused(db_url) as (fake, rapi, rule, cp, d):
        monkeypatch.setattr(RapiClient, "create_instance", late)
        ids = [await cp.request_instance(spec(f"late{i}.example")) for i in range(3)]
        await eventually(lambda: len(create_nodes(fake)) == 3, what="three creates in Ganeti", timeout=30)
        await asyncio.wait_for(answered.wait(), WAIT)
        assert not d._job_requests  # no answer came back yet
        victims = [n for n in create_nodes(fake) if n and not fake.cluster.nodes[n].master]
        if not victims:  # all three on the master: none to crash here; the fake places again
            pytest.fail(f"the dispatcher placed every create on the master: {create_nodes(fake)}")
        victim = victims[0]
        queued_there = create_nodes(fake).count(victim)
        fake.crash_node(victim)
        await eventually(lambda: victim in d.allocator.node_states("b"), what="the node out of placement")
        assert d.stats.moved == 0  # nothing of it known to move yet
        release.set()
        await eventually(lambda: d.stats.moved == queued_there, what="the late creates moved off", timeout=30)
        await rapi.delete_filter(rule)
        done = [await finished(cp, rid, timeout=60) for rid in ids]
        assert [r.status for r in done] == [RequestStatus.SUCCEEDED] * 3, [r.error for r in done]
        assert d.stats.failed == 0
        assert all(i.pnode != victim for i in fake.cluster.instances.values())


async def test_a_create_listed_before_ganeti_enqueued_it_is_canceled_once_enqueued(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The real lab (2026-12-01): with a node crashed, a create's POST timed out, the client found
    its job in the job list ("submitted after all"), and the move's cancel a moment later answered
    "Job N not found in queue": luxid had written the job but was still writing it to the dead
    master candidate before enqueueing it. Such a cancel is sent again until Ganeti enqueues the
    job, which is then dequeued and placed elsewhere; before, it was left "to end on its own", and
    ran on the dead node. The fake holds each create written but not enqueued for 10 s
    (``slow_submit(queued_for=...)``), longer than the client's 1 s timeout."""
    caplog.set_level(logging.INFO, logger="synnefo_ganeti")
    async with _paused(db_url, timeout=1.0) as (fake, rapi, rule, cp, d):
        fake.slow_submit(0.0, job_after=0.0, queued_for=10.0)
        ids = [await cp.request_instance(spec(f"held{i}.example")) for i in range(3)]
        await eventually(
            lambda: len(d._job_requests) == 3, what="three creates found and recorded", timeout=30
        )
        held = list(fake.cluster._held)
        assert len(held) == 3, held  # listed, none in the scheduler yet
        victims = [n for n in create_nodes(fake) if n and not fake.cluster.nodes[n].master]
        if not victims:
            pytest.fail(f"the dispatcher placed every create on the master: {create_nodes(fake)}")
        victim = victims[0]
        queued_there = create_nodes(fake).count(victim)
        fake.crash_node(victim)
        await eventually(lambda: d.stats.moved == queued_there, what="the held creates moved off", timeout=30)
        assert any("not in Ganeti's scheduler yet" in r.getMessage() for r in caplog.records)
        fake.clear_slow_submits()
        await rapi.delete_filter(rule)
        done = [await finished(cp, rid, timeout=60) for rid in ids]
        assert [r.status for r in done] == [RequestStatus.SUCCEEDED] * 3, [r.error for r in done]
        assert d.stats.failed == 0 and d.stats.node_retries == 0
        assert all(i.pnode != victim for i in fake.cluster.instances.values())


async def test_a_create_ganeti_lists_but_never_enqueues_is_placed_again_on_its_backend(
    db_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The 3-node lab again (2026-12-01): job 207, a create found in the job list after its POST timed
    out, stayed listed "queued" for good, its cancel answering "not found in queue" minute after
    minute: luxid had written it and never enqueued it (it runs only when luxid restarts), and its
    request waited past the test's 240 s. Once the patient cancel gives up on such a job it is
    stranded: the request is placed again, on that backend only, the stranded job passed over
    when Ganeti is asked about it; the node it was on is dead, so it is made on another one."""
    caplog.set_level(logging.INFO, logger="synnefo_ganeti")
    monkeypatch.setattr(_base, "NOT_ENQUEUED_WAIT", 1.5)
    monkeypatch.setattr(_base, "NOT_ENQUEUED_PAUSE", 0.2)
    async with _paused(db_url, drain_master=True, timeout=1.0) as (fake, rapi, rule, cp, d):
        master = next(n for n, node in fake.cluster.nodes.items() if node.master)
        fake.slow_submit(0.0, job_after=0.0, queued_for=3600.0, times=1)  # never enqueued within the test
        (rid,) = [await cp.request_instance(spec("stranded.example"))]
        await eventually(lambda: len(d._job_requests) == 1, what="the create found and recorded", timeout=30)
        (stranded,) = fake.cluster._held
        victim = create_nodes(fake)[0]
        assert victim != master
        fake.crash_node(victim)
        await eventually(lambda: d.stats.stranded == 1, what="the create found stranded", timeout=30)
        await rapi.delete_filter(rule)
        done = await finished(cp, rid, timeout=60)
        assert done.status is RequestStatus.SUCCEEDED, done.error
        (entry,) = [e for e in done.attempt_errors if e.get("stranded")]
        assert entry["job_id"] == stranded and entry["backend"] == "b" and entry["node"] == victim
        assert f"job {stranded} is stranded on backend b" in entry["error"]
        # made once, elsewhere; the stranded job still listed queued, as Ganeti leaves it
        assert [i.pnode for i in fake.cluster.instances.values() if i.name == "stranded.example"] != [victim]
        assert len([i for i in fake.cluster.instances.values() if i.name == "stranded.example"]) == 1
        assert (await rapi.get_job(stranded)).status is JobStatus.QUEUED
        assert d.stats.moved == 0 and d.stats.failed == 0
        assert any("is stranded on backend b" in r.getMessage() for r in caplog.records)
