"""The fake Ganeti locks as Ganeti 3.0 does: each test names the Ganeti function it holds the fake to."""

from __future__ import annotations

import asyncio
import base64
import itertools
from typing import Any

import aiohttp
import pytest

from synnefo_ganeti import JobStatus
from synnefo_ganeti.testing import FakeCluster, FakeGaneti
from synnefo_ganeti.testing._cluster import FakeInstance
from synnefo_ganeti.testing._jobs import FakeJob
from synnefo_ganeti.testing._locks import ALL, LockManager, Request
from tests.helpers import eventually

# 0.3 s locked (disks), then 0.6 s unlocked (OS scripts, start)
SPLIT = {"OP_INSTANCE_CREATE": 0.9, "OP_INSTANCE_CREATE/disks": 0.3}
EPS = 0.002


def _create(cluster: FakeCluster, name: str, **params: Any) -> int:
    body = {"instance_name": name, "mode": "create", "disk_template": "diskless", "disks": [], "nics": [{}],
            "os_type": "noop", "beparams": {"memory": 128}, "name_check": False, "ip_check": False} | params  # fmt: skip
    return cluster.submit([("OP_INSTANCE_CREATE", body)], resource="instances")


def _ts(stamp: list[int] | None) -> float:
    assert stamp is not None
    return stamp[0] + stamp[1] / 1e6


def _locked(job: FakeJob) -> tuple[float, float]:
    """The create's locked phase: from exec_timestamp to its "adding disks" line, written as it releases."""
    op = job.ops[0]
    end = next(entry for entry in op.log if entry[3] == "adding disks to cluster config")
    return _ts(op.exec_timestamp), _ts(end[1])


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] - EPS and b[0] < a[1] - EPS


async def _done(cluster: FakeCluster, ids: list[int]) -> list[FakeJob]:
    def ended() -> bool:
        return all(cluster.jobs[i].status.is_final for i in ids)

    await eventually(ended, timeout=30, what="the jobs to end")
    jobs = [cluster.jobs[i] for i in ids]
    assert [job.status for job in jobs] == [JobStatus.SUCCESS] * len(jobs), [j.ops[0].result for j in jobs]
    return jobs


@pytest.fixture
async def cluster() -> Any:
    fake = FakeCluster(nodes=3, op_times=SPLIT, opportunistic_retry=0.05)
    yield fake
    await fake.aclose()


# ------------------------------------------------------------------ the lock manager (wconfd)


async def test_shared_exclusive_and_the_whole_set_lock_as_wconfd_grants_them() -> None:
    """locking.SharedLock semantics, and LOCKSET_NAME covering every member (mcpu._AcquireLocks ALL_SET)."""
    locks = LockManager(lambda level: ["n1", "n2", "n3"])
    a, b, c = object(), object(), object()
    await locks.acquire(a, Request().add("node", ["n1"], shared=True))
    await locks.acquire(b, Request().add("node", ["n1"], shared=True))  # shared with shared: granted
    waiting = asyncio.create_task(locks.acquire(c, Request().add("node", ALL)))
    await eventually(lambda: locks.is_waiting(c), what="the all-nodes request waiting")
    assert locks.try_union(c, "node", ["n1", "n2", "n3"], 3) == []  # guarded union: fewer than 3 free
    locks.release_all(a)
    assert not waiting.done()
    locks.release_all(b)
    await waiting  # ALL exclusive: granted once no member is held by anyone
    assert locks.owned(c, "node") == {"n1", "n2", "n3"}
    assert locks.try_union(a, "node", ["n1", "n2"], 1) == []  # every member taken by the set lock
    locks.release_level(c, "node", keep=["n2"])  # ReleaseLocks(keep=...) after _RunAllocator
    assert locks.owned(c, "node") == {"n2"}
    assert locks.try_union(a, "node", ["n1", "n2", "n3"], 1) == ["n1", "n3"]


# ------------------------------------------------------------------ LUInstanceCreate


async def test_iallocator_creates_never_run_their_locked_phases_at_once(cluster: FakeCluster) -> None:
    """LUInstanceCreate.ExpandNames: an iallocator (here the cluster default) locks ALL_SET nodes;
    Exec releases them after the disks, so the next create's locked phase overlaps only this one's
    unlocked phase (OS scripts and start)."""
    jobs = await _done(cluster, [_create(cluster, f"vm{i}") for i in range(3)])
    phases = sorted(_locked(job) for job in jobs)
    assert not any(_overlap(a, b) for i, a in enumerate(phases) for b in phases[i + 1 :])
    ends = sorted((_ts(job.ops[0].exec_timestamp), _ts(job.ops[0].end_timestamp)) for job in jobs)
    assert all(later[0] < earlier[1] for earlier, later in itertools.pairwise(ends))  # unlocked overlaps
    assert all(job.ops[0].input["iallocator"] == "hail" for job in jobs)  # CheckIAllocatorOrNode
    assert all(any("via iallocator hail" in e[3] for e in job.ops[0].log) for job in jobs)


async def test_opportunistic_creates_lock_different_nodes_at_once(cluster: FakeCluster) -> None:
    """LUInstanceCreate.ExpandNames with opportunistic_locking: only the free node locks
    (GuardedOpportunisticLockUnion), the allocator among them (_RunAllocator's whitelist)."""
    ids = [_create(cluster, f"vm{i}", opportunistic_locking=True) for i in range(3)]
    jobs = await _done(cluster, ids)
    phases = [_locked(job) for job in jobs]
    assert all(_overlap(phases[0], other) for other in phases[1:])
    assert sorted(cluster.instances[f"vm{i}"].pnode for i in range(3)) == sorted(cluster.nodes)


async def test_pnode_creates_lock_only_their_node(cluster: FakeCluster) -> None:
    """LUInstanceCreate.ExpandNames with pnode: needed_locks[LEVEL_NODE] = [pnode] (and node-res)."""
    one, two = "node1.fake.test", "node2.fake.test"
    ids = [
        _create(cluster, "a", pnode=one),
        _create(cluster, "b", pnode=two),
        _create(cluster, "c", pnode=one),
    ]
    a, b, c = (_locked(job) for job in await _done(cluster, ids))
    assert _overlap(a, b)  # different nodes: at once
    assert not _overlap(a, c)  # same node: one after the other
    assert cluster.jobs[ids[0]].ops[0].input["iallocator"] is None


async def test_opportunistic_create_falls_back_to_all_locks(cluster: FakeCluster) -> None:
    """LUInstanceCreate._RunAllocator raises ECODE_TEMP_NORES on the opportunistic nodes; mcpu's
    _LockAndExecLU calls PrepareRetry ("falling back to full lock allocation") and retries."""
    cluster.nodes["node1.fake.test"].mtotal = 2048
    cluster.nodes["node2.fake.test"].mtotal = 2048
    holder = _create(cluster, "big", pnode="node3.fake.test")  # node3 locked for its disks
    await eventually(lambda: cluster.jobs[holder].status is JobStatus.RUNNING, what="node3 held")
    late = _create(cluster, "late", opportunistic_locking=True, beparams={"memory": 4096})
    (held, job) = await _done(cluster, [holder, late])
    log = [entry[3] for entry in job.ops[0].log]
    assert any("IAllocator 'hail' failed on opportunistically acquired nodes" in line for line in log)
    assert "* falling back to full lock allocation" in log
    assert cluster.instances["late"].pnode == "node3.fake.test"
    assert job.ops[0].input["opportunistic_locking"] is False  # PrepareRetry turned it off
    assert _ts(job.ops[0].exec_timestamp) >= _locked(held)[1] - EPS  # waited for all locks


async def test_opportunistic_create_without_room_anywhere_fails_for_good(cluster: FakeCluster) -> None:
    """After the fallback, _RunAllocator over all nodes fails with ECODE_NORES."""
    job_id = _create(cluster, "huge", opportunistic_locking=True, beparams={"memory": 65536})
    await eventually(lambda: cluster.jobs[job_id].status.is_final, what="the create to fail")
    op = cluster.jobs[job_id].ops[0]
    assert op.result[0] == "OpPrereqError" and op.result[1][1] == "insufficient_resources"
    assert "* falling back to full lock allocation" in [entry[3] for entry in op.log]


async def test_waiting_while_another_job_holds_the_locks(cluster: FakeCluster) -> None:
    """_JobProcessor._MarkWaitlock: waiting (opstart) until the locks are held; NotifyStart: running (opexec)."""
    holder = _create(cluster, "a", pnode="node1.fake.test")
    await eventually(lambda: cluster.jobs[holder].status is JobStatus.RUNNING, what="node1 held")
    waiter = _create(cluster, "b")  # all node locks: waits for node1
    job = cluster.jobs[waiter]
    await eventually(lambda: job.status is JobStatus.WAITING, what="the all-locks create waiting")
    assert job.executor_file()["ops"][0]["status"] == "waiting" and job.ops[0].exec_timestamp is None
    assert job.rapi_view()["status"] == "waiting"
    held, waited = await _done(cluster, [holder, waiter])
    assert _ts(waited.ops[0].start_timestamp) < _locked(held)[1] <= _ts(waited.ops[0].exec_timestamp) + EPS


async def test_the_locked_phase_is_the_whole_create_without_a_disks_time() -> None:
    """Without op_times["OP_INSTANCE_CREATE/disks"] a create holds its locks to its end (as before)."""
    fake = FakeCluster(nodes=2, op_times={"OP_INSTANCE_CREATE": 0.3})
    try:
        first, second = await _done(fake, [_create(fake, "a"), _create(fake, "b")])
        assert _ts(second.ops[0].exec_timestamp) >= _ts(first.ops[0].end_timestamp) - EPS
    finally:
        await fake.aclose()


# ------------------------------------------------------------------ the other instance ops


async def test_other_ops_lock_what_their_lu_declares(cluster: FakeCluster) -> None:
    """LUInstanceShutdown.ExpandNames locks the instance only; LUInstanceRemove.DeclareLocks its nodes."""
    for name in ("x", "y"):
        cluster.instances[name] = FakeInstance(
            name=name, pnode="node2.fake.test", os="noop", disk_template="diskless", hypervisor="fake",
            beparams={"maxmem": 128}, custom_beparams={}, nics=[], disks=[], tags=[],
        )  # fmt: skip
    create = _create(cluster, "c", pnode="node2.fake.test")  # holds node2's locks during its disks
    await eventually(lambda: cluster.jobs[create].status is JobStatus.RUNNING, what="node2 held")
    shutdown = cluster.submit(
        [("OP_INSTANCE_SHUTDOWN", {"instance_name": "x"})], resource="instances_name_shutdown"
    )
    remove = cluster.submit([("OP_INSTANCE_REMOVE", {"instance_name": "y"})], resource="instances_name")
    created, shut, removed = await _done(cluster, [create, shutdown, remove])
    assert _ts(shut.ops[0].exec_timestamp) < _locked(created)[1]  # no node lock: did not wait
    assert _ts(removed.ops[0].exec_timestamp) >= _locked(created)[1] - EPS  # node2's lock: waited


# ------------------------------------------------------------------ GET /2/query/job


async def test_query_job_answers_as_r_2_query() -> None:
    """rlib2.R_2_query over query._BuildJobFields: fields, then [status, value] per job and field."""
    async with FakeGaneti(tls=False, op_times=SPLIT) as fake:
        cluster = fake.cluster
        await _done(cluster, [_create(cluster, "a")])
        auth = "Basic " + base64.b64encode(f"{fake.username}:{fake.password}".encode()).decode()
        async with aiohttp.ClientSession(headers={"Authorization": auth}) as session:
            url = f"{fake.url}/2/query/job?fields=id,status,opstart,opexec,opend,nosuch"
            async with session.get(url) as response:
                assert response.status == 200
                answer = await response.json()
            async with session.get(f"{fake.url}/2/query/job") as missing:
                assert missing.status == 400
        names = [field["name"] for field in answer["fields"]]
        assert names == ["id", "status", "opstart", "opexec", "opend", "nosuch"]
        assert answer["fields"][3]["doc"].endswith("(after acquiring locks)")
        assert answer["fields"][5]["kind"] == "unknown"
        ((job_id, status, opstart, opexec, opend, unknown),) = answer["data"]
        assert job_id == [0, 1] and status == [0, "success"] and unknown == [1, None]
        assert _ts(opstart[1][0]) <= _ts(opexec[1][0]) <= _ts(opend[1][0])
