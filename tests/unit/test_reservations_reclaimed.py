"""Every reservation is given back however its create ends or is settled (issue 27, item 7), on
both databases: a backend that lost a job in flight never reports its end, and the request is
settled by someone else (the reconciler, another process); the dispatcher gives its room back
instead of holding it "pending" for ever."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from yarl import URL

from synnefo_ganeti import ControlPlane, RapiClient
from synnefo_ganeti.dispatch import Dispatcher, _reservations
from synnefo_ganeti.metrics import RESERVATIONS_RECLAIMED
from synnefo_ganeti.store import Request, RequestStatus, Store
from synnefo_ganeti.testing import FakeGaneti
from tests._fault_runs import QUICK
from tests.helpers import WAIT, eventually, spec
from tests.unit.test_dispatcher import backend, creates, fakes, running, settings_for


@contextlib.asynccontextmanager
async def _never_ending_creates(db_url: str) -> AsyncIterator[tuple[Store, ControlPlane, Dispatcher]]:
    """A backend ``f1`` whose creates never end while a test runs, and a dispatcher on it."""
    async with fakes(1, op_times=QUICK | {"OP_INSTANCE_CREATE": 600.0}) as (f1,):
        settings = settings_for(db_url, [backend("f1", f1)])
        async with (
            Store(db_url) as store,
            ControlPlane(settings, store=store) as cp,
            running(Dispatcher(settings, store=store, status_server=False)) as d,
        ):
            yield store, cp, d


async def test_the_reservation_of_a_request_settled_elsewhere_is_given_back(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_reservations, "SWEEP_AFTER", 0.2)
    monkeypatch.setattr(_reservations, "SWEEP_INTERVAL", 0.1)
    # a create that never ends while the test runs: its job's end is never seen here
    async with _never_ending_creates(db_url) as (store, cp, d):
        request_id = await cp.request_instance(spec("vm-lost.example"))
        submitted = await eventually(lambda: _submitted(store, request_id), what="the request submitted")
        assert submitted.job_id is not None
        assert d.allocator.pending("f1").count == 1
        before = RESERVATIONS_RECLAIMED._value.get()
        # the backend lost the job; the request is settled by someone else meanwhile
        await store.finish_request(request_id, RequestStatus.FAILED, error="its job vanished")
        await eventually(lambda: d.allocator.pending("f1").count == 0, what="the room given back")
        assert RESERVATIONS_RECLAIMED._value.get() == before + 1
        # the room is there for the next request at once
        other = await cp.request_instance(spec("vm-next.example"))
        assert (await eventually(lambda: _submitted(store, other))).job_id is not None


async def test_a_reservation_whose_job_still_runs_is_kept(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_reservations, "SWEEP_AFTER", 0.05)
    monkeypatch.setattr(_reservations, "SWEEP_INTERVAL", 0.05)
    async with _never_ending_creates(db_url) as (store, cp, d):
        request_id = await cp.request_instance(spec("vm-runs.example"))
        await eventually(lambda: _submitted(store, request_id), what="the request submitted")
        swept = await d._sweep_reservations()  # what the loop runs; nothing to give back
        assert swept == 0 and d.allocator.pending("f1").count == 1


async def test_a_reservation_is_kept_while_its_submit_is_being_stored(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ganeti took the create, and the request's submit (naming its job) is not stored yet: the
    request still reads as placed, with no job. A sweep then keeps the reservation (CI once saw
    one given back: the store's write came later than a short SWEEP_AFTER on a loaded machine)."""
    monkeypatch.setattr(_reservations, "SWEEP_AFTER", 0.0)
    monkeypatch.setattr(_reservations, "SWEEP_INTERVAL", 3600.0)  # only this test's own sweeps
    async with _never_ending_creates(db_url) as (store, cp, d):
        storing, release = asyncio.Event(), asyncio.Event()
        submitted_request = store.submitted_request

        async def held(request_id: str, job_id: int, **kwargs: Any) -> Request:
            storing.set()
            await release.wait()
            return await submitted_request(request_id, job_id, **kwargs)

        monkeypatch.setattr(store, "submitted_request", held)
        request_id = await cp.request_instance(spec("vm-storing.example"))
        await asyncio.wait_for(storing.wait(), WAIT)
        request = await store.get_request(request_id)
        assert request is not None and request.job_id is None  # the store does not know the job yet
        assert await d._sweep_reservations() == 0 and d.allocator.pending("f1").count == 1
        release.set()
        submitted = await eventually(lambda: _submitted(store, request_id), what="the request submitted")
        assert submitted.job_id is not None
        assert await d._sweep_reservations() == 0 and d.allocator.pending("f1").count == 1


async def _submitted(store: Store, request_id: str) -> object:
    request = await store.get_request(request_id)
    return request if request is not None and request.status is RequestStatus.SUBMITTED else None


async def test_a_create_whose_job_the_backend_lost_is_placed_again(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backend restarts empty while a create runs (a cluster restored from a backup): Ganeti
    no longer knows the job, so its end never comes. The dispatcher finds the job gone, gives
    the room back and, Ganeti holding no instance of the request, places it again: it succeeds."""
    monkeypatch.setattr(_reservations, "SWEEP_AFTER", 0.1)
    monkeypatch.setattr(_reservations, "SWEEP_INTERVAL", 0.1)
    monkeypatch.setattr(_reservations, "LOST_AFTER", 0.3)
    monkeypatch.setattr(_reservations, "LOST_CHECK", 0.1)
    first = FakeGaneti(tls=False, op_times=QUICK | {"OP_INSTANCE_CREATE": 600.0})
    await first.__aenter__()
    port = URL(first.url).port
    settings = settings_for(db_url, [backend("f1", first)], health_interval=0.2)
    try:
        async with (
            Store(db_url) as store,
            ControlPlane(settings, store=store) as cp,
            running(Dispatcher(settings, store=store, status_server=False)) as d,
        ):
            # a few jobs first, so that the lost create's id is not the one the empty backend
            # gives next (a real cluster restored from a backup goes on from its serial)
            async with RapiClient(first.url, username=first.username, password=first.password) as rapi:
                for _ in range(3):
                    await rapi.wait_for_job(await rapi.add_cluster_tags(["warm"]))
            request_id = await cp.request_instance(spec("vm-forgotten.example"))
            lost = await eventually(lambda: _submitted(store, request_id), what="the request submitted")
            before = RESERVATIONS_RECLAIMED._value.get()
            await first.__aexit__(None, None, None)  # the backend goes ...
            first = None
            async with FakeGaneti(
                tls=False, port=port, username=settings.backends[0].username,
                password=settings.backends[0].password_value(), op_times=QUICK,
            ) as again:  # fmt: skip
                done = await cp.wait_request(request_id, timeout=60)
                assert done.status is RequestStatus.SUCCEEDED, done.error
                assert done.job_id != lost.job_id or creates(again) == 1
                assert creates(again, name="vm-forgotten.example") == 1
                assert RESERVATIONS_RECLAIMED._value.get() >= before + 1
                # the lost one given back; the new create's, once the node stats show its instance
                await eventually(lambda: d.allocator.pending("f1").count == 0, what="no room pending")
    finally:
        if first is not None:
            await first.__aexit__(None, None, None)
