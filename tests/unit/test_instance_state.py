"""Instance state follows the end of the jobs recorded for it, as Synnefo's dispatcher callbacks did."""

from __future__ import annotations

import json
from typing import Any

import pytest

from synnefo_ganeti.errors import ConflictError, NotFoundError
from synnefo_ganeti.jobs import JobStatus, parse_job_file
from synnefo_ganeti.store import InstanceAction, InstanceStatus, Store, instance_status_after
from tests.helpers import QUEUE_FIXTURES

NAME = "inst4.ganeti.test"


def raw(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((QUEUE_FIXTURES / name).read_text())
    return loaded


def job(content: dict[str, Any], *, job_id: int | None = None, shift: float = 0.0):
    """A job file from a fixture's content, with another id and its timestamps moved by ``shift`` s."""
    content = json.loads(json.dumps(content))
    if job_id is not None:
        content["id"] = job_id

    def moved(stamp: Any) -> Any:
        if stamp is None:
            return None
        total = stamp[0] * 1_000_000 + stamp[1] + int(shift * 1_000_000)
        return [total // 1_000_000, total % 1_000_000]

    for key in ("received_timestamp", "start_timestamp", "end_timestamp"):
        content[key] = moved(content.get(key))
    for op in content["ops"]:
        for key in ("start_timestamp", "exec_timestamp", "end_timestamp"):
            op[key] = moved(op.get(key))
        op["log"] = [
            [serial, moved(when), kind, message] for serial, when, kind, message in op.get("log") or []
        ]
    return parse_job_file(json.dumps(content).encode())


CREATE_OK = raw("job-11.op_instance_create.success.json")
SHUTDOWN_OK = raw("job-12.op_instance_shutdown.success.json")
STARTUP_OK = raw("job-13.op_instance_startup.success.json")
CREATE_FAILED = raw("job-14.op_instance_create.error_already_exists.json")
REMOVE_OK = raw("job-17.op_instance_remove.success.json")


def canceled(content: dict[str, Any]) -> dict[str, Any]:
    content = json.loads(json.dumps(content))
    for op in content["ops"]:
        op["status"] = "canceled"
        op["result"] = "Job canceled by request"
        op["log"] = []
    return content


def failed(content: dict[str, Any]) -> dict[str, Any]:
    content = json.loads(json.dumps(content))
    for op in content["ops"]:
        op["status"] = "error"
        op["result"] = ["OpExecError", ["Could not do it", "unknown"]]
    return content


def modify(beparams: dict[str, Any]) -> dict[str, Any]:
    content = json.loads(json.dumps(SHUTDOWN_OK))
    content["ops"][0]["input"] = {
        "OP_ID": "OP_INSTANCE_SET_PARAMS",
        "instance_name": NAME,
        "beparams": beparams,
    }
    return content


@pytest.mark.parametrize(
    ("action", "status", "start", "expected"),
    [
        (InstanceAction.CREATE, JobStatus.SUCCESS, True, InstanceStatus.STARTED),
        (InstanceAction.CREATE, JobStatus.SUCCESS, None, InstanceStatus.STARTED),
        (InstanceAction.CREATE, JobStatus.SUCCESS, False, InstanceStatus.STOPPED),
        (InstanceAction.CREATE, JobStatus.ERROR, True, InstanceStatus.ERROR),
        (InstanceAction.CREATE, JobStatus.CANCELED, True, InstanceStatus.DESTROYED),
        (InstanceAction.CREATE, JobStatus.RUNNING, True, None),
        (InstanceAction.STARTUP, JobStatus.SUCCESS, None, InstanceStatus.STARTED),
        (InstanceAction.REBOOT, JobStatus.SUCCESS, None, InstanceStatus.STARTED),
        (InstanceAction.SHUTDOWN, JobStatus.SUCCESS, None, InstanceStatus.STOPPED),
        (InstanceAction.REMOVE, JobStatus.SUCCESS, None, InstanceStatus.DESTROYED),
        (InstanceAction.STARTUP, JobStatus.ERROR, None, None),
        (InstanceAction.SHUTDOWN, JobStatus.ERROR, None, None),
        (InstanceAction.MODIFY, JobStatus.ERROR, None, None),
        (InstanceAction.REMOVE, JobStatus.CANCELED, None, None),
        (InstanceAction.MODIFY, JobStatus.SUCCESS, None, None),
    ],
)
def test_status_after_a_job(action, status, start, expected) -> None:
    assert instance_status_after(action, status, start=start) is expected


async def test_a_lifecycle_moves_the_instance(db_url) -> None:
    async with Store(db_url) as store:
        built = await store.add_instance("b1", NAME, beparams={"maxmem": 128, "minmem": 128})
        assert built.status is InstanceStatus.BUILD and built.owned
        recorded = await store.record_instance_job("b1", NAME, 11, InstanceAction.CREATE, start=True)
        assert recorded.status is InstanceStatus.BUILD and recorded.create_job_id == 11
        await store.record("b1", job(CREATE_OK))
        assert (await store.get_instance("b1", NAME)).status is InstanceStatus.STARTED  # type: ignore[union-attr]

        await store.record_instance_job("b1", NAME, 12, "shutdown")
        await store.record("b1", job(SHUTDOWN_OK))
        assert (await store.get_instance("b1", NAME)).status is InstanceStatus.STOPPED  # type: ignore[union-attr]

        await store.record_instance_job("b1", NAME, 13, InstanceAction.STARTUP)
        await store.record("b1", job(STARTUP_OK))
        assert (await store.get_instance("b1", NAME)).status is InstanceStatus.STARTED  # type: ignore[union-attr]

        # a failed shutdown leaves it alone
        await store.record_instance_job("b1", NAME, 15, InstanceAction.SHUTDOWN)
        await store.record("b1", job(failed(SHUTDOWN_OK), job_id=15, shift=1.0))
        assert (await store.get_instance("b1", NAME)).status is InstanceStatus.STARTED  # type: ignore[union-attr]

        # a modify's success updates the recorded beparams
        await store.record_instance_job("b1", NAME, 16, InstanceAction.MODIFY, params={"maxmem": 256})
        await store.record("b1", job(modify({"maxmem": 256}), job_id=16, shift=1.5))
        after = await store.get_instance("b1", NAME)
        assert after is not None and after.status is InstanceStatus.STARTED
        assert after.beparams == {"maxmem": 256, "minmem": 128}

        await store.record_instance_job("b1", NAME, 17, InstanceAction.REMOVE)
        await store.record("b1", job(REMOVE_OK))
        gone = await store.get_instance("b1", NAME)
        assert gone is not None and gone.status is InstanceStatus.DESTROYED
        jobs = await store.instance_jobs("b1", NAME)
        assert [(j["job_id"], j["action"], j["result"]) for j in jobs] == [
            (11, "create", "success"), (12, "shutdown", "success"), (13, "startup", "success"),
            (15, "shutdown", "error"), (16, "modify", "success"), (17, "remove", "success"),
        ]  # fmt: skip
        assert all(j["applied_at"] is not None for j in jobs)


@pytest.mark.parametrize(
    ("content", "start", "expected"),
    [
        (CREATE_OK, False, InstanceStatus.STOPPED),
        (CREATE_FAILED, True, InstanceStatus.ERROR),
        (canceled(CREATE_OK), True, InstanceStatus.DESTROYED),  # canceled before it ran: never existed
    ],
)
async def test_create_outcomes(db_url, content, start, expected) -> None:
    async with Store(db_url) as store:
        await store.add_instance("b1", NAME)
        version = job(content, job_id=11)
        await store.record_instance_job("b1", NAME, 11, InstanceAction.CREATE, start=start)
        await store.record("b1", version)
        assert (await store.get_instance("b1", NAME)).status is expected  # type: ignore[union-attr]


async def test_events_stored_before_the_job_is_recorded_are_applied_on_record(db_url) -> None:
    """The watcher can be faster than the facade: the end waits for the record."""
    async with Store(db_url) as store:
        await store.add_instance("b1", NAME)
        await store.record("b1", job(CREATE_OK))
        assert (await store.get_instance("b1", NAME)).status is InstanceStatus.BUILD  # type: ignore[union-attr]
        recorded = await store.record_instance_job("b1", NAME, 11, InstanceAction.CREATE, start=True)
        assert recorded.status is InstanceStatus.STARTED
        # recording it again applies nothing twice
        again = await store.record_instance_job("b1", NAME, 11, InstanceAction.CREATE, start=True)
        assert again.status is InstanceStatus.STARTED and again.updated_at >= recorded.updated_at


async def test_an_older_job_ending_late_changes_nothing(db_url) -> None:
    async with Store(db_url) as store:
        await store.add_instance("b1", NAME, status=InstanceStatus.STARTED)
        await store.record_instance_job("b1", NAME, 12, InstanceAction.SHUTDOWN)
        await store.record_instance_job("b1", NAME, 13, InstanceAction.STARTUP)
        # the startup ended after the shutdown; its end is stored first
        await store.record("b1", job(STARTUP_OK, shift=10.0))
        assert (await store.get_instance("b1", NAME)).status is InstanceStatus.STARTED  # type: ignore[union-attr]
        await store.record("b1", job(SHUTDOWN_OK))
        late = await store.get_instance("b1", NAME)
        assert late is not None and late.status is InstanceStatus.STARTED
        assert [j["result"] for j in await store.instance_jobs("b1", NAME)] == ["success", "success"]


async def test_jobs_of_instances_not_ours_are_stored_but_move_nothing(db_url) -> None:
    async with Store(db_url) as store:
        await store.add_instance("b1", "ours.example.org", status=InstanceStatus.STOPPED)
        await store.record("b1", job(CREATE_OK))  # about inst4, which the control plane never recorded
        await store.record("b1", job(STARTUP_OK))
        stored = await store.get_job("b1", 13)
        assert stored is not None and stored.status is JobStatus.SUCCESS
        assert await store.get_instance("b1", NAME) is None
        ours = await store.get_instance("b1", "ours.example.org")
        assert ours is not None and ours.status is InstanceStatus.STOPPED


async def test_instance_rows_are_unique_per_live_name(db_url) -> None:
    async with Store(db_url) as store:
        await store.add_instance("b1", NAME, tags=["a"])
        with pytest.raises(ConflictError, match="already in the database"):
            await store.add_instance("b1", NAME)
        await store.add_instance("b2", NAME)  # another backend: another instance
        await store.record_instance_job("b1", NAME, 17, InstanceAction.REMOVE)
        await store.record("b1", job(REMOVE_OK))
        # a destroyed name starts a new life; the old life's jobs do not move it
        await store.record_instance_job("b1", NAME, 12, InstanceAction.SHUTDOWN)
        reborn = await store.add_instance("b1", NAME, tags=["b"])
        assert reborn.status is InstanceStatus.BUILD and reborn.tags == ["b"] and reborn.create_job_id is None
        await store.record("b1", job(SHUTDOWN_OK))
        assert (await store.get_instance("b1", NAME)).status is InstanceStatus.BUILD  # type: ignore[union-attr]
        with pytest.raises(NotFoundError, match="not in the database"):
            await store.record_instance_job("b1", "nobody", 99, InstanceAction.STARTUP)
        with pytest.raises(ValueError, match="not instance fields"):
            await store.update_instance("b1", NAME, colour="blue")
        listed = await store.list_instances()
        # the old life's row stays, DESTROYED, after the live one of its name
        assert [(i.backend, i.name, i.status) for i in listed] == [
            ("b1", NAME, InstanceStatus.BUILD),
            ("b1", NAME, InstanceStatus.DESTROYED),
            ("b2", NAME, InstanceStatus.BUILD),
        ]
        assert listed[0].id == reborn.id != listed[1].id
        assert [i.name for i in await store.list_instances(status=["BUILD"], backend="b2")] == [NAME]


async def test_a_failed_job_moves_neither_the_status_nor_the_state_time(db_url) -> None:
    """Synnefo's UpdateDBTest.test_other_error, ported: an action that failed leaves the instance
    as it was (its last_error says why); state_time moves only with the status."""
    async with Store(db_url) as store:
        await store.add_instance("b1", NAME)
        await store.record_instance_job("b1", NAME, 11, InstanceAction.CREATE, start=True)
        await store.record("b1", job(CREATE_OK))
        before = await store.get_instance("b1", NAME)
        assert (
            before is not None and before.status is InstanceStatus.STARTED and before.state_time is not None
        )
        await store.record_instance_job("b1", NAME, 13, InstanceAction.STARTUP)
        await store.record("b1", job(failed(STARTUP_OK), shift=5.0))
        after = await store.get_instance("b1", NAME)
        assert after is not None and after.status is InstanceStatus.STARTED
        assert after.state_time == before.state_time
        assert after.last_error is not None and after.last_error["job_id"] == 13 and after.task is None
        # a shutdown that succeeds moves both
        await store.record_instance_job("b1", NAME, 12, InstanceAction.SHUTDOWN)
        await store.record("b1", job(SHUTDOWN_OK, shift=10.0))
        stopped = await store.get_instance("b1", NAME)
        assert stopped is not None and stopped.status is InstanceStatus.STOPPED
        assert stopped.state_time is not None and stopped.state_time > before.state_time
