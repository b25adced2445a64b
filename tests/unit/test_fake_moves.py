"""The fake's moves and the node/cluster calls as real Ganeti 3.0 answered them on the 3-node
testbed (tests/integration/test_moves_real.py and test_rapi_real_surface.py compare them live):
where an iallocator sends an instance, the refusals and their error codes, the child jobs of a
node migrate, evacuate and multi-allocation, master failover, filter rules, node ndparams and
recreate-disks of a ``file`` instance."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from synnefo_ganeti import ConflictError, InstanceSpec, JobStatus, NotFoundError, RapiClient
from synnefo_ganeti.testing import FakeGaneti

N1, N2, N3 = "node1.fake.test", "node2.fake.test", "node3.fake.test"


@pytest.fixture
async def fake() -> AsyncIterator[FakeGaneti]:
    fast = {"OP_INSTANCE_CREATE": 0.01, "OP_INSTANCE_CREATE/disks": 0.01}
    async with FakeGaneti(
        nodes=3, disk_templates=("diskless", "file", "sharedfile"), tls=False, op_times=fast
    ) as fake:
        yield fake


@pytest.fixture
async def rapi(fake: FakeGaneti) -> AsyncIterator[RapiClient]:
    async with RapiClient(fake.url, username=fake.username, password=fake.password) as client:
        yield client


def spec(name: str, template: str = "diskless", **kwargs: Any) -> InstanceSpec:
    disks = [{"size": 1024}] if template != "diskless" else []
    kwargs = {"pnode": N1} | kwargs
    return InstanceSpec(name=name, disk_template=template, os="noop", disks=disks, beparams={"memory": 128},
                        hypervisor="fake", **kwargs)  # fmt: skip


async def create(rapi: RapiClient, *specs: InstanceSpec) -> None:
    for s in specs:
        job = await rapi.wait_for_job(await rapi.create_instance(s), timeout=30)
        assert job.status is JobStatus.SUCCESS, job.failure


async def ended(rapi: RapiClient, job_id: int) -> Any:
    job = await rapi.wait_for_job(job_id, timeout=30)
    return job


async def test_migrate_without_a_target_goes_where_the_most_memory_is_free(rapi: RapiClient) -> None:
    await create(rapi, spec("a.fake.test"), spec("b.fake.test", pnode=N2), spec("c.fake.test", pnode=N2))
    job = await ended(rapi, await rapi.migrate_instance("a.fake.test"))
    assert job.status is JobStatus.SUCCESS and job.opresult == [None]
    assert (await rapi.get_instance("a.fake.test")).pnode == N3  # node2 has two instances
    assert job.ops[0]["iallocator"] == "hail" and job.ops[0]["mode"] == "live"
    assert "target_node" not in job.ops[0]  # the allocator's choice stays out of the op, as in Ganeti
    assert (
        job.oplog[0][0].message
        == f" - INFO: Selected nodes for instance a.fake.test via iallocator hail: {N3}"
    )


async def test_refused_moves_name_ganetis_reasons(rapi: RapiClient) -> None:
    await create(rapi, spec("a.fake.test"), spec("f.fake.test", "file"))
    own = await ended(rapi, await rapi.migrate_instance("a.fake.test", target_node=N1))
    assert own.status is JobStatus.ERROR and own.failure.ecode == "wrong_state"
    assert own.failure.message == f"Cannot migrate instance a.fake.test to its primary ({N1})"
    for call, word in ((rapi.migrate_instance, "migrations"), (rapi.failover_instance, "failovers")):
        job = await ended(rapi, await call("f.fake.test", target_node=N2))
        assert (job.failure.type, job.failure.ecode) == ("OpPrereqError", "wrong_state")
        assert job.failure.message == f"Instance's disk layout 'file' does not allow {word}"


async def test_node_migrate_and_evacuate_submit_children_as_ganeti(rapi: RapiClient) -> None:
    await create(rapi, spec("a.fake.test"), spec("s.fake.test", "sharedfile"))
    parent = await ended(rapi, await rapi.migrate_node(N1))
    children = [await ended(rapi, i) for _, i in parent.opresult[0]["jobs"]]
    assert len(children) == 2
    for child in children:
        op = child.ops[0]
        assert (op["OP_ID"], op["comment"]) == ("OP_INSTANCE_MIGRATE", "Submitted by OP_NODE_MIGRATE")
        assert op["reason"][:2] == parent.ops[0]["reason"][:2] and "dry_run" not in op
    where = {(await rapi.get_instance(n)).pnode for n in ("a.fake.test", "s.fake.test")}
    assert N1 not in where and len(where) == 2  # spread: the second goes where more is free
    source = (await rapi.get_instance("s.fake.test")).pnode
    assert source is not None
    parent = await ended(rapi, await rapi.evacuate_node(source, mode="primary-only"))
    assert parent.oplog[0][0].message == f" - INFO: Evacuating instances from node '{source}': s.fake.test"
    (child,) = [await ended(rapi, i) for _, i in parent.opresult[0]["jobs"]]
    op = child.ops[0]
    assert (op["OP_ID"], op["comment"]) == ("OP_INSTANCE_MIGRATE", "Submitted by OP_NODE_EVACUATE")
    assert (op["allow_runtime_changes"], op["allow_failover"], op["ignore_hvversions"]) == (False, True, True)
    assert op["target_node"] != source and (await rapi.get_instance("s.fake.test")).pnode == op["target_node"]
    none = await ended(rapi, await rapi.evacuate_node(source, mode="secondary-only"))
    assert none.opresult == [{"jobs": []}]


async def test_master_failover(fake: FakeGaneti, rapi: RapiClient) -> None:
    assert (await rapi.info()).master == N1
    fake.master_failover(N2)
    assert (await rapi.info()).master == N2
    assert (await rapi.get_node_role(N2), await rapi.get_node_role(N1)) == ("master", "master-candidate")
    with pytest.raises(ConflictError, match="already the master"):
        fake.master_failover(N2)
    with pytest.raises(NotFoundError, match="node9"):
        fake.master_failover("node9.fake.test")
    job = await ended(rapi, await rapi.set_node_role(N3, "regular"))
    assert job.status is JobStatus.SUCCESS
    with pytest.raises(ConflictError, match="not among the nodes marked as master candidates"):
        fake.master_failover(N3)


async def test_filters_node_ndparams_and_recreate_disks(rapi: RapiClient) -> None:
    rule = await rapi.add_filter(predicates=[["opcode", ["&", ["=", "OP_ID", "OP_X"], ["!", ["=", "a", 1]]]]])
    assert (await rapi.get_filter(rule)).predicates == [
        ["opcode", ["&", ["==", "OP_ID", "OP_X"], ["!", ["==", "a", 1]]]]
    ]
    job = await ended(rapi, await rapi.modify_node(N1, ndparams={"spindle_count": 3}))
    assert job.status is JobStatus.SUCCESS and job.opresult == [[]]
    assert (await rapi.get_node(N1)).model_extra["ndparams"]["spindle_count"] == 3  # type: ignore[index]
    await create(rapi, spec("f.fake.test", "file", start=False))
    job = await ended(rapi, await rapi.recreate_instance_disks("f.fake.test"))
    assert job.status is JobStatus.ERROR and job.failure.type == "OpExecError" and job.failure.ecode is None
    assert "[Errno 17] File exists" in job.failure.message
    assert job.start_ts is not None  # it failed executing, not in its checks


async def test_multi_alloc_children_carry_the_allocators_node(rapi: RapiClient) -> None:
    specs = [spec(f"m{k}.fake.test", pnode=None) for k in (1, 2)]
    parent = await ended(rapi, await rapi.instances_multi_alloc(specs, iallocator="hail"))
    for instance in parent.ops[0]["instances"]:
        assert instance["beparams"] == {"maxmem": 128, "minmem": 128} and instance["pnode"] in (N1, N2, N3)
    for _, child_id in parent.opresult[0]["jobs"]:
        child = await ended(rapi, child_id)
        op = child.ops[0]
        assert child.status is JobStatus.SUCCESS and "dry_run" not in op and "iallocator" not in op
        assert (
            op["comment"] == "Submitted by OP_INSTANCE_MULTI_ALLOC"
            and op["reason"][:2] == parent.ops[0]["reason"][:2]
        )
