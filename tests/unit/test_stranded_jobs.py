"""A create Ganeti lists "queued" but will never run (luxid wrote it and never enqueued it), on
both databases: the store's side, and the reservation sweep finding one on a healthy node. The request goes back to be placed, on that backend only, and the
stranded job is named in its ``attempt_errors`` (``"stranded": True``) so that it is passed over
when Ganeti is asked about the request (the dispatcher's side: ``test_node_moves.py``)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

import pytest

from synnefo_ganeti import ControlPlane, RapiClient
from synnefo_ganeti.dispatch import Dispatcher, _base, _reservations
from synnefo_ganeti.metrics import STRANDED_JOBS
from synnefo_ganeti.store import RequestStatus, Store, stranded_backend, stranded_jobs
from synnefo_ganeti.testing import FakeGaneti
from tests._fault_runs import QUICK
from tests.helpers import eventually, spec
from tests.unit.test_dispatcher import backend, fakes, finished, running, settings_for
from tests.unit.test_requests import B1, current, submitted


async def test_a_stranded_create_puts_its_request_back_on_its_backend(db_url: str) -> None:
    async with Store(db_url) as store:
        request = await submitted(store, 207)
        why = f"job 207 is stranded on backend {B1}"
        assert await store.job_lost(request.id, 207, error=why, stranded=(B1, "node3.example"))
        back = await current(store, request.id)
        assert back.status is RequestStatus.PENDING and back.job_id is None and back.claimed_by is None
        assert back.backend == B1 and back.error == why  # still placed there: Ganeti is asked first
        (entry,) = back.attempt_errors
        assert entry["stranded"] is True and entry["job_id"] == 207 and entry["node"] == "node3.example"
        assert entry["backend"] == B1 and entry["error"] == why and entry["attempt"] == back.attempts
        assert stranded_backend(back.attempt_errors) == B1
        assert (
            stranded_jobs(back.attempt_errors, B1) == {207}
            and stranded_jobs(back.attempt_errors, "other") == set()
        )
        # it waits on that job no more: a second report changes nothing
        assert not await store.job_lost(request.id, 207, error=why, stranded=(B1, None))
        assert (await current(store, request.id)).attempt_errors == back.attempt_errors


async def test_a_lost_job_is_not_a_stranded_one(db_url: str) -> None:
    async with Store(db_url) as store:
        request = await submitted(store, 12)
        assert await store.job_lost(request.id, 12, error="job 12 vanished")
        back = await current(store, request.id)
        assert back.status is RequestStatus.PENDING and back.attempt_errors == []
        assert (
            stranded_backend(back.attempt_errors) is None and stranded_jobs(back.attempt_errors, B1) == set()
        )


def test_stranded_entries_are_read_from_any_attempt() -> None:
    errors = [
        {"backend": "a", "job_id": 3, "stranded": True},
        {"backend": "b", "job_id": 9, "error": "node down"},
        {"backend": "a", "job_id": 5, "stranded": True},
        "not an entry",
    ]
    assert stranded_backend(errors) == "a" and stranded_backend(None) is None and stranded_backend([]) is None
    assert stranded_jobs(errors, "a") == {3, 5} and stranded_jobs(errors, "b") == set()


def _quick_sweeps(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reservation sweep looks at once, and a stranded job is given up on after 1.5 s."""
    for name, value in (
        ("SWEEP_AFTER", 0.2),
        ("SWEEP_INTERVAL", 0.1),
        ("LOST_AFTER", 0.5),
        ("LOST_CHECK", 0.3),
    ):
        monkeypatch.setattr(_reservations, name, value)
    monkeypatch.setattr(_base, "NOT_ENQUEUED_WAIT", 1.5)
    monkeypatch.setattr(_base, "NOT_ENQUEUED_PAUSE", 0.2)


@contextlib.asynccontextmanager
async def _held_then_newer(
    db_url: str, *, filtered: bool = False
) -> AsyncIterator[tuple[FakeGaneti, Store, ControlPlane, Dispatcher, str, int]]:
    """A backend ``b`` (the client's timeout 1 s) whose first create is written but never enqueued
    within the test, recorded by the dispatcher, and a newer create that runs and succeeds:
    (fake, store, cp, dispatcher, the first request's id, its job's id). ``filtered``: a job
    filter rule (one that matches nothing) on the backend first."""
    async with fakes(1, op_times=QUICK) as (fake,):
        settings = settings_for(db_url, [backend("b", fake, timeout=1.0)])
        async with (
            Store(db_url) as store,
            ControlPlane(settings, store=store) as cp,
            running(Dispatcher(settings, store=store, status_server=False)) as d,
            RapiClient(fake.url, username=fake.username, password=fake.password) as rapi,
        ):
            if filtered:
                await rapi.add_filter(
                    predicates=[["reason", ["=", "TYPE", "no-such-reason"]]], action="ACCEPT"
                )
            fake.slow_submit(0.0, job_after=0.0, queued_for=3600.0, times=1)  # never enqueued within the test
            first = await cp.request_instance(spec("held.example"))
            await eventually(
                lambda: len(d._job_requests) == 1, what="the first create found and recorded", timeout=30
            )
            (held,) = fake.cluster._held
            second = await cp.request_instance(spec("later.example"))  # a newer job, which runs
            assert (await finished(cp, second, timeout=30)).status is RequestStatus.SUCCEEDED
            yield fake, store, cp, d, first, held


async def test_a_create_left_queued_while_newer_jobs_run_is_found_stranded(
    db_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No node dies here: the create's job is listed "queued" for good while a newer create runs and
    ends (Ganeti schedules jobs of one priority in id order, so an older one still queued is one
    luxid never enqueued). The reservation sweep asks with a cancel, which Ganeti answers "not found
    in queue" minute after minute: stranded, and the request is made again on the same backend."""
    caplog.set_level(logging.INFO, logger="synnefo_ganeti")
    _quick_sweeps(monkeypatch)
    before = STRANDED_JOBS.labels("b")._value.get()
    async with _held_then_newer(db_url) as (fake, _store, cp, d, first, stranded):
        done = await finished(cp, first, timeout=60)
        assert done.status is RequestStatus.SUCCEEDED, done.error
        (entry,) = [e for e in done.attempt_errors if e.get("stranded")]
        assert entry["job_id"] == stranded and entry["backend"] == "b"
        assert d.stats.stranded == 1 and d.stats.failed == 0
        assert STRANDED_JOBS.labels("b")._value.get() == before + 1
        assert sorted(i.name for i in fake.cluster.instances.values()) == [
            "held.example",
            "later.example",
        ]
        assert (await fake_job_status(fake, stranded)) == "queued"  # Ganeti keeps it listed, unrun
        assert any("stayed queued on b while newer jobs started" in r.getMessage() for r in caplog.records)


async def test_no_stranded_probe_while_a_filter_rule_may_hold_creates(
    db_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A job filter rule may hold a create queued on purpose while newer jobs run: with any rule on the
    backend the sweep sends no probing cancel, and the request waits on its job."""
    caplog.set_level(logging.INFO, logger="synnefo_ganeti")
    _quick_sweeps(monkeypatch)
    async with _held_then_newer(db_url, filtered=True) as (_fake, store, _cp, d, first, _held):
        # two of the sweep's looks at the job list after the newer job ended
        looked = d._lost_checked.get("b", 0.0)
        await eventually(lambda: d._lost_checked.get("b", 0.0) > looked, what="a look at the job list")
        looked = d._lost_checked["b"]
        await eventually(lambda: d._lost_checked["b"] > looked, what="another look at the job list")
        assert d.stats.stranded == 0 and d.stats.moved == 0 and not d._moving_tasks
        assert not any("stayed queued" in r.getMessage() for r in caplog.records)
        waiting = await store.get_request(first)
        assert waiting is not None and waiting.status is RequestStatus.SUBMITTED


async def fake_job_status(fake: FakeGaneti, job_id: int) -> str:
    job = fake.cluster.job(job_id)
    assert job is not None
    return job.status.value
