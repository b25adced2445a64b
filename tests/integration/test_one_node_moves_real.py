"""The moves test_moves_real.py calls only on the 3-node testbed (``migrate_instance``,
``failover_instance``, ``migrate_node``, ``evacuate_node``), on any testbed, the single-node ones
(3.0's, 3.1's) too, against a small diskless instance of our own; the same steps on a fake of the
same version and node count, and every job compared key for key (``structure_diff``).

On one node each move is a job that Ganeti refuses: the iallocator (hail) finds no node to move
the instance to (``TLMigrateInstance._RunAllocator``: ``Can't compute nodes using iallocator``), and a
node migrate or evacuate finds no node for the node's instances (``LUNodeMigrate`` and
``LUNodeEvacuate`` ask hail for a ``node-evacuate`` plan). On several nodes they move the instance
(the last node's primaries: test_moves_real.py's node, not the first one of the other ``ganeti``
tests). The instance is removed even when a step fails.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest

from synnefo_ganeti import InstanceSpec, Job, JobStatus, RapiClient
from synnefo_ganeti.testing import FakeGaneti, structure_diff

pytestmark = [pytest.mark.ganeti, pytest.mark.timeout(300)]

DEADLINE = 120.0


@dataclass
class Moves:
    rapi: RapiClient
    home: str  # the node our instance starts on: the cluster's last
    one_node: bool
    domain: str
    instance: str = ""
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    ended: dict[str, Job] = field(default_factory=dict)

    async def job(self, step: str, job_id: int) -> Job:
        job = await self.rapi.wait_for_job(job_id, timeout=DEADLINE)
        self.ended[step] = job
        self.jobs[step] = await self.rapi._get(f"/2/jobs/{job_id}")
        return job

    async def child(self, step: str, parent: Job, instance: str) -> None:
        """The job a node migrate or evacuate submitted for ``instance`` (``{"jobs": [[true, id],
        ...]}``; the others move other instances of the node, e.g. another test's), ended."""
        if parent.status is not JobStatus.SUCCESS:
            return
        assert parent.opresult is not None and set(parent.opresult[0]) == {"jobs"}, parent.opresult
        for ok, job_id in parent.opresult[0]["jobs"]:
            assert ok is True, parent.opresult
            job = await self.rapi.wait_for_job(job_id, timeout=DEADLINE)
            if job.ops[0].get("instance_name") == instance:
                await self.job(f"{step}_child", job_id)


async def run(m: Moves) -> None:
    rapi = m.rapi
    m.instance = instance = f"sg-1mv-{uuid.uuid4().hex[:6]}.{m.domain}"
    spec = InstanceSpec(name=instance, os="noop", disk_template="diskless", hypervisor="fake",
                        beparams={"memory": 128}, pnode=m.home)  # fmt: skip
    created = await rapi.create_instance(spec)
    try:
        assert (await m.job("create", created)).status is JobStatus.SUCCESS, m.ended["create"].failure
        # two reads the record found called by no other real test: the instance's data as a job, and
        # an ended job's change (answered at once: nothing to wait for)
        info = await m.job("instance_info", await rapi.get_instance_info(instance, static=True))
        assert info.status is JobStatus.SUCCESS and info.opresult and instance in info.opresult[0], (
            info.opresult
        )
        change = await rapi.wait_for_job_change(created, ["status"], None, None)
        assert change is not None and change["job_info"] == ["success"], change
        m.jobs["wait_for_job_change"] = change
        # the node's tags, read, and added and removed as dry runs (the node is shared: nothing changes)
        m.jobs["node_tags"] = {"tags": await rapi.get_node_tags(m.home)}
        await m.job("node_tags_add", await rapi.add_node_tags(m.home, ["sg-1mv"], dry_run=True))
        await m.job("node_tags_delete", await rapi.delete_node_tags(m.home, ["sg-1mv"], dry_run=True))
        # replace-disks of a diskless instance: refused (only DRBD disks are replaced)
        await m.job("replace_disks", await rapi.replace_instance_disks(instance))
        await m.job("migrate_instance", await rapi.migrate_instance(instance))
        await m.job("failover_instance", await rapi.failover_instance(instance))
        pnode = (await rapi.get_instance(instance)).pnode
        await m.child(
            "migrate_node", await m.job("migrate_node", await rapi.migrate_node(str(pnode))), instance
        )
        pnode = (await rapi.get_instance(instance)).pnode
        evacuate = await m.job("evacuate_node", await rapi.evacuate_node(str(pnode), mode="primary-only"))
        await m.child("evacuate_node", evacuate, instance)
    finally:
        if instance in {i.name for i in await rapi.list_instances()}:
            await rapi.wait_for_job(await rapi.delete_instance(instance), timeout=DEADLINE)


NO_NODE = "Can't compute nodes using iallocator 'hail': Request failed: Can't find any good node: "


def check_one_node(m: Moves) -> None:
    """What Ganeti (3.0 and 3.1 alike) answers on one node: every move of the instance a job that
    fails with hail's refusal; a node migrate submits one migrate per primary instance (each
    refused), a node evacuate fails in ``LoadNodeEvacResult`` (hail's plan moves nothing)."""
    refused = ("OpPrereqError", "insufficient_resources", NO_NODE)
    for step in ("migrate_instance", "failover_instance", "migrate_node_child"):
        job = m.ended[step]
        assert job.status is JobStatus.ERROR and job.failure is not None, (step, job.status, job.opresult)
        assert (job.failure.type, job.failure.ecode, job.failure.message) == refused, (step, job.failure)
    assert m.ended["migrate_node"].status is JobStatus.SUCCESS, m.ended["migrate_node"].failure
    assert m.ended["migrate_node_child"].ops[0]["OP_ID"] == "OP_INSTANCE_MIGRATE"
    evacuate = m.ended["evacuate_node"]
    assert evacuate.status is JobStatus.ERROR and evacuate.failure is not None, evacuate.opresult
    assert "evacuate_node_child" not in m.ended


def check_evacuate_refusal(real: Moves, ours: Moves, instance: str) -> None:
    failure = real.ended["evacuate_node"].failure
    assert failure is not None and (failure.type, failure.ecode) == ("OpExecError", None), failure
    assert failure.message.startswith("Unable to evacuate instances "), failure  # each primary of the node
    assert f"{instance} (Can't find any good node: )" in failure.message, failure
    # the fake (synnefo_ganeti/testing/_ops_nodes.py, not _ops_moves.py) refuses in CheckPrereq
    # instead: OpPrereqError "Can't compute node evacuation using iallocator 'None': Request failed:
    # no node has room for instance ...", insufficient_resources. Ganeti's hail answers a node-evac
    # request that places nothing with success and every instance in "failed", so the LU fails in
    # Exec (cmdlib/common.py LoadNodeEvacResult): a difference left for the fake's owner.
    ours_failure = ours.ended["evacuate_node"].failure
    assert ours_failure is not None and ours_failure.type == "OpPrereqError", ours_failure


async def test_the_moves_on_the_testbeds_nodes_and_on_a_fake(testbed) -> None:
    async with RapiClient(
        testbed.url, username=testbed.username, password=testbed.password, ca_file=testbed.ca_file
    ) as rapi:
        nodes = sorted(n.name for n in await rapi.list_nodes())
        real = Moves(rapi, nodes[-1], len(nodes) == 1, testbed.domain)
        await run(real)
    async with (
        FakeGaneti(version=testbed.series, nodes=len(nodes)) as fake,
        RapiClient(fake.url, username=fake.username, password=fake.password, ca_file=fake.ca_file) as rapi,
    ):
        ours = Moves(rapi, f"node{len(nodes)}.fake.test", len(nodes) == 1, "fake.test")
        await run(ours)
    # on several nodes hail's plan may differ from the fake's (a child job more or less): the common steps
    assert set(real.ended) == set(ours.ended) or not real.one_node, (sorted(real.ended), sorted(ours.ended))
    common = set(real.ended) & set(ours.ended)
    for m in (real, ours):  # what real Ganeti 3.0 and 3.1 answered, and the fake as they do
        assert m.ended["node_tags_add"].status is JobStatus.SUCCESS, m.ended["node_tags_add"].failure
        untag, replace = m.ended["node_tags_delete"].failure, m.ended["replace_disks"].failure
        assert untag is not None and (untag.type, untag.ecode, untag.message) == (
            "OpPrereqError", "unknown_entity", "Tag(s) 'sg-1mv' not found"), untag  # fmt: skip
        assert replace is not None and (replace.type, replace.ecode, replace.message) == (
            "OpPrereqError", "internal_error", "The instance has a strange layout, expected one secondary but found 0"
        ), replace  # fmt: skip
    assert {s: real.ended[s].status for s in common} == {s: ours.ended[s].status for s in common}
    if real.one_node:
        for m in (real, ours):
            check_one_node(m)
        check_evacuate_refusal(real, ours, real.instance)
    else:  # several nodes: each move succeeds (test_moves_real.py checks where to), here as on the fake
        moves = (
            "migrate_instance",
            "failover_instance",
            "migrate_node",
            "migrate_node_child",
            "evacuate_node",
        )
        moved = [step for step in real.ended if step in moves or step == "evacuate_node_child"]
        assert all(real.ended[step].status is JobStatus.SUCCESS for step in moved), real.ended
    # key for key; one difference the shapes let through (a failure is a positional tuple): on one
    # node the real evacuate_node fails with ["OpExecError", [message]], the fake's with
    # ["OpPrereqError", [message, "insufficient_resources"]] (check_evacuate_refusal)
    for m in (real, ours):  # the instance data is keyed by the instance's name: compare the data
        m.jobs["instance_info"]["opresult"] = [{"NAME": m.jobs["instance_info"]["opresult"][0][m.instance]}]
    problems = {
        step: structure_diff(real.jobs[step], ours.jobs[step]) for step in real.jobs if step in ours.jobs
    }
    assert {step: found for step, found in problems.items() if found} == {}
