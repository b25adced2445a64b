"""Node locks: the same burst of creates on the real 3-node Ganeti and on the fake, compared.

Per mode, 9 diskless creates are sent at once; each create's execution interval
(``opexec`` .. ``opend`` of ``GET /2/query/job``, which both answer: locks acquired .. op ended)
is read back, and both clusters must show the same thing (``LUInstanceCreate`` in Ganeti 3.0's
``lib/cmdlib/instance_create.py``):

* ``ganeti`` (neither ``pnode`` nor ``iallocator``: the cluster's default iallocator, so every
  create asks for all node locks): no two creates' locked phases at once; at most 2 creates
  execute at once (one in its unlocked OS-install/start part, the next in its locked part).
* ``opportunistic`` (``opportunistic_locking``: only the free node locks) and ``pnode`` (the
  creates spread over the 3 nodes, one node's locks each): several creates at once.

The fake's create is shaped like the real one: ``op_times["OP_INSTANCE_CREATE"]`` (the whole
create) and ``op_times["OP_INSTANCE_CREATE/disks"]`` (its locked part). The figures (makespan,
most creates executing at once, median create) are printed, and docs/ganeti-testbed.md keeps them.
"""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import dataclass
from typing import Any

import pytest

from synnefo_ganeti import InstanceSpec, JobStatus, RapiClient
from synnefo_ganeti.store.instances._node_errors import node_fault
from synnefo_ganeti.testing import FakeGaneti
from tests.integration._testbed import name

pytestmark = [pytest.mark.ganeti3, pytest.mark.timeout(900)]

BURST = 9
MODES = ("ganeti", "opportunistic", "pnode")
# The fake's create, shaped like the real diskless create on the 3-node testbed (median 1.4 s when
# they run one at a time; most of it under the node locks).
FAKE_CREATE_S = 1.4
FAKE_DISKS_S = 0.8
JOB_FIELDS = "id,status,opstart,opexec,opend"
DEADLINE = 300.0
FAKE_DEADLINE = BURST * FAKE_CREATE_S + 30  # every create one after the other, and a margin


@dataclass(frozen=True)
class Interval:
    job: int
    start: float  # opstart: the op left the queue (it may then wait for locks)
    exec: float  # opexec: the op holds its locks and executes
    end: float  # opend


@dataclass(frozen=True)
class Figures:
    makespan: float  # first opstart .. last opend
    max_concurrent: int  # most creates executing (opexec .. opend) at once
    median_create: float  # median opexec .. opend

    def row(self, where: str, mode: str) -> str:
        return (
            f"{where:<5} {mode:<14} makespan {self.makespan:5.1f} s   at once {self.max_concurrent}"
            f"   median create {self.median_create:4.1f} s"
        )


def _ts(value: Any) -> float:
    seconds, micro = value
    return seconds + micro / 1e6


def figures(intervals: list[Interval]) -> Figures:
    return Figures(
        makespan=max(i.end for i in intervals) - min(i.start for i in intervals),
        max_concurrent=max_overlap([(i.exec, i.end) for i in intervals]),
        median_create=statistics.median(i.end - i.exec for i in intervals),
    )


def max_overlap(spans: list[tuple[float, float]]) -> int:
    """Most spans open at one moment (an end at the very moment of a start does not overlap it)."""
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans], key=lambda e: (e[0], e[1]))
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


async def query_jobs(rapi: RapiClient, ids: list[int]) -> list[Interval]:
    """The jobs' first-op intervals from ``GET /2/query/job`` (the fields Ganeti 3.0 has)."""
    answer = await rapi._transport.request("GET", "/2/query/job", query={"fields": JOB_FIELDS})
    names = [f["name"] for f in answer["fields"]]
    rows = [dict(zip(names, (value for _, value in row), strict=True)) for row in answer["data"]]
    by_id = {int(r["id"]): r for r in rows}
    missing = sorted(set(ids) - set(by_id))
    assert not missing, f"GET /2/query/job does not list jobs {missing}"
    out = []
    for job in ids:
        r = by_id[job]
        assert r["status"] == "success", r
        out.append(Interval(job, _ts(r["opstart"][0]), _ts(r["opexec"][0]), _ts(r["opend"][0])))
    return out


def burst_specs(mode: str, nodes: tuple[str, ...], domain: str) -> list[InstanceSpec]:
    specs = []
    for k in range(BURST):
        placement: dict[str, Any] = {}
        if mode == "opportunistic":
            placement = {"iallocator": "hail", "opportunistic_locking": True}
        elif mode == "pnode":
            placement = {"pnode": nodes[k % len(nodes)]}
        specs.append(
            InstanceSpec(
                name=name(f"lk{mode[:3]}{k}").replace(".ganeti.test", f".{domain}"),
                disk_template="diskless",
                os="noop",
                beparams={"memory": 128},
                hypervisor="fake",
                **placement,
            )
        )
    return specs


#: Ganeti's fake hypervisor (``hv_fake.py``) starts an instance by opening its file and then
#: writing its memory in it, and reads every instance's file for their memory when another create
#: asks the node's free memory: read between the two, the file is empty and that create fails with
#: this (seen once in a clean-clone rehearsal, 2026-11-30). A defect of Ganeti's test hypervisor,
#: not of locking (no real hypervisor keeps such files).
HV_FAKE_RACE = "invalid literal for int() with base 10: ''"
BURST_ATTEMPTS = 3


class BedHiccup(Exception):
    """Every failed create of the burst failed on the testbed, not on locking: the burst is sent again.

    Two such failures are known: :data:`HV_FAKE_RACE`, and an RPC to a node (which is up) that did
    not answer in time on the loaded 2-core CI machine (CI, 2026-11-30: ``Can't get data for node
    node2.ganeti.test: Error 28: SSL connection timeout``, from ``IAllocator._ComputeDynamicNodeData``),
    which :func:`~synnefo_ganeti.store.instances._node_errors.node_fault` reads as the node down."""


def is_hiccup(message: str | None) -> bool:
    """The failed create's message is one of :class:`BedHiccup`'s."""
    if message is None:
        return False
    fault = node_fault(message)
    return HV_FAKE_RACE in message or (fault is not None and fault.kind == "down")


async def run_burst(rapi: RapiClient, specs: list[InstanceSpec], deadline: float) -> list[int]:
    """Send the creates at once, wait for them all; remove the instances (even on failure)."""
    ids = await asyncio.gather(*(rapi.create_instance(s) for s in specs))
    try:
        jobs = await asyncio.gather(*(rapi.wait_for_job(j, timeout=deadline) for j in ids))
        failed = [(j.id, j.failure) for j in jobs if j.status is not JobStatus.SUCCESS]
        if failed and all(f is not None and is_hiccup(f.message) for _, f in failed):
            raise BedHiccup(failed)
        assert not failed, failed
    finally:
        await remove(rapi, [s.name for s in specs], deadline)
    return list(ids)


async def remove(rapi: RapiClient, names: list[str], deadline: float) -> None:
    existing = {i.name for i in await rapi.list_instances()}
    ids = await asyncio.gather(*(rapi.delete_instance(n) for n in names if n in existing))
    await asyncio.gather(*(rapi.wait_for_job(j, timeout=deadline) for j in ids))


def locked_spans_overlap(intervals: list[Interval], locked: float) -> bool:
    spans = [(i.exec, i.exec + locked) for i in intervals]
    return max_overlap(spans) > 1


def check(mode: str, where: str, got: Figures) -> None:
    """What every cluster, real or fake, must show for the mode."""
    if mode == "ganeti":
        # one create in its locked part (all node locks), the ones before it in their unlocked
        # tails (OS install, start: LUInstanceCreate.Exec releases the locks first); on a loaded
        # machine a tail can outlast two hand-offs (real Ganeti showed 3 once in CI), never more
        assert got.max_concurrent <= 3, f"{where}: all-node-lock creates: {got}"
    else:
        assert got.max_concurrent >= 3, f"{where}: {mode} creates should run several at once: {got}"


@pytest.mark.parametrize("mode", MODES)
async def test_real_and_fake_lock_the_same_way(testbed3, mode: str, capsys) -> None:
    bed = testbed3.bed
    async with RapiClient(bed.url, username=bed.username, password=bed.password, ca_file=bed.ca_file) as rapi:
        for attempt in range(1, BURST_ATTEMPTS + 1):
            try:
                real_ids = await run_burst(rapi, burst_specs(mode, testbed3.nodes, "ganeti.test"), DEADLINE)
                break
            except BedHiccup as hiccup:
                if attempt == BURST_ATTEMPTS:
                    raise
                with capsys.disabled():
                    print(f"\nreal {mode}: the testbed failed a create ({hiccup}); sending the burst again")
        real = figures(await query_jobs(rapi, real_ids))
    with capsys.disabled():
        print(f"\n{real.row('real', mode)}")
    check(mode, "real Ganeti", real)

    op_times = {"OP_INSTANCE_CREATE": FAKE_CREATE_S, "OP_INSTANCE_CREATE/disks": FAKE_DISKS_S}
    async with FakeGaneti(nodes=3, op_times=op_times) as fake:
        nodes = tuple(f"node{k}.fake.test" for k in (1, 2, 3))
        async with RapiClient(
            fake.url, username=fake.username, password=fake.password, ca_file=fake.ca_file
        ) as rapi:
            fake_ids = await run_burst(rapi, burst_specs(mode, nodes, "fake.test"), FAKE_DEADLINE)
            intervals = await query_jobs(rapi, fake_ids)
    ours = figures(intervals)
    with capsys.disabled():
        print(ours.row("fake", mode))
    check(mode, "fake Ganeti", ours)
    if mode == "ganeti":
        # the fake's locked part is known: no two creates ever hold it at once
        assert not locked_spans_overlap(intervals, FAKE_DISKS_S), intervals
