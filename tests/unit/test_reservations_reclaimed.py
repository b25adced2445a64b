"""Every reservation is given back however its create ends or is settled (issue 27, item 7), on
both databases: a backend that lost a job in flight never reports its end, and the request is
settled by someone else (the reconciler, another process); the dispatcher gives its room back
instead of holding it "pending" for ever."""

from __future__ import annotations

import pytest

from synnefo_ganeti import ControlPlane
from synnefo_ganeti.dispatch import Dispatcher, _submitter
from synnefo_ganeti.metrics import RESERVATIONS_RECLAIMED
from synnefo_ganeti.store import RequestStatus, Store
from tests._fault_runs import QUICK
from tests.helpers import eventually, spec
from tests.unit.test_dispatcher import backend, fakes, running, settings_for


async def test_the_reservation_of_a_request_settled_elsewhere_is_given_back(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_submitter, "SWEEP_AFTER", 0.2)
    monkeypatch.setattr(_submitter, "SWEEP_INTERVAL", 0.1)
    # a create that never ends while the test runs: its job's end is never seen here
    async with fakes(1, op_times=QUICK | {"OP_INSTANCE_CREATE": 600.0}) as (f1,):
        settings = settings_for(db_url, [backend("f1", f1)])
        async with (
            Store(db_url) as store,
            ControlPlane(settings, store=store) as cp,
            running(Dispatcher(settings, store=store, status_server=False)) as d,
        ):
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
    monkeypatch.setattr(_submitter, "SWEEP_AFTER", 0.05)
    monkeypatch.setattr(_submitter, "SWEEP_INTERVAL", 0.05)
    async with fakes(1, op_times=QUICK | {"OP_INSTANCE_CREATE": 600.0}) as (f1,):
        settings = settings_for(db_url, [backend("f1", f1)])
        async with (
            Store(db_url) as store,
            ControlPlane(settings, store=store) as cp,
            running(Dispatcher(settings, store=store, status_server=False)) as d,
        ):
            request_id = await cp.request_instance(spec("vm-runs.example"))
            await eventually(lambda: _submitted(store, request_id), what="the request submitted")
            swept = await d._sweep_reservations()  # what the loop runs; nothing to give back
            assert swept == 0 and d.allocator.pending("f1").count == 1


async def _submitted(store: Store, request_id: str) -> object:
    request = await store.get_request(request_id)
    return request if request is not None and request.status is RequestStatus.SUBMITTED else None
