"""The fake Ganeti's node failures and slow submits, held to what real Ganeti 3.0 showed.

tests/fixtures/ganeti-3.0-nodefail holds what scripts/record-node-failure.py recorded on the
3-node lab (node3 crashed, then marked offline, then back). Each test replays a part of it on
a fake with three nodes and the same instances (``nf-a`` on node1, ``nf-c`` running and
``nf-d`` stopped on node3) and compares the fake's answers with the recorded ones: the same
keys and value types (``structure_diff``), the same ``null`` fields and query statuses, the
same error types, ecodes and messages (names, addresses and curl's figures aside).
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from click.testing import CliRunner

from synnefo_ganeti.cli import main
from synnefo_ganeti.errors import ConflictError, NotFoundError
from synnefo_ganeti.testing import FakeGaneti, SlowSubmit, structure_diff
from tests.helpers import FIXTURES, eventually

NODEFAIL = FIXTURES / "ganeti-3.0-nodefail"
N1, N2, N3 = "node1.fake.test", "node2.fake.test", "node3.fake.test"
A, C, D = "nf-a.ganeti.test", "nf-c.ganeti.test", "nf-d.ganeti.test"
QUICK = {
    op: 0.01 for op in ("OP_INSTANCE_CREATE", "OP_INSTANCE_REMOVE", "OP_INSTANCE_STARTUP", "OP_INSTANCE_SHUTDOWN",
                        "OP_INSTANCE_FAILOVER", "OP_INSTANCE_MIGRATE", "OP_NODE_SET_PARAMS")
}  # fmt: skip


def recorded(name: str) -> Any:
    return orjson.loads((NODEFAIL / name).read_bytes())


def real_item(name: str, prefix: str) -> dict[str, Any]:
    """The item of a recorded listing whose name starts with ``prefix``."""
    return next(item for item in recorded(name) if item["name"].startswith(prefix))


def real_row(name: str, prefix: str) -> list[list[Any]]:
    """The row of a recorded query whose first field (the name) starts with ``prefix``."""
    return next(row for row in recorded(name)["data"] if str(row[0][1]).startswith(prefix))


def nulls(item: dict[str, Any]) -> set[str]:
    return {key for key, value in item.items() if value is None}


def message_shape(message: str) -> str:
    """A Ganeti message with what differs between clusters made neutral: curl's error (its
    number, address, time and text), node and instance names, uuids."""
    message = re.sub(
        r"Error \d+: Failed to connect to [\d.]+ port 1811 after \d+ ms: [^:]+$", "<rpc>", message
    )
    message = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "<uuid>", message)
    return re.sub(r"[\w-]+\.(?:ganeti|fake)\.test", "<name>", message)


def same_failure(real: dict[str, Any], fake: dict[str, Any]) -> None:
    """Two ended jobs fail alike: status, error type, ecode, message shape, and both ran (exec)."""
    assert fake["status"] == real["status"] == "error", fake["opresult"]
    (real_kind, real_args), (fake_kind, fake_args) = real["opresult"][0], fake["opresult"][0]
    assert fake_kind == real_kind
    assert len(fake_args) == len(real_args) and fake_args[1:] == real_args[1:]  # no ecode, or the same
    assert message_shape(fake_args[0]) == message_shape(real_args[0])


class Rapi:
    """Plain requests to a fake, as a client that reads JSON."""

    def __init__(self, fake: FakeGaneti, session: aiohttp.ClientSession) -> None:
        self.fake = fake
        self.session = session

    async def call(self, method: str, path: str, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": "application/json"}
        async with self.session.request(
            method, self.fake.url + path, data=data, headers=headers, **kwargs
        ) as answer:
            return answer.status, await answer.json(content_type=None)

    async def get(self, path: str) -> Any:
        status, answer = await self.call("GET", path)
        assert status == 200, answer
        return answer

    async def job(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        """Submit a write and return its job once it ended."""
        status, job_id = await self.call(method, path, body)
        assert status == 200 and isinstance(job_id, int), job_id

        async def ended() -> dict[str, Any] | None:
            job = await self.get(f"/2/jobs/{job_id}")
            return job if job["status"] in ("success", "error", "canceled") else None

        job = await eventually(ended, what=f"job {job_id} to end")
        assert job is not None
        return job

    async def create(self, name: str, node: str | None, *, start: bool = True) -> dict[str, Any]:
        body = {"__version__": 1, "name": name, "mode": "create", "os": "noop", "disk_template": "diskless",
                "disks": [], "nics": [{}], "beparams": {"memory": 128}, "hypervisor": "fake", "name_check": False,
                "ip_check": False, "start": start}  # fmt: skip
        if node is not None:
            body["pnode"] = node
        return await self.job("POST", "/2/instances", body)

    async def query(self, resource: str, fields: list[str]) -> dict[str, Any]:
        status, answer = await self.call("PUT", f"/2/query/{resource}", {"fields": fields})
        assert status == 200, answer
        return dict(answer)

    async def set_offline(self, node: str, offline: bool) -> dict[str, Any]:
        return await self.job("POST", f"/2/nodes/{node}/modify", {"offline": offline})


def session_for(fake: FakeGaneti, **kwargs: Any) -> aiohttp.ClientSession:
    token = base64.b64encode(f"{fake.username}:{fake.password}".encode()).decode()
    return aiohttp.ClientSession(headers={"Authorization": f"Basic {token}"}, **kwargs)


@pytest.fixture
async def lab() -> AsyncIterator[Rapi]:
    """A fake with the lab's instances: ``nf-a`` on node1, ``nf-c`` (running) and ``nf-d`` (stopped) on node3."""
    async with FakeGaneti(nodes=3, tls=False, op_times=QUICK) as fake, session_for(fake) as session:
        rapi = Rapi(fake, session)
        for name, node, start in ((A, N1, True), (C, N3, True), (D, N3, False)):
            assert (await rapi.create(name, node, start=start))["status"] == "success"
        yield rapi


def node_item(nodes: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(item for item in nodes if item["name"] == name)


# -- reads ------------------------------------------------------------------------------------------------------------


async def test_a_crashed_nodes_figures_read_null_as_real_ganetis(lab: Rapi) -> None:
    healthy = node_item(await lab.get("/2/nodes?bulk=1"), N3)
    assert structure_diff(real_item("nodes_bulk_healthy.json", "node3"), healthy) == []
    lab.fake.crash_node(N3)

    nodes = await lab.get("/2/nodes?bulk=1")
    real = real_item("nodes_bulk_dead.json", "node3")
    fake = node_item(nodes, N3)
    assert structure_diff(real, fake) == [] and nulls(fake) == nulls(real)
    assert {key: fake[key] for key in ("offline", "role", "master_candidate", "pinst_cnt")} == {
        "offline": False, "role": "C", "master_candidate": True, "pinst_cnt": 2,
    }  # fmt: skip
    assert node_item(nodes, N1)["mfree"] is not None  # the others still read
    one = await lab.get(f"/2/nodes/{N3}")
    assert structure_diff(recorded("node3_dead.json"), one) == [] and nulls(one) == nulls(
        recorded("node3_dead.json")
    )

    job = await lab.set_offline(N3, True)
    assert job["opresult"] == recorded("job_node3_set_offline.json")["opresult"]
    real_log = recorded("job_node3_set_offline.json")["oplog"][0]
    assert [message_shape(line[3]) for line in job["oplog"][0]] == [
        message_shape(line[3]) for line in real_log
    ]
    real = real_item("nodes_bulk_offline.json", "node3")
    fake = node_item(await lab.get("/2/nodes?bulk=1"), N3)
    assert structure_diff(real, fake) == [] and nulls(fake) == nulls(real)
    assert (fake["offline"], fake["role"], fake["master_candidate"]) == (True, "O", False)
    one = await lab.get(f"/2/nodes/{N3}")
    assert nulls(one) == nulls(recorded("node3_offline.json"))


@pytest.mark.parametrize("phase", ["dead", "offline"])
async def test_the_node_query_marks_live_fields_as_real_ganeti_does(lab: Rapi, phase: str) -> None:
    lab.fake.crash_node(N3)
    if phase == "offline":
        await lab.set_offline(N3, True)
    real = recorded(f"query_node_{phase}.json")
    fields = [field["name"] for field in real["fields"]]
    answer = await lab.query("node", fields)
    assert answer["fields"] == real["fields"]
    fake_row = next(row for row in answer["data"] if row[0][1] == N3)
    real_row_ = real_row(f"query_node_{phase}.json", "node3")
    assert [cell[0] for cell in fake_row] == [cell[0] for cell in real_row_]  # RS_NODATA / RS_OFFLINE alike
    assert [cell[1] for cell in fake_row[1:4]] == [
        cell[1] for cell in real_row_[1:4]
    ]  # offline, role, candidate


@pytest.mark.parametrize("phase", ["dead", "offline"])
async def test_its_instances_read_as_real_ganetis(lab: Rapi, phase: str) -> None:
    lab.fake.crash_node(N3)
    if phase == "offline":
        await lab.set_offline(N3, True)
    status = {"dead": "ERROR_nodedown", "offline": "ERROR_nodeoffline"}[phase]
    instances = await lab.get("/2/instances?bulk=1")
    for name in (C, D):
        real = real_item(f"instances_bulk_{phase}.json", name.split(".")[0])
        fake = node_item(instances, name)
        assert structure_diff(real, fake) == [] and nulls(fake) == nulls(real), name
        assert fake["status"] == real["status"] == status
    assert node_item(instances, A)["status"] == "running"
    if phase == "dead":
        one = await lab.get(f"/2/instances/{C}")
        assert structure_diff(recorded("instance_nf_c_dead.json"), one) == []
        assert nulls(one) == nulls(recorded("instance_nf_c_dead.json"))

    for fixture in (f"query_instance_{phase}.json", f"query_instance_live_{phase}.json"):
        real = recorded(fixture)
        names = [field["name"] for field in real["fields"]]
        answer = await lab.query("instance", names)
        assert answer["fields"] == real["fields"], fixture
        for name in (C, D):
            fake_row = next(row for row in answer["data"] if row[0][1] == name)
            real_row_ = real_row(fixture, name.split(".")[0])
            assert [cell[0] for cell in fake_row] == [cell[0] for cell in real_row_], (fixture, name)
            assert structure_diff(real_row_, fake_row) == [], (fixture, name)
            assert fake_row[names.index("status")] == [0, status]


# -- ops --------------------------------------------------------------------------------------------------------------


async def test_a_create_on_a_crashed_node_fails_as_real_ganetis(lab: Rapi) -> None:
    lab.fake.crash_node(N3)
    job = await lab.create("nf-dead1.ganeti.test", N3)
    real = recorded("job_create_on_dead_node.json")
    same_failure(real, job)
    assert structure_diff(real, job) == []
    assert job["oplog"] == [[]]  # CheckPrereq: no log line, as the lab's
    # its job file: the op ran (exec_timestamp), as the lab's job file shows
    fake_file = orjson.loads((lab.fake.queue_dir / f"job-{job['id']}").read_bytes())  # type: ignore[operator]
    real_file = recorded("queue_create_on_dead_node.json")
    assert fake_file["ops"][0]["exec_timestamp"] and real_file["ops"][0]["exec_timestamp"]
    assert fake_file["ops"][0]["result"][0] == real_file["ops"][0]["result"][0]
    assert "nf-dead1.ganeti.test" not in lab.fake.cluster.instances

    await lab.set_offline(N3, True)
    same_failure(recorded("job_create_on_offline_node.json"), await lab.create("nf-offline1.ganeti.test", N3))


async def test_creates_by_the_iallocator_fail_while_a_node_is_crashed_and_skip_it_once_offline(
    lab: Rapi,
) -> None:
    lab.fake.crash_node(N3)
    same_failure(recorded("job_create_iallocator_dead.json"), await lab.create("nf-hail1.ganeti.test", None))
    status, parent = await lab.call("POST", "/2/instances-multi-alloc", {"instances": [
        {"name": "nf-multi.ganeti.test", "mode": "create", "disk_template": "diskless", "disks": [], "nics": [{}],
         "os": "noop", "beparams": {"memory": 128}}]})  # fmt: skip
    assert status == 200
    multi = await eventually(lambda: (job := lab.fake.cluster.job(parent)) and job.status.is_final and job)
    assert multi.ops[0].result[0] == "OpExecError" and "Can't get data for node" in multi.ops[0].result[1][0]

    await lab.set_offline(N3, True)
    for index in range(4):  # every one lands on a node that answers
        job = await lab.create(f"nf-hail{index + 2}.ganeti.test", None)
        assert job["status"] == recorded("job_create_iallocator_offline.json")["status"] == "success"
        assert job["opresult"][0][0] in (N1, N2)


async def test_ops_on_its_instances_fail_as_real_ganetis(lab: Rapi) -> None:
    lab.fake.crash_node(N3)
    job = await lab.job("PUT", f"/2/instances/{C}/shutdown")
    real = recorded("job_shutdown_on_dead_node.json")
    same_failure(real, job)
    assert [message_shape(line[3]) for line in job["oplog"][0]] == [
        message_shape(line[3]) for line in real["oplog"][0]
    ]
    assert lab.fake.cluster.instances[C].admin_state == "down"  # marked down before the RPC failed, as Ganeti
    same_failure(recorded("job_startup_on_dead_node.json"), await lab.job("PUT", f"/2/instances/{D}/startup"))
    same_failure(recorded("job_remove_on_dead_node.json"), await lab.job("DELETE", f"/2/instances/{D}"))
    assert D in lab.fake.cluster.instances

    await lab.set_offline(N3, True)
    same_failure(
        recorded("job_shutdown_on_offline_node.json"), await lab.job("PUT", f"/2/instances/{C}/shutdown")
    )
    same_failure(recorded("job_remove_on_offline_node.json"), await lab.job("DELETE", f"/2/instances/{D}"))
    assert D in lab.fake.cluster.instances  # RAPI's remove never ignores failures (rlib2)


async def test_a_shutdown_ignoring_offline_nodes_goes_through(lab: Rapi) -> None:
    lab.fake.crash_node(N3)
    await lab.set_offline(N3, True)
    job = await lab.job("PUT", f"/2/instances/{C}/shutdown", {"ignore_offline_nodes": True})
    assert job["status"] == "success", job["opresult"]
    assert job["oplog"][0][-1][3] == " - INFO: Primary node offline, marked instance as stopped"
    assert lab.fake.cluster.instances[C].admin_state == "down"


async def test_reboot_on_a_crashed_or_offline_node_fails_in_its_checks(lab: Rapi) -> None:
    lab.fake.crash_node(N3)
    job = await lab.job("POST", f"/2/instances/{C}/reboot")
    assert job["opresult"][0][0] == "OpPrereqError" and job["opresult"][0][1][1] == "environment_error"
    assert (
        message_shape(job["opresult"][0][1][0])
        == "Error checking bridges on destination node '<name>': <rpc>"
    )
    await lab.set_offline(N3, True)
    job = await lab.job("POST", f"/2/instances/{C}/reboot")
    assert job["opresult"][0][1] == [f"Can't use offline node: {N3}", "wrong_state"]


async def test_failover_off_a_crashed_node_needs_ignore_consistency(lab: Rapi) -> None:
    lab.fake.crash_node(N3)
    job = await lab.job("PUT", f"/2/instances/{C}/migrate", {})
    assert job["opresult"][0][0] == "OpPrereqError" and job["opresult"][0][1][1] == "wrong_state"
    assert message_shape(job["opresult"][0][1][0]) == "Can't migrate, please use failover: <rpc>"
    job = await lab.job("PUT", f"/2/instances/{C}/failover", {"target_node": N2})
    assert job["opresult"][0][0] == "OpExecError"
    assert (
        message_shape(job["opresult"][0][1][0]) == "Could not shutdown instance <name> on node <name>: <rpc>"
    )
    assert lab.fake.cluster.instances[C].pnode == N3

    job = await lab.job("PUT", f"/2/instances/{C}/failover", {"target_node": N2, "ignore_consistency": True})
    assert job["status"] == "success", job["opresult"]
    assert any("proceeding anyway" in line[3] for line in job["oplog"][0])
    inst = lab.fake.cluster.instances[C]
    assert (inst.pnode, inst.oper_state) == (N2, True)  # started on the target: it was marked up
    view = node_item(await lab.get("/2/instances?bulk=1"), C)
    assert view["status"] == "running"


async def test_marking_a_crashed_node_online_fails_and_after_restore_it_is_promoted(lab: Rapi) -> None:
    lab.fake.crash_node(N3)
    await lab.set_offline(N3, True)
    job = await lab.set_offline(N3, False)
    assert job["opresult"][0][0] == "OpPrereqError" and job["opresult"][0][1][1] == "wrong_state"
    assert message_shape(job["opresult"][0][1][0]) == (
        "Node <name> is being de-offlined but fails to report its version: <rpc>"
    )
    lab.fake.restore_node(N3)
    assert node_item(await lab.get("/2/nodes?bulk=1"), N3)["mfree"] is None  # restored, still offline
    job = await lab.set_offline(N3, False)
    real = recorded("job_node3_set_online.json")
    assert job["opresult"] == real["opresult"]
    assert [line[3] for line in job["oplog"][0]] == [line[3] for line in real["oplog"][0]]
    real = real_item("nodes_bulk_restored.json", "node3")
    fake = node_item(await lab.get("/2/nodes?bulk=1"), N3)
    assert structure_diff(real, fake) == [] and nulls(fake) == nulls(real)
    assert (fake["role"], fake["master_candidate"]) == (real["role"], real["master_candidate"]) == ("C", True)


async def test_restore_brings_the_figures_back_at_the_first_read_and_its_instances_stopped(lab: Rapi) -> None:
    lab.fake.crash_node(N3)
    assert node_item(await lab.get("/2/nodes?bulk=1"), N3)["mfree"] is None
    lab.fake.restore_node(N3)
    fake = node_item(await lab.get("/2/nodes?bulk=1"), N3)
    assert nulls(fake) == nulls(real_item("nodes_bulk_end.json", "node3"))
    statuses = {item["name"]: item["status"] for item in await lab.get("/2/instances?bulk=1")}
    # the machine came back without them (the lab's were marked down by then: ADMIN_down)
    assert statuses == {A: "running", C: "ERROR_down", D: "ADMIN_down"}
    real = {row[0][1].split(".")[0]: row[3][1] for row in recorded("query_instance_restored2.json")["data"]}
    assert real["nf-d"] == "ADMIN_down"
    job = await lab.job("PUT", f"/2/instances/{C}/startup")
    assert job["status"] == "success"


async def test_crash_and_restore_refuse_the_master_and_unknown_nodes(lab: Rapi) -> None:
    with pytest.raises(ConflictError, match="master"):
        lab.fake.crash_node(N1)
    with pytest.raises(NotFoundError, match="nosuch"):
        lab.fake.crash_node("nosuch.fake.test")
    with pytest.raises(NotFoundError):
        lab.fake.restore_node("nosuch.fake.test")
    lab.fake.crash_node(N3)
    lab.fake.crash_node(N3)  # twice: no change
    assert lab.fake.cluster.nodes[N3].crashed
    lab.fake.restore_node(N3)
    assert not lab.fake.cluster.nodes[N3].crashed


async def test_the_node_knobs_over_http(lab: Rapi) -> None:
    assert await lab.call("POST", f"/__fake__/nodes/{N3}/crash") == (
        200, {"name": N3, "crashed": True, "offline": False},
    )  # fmt: skip
    assert node_item(await lab.get("/2/nodes?bulk=1"), N3)["mfree"] is None
    assert (await lab.call("POST", f"/__fake__/nodes/{N1}/crash"))[0] == 409
    assert (await lab.call("POST", "/__fake__/nodes/nosuch/restore"))[0] == 404
    assert (await lab.call("POST", f"/__fake__/nodes/{N3}/reboot"))[0] == 404  # not an action
    assert (await lab.call("POST", f"/__fake__/nodes/{N3}/restore"))[1]["crashed"] is False
    status, knobs = await lab.call("PUT", "/__fake__/knobs", {"rpc_timeout": 0.5})
    assert status == 200 and knobs["rpc_timeout"] == 0.5 == lab.fake.rpc_timeout


async def test_reads_of_a_crashed_nodes_live_data_wait_the_rpc_timeout(lab: Rapi) -> None:
    lab.fake.rpc_timeout = 3600.0  # far longer than the test: the reads below can only be waiting
    with pytest.raises(ValueError, match="rpc_timeout"):
        lab.fake.rpc_timeout = -1
    assert node_item(await lab.get("/2/nodes?bulk=1"), N3)["mfree"] is not None  # nothing crashed: no wait
    lab.fake.crash_node(N3)
    waiting = [
        asyncio.create_task(lab.get("/2/nodes?bulk=1")),
        asyncio.create_task(lab.get(f"/2/nodes/{N3}")),
        asyncio.create_task(lab.get("/2/instances?bulk=1")),
        asyncio.create_task(lab.query("instance", ["name", "status"])),
    ]
    await eventually(lambda: lab.fake.rapi.active == len(waiting), what="the reads to reach the fake")
    # reads that need no live data of node3 are answered meanwhile
    assert len(await lab.get("/2/nodes")) == 3
    assert (await lab.get(f"/2/nodes/{N1}"))["mfree"] is not None
    assert (await lab.get(f"/2/instances/{A}"))["status"] == "running"
    assert (await lab.query("instance", ["name", "pnode"]))["data"]
    assert not any(task.done() for task in waiting)
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)


# -- slow submits -----------------------------------------------------------------------------------------------------


async def test_a_slow_create_reaches_the_queue_after_its_client_gave_up() -> None:
    async with FakeGaneti(nodes=3, tls=False, op_times=QUICK) as fake, session_for(fake) as session:
        rapi = Rapi(fake, session)
        rule = fake.slow_submit(3600.0, job_after=0.2)  # no answer within the test
        assert isinstance(rule, SlowSubmit) and (rule.method, rule.path) == ("POST", "/2/instances")
        with pytest.raises(TimeoutError):
            await rapi.call("POST", "/2/instances", {"__version__": 1, "name": "gaveup.ganeti.test", "mode": "create",
                            "disk_template": "diskless", "disks": [], "nics": [{}], "os": "noop",
                            "name_check": False, "ip_check": False},
                            timeout=aiohttp.ClientTimeout(total=0.05))  # fmt: skip

        async def listed() -> list[Any]:
            jobs = await rapi.get("/2/jobs?bulk=1")
            return [job for job in jobs if job["ops"][0].get("instance_name") == "gaveup.ganeti.test"]

        jobs = await eventually(listed, what="the create's job to reach the queue")
        assert len(jobs) == 1 and rule.hits == 1
        assert (fake.queue_dir / f"job-{jobs[0]['id']}").exists()  # type: ignore[operator]
        await eventually(lambda: "gaveup.ganeti.test" in fake.cluster.instances, what="the instance")
        # other requests are not slowed
        assert (await rapi.job("PUT", "/2/instances/gaveup.ganeti.test/shutdown"))["status"] == "success"
        assert "1 rules" in repr(fake.rapi.slow)


async def test_a_slow_submit_answers_the_job_id_once_the_job_exists() -> None:
    async with FakeGaneti(nodes=3, tls=False, op_times=QUICK) as fake, session_for(fake) as session:
        rapi = Rapi(fake, session)
        fake.slow_submit(0.0, job_after=0.1, method=None, path=None, times=2)  # every write, twice
        status, job_id = await rapi.call("DELETE", "/2/instances/nosuch.ganeti.test")
        assert status == 200 and fake.cluster.job(job_id) is not None  # answered after the job existed
        status, job_id = await rapi.call("PUT", "/2/redistribute-config")
        assert status == 200 and fake.cluster.job(job_id) is not None
        assert fake.rapi.slow.rules[0].hits == 2
        fake.clear_slow_submits()
        assert fake.rapi.slow.rules == []
        with pytest.raises(ValueError, match="answer_after"):
            fake.slow_submit(-1.0)


async def test_a_job_written_but_not_yet_enqueued_is_listed_and_not_found_by_a_cancel() -> None:
    """luxid writes a new job to its disk, then to every master candidate, and only then hands it
    to its scheduler (``writeAndReplicateJob``, then ``enqueueNewJobs``): meanwhile the job is
    listed "queued" and a cancel answers "Job N not found in queue" (the 3-node lab with a node
    crashed, 2026-12-01); it runs once enqueued, and the POST is answered no sooner."""
    async with FakeGaneti(nodes=3, tls=False, op_times=QUICK) as fake, session_for(fake) as session:
        rapi = Rapi(fake, session)
        rule = fake.slow_submit(0.0, job_after=0.0, queued_for=0.6)
        body = {"__version__": 1, "name": "held.ganeti.test", "mode": "create", "disk_template": "diskless",
                "disks": [], "nics": [{}], "os": "noop", "name_check": False, "ip_check": False}  # fmt: skip
        post = asyncio.create_task(rapi.call("POST", "/2/instances", body))
        await eventually(lambda: len(fake.cluster._held) == 1, what="the job written, not enqueued")
        (job_id,) = fake.cluster._held
        assert (await rapi.get(f"/2/jobs/{job_id}"))["status"] == "queued"
        assert job_id in [job["id"] for job in await rapi.get("/2/jobs")]
        assert not post.done()  # luxid answers once the job is enqueued
        assert await rapi.call("DELETE", f"/2/jobs/{job_id}") == (
            200,
            [False, f"Job {job_id} not found in queue"],
        )
        assert await post == (200, job_id)
        assert not fake.cluster._held and rule.hits == 1
        await eventually(lambda: "held.ganeti.test" in fake.cluster.instances, what="the create to run")
        with pytest.raises(ValueError, match="queued_for"):
            fake.slow_submit(0.0, queued_for=-1.0)


async def test_slow_submits_over_http_and_a_stop_ends_those_held_back() -> None:
    fake = FakeGaneti(nodes=3, tls=False, op_times=QUICK)
    await fake.start()
    try:
        async with session_for(fake) as session:
            rapi = Rapi(fake, session)
            assert await rapi.call("POST", "/__fake__/slow-submit", {"answer_after": 3600, "job_after": 3600, "method": None, "path": None}) == (
                200, {"slow_submits": 1},
            )  # fmt: skip
            assert (await rapi.call("POST", "/__fake__/slow-submit", {"answer_after": "soon"}))[0] == 400
            held = asyncio.create_task(rapi.call("DELETE", "/2/instances/x.ganeti.test"))
            # the request waits in the fake: no answer, no job
            await eventually(lambda: len(fake.rapi.slow.pending) == 1, what="the submit to be held back")
            assert fake.cluster.jobs == {} and not held.done()
            assert await rapi.call("DELETE", "/__fake__/slow-submit") == (200, {"slow_submits": 0})
            assert fake.rapi.slow.rules == [] and len(fake.rapi.slow.pending) == 1  # held back still
            await fake.stop()  # cancels the held-back submit: its request ends unanswered, no job made
            with pytest.raises(aiohttp.ClientError):
                await held
            assert fake.rapi.slow.pending == set() and fake.cluster.jobs == {}
    finally:
        await fake.stop()


def test_the_command_line_takes_the_new_knobs(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["fake-ganeti", "--slow-submit-job-after", "2"])
    assert result.exit_code == 2 and "needs --slow-submit" in result.output
    result = CliRunner().invoke(main, ["fake-ganeti", "--slow-submit-queued-for", "2"])
    assert (
        result.exit_code == 2
        and "needs --slow-submit" in result.output
        and "--slow-submit-queued-for" in result.output
    )
    result = CliRunner().invoke(main, ["fake-ganeti", "--rpc-timeout", "-1"])
    assert result.exit_code == 2
    help_text = CliRunner().invoke(main, ["fake-ganeti", "--help"]).output
    assert (
        "--slow-submit" in help_text
        and "--rpc-timeout" in help_text
        and "--slow-submit-queued-for" in help_text
    )
