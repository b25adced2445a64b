"""The RAPI calls test_fake_surface_vs_real.py and test_moves_real.py leave out, through RapiClient,
on the real testbed and on the fake: the same steps and checks, and every answer and job compared
key for key (``structure_diff``).

Four independent parts run at once (each locks only its own things):

* the cluster: features, version, OS list, cluster tags, redistribute-config, a no-op cluster
  modify, job filter rules (added, listed, read, replaced, deleted; ``CONTINUE`` rules that match
  nothing, so other jobs are not touched), queries and their fields, node storage units, node
  modify and role on the master (refused: ``The master role can be changed only via
  master-failover``; an ``ndparams`` change, set back), storage units modify and repair (refused
  for ``file``);
* a ``file`` instance, stopped: grow its disk, activate and deactivate its disks, recreate them,
  reinstall, rename, start it and read its console, tag and untag it, prepare a local export,
  modify it, remove it (recreate-disks is refused: its disk file is still there);
* a multi-allocation of two diskless instances, removed again;
* a node group: modified, tagged and untagged, a node's assignment tried as a dry run, removed.

The instances and rules are removed and the node parameters set back even when a step fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from synnefo_ganeti import InstanceSpec, Job, JobStatus, RapiClient
from synnefo_ganeti.testing import FakeGaneti, structure_diff

pytestmark = [pytest.mark.ganeti, pytest.mark.timeout(300)]

DEADLINE = 120.0
NOTHING = [["opcode", ["=", "OP_ID", "OP_SG_MATCHES_NOTHING"]]]  # a filter predicate no job matches
STORED = [["opcode", ["==", "OP_ID", "OP_SG_MATCHES_NOTHING"]]]


@dataclass
class Surface:
    rapi: RapiClient
    master: str
    last_node: str  # the node a group's assign-nodes dry run names
    domain: str
    # multi-alloc: hail places the instances, or (a one-node cluster, where hail refuses every
    # allocation with FailN1 on Ganeti 3.0 and 3.1 alike) each names this node
    alloc_on: str | None = None
    answers: dict[str, Any] = field(default_factory=dict)

    async def job(self, step: str, job_id: int, *, status: JobStatus = JobStatus.SUCCESS) -> Job:
        job = await self.rapi.wait_for_job(job_id, timeout=DEADLINE)
        assert job.status is status, (step, job.status, job.failure)
        self.answers[step] = await self.rapi._get(f"/2/jobs/{job_id}")
        return job

    def keep(self, step: str, answer: Any) -> Any:
        self.answers[step] = answer
        return answer


async def cluster_part(s: Surface) -> None:
    rapi = s.rapi
    assert set(s.keep("features", await rapi.features())) >= {"instance-create-reqv1", "node-evac-res1"}
    assert s.keep("version", await rapi.version()) == 2
    assert "noop" in s.keep("os", await rapi.list_os())

    tag = f"sg:surface:{uuid.uuid4().hex[:6]}"
    await s.job("cluster_tags_add", await rapi.add_cluster_tags([tag]))
    assert tag in s.keep("cluster_tags", await rapi.get_cluster_tags())
    await s.job("cluster_tags_delete", await rapi.delete_cluster_tags([tag]))
    assert tag not in await rapi.get_cluster_tags()
    await s.job("redistribute_config", await rapi.redistribute_config())
    info = await rapi.info()
    await s.job("modify_cluster", await rapi.modify_cluster(candidate_pool_size=info.model_extra["candidate_pool_size"]))  # type: ignore[index]  # fmt: skip

    await filters_part(s)
    await query_part(s)
    await node_part(s)


async def filters_part(s: Surface) -> None:
    rapi = s.rapi
    rule = await rapi.add_filter(priority=7, predicates=NOTHING, action="CONTINUE")
    try:
        got = await rapi.get_filter(rule)
        s.keep("filter", await rapi._get(f"/2/filters/{rule}"))
        # Ganeti stores "=" as "==" (its query language's equality, serialised)
        assert (got.uuid, got.priority, got.predicates, got.action) == (rule, 7, STORED, "CONTINUE")
        assert rule in [f.uuid for f in await rapi.list_filters()]
        assert await rapi.replace_filter(rule, priority=8, predicates=NOTHING, action="CONTINUE") == rule
        assert (await rapi.get_filter(rule)).priority == 8
    finally:
        await rapi.delete_filter(rule)
    assert rule not in [f.uuid for f in await rapi.list_filters()]


async def query_part(s: Surface) -> None:
    rapi = s.rapi
    nodes = await rapi.query("node", ["name", "role", "mtotal", "tags"], qfilter=["=", "name", s.master])
    s.keep("query_node", await rapi._transport.request(
        "PUT", "/2/query/node", body={"fields": ["name", "role", "mtotal", "tags"], "qfilter": ["=", "name", s.master]}
    ))  # fmt: skip
    assert nodes.names == ["name", "role", "mtotal", "tags"] and len(nodes.rows) == 1, nodes
    assert nodes.rows[0]["name"] == s.master and nodes.rows[0]["role"] == "M", nodes.rows
    fields = await rapi.query_fields("instance", ["name", "pnode", "nosuch"])
    assert [(f.name, f.kind) for f in fields][:2] == [("name", "text"), ("pnode", "text")], fields
    assert fields[2].kind == "unknown", fields[2]
    every = await rapi.query_fields("node")
    assert {"name", "role", "mfree", "dfree"} <= {f.name for f in every}
    jobs = await rapi.query("job", ["id", "status"], qfilter=["=", "status", "success"])
    assert jobs.names == ["id", "status"] and all(r["status"] == "success" for r in jobs.rows), jobs.rows[:3]


async def node_part(s: Surface) -> None:
    rapi, master = s.rapi, s.master
    assert await rapi.get_node_role(master) == "master"
    refused = await s.job("master_role", await rapi.set_node_role(master, "regular"), status=JobStatus.ERROR)
    assert refused.failure is not None and refused.failure.message == (
        "The master role can be changed only via master-failover"
    ), refused.failure
    assert await rapi.get_node_role(master) == "master"
    before = (await rapi.get_node(master)).model_extra["ndparams"]["spindle_count"]  # type: ignore[index]
    try:
        changed = await s.job(
            "node_modify", await rapi.modify_node(master, ndparams={"spindle_count": before + 1})
        )
        assert changed.opresult == [[]], changed.opresult  # LUNodeSetParams lists no ndparams change
        assert (await rapi.get_node(master)).model_extra["ndparams"]["spindle_count"] == before + 1  # type: ignore[index]
    finally:
        await s.job("node_modify_back", await rapi.modify_node(master, ndparams={"spindle_count": before}))
    assert (await rapi.get_node(master)).model_extra["ndparams"]["spindle_count"] == before  # type: ignore[index]
    units = await s.job("node_storage", await rapi.get_node_storage_units(master, "file", ["name", "size", "used", "free", "allocatable"]))  # fmt: skip
    assert units.opresult is not None and len(units.opresult[0]) == 1, units.opresult
    name, size, used, free, allocatable = units.opresult[0][0]
    assert isinstance(name, str) and size >= used >= 0 and free >= 0 and allocatable is True, units.opresult
    refused = await s.job("node_storage_modify", await rapi.modify_node_storage_units(master, "file", name, allocatable=False),
                          status=JobStatus.ERROR)  # fmt: skip
    assert refused.failure is not None and refused.failure.ecode == "wrong_input", refused.failure
    refused = await s.job("node_storage_repair", await rapi.repair_node_storage_units(master, "file", name),
                          status=JobStatus.ERROR)  # fmt: skip
    assert refused.failure is not None and refused.failure.message == (
        "Storage units of type 'file' can not be repaired"
    ), refused.failure


async def instance_part(s: Surface) -> None:
    rapi = s.rapi
    tag = uuid.uuid4().hex[:6]
    name, renamed = f"sg-sf-file{tag}.{s.domain}", f"sg-sf-ren{tag}.{s.domain}"
    spec = InstanceSpec(name=name, disk_template="file", os="noop", disks=[{"size": 1024}], beparams={"memory": 128},
                        hypervisor="fake", pnode=s.master, start=False)  # fmt: skip
    await s.job("create_file", await rapi.create_instance(spec))
    try:
        await s.job("grow_disk", await rapi.grow_instance_disk(name, 0, 128, wait_for_sync=False))
        assert (await rapi.get_instance(name)).disk_sizes == [1152]
        activated = await s.job("activate_disks", await rapi.activate_instance_disks(name))
        assert activated.opresult is not None and len(activated.opresult[0]) == 1, activated.opresult
        node, iv_name, _path = activated.opresult[0][0][:3]
        assert (node, iv_name) == (s.master, "disk/0"), activated.opresult
        await s.job("deactivate_disks", await rapi.deactivate_instance_disks(name))
        # recreate-disks is for lost disks: on its own node, Ganeti refuses to overwrite the file
        refused = await s.job(
            "recreate_disks", await rapi.recreate_instance_disks(name), status=JobStatus.ERROR
        )
        assert refused.failure is not None and refused.failure.type == "OpExecError", refused.failure
        assert "File exists" in refused.failure.message, refused.failure
        await s.job("reinstall", await rapi.reinstall_instance(name, os="noop", no_startup=True))
        await s.job("rename", await rapi.rename_instance(name, renamed, ip_check=False, name_check=False))
        name = renamed
        assert (await rapi.get_instance(name)).name == renamed
        await s.job("startup", await rapi.startup_instance(name))
        console = await rapi.get_instance_console(name)
        s.keep("console", await rapi._get(f"/2/instances/{name}/console"))
        assert console.instance == name and console.kind in ("msg", "ssh", "vnc", "spice"), console
        await s.job("tags_add", await rapi.add_instance_tags(name, ["sg:a", "sg:b"]))
        await s.job("tags_delete", await rapi.delete_instance_tags(name, ["sg:a"]))
        assert await rapi.get_instance_tags(name) == ["sg:b"]
        await s.job("prepare_export", await rapi.prepare_export(name, "local"))
        await s.job("modify", await rapi.modify_instance(name, beparams={"memory": 192}))
        assert (await rapi.get_instance(name)).beparams.get("memory") == 192
    finally:
        await s.job("remove_file", await rapi.delete_instance(name))


async def multi_alloc_part(s: Surface) -> None:
    rapi = s.rapi
    tag = uuid.uuid4().hex[:6]
    names = [f"sg-sf-ma{k}{tag}.{s.domain}" for k in (1, 2)]
    specs = [InstanceSpec(name=n, disk_template="diskless", os="noop", beparams={"memory": 128}, hypervisor="fake",
                          pnode=s.alloc_on) for n in names]  # fmt: skip
    iallocator = None if s.alloc_on else "hail"
    job = await s.job("multi_alloc", await rapi.instances_multi_alloc(specs, iallocator=iallocator))
    try:
        assert job.opresult is not None, job.opresult
        result = job.opresult[0]
        assert set(result) == {"jobs", "allocatable", "failed"}, result
        assert sorted(result["allocatable"]) == sorted(names) and result["failed"] == [], result
        for ok, child in result["jobs"]:
            assert ok is True
            await s.job("multi_alloc_child", child)
    finally:
        existing = {i.name for i in await rapi.list_instances()}
        removes = [await rapi.delete_instance(n) for n in names if n in existing]
        for job_id in removes:
            await rapi.wait_for_job(job_id, timeout=DEADLINE)


async def group_part(s: Surface, node: str) -> None:
    rapi = s.rapi
    tag = uuid.uuid4().hex[:6]
    group = f"sg-sf-grp{tag}"
    await s.job("group_add", await rapi.create_group(group))
    try:
        await s.job("group_modify", await rapi.modify_group(group, alloc_policy="last_resort"))
        assert (await rapi.get_group(group)).alloc_policy == "last_resort"
        await s.job("group_tags_add", await rapi.add_group_tags(group, [f"sg:{tag}"]))
        assert s.keep("group_tags", await rapi.get_group_tags(group)) == [f"sg:{tag}"]
        await s.job("group_tags_delete", await rapi.delete_group_tags(group, [f"sg:{tag}"]))
        assert await rapi.get_group_tags(group) == []
        # a dry run: the checks of moving a node there, nothing moved (other tests use the nodes)
        await s.job("group_assign_dry_run", await rapi.assign_group_nodes(group, [node], dry_run=True))
        assert (await rapi.get_group(group)).node_list == []
    finally:
        await s.job("group_remove", await rapi.delete_group(group))


async def run(s: Surface) -> dict[str, Any]:
    """The three parts at once; each ends (and cleans up) before the first failure is raised."""
    outcomes = await asyncio.gather(
        cluster_part(s),
        instance_part(s),
        multi_alloc_part(s),
        group_part(s, s.last_node),
        return_exceptions=True,
    )
    failed = [outcome for outcome in outcomes if isinstance(outcome, Exception)]
    if failed:
        raise ExceptionGroup(f"{len(failed)} of the 4 parts failed", failed)
    return s.answers


@contextlib.asynccontextmanager
async def fake_surface(one_node: bool, version: str) -> AsyncIterator[Surface]:
    async with (
        FakeGaneti(nodes=3, version=version) as fake,
        RapiClient(fake.url, username=fake.username, password=fake.password, ca_file=fake.ca_file) as rapi,
    ):
        alloc_on = "node1.fake.test" if one_node else None
        yield Surface(rapi, "node1.fake.test", "node3.fake.test", "fake.test", alloc_on=alloc_on)


async def test_the_rest_of_the_rapi_on_real_ganeti_and_on_the_fake(testbed) -> None:
    async with RapiClient(
        testbed.url, username=testbed.username, password=testbed.password, ca_file=testbed.ca_file
    ) as rapi:
        master = (await rapi.info()).master
        assert master is not None
        nodes = sorted(n.name for n in await rapi.list_nodes())
    one_node = len(nodes) == 1  # the single-node testbeds (3.0's, 3.1's): multi-alloc names the node
    async with fake_surface(one_node, testbed.series) as fake:
        ours = await run(fake)
    async with RapiClient(
        testbed.url, username=testbed.username, password=testbed.password, ca_file=testbed.ca_file
    ) as rapi:
        surface = Surface(rapi, master, nodes[-1], testbed.domain, alloc_on=master if one_node else None)
        real = await run(surface)
    assert set(real) == set(ours)
    problems = {step: structure_diff(real[step], ours[step]) for step in real}
    assert {step: found for step, found in problems.items() if found} == {}
