"""The fault matrix of tests/unit/test_faults.py and benchmarks/faults.py: the cases, and the scene
each is played in (a fake Ganeti behind a ChaosProxy, broken and mended as the case says)."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from synnefo_ganeti import (
    AuthenticationError,
    GanetiError,
    RapiClient,
    RapiConnectionError,
    RapiError,
    RapiTimeoutError,
    RetryPolicy,
    TLSError,
    UnavailableError,
)
from synnefo_ganeti.config import BackendSettings
from synnefo_ganeti.metrics import REGISTRY
from synnefo_ganeti.testing import ChaosProxy, FakeGaneti
from tests import helpers

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


#: the matrix's instances: small, so that no backend runs out of memory
spec = functools.partial(helpers.spec, memory=128)


def rapi_requests(backend: str, method: str | None = None, *, failed: bool = False) -> float:
    """``synnefo_ganeti_rapi_requests_total`` of ``backend`` (one method, or all; every outcome,
    or with ``failed`` every outcome but ``ok``)."""
    total = 0.0
    for metric in REGISTRY.collect():
        if metric.name != "synnefo_ganeti_rapi_requests":
            continue
        for sample in metric.samples:
            labels = sample.labels
            if not sample.name.endswith("_total") or labels["backend"] != backend:
                continue
            if (method is None or labels["method"] == method) and not (failed and labels["outcome"] == "ok"):
                total += sample.value
    return total


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
    timeout: float = TIMEOUT

    def settings(self, name: str) -> BackendSettings:
        return BackendSettings(
            name=name,
            url=self.proxy.url_for(self.fake),
            username=self.fake.username,
            password=self.fake.password,
            fingerprint=self.fake.fingerprint,
            timeout=self.timeout,
        )

    def client(self, name: str) -> RapiClient:
        """A client made the way the dispatcher makes them: from the backend's settings."""
        return self.settings(name).rapi_client(timeout=self.timeout, retry=POLICY)

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

    def fakes(self) -> list[FakeGaneti]:
        """The fakes a create may reach: the trusted one and, for a certificate mismatch, the impostor."""
        return [self.fake] + ([self.impostor] if self.impostor is not None else [])

    def seen(self) -> int:
        """Tries that reached the fault: the fake's fault hits, else the proxy's connections."""
        if self.faults:
            return sum(fault.hits for fault in self.faults)
        return self.proxy.connections


@asynccontextmanager
async def scene(case: Case, *, timeout: float = TIMEOUT, **fake_options: Any) -> AsyncIterator[Scene]:
    options: dict[str, Any] = {"tls": case.tls, "op_times": QUICK} | fake_options
    async with AsyncExitStack() as stack:
        fake = await stack.enter_async_context(FakeGaneti(**options))
        impostor = None
        if case.name == "tls_mismatch":
            impostor = await stack.enter_async_context(FakeGaneti(**options))
        proxy = await stack.enter_async_context(ChaosProxy("127.0.0.1", fake.port))
        yield Scene(case, fake, proxy, impostor, timeout=timeout)
