"""Parsing real Ganeti 3.0 job files, and the events between two versions of one."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from synnefo_ganeti.jobs import EventKind, JobFileError, JobStatus, job_events, parse_job_file
from tests.helpers import QUEUE_FIXTURES

ALL_FILES = sorted([*QUEUE_FIXTURES.rglob("*.json"), QUEUE_FIXTURES / "archive" / "0" / "job-2"])
LIFECYCLES = {
    name: sorted((QUEUE_FIXTURES / name).iterdir())
    for name in ("lifecycle-job-12", "lifecycle-job-20", "lifecycle-job-23")
}


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: p.relative_to(QUEUE_FIXTURES).as_posix())
def test_every_recorded_file_parses(path) -> None:
    raw = json.loads(path.read_text())
    job = parse_job_file(path.read_bytes())
    assert job.job_id == raw["id"]
    assert [op.status.value for op in job.ops] == [op["status"] for op in raw["ops"]]
    assert [op.op_id for op in job.ops] == [op["input"]["OP_ID"] for op in raw["ops"]]
    assert job.last_serial == max((e[0] for op in raw["ops"] for e in op["log"]), default=0)


def test_fields_of_a_create() -> None:
    job = parse_job_file((QUEUE_FIXTURES / "job-11.op_instance_create.success.json").read_bytes())
    (op,) = job.ops
    assert job.status is JobStatus.SUCCESS and job.is_final
    assert job.instance == op.instance == "inst4.ganeti.test"
    assert op.result == ["node1.ganeti.test"]
    assert op.log[0].message == "* creating instance disks..."
    assert job.received_time == 1795327425.854103 and op.end_time == 1795327426.716149


def test_multi_alloc_of_one_names_its_instance_and_of_two_none() -> None:
    job = parse_job_file((QUEUE_FIXTURES / "job-1528.op_instance_multi_alloc.success.json").read_bytes())
    assert job.instance is None  # two instances: not one job's instance


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b'{"id": 1, "ops": [', "not JSON"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b"[]", "not a JSON object"),
        (b'{"id": "x", "ops": []}', "not a job number"),
        (b'{"id": 1, "ops": []}', "ops is missing or empty"),
        (b'{"id": 1, "ops": [{"input": {}}]}', "no input with an OP_ID"),
        (b'{"id": 1, "ops": [{"input": {"OP_ID": "X"}, "status": "exploded"}]}', "not one of Ganeti's"),
        (
            b'{"id": 1, "ops": [{"input": {"OP_ID": "X"}, "status": "queued", "start_timestamp": 5}]}',
            r"not \[seconds",
        ),
    ],
)
def test_bad_files_say_what_is_wrong(data, reason) -> None:
    with pytest.raises(JobFileError, match=reason):
        parse_job_file(data)


def test_events_along_a_create_lifecycle() -> None:
    versions = [parse_job_file(p.read_bytes()) for p in LIFECYCLES["lifecycle-job-20"]]
    events = [e for old, new in zip([None, *versions], versions, strict=False) for e in job_events(old, new)]
    summary = [(e.kind.value, e.status.value, e.log_serial) for e in events]
    assert summary == [
        ("op_status", "queued", None), ("job_status", "queued", None),
        ("op_status", "waiting", None), ("job_status", "waiting", None),
        ("op_status", "running", None), ("job_status", "running", None),
        ("log", "running", 1), ("log", "running", 2), ("log", "running", 3), ("log", "running", 4),
        ("op_status", "success", None), ("job_status", "success", None),
    ]  # fmt: skip
    times = [e.event_time for e in events]
    assert all(t is not None for t in times) and times == sorted(times)  # type: ignore[type-var]
    assert {e.instance for e in events} == {"inst5.ganeti.test"}
    assert events[-1].event_time == versions[-1].end_time


def test_events_of_a_multi_op_job_advance_op_by_op() -> None:
    versions = [parse_job_file(p.read_bytes()) for p in LIFECYCLES["lifecycle-job-23"]]
    events = [e for old, new in zip([None, *versions], versions, strict=False) for e in job_events(old, new)]
    op_events = [(e.op_index, e.status.value) for e in events if e.kind is EventKind.OP_STATUS]
    assert op_events == [
        (0, "queued"), (1, "queued"), (2, "queued"), (0, "waiting"), (0, "running"), (0, "success"),
        (1, "waiting"), (1, "running"), (1, "success"), (2, "waiting"), (2, "running"), (2, "success"),
    ]  # fmt: skip
    assert events[-1].kind is EventKind.JOB_STATUS and events[-1].status is JobStatus.SUCCESS


def test_lock_retry_running_to_waiting_is_a_change() -> None:
    running = json.loads((QUEUE_FIXTURES / "job-20.op_instance_create.running.json").read_text())
    waiting = json.loads((QUEUE_FIXTURES / "job-20.op_instance_create.waiting.json").read_text())
    events = job_events(
        parse_job_file(json.dumps(running).encode()), parse_job_file(json.dumps(waiting).encode())
    )
    assert [(e.kind, e.status) for e in events] == [
        (EventKind.OP_STATUS, JobStatus.WAITING),
        (EventKind.JOB_STATUS, JobStatus.WAITING),
    ]


def test_same_version_twice_changes_nothing() -> None:
    for path in ALL_FILES:
        job = parse_job_file(path.read_bytes())
        assert job_events(job, job) == []


def test_different_jobs_are_refused() -> None:
    a = parse_job_file((QUEUE_FIXTURES / "job-11.op_instance_create.success.json").read_bytes())
    b = parse_job_file((QUEUE_FIXTURES / "job-12.op_instance_shutdown.success.json").read_bytes())
    with pytest.raises(ValueError, match="different jobs"):
        job_events(a, b)


@given(st.data())
def test_coalesced_versions_keep_the_final_state_and_the_order(data) -> None:
    """Whatever versions a watcher misses, what it stores ends in the final state, in time order,
    and holds every log line once."""
    name = data.draw(st.sampled_from(sorted(LIFECYCLES)))
    paths = LIFECYCLES[name]
    kept = data.draw(st.lists(st.booleans(), min_size=len(paths) - 1, max_size=len(paths) - 1))
    seen = [p for p, keep in zip(paths[:-1], kept, strict=True) if keep] + [paths[-1]]
    versions = [parse_job_file(p.read_bytes()) for p in seen]
    events = [e for old, new in zip([None, *versions], versions, strict=False) for e in job_events(old, new)]
    final = versions[-1]
    assert events[-1].kind is EventKind.JOB_STATUS and events[-1].status is final.status
    logs = [e.log_serial for e in events if e.kind is EventKind.LOG]
    assert logs == sorted(logs) and len(logs) == len(set(logs)) == final.last_serial
    times = [e.event_time for e in events]
    assert times == sorted(times)  # type: ignore[type-var]
