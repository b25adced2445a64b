"""``plan``: every drift kind, and what is no drift, from hand-made snapshots (no I/O)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest

from synnefo_ganeti.jobs import JobStatus
from synnefo_ganeti.rapi import Instance, Job
from synnefo_ganeti.reconcile import (
    DbSnapshot,
    Drift,
    DriftKind,
    Fix,
    GanetiSnapshot,
    ganeti_state,
    job_file,
    plan,
)
from synnefo_ganeti.reconcile._plan import job_instances
from synnefo_ganeti.store import InstanceStatus, StoredInstance, StoredJob

B = "athens"
NOW = time.time()
LONG_AGO = datetime.fromtimestamp(NOW - 3600, UTC)


def row(
    name: str,
    status: InstanceStatus = InstanceStatus.STARTED,
    *,
    owned: bool = True,
    create_job_id: int | None = None,
    updated_at: datetime = LONG_AGO,
    **fields: Any,
) -> StoredInstance:
    values: dict[str, Any] = {
        "os": "noop",
        "disk_template": "diskless",
        "beparams": {"maxmem": 512, "minmem": 512},
        "nics": [{"mode": "bridged"}],
        "disks": [{"size": 1024}],
        "tags": ["synnefo-ganeti:owned"],
    } | fields
    return StoredInstance(
        id=f"id-of-{name}", backend=B, name=name, status=status, owned=owned, create_job_id=create_job_id,
        state_time=None, created_at=LONG_AGO, updated_at=updated_at, **values,
    )  # fmt: skip


def gnt(name: str, *, admin: str = "up", running: bool | None = True, **fields: Any) -> Instance:
    values: dict[str, Any] = {
        "name": name,
        "admin_state": admin,
        "oper_state": running,
        "beparams": {"maxmem": 512, "minmem": 512, "vcpus": 1},
        "tags": ["synnefo-ganeti:owned"],
        "nic.macs": ["aa:00:00:00:00:01"],
        "nic.modes": ["bridged"],
        "nic.links": ["gntbr0"],
        "nic.ips": [None],
        "nic.networks": [None],
        "disk.sizes": [1024],
    } | fields
    return Instance.model_validate(values)


def ts(when: float) -> list[int]:
    return [int(when), int((when % 1) * 1_000_000)]


def job(
    job_id: int,
    status: JobStatus,
    *,
    instance: str = "a",
    op: str = "OP_INSTANCE_CREATE",
    ended: float | None = None,
    full: bool = False,
) -> Job:
    final = status.is_final
    end = (NOW - 600 if ended is None else ended) if final else None
    values: dict[str, Any] = {
        "id": job_id,
        "status": status.value,
        "ops": [{"OP_ID": op, "instance_name": instance}],
        "opstatus": [status.value],
        "received_ts": ts(NOW - 700),
        "start_ts": ts(NOW - 690),
        "end_ts": ts(end) if end is not None else None,
    }
    if full:
        values["oplog"] = [[[1, ts(NOW - 650), "message", "working"]]]
        values["opresult"] = [None if status is JobStatus.SUCCESS else ["OpExecError", ["boom", "ecode"]]]
    return Job.model_validate(values)


def stored_job(job_id: int, status: JobStatus = JobStatus.RUNNING, instance: str | None = "a") -> StoredJob:
    return StoredJob(
        backend=B, job_id=job_id, status=status, instance=instance, ops=(), received_at=None,
        started_at=None, ended_at=None, archived=False, revision=1, event_count=1,
        first_seen_at=LONG_AGO, updated_at=LONG_AGO,
    )  # fmt: skip


def snapshots(
    rows: list[StoredInstance] = (),  # type: ignore[assignment]
    instances: list[Instance] = (),  # type: ignore[assignment]
    *,
    db_jobs: list[StoredJob] = (),  # type: ignore[assignment]
    jobs: list[Job] = (),  # type: ignore[assignment]
    looked_up: dict[int, Job | None] | None = None,
    owned: set[str] | None = None,
) -> tuple[DbSnapshot, GanetiSnapshot]:
    db = DbSnapshot(B, {r.name: r for r in rows}, {j.job_id: j for j in db_jobs}, taken_at=NOW)
    names = {i.name for i in instances} if owned is None else owned
    g = GanetiSnapshot(
        B,
        {i.name: i for i in instances},
        {j.id: j for j in jobs},
        looked_up or {},
        frozenset(names),
        NOW + 0.1,
    )
    return db, g


def kinds(drifts: list[Drift]) -> list[tuple[str, str | None]]:
    return [(d.kind.value, d.instance) for d in drifts]


# -- clean ---------------------------------------------------------------------------------------


def test_clean_system_has_no_drift() -> None:
    rows = [row("a"), row("b", InstanceStatus.STOPPED), row("gone", InstanceStatus.DESTROYED)]
    instances = [gnt("a"), gnt("b", admin="down", running=False)]
    jobs = [job(1, JobStatus.SUCCESS, instance="a"), job(2, JobStatus.SUCCESS, instance="b")]
    assert plan(*snapshots(rows, instances, jobs=jobs)) == []


def test_only_what_the_row_names_is_compared() -> None:
    bare = row("a", beparams=None, nics=None, disks=None, tags=None)
    assert plan(*snapshots([bare], [gnt("a", tags=["other"], beparams={"maxmem": 1})])) == []
    partial = row("a", beparams={"vcpus": 1}, nics=[{}], disks=[{"size": 1024}])
    assert plan(*snapshots([partial], [gnt("a")])) == []


def test_instances_not_ours_are_ignored() -> None:
    # in Ganeti, not ours: not an orphan; in the database with owned=False: not checked, but
    # a name Ganeti gives an instance lacking the marks is reported (not_owned, never fixed)
    db, g = snapshots(
        [row("theirs-db", owned=False), row("gone", owned=False)],
        [gnt("theirs"), gnt("theirs-db", running=False)],
        owned=set(),
    )
    assert kinds(plan(db, g)) == [("not_owned", "theirs-db")]


# -- stale and orphan ----------------------------------------------------------------------------


def test_stale() -> None:
    drifts = plan(*snapshots([row("a"), row("b", InstanceStatus.STOPPED)], []))
    assert kinds(drifts) == [("stale", "a"), ("stale", "b")]
    assert all(d.status is InstanceStatus.DESTROYED for d in drifts)
    assert "not in Ganeti" in drifts[0].detail


def test_error_row_missing_from_ganeti_is_consistent() -> None:
    assert plan(*snapshots([row("a", InstanceStatus.ERROR)], [])) == []


def test_missing_instance_with_a_remove_in_flight_is_not_stale() -> None:
    running = job(7, JobStatus.RUNNING, op="OP_INSTANCE_REMOVE")
    assert plan(*snapshots([row("a")], [], jobs=[running])) == []
    just_ended = job(7, JobStatus.SUCCESS, op="OP_INSTANCE_REMOVE", ended=NOW + 0.05)
    assert plan(*snapshots([row("a")], [], jobs=[just_ended])) == []
    long_ago = job(7, JobStatus.SUCCESS, op="OP_INSTANCE_REMOVE")
    assert kinds(plan(*snapshots([row("a")], [], jobs=[long_ago]))) == [("stale", "a")]


def test_orphan() -> None:
    db, g = snapshots(
        [row("gone", InstanceStatus.DESTROYED)],
        [gnt("new"), gnt("gone"), gnt("theirs")],
        owned={"new", "gone"},
    )
    drifts = plan(db, g)
    assert kinds(drifts) == [("orphan", "new"), ("orphan", "gone")]
    assert "not in the database" in drifts[0].detail and "DESTROYED" in drifts[1].detail
    assert all(d.status is None and not d.values for d in drifts)


# -- building ------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [JobStatus.QUEUED, JobStatus.WAITING, JobStatus.RUNNING])
def test_building_with_a_running_create_job_is_left_alone(status: JobStatus) -> None:
    rows = [row("a", InstanceStatus.BUILD, create_job_id=5)]
    assert plan(*snapshots(rows, [], jobs=[job(5, status)])) == []
    assert plan(*snapshots(rows, [gnt("a")], jobs=[job(5, status)])) == []


def test_building_whose_create_succeeded() -> None:
    rows = [row("a", InstanceStatus.BUILD, create_job_id=5), row("b", InstanceStatus.BUILD, create_job_id=6)]
    instances = [gnt("a"), gnt("b", admin="down", running=False)]
    drifts = plan(
        *snapshots(rows, instances, jobs=[job(5, JobStatus.SUCCESS), job(6, JobStatus.SUCCESS, instance="b")])
    )
    assert kinds(drifts) == [("building", "a"), ("building", "b")]
    assert [d.status for d in drifts] == [InstanceStatus.STARTED, InstanceStatus.STOPPED]
    assert drifts[0].job_id == 5 and "succeeded" in drifts[0].detail


@pytest.mark.parametrize("status", [JobStatus.ERROR, JobStatus.CANCELED])
def test_building_whose_create_failed(status: JobStatus) -> None:
    rows = [row("a", InstanceStatus.BUILD, create_job_id=5)]
    drifts = plan(*snapshots(rows, [], jobs=[job(5, status)]))
    assert kinds(drifts) == [("building", "a")]
    # canceled before it ran: DESTROYED, as when the watcher stores the job's end
    expected = InstanceStatus.DESTROYED if status is JobStatus.CANCELED else InstanceStatus.ERROR
    assert drifts[0].status is expected and str(status) in drifts[0].detail


def test_building_whose_create_job_is_gone() -> None:
    rows = [row("a", InstanceStatus.BUILD, create_job_id=5)]
    drifts = plan(*snapshots(rows, [], looked_up={5: None}))
    assert kinds(drifts) == [("building", "a")] and drifts[0].status is InstanceStatus.ERROR
    # archived: found by the lookup
    drifts = plan(*snapshots(rows, [gnt("a")], looked_up={5: job(5, JobStatus.SUCCESS)}))
    assert drifts[0].status is InstanceStatus.STARTED


def test_building_whose_create_ended_after_the_snapshot_waits() -> None:
    rows = [row("a", InstanceStatus.BUILD, create_job_id=5)]
    assert plan(*snapshots(rows, [gnt("a")], jobs=[job(5, JobStatus.SUCCESS, ended=NOW + 0.05)])) == []


def test_building_without_a_create_job() -> None:
    # Ganeti has it: settle it as Ganeti runs it
    drifts = plan(*snapshots([row("a", InstanceStatus.BUILD)], [gnt("a", admin="down", running=False)]))
    assert kinds(drifts) == [("building", "a")] and drifts[0].status is InstanceStatus.STOPPED
    # neither the job nor the instance, for longer than the grace: ERROR
    drifts = plan(*snapshots([row("a", InstanceStatus.BUILD)], []))
    assert kinds(drifts) == [("building", "a")] and drifts[0].status is InstanceStatus.ERROR
    # ... but a row just written may have its create on the way
    fresh = row("a", InstanceStatus.BUILD, updated_at=datetime.fromtimestamp(NOW - 1, UTC))
    assert plan(*snapshots([fresh], [])) == []
    # a create of that name in Ganeti's queue (its id not recorded yet) counts as its create job
    assert (
        plan(*snapshots([row("a", InstanceStatus.BUILD)], [gnt("a")], jobs=[job(9, JobStatus.RUNNING)])) == []
    )
    drifts = plan(*snapshots([row("a", InstanceStatus.BUILD)], [], jobs=[job(9, JobStatus.ERROR)]))
    assert drifts[0].status is InstanceStatus.ERROR and drifts[0].job_id == 9


# -- operstate -----------------------------------------------------------------------------------


def test_ganeti_state() -> None:
    assert ganeti_state(gnt("a")) is InstanceStatus.STARTED
    assert ganeti_state(gnt("a", running=None)) is InstanceStatus.STARTED  # offline node: trust admin_state
    assert ganeti_state(gnt("a", running=False)) is InstanceStatus.STOPPED  # ERROR_down
    assert ganeti_state(gnt("a", admin="down", running=True)) is InstanceStatus.STOPPED  # ERROR_up
    assert ganeti_state(gnt("a", admin="down", running=False)) is InstanceStatus.STOPPED


def test_operstate() -> None:
    rows = [row("a"), row("b", InstanceStatus.STOPPED), row("c"), row("d", InstanceStatus.ERROR)]
    instances = [gnt("a", admin="down", running=False), gnt("b"), gnt("c", running=False), gnt("d")]
    drifts = plan(*snapshots(rows, instances))
    assert kinds(drifts) == [("operstate", "a"), ("operstate", "b"), ("operstate", "c"), ("operstate", "d")]
    assert [d.status for d in drifts] == [
        InstanceStatus.STOPPED, InstanceStatus.STARTED, InstanceStatus.STOPPED, InstanceStatus.STARTED,
    ]  # fmt: skip
    # an ERROR row that Ganeti does not run is consistent
    assert plan(*snapshots([row("d", InstanceStatus.ERROR)], [gnt("d", running=False)])) == []


def test_an_instance_with_a_job_in_flight_is_left_alone() -> None:
    instances = [gnt("a", admin="down", running=False, tags=[])]
    assert (
        plan(*snapshots([row("a")], instances, jobs=[job(3, JobStatus.RUNNING, op="OP_INSTANCE_SHUTDOWN")]))
        == []
    )
    # a job the database holds as running and Ganeti too
    assert (
        plan(*snapshots([row("a")], instances, db_jobs=[stored_job(3)], jobs=[job(3, JobStatus.RUNNING)]))
        == []
    )


# -- flavor, NICs, disks, tags -------------------------------------------------------------------


def test_flavor() -> None:
    drifts = plan(*snapshots([row("a")], [gnt("a", beparams={"maxmem": 1024, "minmem": 512, "vcpus": 2})]))
    assert kinds(drifts) == [("flavor", "a")]
    assert "maxmem 512 expected, Ganeti has 1024" in drifts[0].detail
    assert drifts[0].values == {"beparams": {"maxmem": 1024, "minmem": 512, "vcpus": 2}}


def test_nics() -> None:
    drifts = plan(*snapshots([row("a")], [gnt("a", **{"nic.modes": ["routed"]})]))
    assert kinds(drifts) == [("nics", "a")] and "mode" in drifts[0].detail
    assert drifts[0].values["nics"][0]["mode"] == "routed"
    assert drifts[0].values["nics"][0]["mac"] == "aa:00:00:00:00:01"
    two = {"nic.macs": ["m1", "m2"], "nic.modes": ["bridged"] * 2, "nic.links": ["l"] * 2}
    drifts = plan(*snapshots([row("a")], [gnt("a", **two)]))
    assert kinds(drifts) == [("nics", "a")] and "1 NICs expected, Ganeti reports 2" in drifts[0].detail


def test_disks() -> None:
    drifts = plan(*snapshots([row("a")], [gnt("a", **{"disk.sizes": [2048]})]))
    assert kinds(drifts) == [("disks", "a")]
    assert drifts[0].values == {"disks": [{"size": 2048, "uuid": None}]}  # Ganeti's disks, as stored


def test_tags() -> None:
    drifts = plan(*snapshots([row("a")], [gnt("a", tags=["synnefo-ganeti:owned", "extra"])]))
    assert kinds(drifts) == [("tags", "a")] and "only in Ganeti: extra" in drifts[0].detail
    assert drifts[0].values == {"tags": ["extra", "synnefo-ganeti:owned"]}


def test_several_kinds_for_one_instance() -> None:
    observed = gnt("a", running=False, tags=[], beparams={"maxmem": 1}, **{"disk.sizes": []})
    drifts = plan(*snapshots([row("a")], [observed]))
    assert [d.kind for d in drifts] == [
        DriftKind.OPERSTATE,
        DriftKind.FLAVOR,
        DriftKind.DISKS,
        DriftKind.TAGS,
    ]


# -- jobs ----------------------------------------------------------------------------------------


def test_pending_job_that_ganeti_ended() -> None:
    db_jobs = [stored_job(3, JobStatus.RUNNING), stored_job(4, JobStatus.QUEUED, instance=None)]
    jobs = [job(3, JobStatus.SUCCESS, op="OP_INSTANCE_STARTUP")]
    looked_up = {4: job(4, JobStatus.ERROR, op="OP_TEST_DELAY", full=True)}
    drifts = plan(*snapshots([row("a")], [gnt("a")], db_jobs=db_jobs, jobs=jobs, looked_up=looked_up))
    assert kinds(drifts) == [("job", "a"), ("job", None)]
    assert drifts[0].job is jobs[0] and drifts[0].job_id == 3
    assert "running in the database, Ganeti says success" in drifts[0].detail
    assert drifts[1].job is looked_up[4] and "error" in drifts[1].detail
    assert drifts[1].to_json() == {
        "kind": "job",
        "instance": None,
        "detail": drifts[1].detail,
        "fixed": False,
    }


def test_pending_job_still_running_or_ended_after_the_snapshot() -> None:
    db_jobs = [stored_job(3), stored_job(4)]
    jobs = [job(3, JobStatus.RUNNING), job(4, JobStatus.SUCCESS, ended=NOW + 0.05)]
    assert plan(*snapshots([row("a")], [gnt("a")], db_jobs=db_jobs, jobs=jobs)) == []


def test_unknown_job_is_reported_not_failed() -> None:
    db, g = snapshots([row("a")], [gnt("a")], db_jobs=[stored_job(3)], looked_up={3: None})
    drifts = plan(db, g)
    assert kinds(drifts) == [("job", "a")]
    assert "unknown to Ganeti" in drifts[0].detail
    assert drifts[0].job is None and drifts[0].status is None  # nothing to apply: not marked failed


def test_job_instances_and_fix_kinds() -> None:
    assert job_instances(job(1, JobStatus.RUNNING, instance="x")) == {"x"}
    multi = Job.model_validate(
        {"id": 2, "status": "running", "ops": [{"OP_ID": "OP_INSTANCE_MULTI_ALLOC", "instances": [
            {"instance_name": "m1"}, {"instance_name": "m2"}]}]}
    )  # fmt: skip
    assert job_instances(multi) == {"m1", "m2"}
    assert Fix.JOBS.kind is DriftKind.JOB and Fix.FLAVOR.kind is DriftKind.FLAVOR
    assert {fix.value for fix in Fix} == {
        "stale",
        "building",
        "operstate",
        "flavor",
        "nics",
        "disks",
        "tags",
        "jobs",
    }


def test_job_file_from_a_rapi_job() -> None:
    failed = job(4, JobStatus.ERROR, full=True)
    version = job_file(failed)
    assert version.job_id == 4 and version.status is JobStatus.ERROR and version.is_final
    assert version.instance == "a" and version.ops[0].op_id == "OP_INSTANCE_CREATE"
    assert version.ops[0].result == ["OpExecError", ["boom", "ecode"]]
    assert version.ops[0].log[0].message == "working" and version.end_time == pytest.approx(
        NOW - 600, abs=1e-5
    )


def test_a_large_clean_backend_plans_clean() -> None:
    """5,000 instances with their jobs: no drift (the plan's speed is benchmarks/reconcile.py's)."""
    n = 5000
    rows = [row(f"i{k}") for k in range(n)]
    instances = [gnt(f"i{k}") for k in range(n)]
    jobs = [job(k, JobStatus.SUCCESS, instance=f"i{k}") for k in range(n)]
    db, g = snapshots(rows, instances, jobs=jobs)
    assert plan(db, g) == []
