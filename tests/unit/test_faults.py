"""Faults from Ganeti, the whole matrix in one place: for each fault, a read, a create, and the
dispatcher with one faulty backend beside a healthy one.

HTTP faults come from the fake Ganeti (``inject_fault``), network faults from a
:class:`ChaosProxy` between client and fake. What every case promises:

* a read makes at most ``RetryPolicy.attempts`` tries (one for what retrying cannot fix:
  401, an answer that is not JSON, a certificate that does not match), counted by the
  fake or the proxy, and ends in the error class of the matrix, whose message names the
  backend (its configured name and URL);
* a create is never duplicated: whatever the fault did, Ganeti ends with one instance and
  one create job carrying the request id;
* through the dispatcher, a faulty backend loses and duplicates nothing, the other one
  takes the work, and the faulty backend's failures show in the metrics.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
from aiohttp import web

from synnefo_ganeti import (
    ControlPlane,
    CreateOutcomeUnknownError,
    GanetiError,
    JobStatus,
    RapiClient,
)
from synnefo_ganeti.config import Settings
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.metrics import REGISTRY
from synnefo_ganeti.store import RequestStatus, Store
from synnefo_ganeti.testing import FakeGaneti
from tests._fault_matrix import (
    CASES,
    IDS,
    POLICY,
    QUICK,
    TIMEOUT,
    Case,
    create_jobs,
    rapi_requests,
    scene,
    spec,
)
from tests.helpers import PASSWORD, USER, StubRapi, eventually, json_response


def submissions(backend: str, outcome: str) -> float:
    value = REGISTRY.get_sample_value(
        "synnefo_ganeti_submissions_total", {"backend": backend, "outcome": outcome}
    )
    return value or 0.0


# -- (a) a read: bounded tries, a typed error naming the backend ------------------------------------


@pytest.mark.parametrize("case", CASES, ids=IDS)
async def test_a_read_makes_bounded_tries_and_ends_in_a_typed_error_naming_the_backend(case: Case) -> None:
    name = f"read-{case.name}"
    async with scene(case) as s, s.client(name) as rapi:
        assert (await rapi.info()).name == "cluster.fake.test"  # through the proxy, before the fault
        connections, before = s.proxy.connections, rapi_requests(name, "GET")
        s.break_()
        with pytest.raises(GanetiError) as caught:
            await rapi.info()
        error = caught.value
        assert type(error) is case.error, repr(error)
        assert error.url == s.proxy.url_for(s.fake)
        assert str(error).startswith(f"{name} ({error.url}): GET /2/info")
        assert rapi_requests(name, "GET") - before == case.attempts  # every try, counted by the client
        if case.name == "refused":
            assert s.proxy.connections == connections  # the kernel refused them all
            assert "mode=refuse not listening" in repr(s.proxy)
        else:
            assert s.seen() - (0 if s.faults else connections) == case.attempts
        if case.name == "tls_mismatch":
            assert s.impostor is not None and s.impostor.requests == 0  # no credentials went there
            assert f"the server's SHA-256 is {s.impostor.fingerprint}, not the pinned one" in str(error)
        s.mend()
        assert (await rapi.info()).name == "cluster.fake.test"
        assert "mode=pass listening" in repr(s.proxy)


# -- (b) a create: never duplicated -------------------------------------------------------------------


#: faults after which a create's fate is unknown (it may have reached Ganeti, no job shows yet)
UNKNOWN_OUTCOME = {"504", "slow_body", "malformed_json"}


@pytest.mark.parametrize("case", CASES, ids=IDS)
async def test_a_create_is_never_duplicated(case: Case) -> None:
    """The fault meets the create's first try; a fault that retrying can get past is got past by
    the client itself (looking for the job first when the create may have been sent); the others
    end in their typed error, with nothing created, and the caller's try after the fault clears
    creates it once."""
    name = f"create-{case.name}"
    rid = f"rid-{case.name}"
    async with scene(case) as s, s.client(name) as rapi:
        await rapi.info()
        posts = rapi_requests(name, "POST")
        if case.name in UNKNOWN_OUTCOME:
            # an answer lost after Ganeti may have taken the create: looked for once, never sent
            # again (a slow ganeti-rapi may queue it later); the caller asks again later
            s.break_(method="POST", path="/2/instances", times=1)
            with pytest.raises(CreateOutcomeUnknownError) as caught:
                await rapi.create_instance(spec("vm1"), request_id=rid)
            assert caught.value.request_id == rid
            assert rapi_requests(name, "POST") - posts == 1
            assert create_jobs(rid, s.fake) == 0 and not s.fake.cluster.instances
            job_id = await rapi.create_instance(spec("vm1"), request_id=rid)
        elif case.attempts > 1 and case.name != "refused":
            s.break_(method="POST", path="/2/instances", times=1)
            job_id = await rapi.create_instance(spec("vm1"), request_id=rid)
            sent = rapi_requests(name, "POST") - posts
            assert sent == (1 if case.sent else 2)  # found by its request id, else sent once more
        else:  # no retry gets past these (a refused port stays refused)
            s.break_(method="POST", path="/2/instances")
            with pytest.raises(case.error):
                await rapi.create_instance(spec("vm1"), request_id=rid)
            assert rapi_requests(name, "POST") - posts == case.attempts
            assert create_jobs(rid, s.fake) == 0 and not s.fake.cluster.instances
            s.mend()
            job_id = await rapi.create_instance(spec("vm1"), request_id=rid)
        s.mend()
        job = await rapi.wait_for_job(job_id, timeout=5)
    assert job.status is JobStatus.SUCCESS
    assert create_jobs(rid, s.fake) == 1
    assert list(s.fake.cluster.instances) == ["vm1"]
    if s.impostor is not None:
        assert create_jobs(rid, s.impostor) == 0 and not s.impostor.cluster.instances


# -- (c) the dispatcher: the healthy backend takes the work, nothing lost or sent twice ---------------


REQUESTS = 6


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", CASES, ids=IDS)
async def test_the_dispatcher_routes_around_a_faulty_backend(case: Case, tmp_path: Path) -> None:
    faulty, healthy = f"faulty-{case.name}", f"healthy-{case.name}"
    db_url = f"sqlite:///{tmp_path / 'store.db'}"
    async with (
        scene(case) as s,
        FakeGaneti(tls=case.tls, op_times=QUICK) as other,
    ):
        good = {"name": healthy, "url": other.url, "username": other.username, "password": other.password,
                "fingerprint": other.fingerprint, "timeout": TIMEOUT}  # fmt: skip
        settings = Settings(
            database={"url": db_url},
            backends=[s.settings(faulty).model_dump(), good],
            dispatcher={
                "status_port": None,
                "poll_interval": 0.05,
                "health_interval": 0.2,
                "health_timeout": 1.0,
                "stats_interval": 0.3,
                "shutdown_timeout": 5.0,
                # a create whose answer was lost is looked for this long before it goes elsewhere
                "unknown_outcome_wait": 1.0,
            },
        )
        before = {
            "rapi_failed": rapi_requests(faulty, failed=True),
            "submissions": sum(submissions(faulty, o) for o in ("refused", "error", "unknown")),
            "unknown": submissions(faulty, "unknown"),
        }
        async with AsyncExitStack() as stack:
            clients = {
                backend.name: await stack.enter_async_context(
                    backend.rapi_client(timeout=TIMEOUT, retry=POLICY)
                )
                for backend in settings.backends
            }
            store = await stack.enter_async_context(Store(db_url))
            cp = await stack.enter_async_context(ControlPlane(settings, store=store))
            dispatcher = Dispatcher(settings, store=store, clients=clients, status_server=False)
            task = asyncio.create_task(dispatcher.run(), name="faults dispatcher")
            try:
                await asyncio.wait_for(dispatcher.ready.wait(), 10)
                await eventually(
                    lambda: all(dispatcher.allocator.view(n).stats_at is not None for n in (faulty, healthy)),
                    what="node stats of both backends",
                )
                # the requests' checks have the backends' catalogs before the fault (a backend
                # that hangs would hold the first check for its catalog timeout meanwhile)
                await cp.validate(spec("vm0.example"))
                # HTTP faults meet only the creates (the faulty backend stays up and gets them);
                # network faults break the whole backend, as a network would.
                if case.fake_kind is not None:
                    s.break_(method="POST", path="/2/instances")
                else:
                    s.break_()
                ids = [await cp.request_instance(spec(f"vm{i}.example")) for i in range(REQUESTS)]
                await eventually(
                    lambda: (
                        sum(submissions(faulty, o) for o in ("refused", "error", "unknown"))
                        > before["submissions"]
                    ),
                    what="a failed submission to the faulty backend",
                )
                if case.sent:  # creates whose fate is unknown wait until the backend can be asked
                    s.mend()

                mended_early: list[bool] = []

                async def all_ended() -> bool:
                    # (on a loaded machine a create that met another fault may time out first, its
                    # fate unknown too: it waits, like those, until the backend can be asked)
                    if submissions(faulty, "unknown") > before["unknown"]:
                        if not mended_early:
                            mended_early.append(True)
                        s.mend()
                    return all([(await cp.get_request(rid)).is_final for rid in ids])

                await eventually(all_ended, timeout=120, what="every request to end")
                done = [await cp.get_request(rid) for rid in ids]
            finally:
                dispatcher.stop()
                await task
        assert [r.status for r in done] == [RequestStatus.SUCCEEDED] * REQUESTS, [r.error for r in done]
        fakes = [*s.fakes(), other]
        assert [create_jobs(rid, *fakes) for rid in ids] == [1] * REQUESTS  # none lost, none twice
        assert sum(len(fake.cluster.instances) for fake in fakes) == REQUESTS
        if not case.sent and not mended_early:
            # (mended early for a create of unknown fate, the faulty backend may take the rest)
            assert {r.backend for r in done} == {healthy}
            assert not s.fake.cluster.instances
        assert rapi_requests(faulty, failed=True) > before["rapi_failed"]


async def test_a_create_answered_with_garbage_after_ganeti_took_it_is_found_not_sent_again() -> None:
    """The fake's faults come before its handler; here Ganeti takes the create, then the answer
    is mangled on its way: the client looks for the job by its request id instead of failing."""
    taken: list[str] = []

    async def create(request: web.Request) -> web.StreamResponse:
        taken.append(request.query["reason"])
        return web.Response(body=b"<html>proxy error</html>", content_type="text/html")

    async def jobs(_request: web.Request) -> web.StreamResponse:
        op = {"OP_ID": "OP_INSTANCE_CREATE", "reason": [["gnt:user", reason, 1] for reason in taken]}
        return json_response([{
            "id": 77, "ops": [op], "status": "queued", "summary": ["INSTANCE_CREATE(vm1)"], "opstatus": ["queued"],
            "received_ts": [1, 0], "start_ts": None, "end_ts": None, "oplog": [[]], "opresult": [None],
        }])  # fmt: skip

    async with StubRapi() as stub:
        stub.route("POST", "/2/instances", create)
        stub.route("GET", "/2/jobs", jobs)
        async with RapiClient(stub.url, username=USER, password=PASSWORD, retry=POLICY) as rapi:
            assert await rapi.create_instance(spec("vm1"), request_id="garbled") == 77
    assert taken == ["synnefo-ganeti:garbled"]  # sent once
