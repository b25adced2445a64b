"""Durable create requests in the store and through the facade, on SQLite and on PostgreSQL.

The dispatcher's steps (claim, place, submit, finish) are driven by hand here, so that
each step's effect on the request and on its instance row is pinned down; job ends are
real Ganeti 3.0 job files (edited for another id or outcome), or a fake Ganeti's queue
stored by the watcher.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import Connection, inspect
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from synnefo_ganeti.errors import ConflictError, NotFoundError
from synnefo_ganeti.jobs import JobFile, JobStatus, parse_job_file
from synnefo_ganeti.store import (
    InstanceAction,
    InstanceStatus,
    Request,
    RequestNotHeldError,
    RequestStatus,
    Store,
    current_revision,
    head_revision,
    normalize_url,
    upgrade,
)
from tests.helpers import QUEUE_FIXTURES
from tests.unit.test_store_migrations import _command, _diff, _run, _tables

B1 = "b1"
NAME = "inst4.ganeti.test"
WAIT = 20.0  # generous: only a hang should hit it


def spec_of(name: str = NAME) -> dict[str, Any]:
    return {"name": name, "disk_template": "diskless", "os": "noop", "beparams": {"memory": 256}}


def raw(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((QUEUE_FIXTURES / name).read_text())
    return loaded


def job(content: dict[str, Any], *, job_id: int) -> JobFile:
    content = json.loads(json.dumps(content))
    content["id"] = job_id
    return parse_job_file(json.dumps(content).encode())


def canceled(content: dict[str, Any]) -> dict[str, Any]:
    content = json.loads(json.dumps(content))
    for op in content["ops"]:
        op["status"] = "canceled"
        op["result"] = "Job canceled by request"
        op["log"] = []
    return content


CREATE_OK = raw("job-11.op_instance_create.success.json")
REMOVE_OK = raw("job-17.op_instance_remove.success.json")
CREATE_BAD_OS = raw("job-16.op_instance_create.error_bad_os.json")
BAD_OS_ERROR = (
    "OpExecError: OS Parameters validation failed on node node1.ganeti.test: "
    "Directory for OS doesnotexist not found in search path"
)
EXPECTED = {"os": "noop", "disk_template": "diskless", "beparams": {"maxmem": 256, "minmem": 256}}


async def placed(
    store: Store, name: str = NAME, *, backend: str = B1, dispatcher: str = "d1", **add: Any
) -> Request:
    """A request added, claimed by ``dispatcher`` and placed on ``backend``."""
    request, _ = await store.add_request(spec_of(name), name=name, **add)
    claimed = await store.claim_requests(dispatcher)
    assert request.id in [r.id for r in claimed]
    return await store.place_request(request.id, dispatcher, backend, EXPECTED)


async def submitted(store: Store, job_id: int, name: str = NAME) -> Request:
    request = await placed(store, name)
    return await store.submitted_request(request.id, job_id, start=True)


async def current(store: Store, request_id: str) -> Request:
    found = await store.get_request(request_id)
    assert found is not None, f"request {request_id} is gone"
    return found


async def status_of(store: Store, name: str = NAME, backend: str = B1) -> InstanceStatus | None:
    instance = await store.get_instance(backend, name)
    return None if instance is None else instance.status


# -- adding and claiming -------------------------------------------------------------------------


async def test_add_request_is_idempotent_per_id(db_url) -> None:
    async with Store(db_url) as store:
        request, new = await store.add_request(spec_of(), name=NAME, backend=B1)
        assert new and str(uuid.UUID(request.id)) == request.id
        assert request.status is RequestStatus.PENDING and not request.is_final and not request.placed
        assert (request.instance, request.want_backend, request.backend) == (NAME, B1, None)
        assert request.spec == spec_of() and request.attempts == 0 and request.claimed_by is None
        again, new_again = await store.add_request(spec_of(), name=NAME, request_id=request.id)
        assert not new_again and again == request
        with pytest.raises(ConflictError, match="already exists with another name"):
            await store.add_request(spec_of("other"), name="other", request_id=request.id)
        mine, new_mine = await store.add_request(spec_of(), name=NAME, request_id="my-own-id")
        assert new_mine and mine.id == "my-own-id"
        assert [r.id for r in await store.list_requests()] == ["my-own-id", request.id]
        assert await store.get_request("no-such-request") is None
        assert mine.to_json()["status"] == "pending" and mine.to_json()["instance"] == NAME


async def test_claims_take_the_oldest_first_and_never_twice(db_url) -> None:
    async with Store(db_url) as store:
        ids = [(await store.add_request(spec_of(f"vm{i}"), name=f"vm{i}"))[0].id for i in range(5)]
        first = await store.claim_requests("d1", limit=2)
        assert [r.id for r in first] == ids[:2]
        assert all(r.claimed_by == "d1" and r.claimed_at is not None for r in first)
        second = await store.claim_requests("d2", limit=10)
        assert [r.id for r in second] == ids[2:]
        assert await store.claim_requests("d1") == [] and await store.claim_requests("d3") == []
        # a request that ended is not pending any more: a new one is the only one to claim
        await store.finish_request(ids[0], RequestStatus.FAILED, error="no room", dispatcher="d1")
        late, _ = await store.add_request(spec_of("vm9"), name="vm9")
        assert [r.id for r in await store.claim_requests("d3")] == [late.id]


async def test_concurrent_claimers_never_take_the_same_request(db_url) -> None:
    """Two stores (two processes' writers) claiming at once: SKIP LOCKED on PostgreSQL,
    one writer at a time on SQLite; each request goes to exactly one of them."""
    async with Store(db_url) as one, Store(db_url) as two:
        ids = {(await one.add_request(spec_of(f"vm{i}"), name=f"vm{i}"))[0].id for i in range(60)}

        async def claims(store: Store, dispatcher: str) -> list[str]:
            got: list[str] = []
            for batch in await asyncio.gather(
                *(store.claim_requests(dispatcher, limit=3) for _ in range(20))
            ):
                assert all(r.claimed_by == dispatcher for r in batch)
                got.extend(r.id for r in batch)
            return got

        got_one, got_two = await asyncio.gather(claims(one, "d1"), claims(two, "d2"))
        assert len(got_one) + len(got_two) == len(ids)
        assert set(got_one) | set(got_two) == ids and not set(got_one) & set(got_two)
        stored = {r.id: r.claimed_by for r in await one.list_requests()}
        assert stored == {rid: "d1" for rid in got_one} | {rid: "d2" for rid in got_two}


async def test_release_claimants_and_take_over(db_url) -> None:
    async with Store(db_url) as store:
        ids = [(await store.add_request(spec_of(f"vm{i}"), name=f"vm{i}"))[0].id for i in range(4)]
        await store.claim_requests("d1", limit=3)
        await store.claim_requests("d2")
        await store.place_request(ids[0], "d1", B1, EXPECTED)
        assert await store.request_claimants(exclude="d3") == {"d1", "d2"}
        assert await store.request_claimants(exclude="d1") == {"d2"}
        # shutdown: what d1 has not placed goes back; the placed one may have reached Ganeti
        assert await store.release_requests("d1") == 2
        assert [r.claimed_by for r in await store.list_requests(newest_first=False)] == [
            "d1", None, None, "d2",
        ]  # fmt: skip
        assert await store.release_requests("d1") == 0
        # d1 died: d3 takes over its placed request (a submitted one is nobody's)
        taken = await store.take_over_requests("d1", "d3")
        assert [(r.id, r.claimed_by, r.backend) for r in taken] == [(ids[0], "d3", B1)]
        assert await store.take_over_requests("d1", "d3") == []
        await store.submitted_request(ids[0], 11)
        assert await store.request_claimants(exclude="d2") == set()
        assert [r.id for r in await store.claim_requests("d4")] == ids[1:3]


# -- placing -------------------------------------------------------------------------------------


async def test_place_writes_the_backend_and_the_build_row_and_retries_after_unplace(db_url) -> None:
    async with Store(db_url) as store:
        request = await placed(store)
        assert request.backend == B1 and request.attempts == 1 and request.placed
        assert request.claimed_by == "d1" and request.status is RequestStatus.PENDING
        instance = await store.get_instance(B1, NAME)
        assert instance is not None and instance.status is InstanceStatus.BUILD and instance.owned
        assert (instance.os, instance.disk_template, instance.beparams) == (
            "noop", "diskless", {"maxmem": 256, "minmem": 256},
        )  # fmt: skip
        assert instance.create_job_id is None
        # Ganeti certainly got nothing: the backend and the row are forgotten
        back = await store.unplace_request(request.id, "d1", error="b1: 503 Service Unavailable")
        assert back.backend is None and not back.placed and back.error == "b1: 503 Service Unavailable"
        assert back.attempts == 1 and back.claimed_by == "d1"
        assert await store.get_instance(B1, NAME) is None
        # placed again, elsewhere: a second attempt
        again = await store.place_request(request.id, "d1", "b2", EXPECTED)
        assert again.backend == "b2" and again.attempts == 2
        assert await status_of(store, backend="b2") is InstanceStatus.BUILD
        # a retry of its own attempt on the same backend keeps its BUILD row
        retry = await store.place_request(request.id, "d1", "b2", EXPECTED)
        assert retry.attempts == 3
        assert [(i.backend, i.status) for i in await store.list_instances()] == [("b2", InstanceStatus.BUILD)]


async def test_place_refuses_a_name_taken_on_the_backend(db_url) -> None:
    async with Store(db_url) as store:
        await store.add_instance(B1, NAME, status=InstanceStatus.STARTED)
        request, _ = await store.add_request(spec_of(), name=NAME)
        [claimed] = await store.claim_requests("d1")
        with pytest.raises(ConflictError, match="already in the database"):
            await store.place_request(request.id, "d1", B1, EXPECTED)
        untouched = await current(store, request.id)
        assert untouched == claimed and untouched.backend is None and untouched.attempts == 0
        assert await status_of(store) is InstanceStatus.STARTED


async def test_place_refuses_the_build_row_of_another_request(db_url) -> None:
    """Two requests for one name on one backend: the second must not adopt the first's
    BUILD row (its create would fail and record its failure against the first's instance)."""
    async with Store(db_url) as store:
        first = await placed(store)
        second, _ = await store.add_request(spec_of(), name=NAME)
        [claimed] = await store.claim_requests("d2")
        with pytest.raises(ConflictError, match="already in the database"):
            await store.place_request(second.id, "d2", B1, EXPECTED)
        assert await current(store, second.id) == claimed
        # the first request's row is still its own: its job settles it
        await store.submitted_request(first.id, 11, start=True)
        await store.record(B1, job(CREATE_OK, job_id=11))
        assert await status_of(store) is InstanceStatus.STARTED
        assert (await current(store, first.id)).status is RequestStatus.SUCCEEDED


async def test_place_and_unplace_need_the_request_held(db_url) -> None:
    async with Store(db_url) as store:
        request, _ = await store.add_request(spec_of(), name=NAME)
        with pytest.raises(RequestNotHeldError, match="no longer held by dispatcher d1"):
            await store.place_request(request.id, "d1", B1, EXPECTED)  # nobody claimed it
        await store.claim_requests("d1")
        with pytest.raises(RequestNotHeldError, match="held by d1"):
            await store.place_request(request.id, "d2", B1, EXPECTED)
        await store.place_request(request.id, "d1", B1, EXPECTED)
        with pytest.raises(RequestNotHeldError):
            await store.unplace_request(request.id, "d2")
        assert await status_of(store) is InstanceStatus.BUILD
        # a cancel asked for while d1 holds it: d1 must not place it (again)
        _, done = await store.cancel_request(request.id)
        assert not done
        with pytest.raises(RequestNotHeldError, match="was canceled"):
            await store.place_request(request.id, "d1", B1, EXPECTED)
        still = await current(store, request.id)
        assert still.attempts == 1 and still.cancel_requested and still.status is RequestStatus.PENDING
        with pytest.raises(NotFoundError, match="not in the database"):
            await store.place_request("no-such-request", "d1", B1, EXPECTED)


# -- submitted, and the job's end ----------------------------------------------------------------


async def test_submitted_request_records_the_create_job(db_url) -> None:
    async with Store(db_url) as store:
        request = await submitted(store, 11)
        assert request.status is RequestStatus.SUBMITTED and request.job_id == 11
        assert request.submitted_at is not None and request.claimed_by is None and not request.is_final
        instance = await store.get_instance(B1, NAME)
        assert (
            instance is not None and instance.create_job_id == 11 and instance.status is InstanceStatus.BUILD
        )
        jobs = await store.instance_jobs(B1, NAME)
        assert [(j["job_id"], j["action"], j["start"], j["applied_at"]) for j in jobs] == [
            (11, "create", True, None)
        ]
        assert await store.unapplied_jobs(B1) == [11]
        # nobody holds a submitted request: no dispatcher may place it again
        with pytest.raises(RequestNotHeldError, match="status submitted"):
            await store.place_request(request.id, "d1", B1, EXPECTED)
        unplaced, _ = await store.add_request(spec_of("vm2"), name="vm2")
        with pytest.raises(ConflictError, match="has no backend"):
            await store.submitted_request(unplaced.id, 12)


async def test_a_job_end_stored_before_submitted_settles_at_once(db_url) -> None:
    """The watcher was faster than the dispatcher's submitted_request."""
    async with Store(db_url) as store:
        request = await placed(store)
        await store.record(B1, job(CREATE_OK, job_id=11))
        assert (await current(store, request.id)).status is RequestStatus.PENDING
        settled = await store.submitted_request(request.id, 11, start=True)
        assert settled.status is RequestStatus.SUCCEEDED and settled.job_id == 11
        assert settled.finished_at is not None and settled.error is None
        assert await status_of(store) is InstanceStatus.STARTED
        assert await store.unapplied_jobs(B1) == []


async def test_a_job_end_stored_after_submitted_settles_in_the_writer(db_url) -> None:
    outcomes = [
        (CREATE_OK, RequestStatus.SUCCEEDED, None, InstanceStatus.STARTED),
        (canceled(CREATE_OK), RequestStatus.CANCELED, "job 12 was canceled", InstanceStatus.DESTROYED),
    ]
    async with Store(db_url) as store:
        for job_id, (content, expected, error, after) in enumerate(outcomes, start=11):
            name = f"vm{job_id}"
            request = await submitted(store, job_id, name=name)
            await store.record(B1, job(content, job_id=job_id))
            settled = await current(store, request.id)
            assert (settled.status, settled.error, settled.job_id) == (expected, error, job_id)
            assert settled.finished_at is not None and settled.is_final
            assert await status_of(store, name) is after
        # refused by its backend (an OS it lacks): put back, to be placed on another backend
        refused = await submitted(store, 13, name="vm13")
        await store.record(B1, job(CREATE_BAD_OS, job_id=13))
        again = await current(store, refused.id)
        assert (again.status, again.job_id, again.backend) == (RequestStatus.PENDING, None, None)
        assert again.error is not None and BAD_OS_ERROR in again.error and "placing it again" in again.error
        assert not again.is_final and again.finished_at is None
        # the attempt made nothing: its row goes (never ERROR for one attempt), and the one id
        # of the request's server still finds it, BUILD, until it is placed again
        assert await status_of(store, "vm13") is None
        assert again.instance_id == refused.instance_id is not None
        view = await store.get_instance(None, None, id=again.instance_id)
        assert view is not None and view.status is InstanceStatus.BUILD and view.request_id == refused.id
        # a job of the same id on another backend settles nothing here
        other = await submitted(store, 14, name="vm14")
        await store.record("b2", job(CREATE_OK, job_id=14))
        assert (await current(store, other.id)).status is RequestStatus.SUBMITTED


# -- finishing and canceling ---------------------------------------------------------------------


async def test_finish_request_touches_only_a_build_row_without_a_create_job(db_url) -> None:
    async with Store(db_url) as store:
        refused = await placed(store)
        ended = await store.finish_request(
            refused.id,
            RequestStatus.FAILED,
            error="b1 refused the create",
            dispatcher="d1",
            instance_status=InstanceStatus.ERROR,
        )
        assert (ended.status, ended.error, ended.claimed_by) == (
            RequestStatus.FAILED,
            "b1 refused the create",
            None,
        )
        assert ended.finished_at is not None
        assert await status_of(store) is InstanceStatus.ERROR

        # a submitted request's BUILD row has its create job: the job's end decides it
        running = await submitted(store, 11, name="vm2")
        await store.finish_request(
            running.id, RequestStatus.CANCELED, instance_status=InstanceStatus.DESTROYED
        )
        assert await status_of(store, "vm2") is InstanceStatus.BUILD
        assert (await current(store, running.id)).status is RequestStatus.CANCELED

        with pytest.raises(ValueError, match="not a final request status"):
            await store.finish_request(running.id, RequestStatus.SUBMITTED)


async def test_a_final_request_never_changes_again(db_url) -> None:
    async with Store(db_url) as store:
        request = await placed(store)
        failed = await store.finish_request(
            request.id,
            RequestStatus.FAILED,
            error="no room",
            dispatcher="d1",
            instance_status=InstanceStatus.ERROR,
        )
        # the name starts a new life on b1 (a create of the facade's, not sent yet)
        await store.add_instance(B1, NAME)
        again = await store.finish_request(
            request.id, RequestStatus.SUCCEEDED, error="late", instance_status=InstanceStatus.ERROR
        )
        assert again == failed
        assert await status_of(store) is InstanceStatus.BUILD
        with pytest.raises(RequestNotHeldError):
            await store.finish_request(request.id, RequestStatus.CANCELED, dispatcher="d1")
        assert await store.cancel_request(request.id) == (failed, True)
        assert await current(store, request.id) == failed
        # nor does a job end recorded for it later
        await store.record(B1, job(CREATE_OK, job_id=11))
        assert await current(store, request.id) == failed


async def test_cancel_request_in_the_database(db_url) -> None:
    async with Store(db_url) as store:
        waiting, _ = await store.add_request(spec_of("vm1"), name="vm1")
        held, _ = await store.add_request(spec_of("vm2"), name="vm2")
        canceled_now, done = await store.cancel_request(waiting.id)
        assert done and canceled_now.status is RequestStatus.CANCELED
        assert (
            canceled_now.error == "canceled before it was submitted" and canceled_now.finished_at is not None
        )
        assert [r.id for r in await store.claim_requests("d1")] == [held.id]
        asked, done = await store.cancel_request(held.id)
        assert not done and asked.status is RequestStatus.PENDING and asked.cancel_requested
        assert asked.claimed_by == "d1"
        # the dispatcher honours it
        honoured = await store.finish_request(held.id, RequestStatus.CANCELED, dispatcher="d1")
        assert honoured.status is RequestStatus.CANCELED

        sent = await submitted(store, 11, name="vm3")
        left, done = await store.cancel_request(sent.id)
        assert not done and left.status is RequestStatus.SUBMITTED and left.job_id == 11
        with pytest.raises(NotFoundError, match="not in the database"):
            await store.cancel_request("no-such-request")


async def test_the_reconciler_settling_a_build_instance_settles_its_request(db_url) -> None:
    outcomes = [
        (InstanceStatus.STARTED, RequestStatus.SUCCEEDED, None),
        (InstanceStatus.STOPPED, RequestStatus.SUCCEEDED, None),
        (InstanceStatus.ERROR, RequestStatus.FAILED, "the reconciler found the instance ERROR"),
        # a BUILD settled DESTROYED: its create was canceled before it ran (as the watcher says)
        (InstanceStatus.DESTROYED, RequestStatus.CANCELED, "job 14 was canceled"),
    ]
    async with Store(db_url) as store:
        for job_id, (instance_status, expected, error) in enumerate(outcomes, start=11):
            name = f"vm{job_id}"
            request = await submitted(store, job_id, name=name)
            await store.update_instance(B1, name, status=instance_status)
            settled = await current(store, request.id)
            assert (settled.status, settled.error) == (expected, error)
            # the job's end stored later does not change the request again
            assert job_id in await store.unapplied_jobs(B1)
            await store.record(B1, job(CREATE_BAD_OS, job_id=job_id))
            assert await current(store, request.id) == settled
        # moving an instance that is not BUILD settles nothing
        late = await submitted(store, 15, name="vm15")
        await store.update_instance(B1, "vm15", tags=["a"])
        assert (await current(store, late.id)).status is RequestStatus.SUBMITTED


async def test_a_build_instance_whose_create_was_canceled_or_failed_is_destroyed(db_url) -> None:
    """delete_instance canceled the create (or it failed); the watcher stores the create's end
    before or after the delete records it: either way DESTROYED, and the request ends with it."""
    async with Store(db_url) as store:
        for job_id, watcher_first in ((11, False), (12, True)):
            name = f"vm{job_id}"
            request = await submitted(store, job_id, name=name)
            end = job(canceled(CREATE_OK), job_id=job_id)
            if watcher_first:
                await store.record(B1, end)
                # a create canceled before it ran leaves nothing: DESTROYED already
                assert await status_of(store, name) is InstanceStatus.DESTROYED
            gone = await store.destroy_unbuilt(B1, name, job_id, JobStatus.CANCELED)
            assert gone.status is InstanceStatus.DESTROYED
            await store.record(B1, end)
            assert await status_of(store, name) is InstanceStatus.DESTROYED
            assert [j["result"] for j in await store.instance_jobs(B1, name)] == ["canceled"]
            settled = await current(store, request.id)
            assert (settled.status, settled.error) == (RequestStatus.CANCELED, f"job {job_id} was canceled")

        failed = await submitted(store, 13, name="vm13")
        await store.destroy_unbuilt(B1, "vm13", 13, JobStatus.ERROR, error=BAD_OS_ERROR)
        await store.record(B1, job(CREATE_BAD_OS, job_id=13))
        assert await status_of(store, "vm13") is InstanceStatus.DESTROYED
        settled = await current(store, failed.id)
        assert (settled.status, settled.error) == (RequestStatus.FAILED, BAD_OS_ERROR)
        assert await store.unapplied_jobs(B1) == []
        with pytest.raises(ValueError, match="leaves nothing built, not success"):
            await store.destroy_unbuilt(B1, "vm13", 13, JobStatus.SUCCESS)


# -- reading: counts, lists, backends ------------------------------------------------------------


async def test_counts_and_list_filters(db_url) -> None:
    async with Store(db_url) as store:
        pending, _ = await store.add_request(spec_of("vm1"), name="vm1")
        on_b1 = await submitted(store, 11, name="vm2")
        on_b2 = await placed(store, "vm3", backend="b2")
        done = await submitted(store, 12, name="vm4")
        await store.record(B1, job(CREATE_OK, job_id=12))
        assert await store.request_counts() == {
            (None, "pending"): 1, ("b1", "submitted"): 1, ("b2", "pending"): 1, ("b1", "succeeded"): 1,
        }  # fmt: skip
        order = [pending.id, on_b1.id, on_b2.id, done.id]
        assert [r.id for r in await store.list_requests()] == order[::-1]
        assert [r.id for r in await store.list_requests(newest_first=False)] == order
        assert [r.id for r in await store.list_requests(limit=2)] == [done.id, on_b2.id]
        assert [r.id for r in await store.list_requests(limit=2, newest_first=False)] == order[:2]
        assert [r.id for r in await store.list_requests(status=["pending"])] == [on_b2.id, pending.id]
        assert [r.id for r in await store.list_requests(status=[RequestStatus.SUBMITTED, "succeeded"])] == [
            done.id, on_b1.id,
        ]  # fmt: skip
        assert [r.id for r in await store.list_requests(backend=B1)] == [done.id, on_b1.id]
        assert [r.id for r in await store.list_requests(backend="b2", status=["pending"])] == [on_b2.id]
        assert await store.list_requests(backend="nowhere") == []
        with pytest.raises(ValueError, match="'lost' is not a valid RequestStatus"):
            await store.list_requests(status=["lost"])


async def test_backend_health_and_events(db_url) -> None:
    async with Store(db_url) as store:
        await store.set_backend_health(B1, False, detail="connection refused", event="b1 is down")
        states = await store.backend_states()
        assert states[B1]["health"] == "down" and states[B1]["health_detail"] == "connection refused"
        first_at = states[B1]["health_at"]
        await store.set_backend_health(B1, True)
        states = await store.backend_states()
        assert states[B1]["health"] == "up" and states[B1]["health_detail"] is None
        assert states[B1]["health_at"] >= first_at and states[B1]["drained"] is False
        await store.set_backend_health("b2", True, event="b2 is up")
        await store.add_backend_event(B1, "drained", "drained by an operator")
        events = await store.backend_events()
        assert [(e["backend"], e["kind"], e["message"]) for e in events] == [
            (B1, "drained", "drained by an operator"), ("b2", "up", "b2 is up"), (B1, "down", "b1 is down"),
        ]  # fmt: skip
        assert all(e["at"] is not None for e in events)
        assert [e["message"] for e in await store.backend_events(backend=B1)] == [
            "drained by an operator", "b1 is down",
        ]  # fmt: skip
        assert [e["message"] for e in await store.backend_events(backend=B1, limit=1)] == [
            "drained by an operator"
        ]
        assert await store.backend_events(backend="b3") == []
        assert (await store.backend_states()).keys() == {B1, "b2"}


async def test_unapplied_jobs(db_url) -> None:
    async with Store(db_url) as store:
        assert await store.unapplied_jobs("nowhere") == []
        await store.add_instance(B1, "vm1", status=InstanceStatus.STARTED)
        await store.record_instance_job(B1, "vm1", 13, InstanceAction.SHUTDOWN)
        await submitted(store, 11)
        await store.record_instance_job(B1, "vm1", 12, InstanceAction.REBOOT)
        assert await store.unapplied_jobs(B1) == [11, 12, 13]
        await store.record(B1, job(CREATE_OK, job_id=11))
        assert await store.unapplied_jobs(B1) == [12, 13]
        assert await store.unapplied_jobs("b2") == []


async def test_wait_for_change_wakes_on_a_commit(db_url) -> None:
    async with Store(db_url) as store:
        assert await store.wait_for_change(0.05) is False
        waiter = asyncio.create_task(store.wait_for_change(WAIT))
        await asyncio.sleep(0)  # the waiter is waiting
        await store.add_request(spec_of(), name=NAME)
        assert await waiter is True
        # a job version committed by the writer wakes it too
        waiter = asyncio.create_task(store.wait_for_change(WAIT))
        await asyncio.sleep(0)
        await store.record(B1, job(CREATE_OK, job_id=11))
        assert await waiter is True
        assert await store.wait_for_change(0.05) is False


# -- the migration -------------------------------------------------------------------------------


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(normalize_url(db_url))
    try:
        yield engine
    finally:
        await engine.dispose()


def _backend_columns(connection: Connection) -> set[str]:
    return {column["name"] for column in inspect(connection).get_columns("backends")}


# SQLite cannot reflect the index on lower(name) (migration 0012): the schema compare skips it
@pytest.mark.filterwarnings(
    "ignore:Skipped unsupported reflection of expression-based index ix_(instances|requests)_name_lower",
    "ignore:autogenerate skipping metadata-specified expression-based index 'ix_(instances|requests)_name_lower'",
)
async def test_0004_downgrades_to_0003_and_upgrades_again(db_url: str, engine: AsyncEngine) -> None:
    await upgrade(engine)
    async with Store(db_url, create=False) as store:
        await store.set_backend_health(B1, True, event="up")
        await store.set_backend_drained(B1, True)
        await store.add_request(spec_of(), name=NAME)
    await _run(engine, _command, "downgrade", "0003")
    assert await current_revision(engine) == "0003"
    tables = await _run(engine, _tables)
    assert "requests" not in tables and "backend_events" not in tables and "backends" in tables
    columns = await _run(engine, _backend_columns)
    assert "drained" in columns and not columns & {"health", "health_at", "health_detail"}

    await _run(engine, _command, "upgrade", "head")
    assert await current_revision(engine) == head_revision()
    assert await _run(engine, _diff) == []
    async with Store(db_url, create=False) as store:
        # the backend and its drain outlived the round trip; the requests did not
        assert await store.drained_backends() == {B1}
        assert await store.list_requests() == [] and await store.backend_events() == []
        request, new = await store.add_request(spec_of(), name=NAME)
        assert new and (await store.request_counts()) == {(None, "pending"): 1}
        assert request.id in [r.id for r in await store.claim_requests("d1")]


async def test_a_remove_that_ends_before_its_delete_mark_is_cleared_leaves_no_mark(db_url) -> None:
    """A deferred delete's follower sends the remove, records it, then clears the mark: a remove
    that ends first (Ganeti removes a fake instance in milliseconds) is applied before the clear.
    The row is DESTROYED and unmarked in the same write, not marked until the clear comes (a CI
    rehearsal's ``test_delete_instance_of_a_build_instance`` read it in between)."""
    async with Store(db_url) as store:
        request = await submitted(store, 22, name="vm22")
        assert request.instance_id is not None
        assert await store.defer_delete(request.instance_id, request_id=request.id)
        await store.record(B1, job(CREATE_OK, job_id=22))
        (due,) = await store.deletes_due()
        assert due.id == request.instance_id
        await store.record_instance_job(B1, "vm22", 23, "remove")
        await store.record(B1, job(REMOVE_OK, job_id=23))
        gone = await store.get_instance(None, None, id=request.instance_id)
        assert gone is not None and gone.status is InstanceStatus.DESTROYED
        assert gone.delete_requested_at is None
        assert await store.deletes_due() == [] and await store.pending_deletes() == 0
        await store.clear_delete(request.instance_id)  # (the follower's clear, late: changes nothing)
        assert await store.get_instance(None, None, id=request.instance_id) == gone


async def test_a_delete_during_a_create_that_would_be_placed_again_cancels_it_for_good(db_url) -> None:
    """The reported bug: a create failing for a reason of its backend went back to be placed again,
    the user deleted the server meanwhile, and it was created anyway. Deleted while the create
    runs, the request ends canceled and its instance DESTROYED: never placed again."""
    async with Store(db_url) as store:
        request = await submitted(store, 21, name="vm21")
        assert request.instance_id is not None
        assert await store.defer_delete(request.instance_id, request_id=request.id)
        marked = await store.get_instance(None, None, id=request.instance_id)
        assert marked is not None and marked.delete_requested_at is not None
        await store.record(B1, job(CREATE_BAD_OS, job_id=21))
        ended = await current(store, request.id)
        assert ended.status is RequestStatus.CANCELED and ended.is_final
        assert ended.error is not None and "deleted while being built" in ended.error
        gone = await store.get_instance(None, None, id=request.instance_id)
        assert (
            gone is not None and gone.status is InstanceStatus.DESTROYED and gone.delete_requested_at is None
        )
        assert await store.deletes_due() == []
        # a create that succeeds is followed by its delete: due once its task is free
        other = await submitted(store, 22, name="vm22")
        assert other.instance_id is not None
        await store.defer_delete(other.instance_id, request_id=other.id)
        assert await store.deletes_due() == []  # its create still runs
        await store.record(B1, job(CREATE_OK, job_id=22))
        assert (await current(store, other.id)).status is RequestStatus.SUCCEEDED
        (due,) = await store.deletes_due()
        assert (due.id, due.name, due.backend) == (other.instance_id, "vm22", B1)
        await store.clear_delete(other.instance_id)
        assert await store.deletes_due() == [] and await store.pending_deletes() == 0
