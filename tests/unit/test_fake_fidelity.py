"""The fake Ganeti writes job files of the same shape as real Ganeti 3.0, version by version.

Each test runs the operation a fixture recorded (tests/fixtures/ganeti-3.0-queue) on the
fake, and compares every version of the job file it wrote with the real one's: same
keys and value types at every level (``structure_diff``), same writer (luxid's compact
JSON or the executor's spaced JSON).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from synnefo_ganeti.jobs import JobStatus
from synnefo_ganeti.testing import FakeGaneti, structure_diff
from tests.helpers import QUEUE_FIXTURES, eventually

FAST = {
    "OP_INSTANCE_CREATE": 0.02, "OP_INSTANCE_REMOVE": 0.01, "OP_INSTANCE_STARTUP": 0.01,
    "OP_INSTANCE_SHUTDOWN": 0.01, "OP_INSTANCE_REBOOT": 0.01, "OP_INSTANCE_SET_PARAMS": 0.01,
    "OP_INSTANCE_MULTI_ALLOC": 0.01, "dry_run": 0.01,
}  # fmt: skip


def fixture(name: str) -> dict[str, Any]:
    return json.loads((QUEUE_FIXTURES / name).read_text())


def written_by_luxid(path: Path) -> bool:
    return not path.read_text().startswith('{"id": ')


class Recorder:
    """Every version of every job file the fake writes, as written."""

    def __init__(self, fake: FakeGaneti) -> None:
        self.versions: dict[int, list[tuple[bool, dict[str, Any]]]] = {}
        assert fake.cluster.queue is not None
        fake.cluster.queue.listeners.append(self._record)

    def _record(self, job_id: int, content: dict[str, Any], luxid: bool) -> None:
        self.versions.setdefault(job_id, []).append((luxid, content))

    def final(self, job_id: int) -> dict[str, Any]:
        return self.versions[job_id][-1][1]


async def ended(fake: FakeGaneti, job_id: int) -> None:
    def done() -> bool:
        job = fake.cluster.job(job_id)
        return job is not None and job.status.is_final and job_id not in fake.cluster._running

    await eventually(done, what=f"job {job_id} to end")


def create_params(name: str, **extra: Any) -> dict[str, Any]:
    params = {
        "instance_name": name, "mode": "create", "disk_template": "diskless", "disks": [], "nics": [{}],
        "os_type": "noop", "pnode": "node1.fake.test", "beparams": {"memory": 128}, "hypervisor": "fake",
        "name_check": False, "ip_check": False,
    }  # fmt: skip
    return params | extra


@pytest.fixture
async def fake(tmp_path):
    async with FakeGaneti(tls=False, op_times=FAST, queue_dir=tmp_path / "queue") as fake:
        yield fake


async def run(fake: FakeGaneti, recorder: Recorder, ops, **kwargs) -> int:
    kwargs.setdefault("resource", "instances")
    job_id = fake.cluster.submit(ops, **kwargs)
    await ended(fake, job_id)
    assert recorder.versions[job_id]
    return job_id


def assert_same_shape(real: dict[str, Any], ours: dict[str, Any], what: str) -> None:
    problems = structure_diff(real, ours)
    assert not problems, f"{what}: " + "; ".join(problems)


async def test_create_versions_match_lifecycle_of_job_20(fake) -> None:
    recorder = Recorder(fake)
    job_id = await run(fake, recorder, [("OP_INSTANCE_CREATE", create_params("inst5.fake.test"))])
    real = sorted((QUEUE_FIXTURES / "lifecycle-job-20").iterdir())
    ours = recorder.versions[job_id]
    assert len(ours) == len(real) == 10
    for path, (luxid, content) in zip(real, ours, strict=True):
        assert luxid == written_by_luxid(path), path.name
        assert_same_shape(json.loads(path.read_text()), content, path.name)
    assert_same_shape(fixture("job-11.op_instance_create.success.json"), recorder.final(job_id), "job-11")
    assert recorder.final(job_id)["ops"][0]["result"] == ["node1.fake.test"]


async def test_shutdown_versions_match_lifecycle_of_job_12(fake) -> None:
    recorder = Recorder(fake)
    await run(fake, recorder, [("OP_INSTANCE_CREATE", create_params("inst4.fake.test"))])
    job_id = await run(
        fake,
        recorder,
        [("OP_INSTANCE_SHUTDOWN", {"instance_name": "inst4.fake.test"})],
        resource="instances_name_shutdown",
    )
    real = sorted((QUEUE_FIXTURES / "lifecycle-job-12").iterdir())
    ours = recorder.versions[job_id]
    assert len(ours) == len(real) == 6
    for path, (luxid, content) in zip(real, ours, strict=True):
        assert luxid == written_by_luxid(path), path.name
        assert_same_shape(json.loads(path.read_text()), content, path.name)
    assert fake.cluster.instances["inst4.fake.test"].oper_state is False


async def test_startup_and_remove_match(fake) -> None:
    recorder = Recorder(fake)
    await run(fake, recorder, [("OP_INSTANCE_CREATE", create_params("inst4.fake.test", start=False))])
    startup = await run(fake, recorder, [("OP_INSTANCE_STARTUP", {"instance_name": "inst4.fake.test"})])
    remove = await run(fake, recorder, [("OP_INSTANCE_REMOVE", {"instance_name": "inst4.fake.test"})])
    assert_same_shape(fixture("job-13.op_instance_startup.success.json"), recorder.final(startup), "job-13")
    assert_same_shape(fixture("job-17.op_instance_remove.success.json"), recorder.final(remove), "job-17")
    assert "inst4.fake.test" not in fake.cluster.instances


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("job-14.op_instance_create.error_already_exists.json", {}),
        ("job-15.op_instance_create.error_type_enforcement.json", {"beparams": {"memory": "abc"}}),
        ("job-16.op_instance_create.error_bad_os.json", {"os_type": "doesnotexist"}),
        (
            "job-306.op_instance_create_file.error_ipolicy.json",
            {"disk_template": "file", "disks": [{"size": 64}]},
        ),
    ],
)
async def test_failed_creates_match(fake, name, params) -> None:
    recorder = Recorder(fake)
    await run(fake, recorder, [("OP_INSTANCE_CREATE", create_params("inst1.fake.test"))])
    params = create_params("inst1.fake.test" if "already_exists" in name else "other.fake.test") | params
    job_id = await run(fake, recorder, [("OP_INSTANCE_CREATE", params)])
    real = fixture(name)
    ours = recorder.final(job_id)
    assert_same_shape(real, ours, name)
    assert ours["ops"][0]["result"][0] == real["ops"][0]["result"][0]
    assert len(ours["ops"][0]["result"][1]) == len(real["ops"][0]["result"][1])  # ecode given, or not
    if len(real["ops"][0]["result"][1]) > 1:
        assert ours["ops"][0]["result"][1][1] == real["ops"][0]["result"][1][1]


async def test_canceled_matches_job_22(fake) -> None:
    recorder = Recorder(fake)
    fake.cluster.max_running_jobs = 1
    await run(fake, recorder, [("OP_INSTANCE_CREATE", create_params("inst2.fake.test"))])
    blocker = fake.cluster.submit([("OP_TEST_DELAY", {"duration": 0.3})], client=("gnt-debug", "delay"))
    job_id = fake.cluster.submit(
        [("OP_INSTANCE_SHUTDOWN", {"instance_name": "inst2.fake.test"})], resource="x"
    )
    assert fake.cluster.cancel(job_id) == (True, f"Dequeued job {job_id}")
    await ended(fake, blocker)
    luxid, final = recorder.versions[job_id][-1]
    assert luxid is True
    assert_same_shape(fixture("job-22.op_instance_shutdown.canceled.json"), final, "job-22")
    assert [v[1]["ops"][0]["status"] for v in recorder.versions[job_id]] == ["queued"] * 3 + ["canceled"]


async def test_multi_op_versions_match_lifecycle_of_job_23(fake) -> None:
    recorder = Recorder(fake)
    await run(fake, recorder, [("OP_INSTANCE_CREATE", create_params("inst2.fake.test"))])
    first = {"duration": 0, "on_master": True, "on_nodes": ["node1.fake.test"]}  # as job 23's: an int,
    last = first | {"duration": 0.0}  # and a float
    ops = [
        ("OP_TEST_DELAY", first),
        ("OP_INSTANCE_SHUTDOWN", {"instance_name": "inst2.fake.test"}),
        ("OP_TEST_DELAY", last),
    ]
    job_id = await run(fake, recorder, ops, resource=None, client=("gnt-debug", "submit-job"))
    real = sorted((QUEUE_FIXTURES / "lifecycle-job-23").iterdir())
    ours = recorder.versions[job_id]
    assert len(ours) == len(real) == 12
    for path, (luxid, content) in zip(real, ours, strict=True):
        assert luxid == written_by_luxid(path), path.name
        assert_same_shape(json.loads(path.read_text()), content, path.name)
    assert_same_shape(fixture("job-23.multi_op.success.json"), recorder.final(job_id), "job-23")


async def test_multi_op_failure_matches_job_24(fake) -> None:
    recorder = Recorder(fake)
    delay = {"duration": 0.01, "on_master": True, "on_nodes": ["node1.fake.test"]}
    startup = {"instance_name": "nosuch.fake.test", "instance_uuid": None, "shutdown_timeout": 120}
    ops = [("OP_TEST_DELAY", delay), ("OP_INSTANCE_STARTUP", startup), ("OP_TEST_DELAY", delay)]
    job_id = await run(fake, recorder, ops, resource=None, client=("gnt-debug", "submit-job"))
    final = recorder.final(job_id)
    real = fixture("job-24.multi_op.error.json")
    # gnt-debug submits the whole startup opcode; compare its input by what it has, the rest fully
    for op in (final, real):
        op["ops"][1]["input"] = {
            k: v for k, v in op["ops"][1]["input"].items() if k in final["ops"][1]["input"]
        }
    assert_same_shape(real, final, "job-24")
    assert [op["status"] for op in final["ops"]] == ["success", "error", "error"]
    assert final["ops"][2]["result"] == ["OpExecError", ["Preceding opcode failed"]]


async def test_multi_alloc_matches_job_1528(fake) -> None:
    recorder = Recorder(fake)
    params = {
        "instances": [create_params(f"ma-{i}.fake.test") for i in (1, 2)],
        "opportunistic_locking": False,
    }
    job_id = await run(
        fake, recorder, [("OP_INSTANCE_MULTI_ALLOC", params)], resource="instances_multi_alloc"
    )
    final = recorder.final(job_id)
    assert_same_shape(fixture("job-1528.op_instance_multi_alloc.success.json"), final, "job-1528")
    children = [child for ok, child in final["ops"][0]["result"]["jobs"]]
    for child in children:
        await ended(fake, child)
        final = recorder.final(child)
        assert final["ops"][0]["input"]["comment"] == "Submitted by OP_INSTANCE_MULTI_ALLOC"
        final["ops"][0]["input"]["comment"] = None  # a plain create (job 11) has none
        # nor a dry_run of its own (mcpu._SetBaseOpParams; real GET /2/jobs of such a child has none)
        assert final["ops"][0]["input"]["dry_run"] is None
        final["ops"][0]["input"]["dry_run"] = False
        assert_same_shape(fixture("job-11.op_instance_create.success.json"), final, "child")
    assert sorted(fake.cluster.instances) == ["ma-1.fake.test", "ma-2.fake.test"]


async def test_archive_moves_the_final_file(fake) -> None:
    recorder = Recorder(fake)
    job_id = await run(fake, recorder, [("OP_INSTANCE_CREATE", create_params("inst9.fake.test"))])
    live = fake.queue_dir / f"job-{job_id}"
    before = live.read_bytes()
    assert fake.archive_jobs() == 1
    archived = fake.queue_dir / "archive" / "0" / f"job-{job_id}"
    assert not live.exists() and archived.read_bytes() == before
    assert_same_shape(fixture("job-11.op_instance_create.success.json"), json.loads(before), "archived")
    assert fake.cluster.job(job_id).status is JobStatus.SUCCESS


async def test_queue_directory_layout(fake) -> None:
    recorder = Recorder(fake)
    job_id = await run(fake, recorder, [("OP_INSTANCE_CREATE", create_params("inst3.fake.test"))])
    names = sorted(p.name for p in fake.queue_dir.iterdir())
    assert names == ["archive", f"job-{job_id}", "lock", "serial", "version"]  # no temp file left behind
    assert (fake.queue_dir / "serial").read_text() == f"{job_id}\n"
    luxid = (fake.queue_dir / f"job-{job_id}").read_text()
    assert luxid.startswith('{"id": ') and luxid.endswith("}\n")  # the executor's style, last
