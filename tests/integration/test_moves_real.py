"""Ganeti's moves on the real 3-node testbed and on the fake, through RapiClient: the same steps,
the same checks, and the jobs' answers compared key for key.

The steps (``sharedfile`` and ``diskless`` instances, the templates that move on the testbed,
``../shared/ganeti/multi/NOTES.md``): migrate an instance to a named node and back, fail the other
over and back, migrate every primary off a node (``LUNodeMigrate``: one child job per instance),
evacuate a node's primaries with the default iallocator (``LUNodeEvacuate``: hail's plan, one
``OP_INSTANCE_MIGRATE`` child per instance) and its secondaries (none: no jobs), the refusals
Ganeti gives (``evacuate`` mode ``all``, a migration to the instance's own primary), and a master
failover there and back. Ganeti's RAPI has no call for a master failover (it is
``gnt-cluster master-failover`` run on the new master, ``bootstrap.MasterFailover``): on the
testbed it runs there; the fake has ``FakeGaneti.master_failover``. Either way the client opened
before it reaches the new master afterwards (the testbed's RAPI address follows the cluster IP).

The instances live on the third node (the ``ganeti`` tests use the first): a node migrate or
evacuate moves every primary instance of its node, other tests' too, so the checks name ours.
The instances are removed and the master given back even when a step fails. The master failover
needs an idle job queue (a failover with running jobs failed, NOTES.md) and takes RAPI away for
20-40 s: in CI the real-Ganeti tests run one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from synnefo_ganeti import InstanceSpec, Job, JobStatus, RapiClient
from synnefo_ganeti.testing import FakeGaneti, structure_diff
from tests.helpers import eventually

pytestmark = [pytest.mark.ganeti3, pytest.mark.timeout(400)]

DEADLINE = 120.0  # a move takes 1-3 s on the testbed; creates and failovers queue behind others' jobs
FAILOVER_DEADLINE = 120.0  # gnt-cluster master-failover: 17-24 s measured (NOTES.md), more when loaded
MULTI_RUN = "/run/ganeti-multi"


@dataclass
class Record:
    """What one run answered: jobs (by step) for the shape comparison, and what each step took."""

    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


class Cluster:
    """The one thing that differs between the testbed and the fake: how the master fails over."""

    def __init__(self, rapi: RapiClient, nodes: tuple[str, str, str], domain: str,
                 master_failover: Callable[[str], Awaitable[None]]) -> None:  # fmt: skip
        self.rapi = rapi
        self.nodes = nodes
        self.domain = domain
        self.master_failover = master_failover
        self.record = Record()

    async def job(self, step: str, job_id: int, *, status: JobStatus = JobStatus.SUCCESS) -> Job:
        started = time.monotonic()
        job = await self.rapi.wait_for_job(job_id, timeout=DEADLINE)
        self.record.seconds[step] = time.monotonic() - started
        assert job.status is status, (step, job.status, job.failure)
        self.record.jobs[step] = await self.rapi._get(f"/2/jobs/{job_id}")
        return job

    async def pnode(self, instance: str) -> str:
        found = (await self.rapi.get_instance(instance)).pnode
        assert found is not None, instance
        return found


async def children(cluster: Cluster, step: str, job: Job, opcode: str) -> list[Job]:
    """The jobs a node migrate or evacuate submitted (``{"jobs": [[true, id], ...]}``), ended."""
    assert job.opresult is not None and len(job.opresult) == 1, job.opresult
    result = job.opresult[0]
    assert set(result) == {"jobs"}, result
    assert all(ok is True and isinstance(i, int) for ok, i in result["jobs"]), result
    ended = [await cluster.job(f"{step}_child", i) for _, i in result["jobs"]]  # the shapes of the last
    for child in ended:
        assert [op["OP_ID"] for op in child.ops] == [opcode], child.ops
        assert child.ops[0]["comment"] == f"Submitted by {job.ops[0]['OP_ID']}", child.ops[0]
        trail = [entry[0] for entry in child.ops[0]["reason"]]
        assert trail[:2] == [entry[0] for entry in job.ops[0]["reason"]], trail  # the parent's trail first
        assert child.opresult == [None], child.opresult
    return ended


async def scenario(cluster: Cluster) -> None:
    """On the third node: the ``ganeti`` tests place their instances on the first one, and a
    node migrate or evacuate moves every primary of its node (ours, and any other's)."""
    rapi, home = cluster.rapi, cluster.nodes[2]
    tag = uuid.uuid4().hex[:6]
    sf, dl = f"sg-mv-sf{tag}.{cluster.domain}", f"sg-mv-dl{tag}.{cluster.domain}"
    common: dict[str, Any] = {"os": "noop", "beparams": {"memory": 128}, "hypervisor": "fake", "pnode": home}
    specs = [
        InstanceSpec(name=sf, disk_template="sharedfile", disks=[{"size": 1024}], **common),
        InstanceSpec(name=dl, disk_template="diskless", **common),
    ]
    created = await asyncio.gather(*(rapi.create_instance(s) for s in specs))
    try:
        for step, job_id in zip(("create_sharedfile", "create_diskless"), created, strict=True):
            await cluster.job(step, job_id)
        await moves(cluster, sf, dl)
        await node_moves(cluster, sf, dl)
        await master_failover(cluster, sf)
    finally:
        existing = {i.name for i in await rapi.list_instances()}
        removes = [await rapi.delete_instance(n) for n in (sf, dl) if n in existing]
        for job_id in removes:
            await rapi.wait_for_job(job_id, timeout=DEADLINE)


async def moves(cluster: Cluster, sf: str, dl: str) -> None:
    rapi, (n1, n2, home) = cluster.rapi, cluster.nodes
    # migrate to a named node, and back; fail over to a named node, and back
    migrate, failover = await asyncio.gather(
        rapi.migrate_instance(sf, target_node=n2), rapi.failover_instance(dl, target_node=n1)
    )
    for step, job_id in (("migrate", migrate), ("failover", failover)):
        job = await cluster.job(step, job_id)
        assert job.opresult == [None], (step, job.opresult)
    assert (await cluster.pnode(sf), await cluster.pnode(dl)) == (n2, n1)
    back = await asyncio.gather(
        rapi.migrate_instance(sf, target_node=home, mode="live"), rapi.failover_instance(dl, target_node=home)
    )
    for step, job_id in zip(("migrate_back", "failover_back"), back, strict=True):
        await cluster.job(step, job_id)
    assert (await cluster.pnode(sf), await cluster.pnode(dl)) == (home, home)

    # Ganeti's refusals: a migration to the instance's own primary, an evacuation of "all"
    own = await cluster.job("migrate_to_primary", await rapi.migrate_instance(sf, target_node=home),
                            status=JobStatus.ERROR)  # fmt: skip
    assert own.failure is not None and (own.failure.type, own.failure.ecode) == (
        "OpPrereqError",
        "wrong_state",
    )
    assert own.failure.message == f"Cannot migrate instance {sf} to its primary ({home})", own.failure
    every = await cluster.job(
        "evacuate_all", await rapi.evacuate_node(home, mode="all"), status=JobStatus.ERROR
    )
    assert every.failure is not None and every.failure.ecode == "wrong_input", every.failure


async def node_moves(cluster: Cluster, sf: str, dl: str) -> None:
    rapi, home = cluster.rapi, cluster.nodes[2]
    # node migrate: every primary of the node goes (the default iallocator picks where)
    job = await cluster.job("node_migrate", await rapi.migrate_node(home))
    moved = await children(cluster, "node_migrate", job, "OP_INSTANCE_MIGRATE")
    assert {c.ops[0]["instance_name"] for c in moved} >= {sf, dl}, [c.ops for c in moved]
    where = {await cluster.pnode(sf), await cluster.pnode(dl)}
    assert home not in where, where

    # node evacuate, primaries (hail's plan: OP_INSTANCE_MIGRATE to a node it names) and secondaries
    await cluster.job("migrate_home", await rapi.migrate_instance(sf, target_node=home))
    job = await cluster.job("node_evacuate", await rapi.evacuate_node(home, mode="primary-only"))
    moved = await children(cluster, "node_evacuate", job, "OP_INSTANCE_MIGRATE")
    (ours,) = [c.ops[0] for c in moved if c.ops[0]["instance_name"] == sf]
    assert ours["target_node"] != home and await cluster.pnode(sf) == ours["target_node"], ours
    job = await cluster.job(
        "node_evacuate_secondaries", await rapi.evacuate_node(home, mode="secondary-only")
    )
    assert job.opresult == [{"jobs": []}], job.opresult


async def master_failover(cluster: Cluster, sf: str) -> None:
    """The master to the second node and back; the same client reaches each new master."""
    rapi, (n1, n2, _) = cluster.rapi, cluster.nodes
    assert (await rapi.info()).master == n1
    await idle(rapi)
    started = time.monotonic()
    try:
        await cluster.master_failover(n2)
        await eventually(lambda: master_is(rapi, n2), timeout=FAILOVER_DEADLINE, interval=0.5,
                         what=f"RAPI to report {n2} as the master")  # fmt: skip
        cluster.record.seconds["master_failover"] = time.monotonic() - started
        assert await rapi.get_node_role(n2) == "master"
        assert await rapi.get_node_role(n1) == "master-candidate"
        # a job through the same client, run by the new master
        now = await cluster.pnode(sf)
        target = next(n for n in cluster.nodes if n != now)
        await cluster.job("migrate_on_new_master", await rapi.migrate_instance(sf, target_node=target))
        assert await cluster.pnode(sf) == target
    finally:
        if not await master_is(rapi, n1):
            await idle(rapi)
            started = time.monotonic()
            await cluster.master_failover(n1)
            await eventually(lambda: master_is(rapi, n1), timeout=FAILOVER_DEADLINE, interval=0.5,
                             what=f"RAPI to report {n1} as the master again")  # fmt: skip
            cluster.record.seconds["master_failover_back"] = time.monotonic() - started
    assert await rapi.get_node_role(n1) == "master"


async def master_is(rapi: RapiClient, node: str) -> bool:
    """The RAPI address answers, and names ``node`` the master (RAPI is down while it moves)."""
    try:
        return (await rapi.info()).master == node
    except Exception:
        return False


async def idle(rapi: RapiClient) -> None:
    """No job queued or running: a master failover with running jobs failed (NOTES.md)."""

    async def quiet() -> bool:
        return all(j.status.is_final for j in await rapi.list_jobs())

    await eventually(quiet, timeout=DEADLINE, interval=0.5, what="the job queue to be idle")


# -- the testbed: gnt-cluster master-failover on the new master ----------------------------------------


async def run_master_failover_on(node: str) -> None:
    """``gnt-cluster master-failover`` on ``node`` (``nodeN.ganeti.test``), in its namespaces."""
    short = node.split(".", 1)[0]
    command = ["nsenter", f"--net=/run/netns/gm-{short}", f"--mount={MULTI_RUN}/{short}.mnt",
               f"--uts={MULTI_RUN}/{short}.uts", "--wd=/", "--", "gnt-cluster", "master-failover"]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), FAILOVER_DEADLINE)
    assert proc.returncode == 0, f"{' '.join(command)} exited {proc.returncode}: {out.decode()[-2000:]}"


@contextlib.asynccontextmanager
async def real_cluster(testbed3) -> AsyncIterator[Cluster]:
    bed = testbed3.bed
    async with RapiClient(bed.url, username=bed.username, password=bed.password, ca_file=bed.ca_file) as rapi:
        nodes = testbed3.nodes
        yield Cluster(rapi, (nodes[0], nodes[1], nodes[2]), "ganeti.test", run_master_failover_on)


@contextlib.asynccontextmanager
async def fake_cluster() -> AsyncIterator[Cluster]:
    async with (
        FakeGaneti(nodes=3, disk_templates=("diskless", "file", "sharedfile")) as fake,
        RapiClient(fake.url, username=fake.username, password=fake.password, ca_file=fake.ca_file) as rapi,
    ):

        async def failover(node: str) -> None:
            fake.master_failover(node)

        nodes = tuple(sorted(fake.cluster.nodes))
        yield Cluster(rapi, (nodes[0], nodes[1], nodes[2]), "fake.test", failover)


async def test_moves_on_real_ganeti_and_on_the_fake(testbed3, capsys) -> None:
    async with fake_cluster() as fake:
        await scenario(fake)
    async with real_cluster(testbed3) as real:
        await scenario(real)
    with capsys.disabled():
        print("\nreal Ganeti, seconds per step:", {k: round(v, 1) for k, v in real.record.seconds.items()})
    assert set(real.record.jobs) == set(fake.record.jobs)
    problems = {
        step: structure_diff(real.record.jobs[step], fake.record.jobs[step]) for step in real.record.jobs
    }
    assert {step: found for step, found in problems.items() if found} == {}
