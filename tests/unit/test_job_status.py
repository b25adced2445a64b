from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from synnefo_ganeti.jobs import FINAL_STATUSES, JobStatus, calc_job_status
from tests.helpers import QUEUE_FIXTURES, rapi_fixture


def test_values_are_ganetis_strings() -> None:
    assert [s.value for s in JobStatus] == [
        "queued", "waiting", "canceling", "running", "canceled", "success", "error",
    ]  # fmt: skip
    assert {s for s in JobStatus if s.is_final} == FINAL_STATUSES
    assert JobStatus("success") is JobStatus.SUCCESS
    assert f"{JobStatus.RUNNING}" == "running"


@pytest.mark.parametrize(
    "path",
    sorted(p for p in QUEUE_FIXTURES.rglob("*.json")),
    ids=lambda p: p.relative_to(QUEUE_FIXTURES).as_posix(),
)
def test_matches_status_in_recorded_file_names(path) -> None:
    ops = json.loads(path.read_text())["ops"]
    computed = calc_job_status(op["status"] for op in ops)
    if path.parent.name.startswith("lifecycle-"):
        statuses = path.stem.split("-", 1)[1].split("_")
        assert [op["status"] for op in ops] == statuses
    else:
        named = path.stem.split(".")[2].split("_")[0]
        assert computed == JobStatus(named)


@pytest.mark.parametrize(
    "name", ["job_create_success.json", "job_create_error_already_exists.json", "job_shutdown_success.json"]
)
def test_matches_rapi_status(name) -> None:
    job = rapi_fixture(name)
    assert calc_job_status(job["opstatus"]) == JobStatus(job["status"])


def test_examples() -> None:
    s = JobStatus
    assert calc_job_status([s.SUCCESS, s.SUCCESS]) is s.SUCCESS
    assert calc_job_status([s.SUCCESS, s.QUEUED]) is s.QUEUED
    assert calc_job_status([s.SUCCESS, s.WAITING, s.QUEUED]) is s.WAITING
    assert calc_job_status([s.SUCCESS, s.ERROR, s.ERROR]) is s.ERROR
    assert calc_job_status([s.CANCELING, s.QUEUED]) is s.CANCELING
    assert calc_job_status([s.QUEUED]) is s.QUEUED


statuses = st.lists(st.sampled_from(list(JobStatus)), min_size=1, max_size=6)


@given(statuses)
def test_all_success_is_success_and_only_then(ops) -> None:
    assert (calc_job_status(ops) is JobStatus.SUCCESS) == all(o is JobStatus.SUCCESS for o in ops)


@given(statuses)
def test_first_deciding_op_wins(ops) -> None:
    deciding = [o for o in ops if o in (JobStatus.ERROR, JobStatus.CANCELED, JobStatus.CANCELING)]
    if deciding:
        assert calc_job_status(ops) is deciding[0]
    else:
        assert calc_job_status(ops) in (
            JobStatus.QUEUED,
            JobStatus.WAITING,
            JobStatus.RUNNING,
            JobStatus.SUCCESS,
        )
