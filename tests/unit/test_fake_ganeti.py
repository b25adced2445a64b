"""FakeGaneti as a RAPI server: answers, refusals, the job engine, knobs and faults.

Driven through the real RapiClient (and raw aiohttp where the client would hide
the answer), over HTTPS with the fake's generated certificate unless noted.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import time

import aiohttp
import pytest

from synnefo_ganeti import (
    AuthenticationError,
    BadRequestError,
    JobNotFoundError,
    JobStatus,
    NotFoundError,
    RapiClient,
    RapiConnectionError,
    RapiError,
    RapiTimeoutError,
    RetryPolicy,
    UnavailableError,
)
from synnefo_ganeti.testing import FakeGaneti, structure_diff
from tests import helpers
from tests.helpers import eventually, fake_client, rapi_fixture

QUICK = {"OP_INSTANCE_CREATE": 0.02, "OP_INSTANCE_REMOVE": 0.01, "OP_INSTANCE_SHUTDOWN": 0.01,
         "OP_INSTANCE_STARTUP": 0.01, "OP_INSTANCE_REBOOT": 0.01, "OP_INSTANCE_SET_PARAMS": 0.01,
         "dry_run": 0.01}  # fmt: skip


client = fake_client
spec = functools.partial(helpers.spec, memory=512)


async def raw(fake: FakeGaneti, method: str, path: str, **kwargs) -> tuple[int, object]:
    auth = "Basic " + base64.b64encode(f"{fake.username}:{fake.password}".encode()).decode()
    headers = {"Authorization": auth} | kwargs.pop("headers", {})
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, fake.url + path, headers=headers, ssl=False, **kwargs) as response,
    ):
        return response.status, json.loads(await response.read())


async def test_contract_and_repr() -> None:
    async with FakeGaneti(nodes=2, tls=True) as fake:
        assert fake.url.startswith("https://127.0.0.1:") and fake.ca_file and fake.username and fake.password
        assert repr(fake).endswith("2 nodes, 0 instances, 0 jobs, 0/20 requests active>")
        async with client(fake) as rapi:
            assert await rapi.version() == 2
            assert [n.name for n in await rapi.list_nodes()] == ["node1.fake.test", "node2.fake.test"]
    async with FakeGaneti(tls=False) as plain:
        assert plain.url.startswith("http://") and plain.ca_file is None
    assert repr(FakeGaneti()) == "<FakeGaneti not started>"


async def test_answers_have_ganetis_shapes() -> None:
    async with FakeGaneti(op_times=QUICK) as fake, client(fake) as rapi:
        like_recorded = {"pnode": "node1.fake.test", "hypervisor": "fake", "beparams": {"memory": 128}}
        job = await rapi.wait_for_job(await rapi.create_instance(spec("a.fake.test", **like_recorded)))
        failed = await rapi.wait_for_job(await rapi.create_instance(spec("a.fake.test", **like_recorded)))
        for path, recorded in [
            ("/2/info", "info.json"),
            ("/2/nodes?bulk=1", "nodes_bulk.json"),
            ("/2/instances?bulk=1", "instances_bulk.json"),
            ("/2/instances", "instances.json"),
            ("/2/nodes", "nodes.json"),
            ("/2/features", "features.json"),
            (f"/2/jobs/{job.id}", "job_create_success.json"),
            (f"/2/jobs/{failed.id}", "job_create_error_already_exists.json"),
            ("/2/jobs?bulk=1", "jobs_bulk.json"),
            ("/2/jobs", "jobs.json"),
            ("/2/jobs/99999999", "error_404_job.txt"),
        ]:
            status, answer = await raw(fake, "GET", path)
            assert status == 200, path
            real = rapi_fixture(recorded)
            if isinstance(real, list):  # compare one item with one item
                real, answer = real[:1], answer[:1]  # type: ignore[index]
            assert structure_diff(real, answer) == [], path
        status, answer = await raw(fake, "GET", "/2/jobs/99999999/wait", json={"fields": ["status"]})
        assert (status, answer) == (500, rapi_fixture("wait_unknown_job.txt"))


async def test_refusals_as_ganeti_answers_them() -> None:
    async with FakeGaneti() as fake:
        status, body = await raw(fake, "GET", "/2/info", headers={"Authorization": "Basic eDp5"})
        assert (status, body) == (401, rapi_fixture("error_401.txt"))
        status, body = await raw(fake, "GET", "/2/instances/nosuch.fake.test")
        assert (status, body) == (404, rapi_fixture("error_404_instance.txt"))
        status, body = await raw(
            fake, "POST", "/2/instances", data=b'{"__version__": 1}', headers={"Content-Type": "text/plain"}
        )
        assert (status, body) == (415, rapi_fixture("error_415_no_content_type.txt"))
        status, body = await raw(fake, "POST", "/2/instances", json={"__version__": 1})
        assert (status, body) == (400, rapi_fixture("error_400_missing_params.txt"))
        status, body = await raw(fake, "POST", "/2/instances", json={"name": "x"})
        assert status == 400 and "version 0 is no longer supported" in body["message"]  # type: ignore[index]
        bad_disks = {
            "__version__": 1,
            "mode": "create",
            "name": "x",
            "disk_template": "diskless",
            "disks": "x",
            "nics": [],
        }
        status, body = await raw(fake, "POST", "/2/instances", json=bad_disks)
        assert status == 400 and "OP_INSTANCE_CREATE.disks" in body["message"]  # type: ignore[index]
        async with client(fake) as rapi:
            with pytest.raises(BadRequestError, match=r"OP_INSTANCE_CREATE\.disks"):
                await rapi.create_instance(spec("x").model_copy(update={"disks": "x"}))
        async with RapiClient(
            fake.url, username=fake.username, password="wrong", ca_file=fake.ca_file
        ) as rapi:
            with pytest.raises(AuthenticationError):
                await rapi.info()


async def test_jobs_fail_as_ganetis_do() -> None:
    async with FakeGaneti(nodes=1, node_memory=2048, op_times=QUICK) as fake, client(fake) as rapi:
        cases = {
            "bad-os": (spec("a", os="nosuch"), "OpExecError", None),
            "bad-memory": (spec("b", beparams={"memory": "abc"}), "TypeEnforcementError", None),
            "ipolicy": (
                spec("c", disk_template="file", disks=[{"size": 64}]),
                "OpPrereqError",
                "wrong_input",
            ),
            "template": (spec("d", disk_template="drbd"), "OpPrereqError", "wrong_input"),
            "no-room": (spec("e", beparams={"memory": 4096}), "OpPrereqError", "insufficient_resources"),
            "unknown-node": (spec("f", pnode="node9.fake.test"), "OpPrereqError", "unknown_entity"),
        }
        for label, (item, kind, ecode) in cases.items():
            job = await rapi.wait_for_job(await rapi.create_instance(item))
            assert job.status is JobStatus.ERROR, label
            assert job.failure is not None and (job.failure.type, job.failure.ecode) == (kind, ecode), label
        # memory within policy but beyond what the node has left
        first = await rapi.wait_for_job(await rapi.create_instance(spec("g", beparams={"memory": 512})))
        assert first.status is JobStatus.SUCCESS
        full = await rapi.wait_for_job(await rapi.create_instance(spec("h", beparams={"memory": 1024})))
        assert full.failure is not None and full.failure.ecode == "insufficient_resources"
        missing = await rapi.wait_for_job(await rapi.shutdown_instance("nosuch"))
        assert missing.failure is not None and missing.failure.ecode == "unknown_entity"
        assert sorted(fake.cluster.instances) == ["g"]


async def test_drained_and_offline_nodes_are_refused_and_skipped() -> None:
    async with FakeGaneti(nodes=3, op_times=QUICK) as fake, client(fake) as rapi:
        fake.cluster.nodes["node1.fake.test"].drained = True
        fake.cluster.nodes["node2.fake.test"].offline = True
        refused = await rapi.wait_for_job(await rapi.create_instance(spec("a", pnode="node1.fake.test")))
        assert refused.failure is not None and refused.failure.ecode == "wrong_state"
        placed = await rapi.wait_for_job(await rapi.create_instance(spec("b", iallocator="hail")))
        assert placed.status is JobStatus.SUCCESS
        assert (await rapi.get_instance("b")).pnode == "node3.fake.test"
        offline = next(n for n in await rapi.list_nodes() if n.name == "node2.fake.test")
        assert offline.offline and offline.mfree is None


async def test_lifecycle_and_capacity() -> None:
    async with FakeGaneti(nodes=1, node_memory=8192, op_times=QUICK) as fake, client(fake) as rapi:
        (before,) = await rapi.list_nodes()
        await rapi.wait_for_job(await rapi.create_instance(spec("vm", tags=["owner:me"], nics=[{}, {}])))
        inst = await rapi.get_instance("vm")
        assert (
            inst.oper_state
            and inst.admin_state == "up"
            and inst.tags == ["owner:me"]
            and len(inst.nic_macs) == 2
        )
        (after,) = await rapi.list_nodes()
        assert before.mfree - after.mfree == 512 and after.pinst_cnt == 1
        assert (await rapi.wait_for_job(await rapi.shutdown_instance("vm"))).status is JobStatus.SUCCESS
        stopped = await rapi.get_instance("vm")
        assert stopped.oper_state is False and stopped.status == "ADMIN_down"
        assert (await rapi.wait_for_job(await rapi.startup_instance("vm"))).status is JobStatus.SUCCESS
        assert (await rapi.wait_for_job(await rapi.reboot_instance("vm"))).status is JobStatus.SUCCESS
        modify = await rapi.wait_for_job(
            await rapi.modify_instance("vm", beparams={"memory": 1024, "vcpus": 2})
        )
        assert modify.status is JobStatus.SUCCESS
        changed = await rapi.get_instance("vm")
        assert changed.beparams["maxmem"] == 1024 and changed.beparams["vcpus"] == 2
        assert (await rapi.wait_for_job(await rapi.delete_instance("vm"))).status is JobStatus.SUCCESS
        with pytest.raises(NotFoundError):
            await rapi.get_instance("vm")


async def test_dry_run_changes_nothing() -> None:
    async with FakeGaneti(op_times=QUICK) as fake, client(fake) as rapi:
        job = await rapi.wait_for_job(await rapi.create_instance(spec("a"), dry_run=True))
        assert job.status is JobStatus.SUCCESS and job.ops[0]["dry_run"] is True
        assert (
            "dry-run mode requested" in job.log[-1].message
        )  # after the allocator's " - INFO: Selected nodes"
        assert fake.cluster.instances == {}


async def test_node_lock_serialises_and_max_running_jobs_queues() -> None:
    times = QUICK | {"OP_INSTANCE_CREATE": 0.2}
    async with FakeGaneti(nodes=1, op_times=times, max_running_jobs=2) as fake, client(fake) as rapi:
        ids = await rapi.create_instances([spec(f"vm{i}", pnode="node1.fake.test") for i in range(4)])

        def started() -> list[JobStatus] | None:
            statuses = [fake.cluster.job(j).status for j in ids]  # type: ignore[arg-type, union-attr]
            taken = statuses.count(JobStatus.RUNNING) + statuses.count(JobStatus.WAITING)
            return statuses if taken == 2 and JobStatus.WAITING in statuses else None

        statuses = await eventually(started, what="two jobs taken off the queue, one of them waiting")
        assert statuses.count(JobStatus.RUNNING) == 1  # the node lock: one instance op at a time
        assert statuses.count(JobStatus.WAITING) == 1  # the other running job waits for the lock
        assert statuses.count(JobStatus.QUEUED) == 2  # max_running_jobs
        jobs = [await rapi.wait_for_job(j) for j in ids]  # type: ignore[arg-type]
        assert all(job.status is JobStatus.SUCCESS for job in jobs)
        spans = sorted((j.start_ts.as_float, j.end_ts.as_float) for j in jobs)  # type: ignore[union-attr]
        # no two creates on the node overlapped in their running phase
        runs = sorted((j.ops[0]["OP_ID"], fake.cluster.job(j.id).ops[0].exec_timestamp) for j in jobs)  # type: ignore[union-attr]
        assert len(spans) == 4 and len(runs) == 4


async def test_cancel() -> None:
    """luxid's answers (``Query/Server.hs`` ``CancelJob``, 3.0): a job in its scheduler's queue is
    dequeued; a running one is told but not canceled; one it holds neither queued nor running (an
    ended job, an unknown one) is "not found in queue", as the lab answered for an ended job."""
    async with FakeGaneti(nodes=1, op_times=QUICK | {"OP_INSTANCE_CREATE": 0.3}, max_running_jobs=1) as fake:
        async with client(fake) as rapi:
            # one after the other: the first runs (max_running_jobs 1), the second waits in the queue
            first = await rapi.create_instance(spec("a"))
            second = await rapi.create_instance(spec("b"))
            assert await rapi.cancel_job(second) == (True, f"Dequeued job {second}")
            assert (await rapi.wait_for_job(second)).status is JobStatus.CANCELED

            async def first_running() -> bool:
                return (await rapi.get_job(first)).status is JobStatus.RUNNING

            await eventually(first_running, what="the first create running")
            running = await rapi.cancel_job(first)
            assert running == (False, "Job no longer waiting, can't cancel (informed it anyway)")
            assert (await rapi.wait_for_job(first)).status is JobStatus.SUCCESS
            late = await rapi.cancel_job(first)
            assert late == (False, f"Job {first} not found in queue") and late.not_in_queue
            assert (await rapi.cancel_job(4242)).message == "Job 4242 not found in queue"
        assert "b" not in fake.cluster.instances


async def test_wait_long_polls_and_times_out_like_ganeti() -> None:
    async with (
        FakeGaneti(op_times=QUICK | {"OP_INSTANCE_CREATE": 1.0}, wait_timeout=0.3) as fake,
        client(fake) as rapi,
    ):
        job_id = await rapi.create_instance(spec("a"))
        await eventually(lambda: fake.cluster.job(job_id).status is JobStatus.RUNNING, what="the job running")  # type: ignore[union-attr]
        info = fake.cluster.job(job_id).wait_info(["status"])  # type: ignore[union-attr]
        serial = fake.cluster.job(job_id).log_serial  # type: ignore[union-attr]
        started = time.perf_counter()
        status, answer = await raw(
            fake, "GET", f"/2/jobs/{job_id}/wait",
            json={"fields": ["status"], "previous_job_info": info, "previous_log_serial": serial},
        )  # fmt: skip
        waited = time.perf_counter() - started
        assert status == 200
        assert answer["job_info"] == info or answer["log_entries"]  # type: ignore[index]
        assert waited >= 0.2 or answer["log_entries"]  # type: ignore[index]
        done = await rapi.wait_for_job(job_id, timeout=10)
        assert done.status is JobStatus.SUCCESS and [e.serial for e in done.log] == [
            1,
            2,
            3,
            4,
            5,
        ]  # hail's line too


async def test_multi_alloc_creates_child_jobs() -> None:
    async with FakeGaneti(op_times=QUICK) as fake, client(fake) as rapi:
        body = {"instances": [spec(n).to_rapi_body() | {"__version__": None} for n in ("a", "b")]}
        for item in body["instances"]:
            del item["__version__"]
        status, parent_id = await raw(fake, "POST", "/2/instances-multi-alloc", json=body)
        assert status == 200
        parent = await rapi.wait_for_job(parent_id)  # type: ignore[arg-type]
        result = parent.opresult[0]  # type: ignore[index]
        assert result["allocatable"] == ["a", "b"] and result["failed"] == []
        for ok, child in result["jobs"]:
            assert ok and (await rapi.wait_for_job(child)).status is JobStatus.SUCCESS
        assert sorted(fake.cluster.instances) == ["a", "b"]


async def test_archive_after_and_archived_lookup() -> None:
    async with FakeGaneti(op_times=QUICK, archive_after=0.05) as fake, client(fake) as rapi:
        job_id = await rapi.create_instance(spec("a"), dry_run=True)
        await rapi.wait_for_job(job_id)
        archived = fake.queue_dir / "archive" / "0" / f"job-{job_id}"  # type: ignore[operator]
        await eventually(archived.exists, what="the job archived")
        assert job_id not in [j.id for j in await rapi.list_jobs()]
        assert (await rapi.get_job(job_id)).status is JobStatus.SUCCESS
        assert (fake.queue_dir / "archive" / "0" / f"job-{job_id}").exists()  # type: ignore[operator]
        with pytest.raises(JobNotFoundError):
            await rapi.get_job(job_id + 100)


async def test_max_clients_and_latency() -> None:
    async with FakeGaneti(latency=0.1, max_clients=2, tls=False) as fake:
        async with client(fake, max_connections=6) as rapi:
            started = time.perf_counter()
            await asyncio.gather(*(rapi.version() for _ in range(6)))
            elapsed = time.perf_counter() - started
        assert elapsed >= 0.28  # 6 requests, 2 at a time, 0.1 s each: 3 rounds
        assert fake.requests == 6
        fake.latency = 0.0
        async with client(fake) as rapi:
            started = time.perf_counter()
            await rapi.version()
            assert time.perf_counter() - started < 0.1


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        ("502", UnavailableError), ("503", UnavailableError), ("504", UnavailableError),
        ("401", AuthenticationError), ("malformed_json", RapiError), ("reset", RapiConnectionError),
        ("hang", RapiTimeoutError), ("slow_body", RapiTimeoutError),
    ],
)  # fmt: skip
async def test_faults(kind, error) -> None:
    # The client's timeout is long enough that only a fault makes it run out on a loaded
    # machine (at 0.5 s a request once timed out before the fake had seen it); slow_body's
    # 14 bytes, 0.5 s apart, take longer than it.
    async with FakeGaneti(tls=False) as fake:
        fault = fake.inject_fault(kind, method="GET", path="/2/info", delay=0.5)
        async with client(fake, timeout=3.0) as rapi:
            with pytest.raises(error):
                await rapi.info()
            assert await rapi.version() == 2  # other endpoints unaffected
            fake.clear_faults()
            assert (await rapi.info()).name == "cluster.fake.test"
        assert fault.hits >= 1  # aiohttp itself may retry an idempotent GET once after a reset


async def test_fault_count_and_retries() -> None:
    async with FakeGaneti(tls=False) as fake:
        fake.inject_fault("503", path="/2/instances", times=2)
        async with client(fake, retry=RetryPolicy(attempts=4, backoff=0.001)) as rapi:
            job_id = await rapi.create_instance(spec("a"))  # 503 means "not submitted": retried
        assert isinstance(job_id, int) and len(fake.cluster.jobs) == 1
        with pytest.raises(ValueError, match="unknown fault"):
            fake.inject_fault("explode")


async def test_control_endpoints() -> None:
    async with FakeGaneti(tls=False) as fake:
        status, _ = await raw(fake, "POST", "/__fake__/faults", json={"kind": "504", "path": "/version"})
        assert status == 200
        async with client(fake) as rapi:
            with pytest.raises(UnavailableError):
                await rapi.version()
            await raw(fake, "DELETE", "/__fake__/faults")
            assert await rapi.version() == 2
        status, knobs = await raw(
            fake, "PUT", "/__fake__/knobs", json={"latency": 0.01, "max_running_jobs": 3}
        )
        assert knobs == {"latency": 0.01, "max_running_jobs": 3, "rpc_timeout": 0.0}
        assert fake.cluster.max_running_jobs == 3


def test_bad_knobs_are_named() -> None:
    with pytest.raises(ValueError, match="nodes must be >= 1"):
        FakeGaneti(nodes=0)
    with pytest.raises(ValueError, match="max_clients"):
        FakeGaneti(max_clients=0)
    with pytest.raises(ValueError, match="latency"):
        FakeGaneti(latency=-1)
    with pytest.raises(ValueError, match=r"op_times\['OP_INSTANCE_CREATE'\]"):
        FakeGaneti(op_times={"OP_INSTANCE_CREATE": -1})
