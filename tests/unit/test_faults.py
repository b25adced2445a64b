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
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from synnefo_ganeti import (
    AuthenticationError,
    ControlPlane,
    GanetiError,
    InstanceSpec,
    JobStatus,
    RapiClient,
    RapiConnectionError,
    RapiError,
    RapiTimeoutError,
    RetryPolicy,
    TLSError,
    UnavailableError,
)
from synnefo_ganeti.config import BackendSettings, Settings
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.metrics import REGISTRY
from synnefo_ganeti.store import RequestStatus, Store
from synnefo_ganeti.testing import ChaosProxy, FakeGaneti
from tests.helpers import PASSWORD, USER, StubRapi, json_response

POLICY = RetryPolicy(attempts=3, backoff=0.01, max_backoff=0.02)
TIMEOUT = 0.3  # per request; the hang and the slow body outlast it
QUICK = {"OP_INSTANCE_CREATE": 0.01, "OP_INSTANCE_STARTUP": 0.01}


@dataclass(frozen=True)
class Case:
    """One fault: where it comes from, how to cause it, what a read must end in."""

    name: str
    error: type[GanetiError]
    attempts: int  # tries of one read: POLICY.attempts when retried, else 1
    fake_kind: str | None = None  # FakeGaneti.inject_fault kind
    proxy: dict[str, Any] = field(default_factory=dict)  # ChaosProxy.set_mode arguments
    tls: bool = False
    sent: bool = False  # a create reaches Ganeti before the fault (its answer is lost)


CASES = [
    Case("502", UnavailableError, POLICY.attempts, fake_kind="502"),
    Case("503", UnavailableError, POLICY.attempts, fake_kind="503"),
    Case("504", UnavailableError, POLICY.attempts, fake_kind="504"),
    Case("reset", RapiConnectionError, POLICY.attempts, proxy={"mode": "reset", "forward": True}, sent=True),
    Case("refused", RapiConnectionError, POLICY.attempts, proxy={"mode": "refuse"}),
    Case("hang", RapiTimeoutError, POLICY.attempts, proxy={"mode": "hang", "forward": True}, sent=True),
    Case("slow_body", RapiTimeoutError, POLICY.attempts, fake_kind="slow_body"),
    Case("malformed_json", RapiError, 1, fake_kind="malformed_json"),
    Case("401", AuthenticationError, 1, fake_kind="401"),
    Case("tls_mismatch", TLSError, 1, proxy={"mode": "pass"}, tls=True),
]
IDS = [case.name for case in CASES]


def spec(name: str) -> InstanceSpec:
    return InstanceSpec(name=name, disk_template="diskless", os="noop", beparams={"memory": 128})


def rapi_requests(backend: str, method: str | None = None) -> float:
    """``synnefo_ganeti_rapi_requests_total`` of ``backend`` (one method, or all), every outcome."""
    total = 0.0
    for metric in REGISTRY.collect():
        if metric.name != "synnefo_ganeti_rapi_requests":
            continue
        for sample in metric.samples:
            labels = sample.labels
            wanted = method is None or labels["method"] == method
            if sample.name.endswith("_total") and labels["backend"] == backend and wanted:
                total += sample.value
    return total


def failed_rapi_requests(backend: str) -> float:
    return rapi_requests(backend) - sum(
        REGISTRY.get_sample_value(
            "synnefo_ganeti_rapi_requests_total", {"backend": backend, "method": method, "outcome": "ok"}
        )
        or 0.0
        for method in ("GET", "POST", "PUT", "DELETE")
    )


def submissions(backend: str, outcome: str) -> float:
    value = REGISTRY.get_sample_value(
        "synnefo_ganeti_submissions_total", {"backend": backend, "outcome": outcome}
    )
    return value or 0.0


def create_jobs(rid: str, *fakes: FakeGaneti) -> int:
    """Create jobs carrying request id ``rid``, over all ``fakes``."""
    wanted = f"synnefo-ganeti:{rid}"
    return sum(
        1
        for fake in fakes
        for job in fake.cluster.jobs.values()
        for op in job.ops
        if op.op_id == "OP_INSTANCE_CREATE"
        and any(item[0] == "gnt:user" and item[1] == wanted for item in op.luxid.get("reason", []))
    )


@dataclass
class Scene:
    """A faulty backend: a fake behind a proxy, ready to break as ``case`` says.

    ``fake`` is the one the backend's settings trust; with ``tls_mismatch`` the proxy
    leads to ``impostor``, another fake with its own certificate.
    """

    case: Case
    fake: FakeGaneti
    proxy: ChaosProxy
    impostor: FakeGaneti | None = None
    faults: list[Any] = field(default_factory=list)

    def settings(self, name: str) -> BackendSettings:
        return BackendSettings(
            name=name,
            url=self.proxy.url_for(self.fake),
            username=self.fake.username,
            password=self.fake.password,
            fingerprint=self.fake.fingerprint,
            timeout=TIMEOUT,
        )

    def client(self, name: str) -> RapiClient:
        """A client made the way the dispatcher makes them: from the backend's settings."""
        return self.settings(name).rapi_client(timeout=TIMEOUT, retry=POLICY)

    def break_(self, *, method: str | None = None, path: str | None = None, times: int | None = None) -> None:
        case = self.case
        if case.fake_kind is not None:
            self.faults.append(
                self.fake.inject_fault(case.fake_kind, method=method, path=path, times=times, delay=0.2)
            )
        elif case.name == "tls_mismatch":
            assert self.impostor is not None
            self.proxy.retarget("127.0.0.1", self.impostor.port)
        else:
            mode = dict(case.proxy)
            self.proxy.set_mode(mode.pop("mode"), times=times, **mode)

    def mend(self) -> None:
        self.fake.clear_faults()
        self.proxy.retarget("127.0.0.1", self.fake.port)
        self.proxy.set_mode("pass")

    def seen(self) -> int:
        """Tries that reached the fault: the fake's fault hits, else the proxy's connections."""
        if self.faults:
            return sum(fault.hits for fault in self.faults)
        return self.proxy.connections


@asynccontextmanager
async def scene(case: Case, **fake_options: Any) -> AsyncIterator[Scene]:
    options: dict[str, Any] = {"tls": case.tls, "op_times": QUICK} | fake_options
    async with AsyncExitStack() as stack:
        fake = await stack.enter_async_context(FakeGaneti(**options))
        impostor = None
        if case.name == "tls_mismatch":
            impostor = await stack.enter_async_context(FakeGaneti(**options))
        proxy = await stack.enter_async_context(ChaosProxy("127.0.0.1", fake.port))
        yield Scene(case, fake, proxy, impostor)


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
        if case.attempts > 1 and case.name != "refused":
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


async def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout:g} s")
        await asyncio.sleep(0.02)


REQUESTS = 6


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
            },
        )
        before = {
            "rapi_failed": failed_rapi_requests(faulty),
            "submissions": sum(submissions(faulty, o) for o in ("refused", "error", "unknown")),
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
                await wait_until(
                    lambda: all(dispatcher.allocator.view(n).stats_at is not None for n in (faulty, healthy)),
                    10,
                    "node stats of both backends",
                )
                # HTTP faults meet only the creates (the faulty backend stays up and gets them);
                # network faults break the whole backend, as a network would.
                if case.fake_kind is not None:
                    s.break_(method="POST", path="/2/instances")
                else:
                    s.break_()
                ids = [await cp.request_instance(spec(f"vm{i}.example")) for i in range(REQUESTS)]
                await wait_until(
                    lambda: (
                        sum(submissions(faulty, o) for o in ("refused", "error", "unknown"))
                        > before["submissions"]
                    ),
                    10,
                    "a failed submission to the faulty backend",
                )
                if case.sent:  # creates whose fate is unknown wait until the backend can be asked
                    s.mend()
                done = [await cp.wait_request(rid, timeout=20) for rid in ids]
            finally:
                dispatcher.stop()
                await task
        assert [r.status for r in done] == [RequestStatus.SUCCEEDED] * REQUESTS, [r.error for r in done]
        fakes = [s.fake, other] + ([s.impostor] if s.impostor is not None else [])
        assert [create_jobs(rid, *fakes) for rid in ids] == [1] * REQUESTS  # none lost, none twice
        assert sum(len(fake.cluster.instances) for fake in fakes) == REQUESTS
        if not case.sent:
            assert {r.backend for r in done} == {healthy}
            assert not s.fake.cluster.instances
        assert failed_rapi_requests(faulty) > before["rapi_failed"]


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
