"""The RAPI metrics per backend (counted and timed in the transport), and the reconciler's drifts."""

from __future__ import annotations

from pathlib import Path

import pytest

from synnefo_ganeti import InstanceSpec, RapiClient, RapiConnectionError, RetryPolicy, UnavailableError
from synnefo_ganeti.config import BackendSettings, Settings
from synnefo_ganeti.metrics import (
    BACKEND_UP,
    DRIFT_FOUND,
    JOBS_TRACKED,
    RAPI_LATENCY,
    RAPI_LATENCY_BUCKETS,
    RAPI_REQUESTS,
    REGISTRY,
    REQUESTS,
    REQUESTS_PENDING,
    SUBMISSIONS,
)
from synnefo_ganeti.reconcile import Reconciler
from synnefo_ganeti.store import Store
from synnefo_ganeti.testing import FakeGaneti
from tests.helpers import closed_port

ONCE = RetryPolicy(attempts=1)


def requests(backend: str, method: str, outcome: str) -> float:
    value = REGISTRY.get_sample_value(
        "synnefo_ganeti_rapi_requests_total", {"backend": backend, "method": method, "outcome": outcome}
    )
    return value or 0.0


def timed(backend: str, method: str, suffix: str = "count") -> float:
    value = REGISTRY.get_sample_value(
        f"synnefo_ganeti_rapi_request_duration_seconds_{suffix}", {"backend": backend, "method": method}
    )
    return value or 0.0


def settings_of(fake: FakeGaneti, name: str, **extra: object) -> BackendSettings:
    return BackendSettings(name=name, url=fake.url, username=fake.username, password=fake.password, **extra)


async def test_an_ok_call_is_counted_and_timed_under_the_configured_name() -> None:
    async with FakeGaneti(tls=False, latency=0.02) as fake:
        count, seconds = timed("athens", "GET"), timed("athens", "GET", "sum")
        before, unnamed = requests("athens", "GET", "ok"), requests(f"127.0.0.1:{fake.port}", "GET", "ok")
        async with settings_of(fake, "athens").rapi_client(retry=ONCE) as rapi:
            assert rapi.name == "athens"
            await rapi.info()
    assert requests("athens", "GET", "ok") == before + 1
    assert timed("athens", "GET") == count + 1
    assert timed("athens", "GET", "sum") - seconds >= 0.02  # the fake's latency, on the wire
    assert requests(f"127.0.0.1:{fake.port}", "GET", "ok") == unnamed  # the name, not host:port


async def test_without_a_name_the_backend_label_is_host_and_port() -> None:
    async with FakeGaneti(tls=False) as fake:
        label = f"127.0.0.1:{fake.port}"
        before = requests(label, "GET", "ok")
        async with RapiClient(fake.url, username=fake.username, password=fake.password) as rapi:
            assert rapi.name == label
            await rapi.version()
    assert requests(label, "GET", "ok") == before + 1


async def test_a_503_is_counted_as_http_503_at_every_attempt() -> None:
    async with FakeGaneti(tls=False) as fake:
        fake.inject_fault("503", method="GET", path="/2/info")
        ok, failed = requests("sofia", "GET", "ok"), requests("sofia", "GET", "http_503")
        count = timed("sofia", "GET")
        policy = RetryPolicy(attempts=2, backoff=0.001, max_backoff=0.002)
        async with settings_of(fake, "sofia").rapi_client(retry=policy) as rapi:
            with pytest.raises(UnavailableError):
                await rapi.info()
    assert requests("sofia", "GET", "http_503") == failed + 2  # each attempt, the retry included
    assert requests("sofia", "GET", "ok") == ok
    assert timed("sofia", "GET") == count + 2  # answered: timed too


async def test_a_refused_connection_is_counted() -> None:
    port = closed_port()
    backend = BackendSettings(name="down", url=f"http://127.0.0.1:{port}", username="u", password="p")
    before, count = requests("down", "GET", "connection"), timed("down", "GET")
    async with backend.rapi_client(retry=ONCE) as rapi:
        with pytest.raises(RapiConnectionError):
            await rapi.version()
    assert requests("down", "GET", "connection") == before + 1
    assert timed("down", "GET") == count + 1


async def test_long_polls_are_counted_but_not_timed() -> None:
    fake = FakeGaneti(tls=False, op_times={"OP_INSTANCE_CREATE": 0.05})
    posts = requests("lyon", "POST", "ok")
    async with fake, settings_of(fake, "lyon").rapi_client(retry=ONCE) as rapi:
        job_id = await rapi.create_instance(InstanceSpec(name="sg-a", disk_template="diskless", os="noop"))
        assert requests("lyon", "POST", "ok") == posts + 1
        counted, count = requests("lyon", "GET", "ok"), timed("lyon", "GET")
        await rapi.wait_for_job(job_id)  # /wait long-polls, then one GET of the whole job
    assert requests("lyon", "GET", "ok") - counted >= 2
    assert timed("lyon", "GET") - count == 1


async def test_reconcile_counts_drifts_per_backend_and_kind(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'store.db'}"
    async with FakeGaneti(tls=False, op_times={"OP_INSTANCE_CREATE": 0.01}) as fake, Store(db_url) as store:
        settings = Settings(
            database={"url": db_url},
            backends=[
                {"name": "oslo", "url": fake.url, "username": fake.username, "password": fake.password}
            ],
            ownership={"prefix": "sg-", "tag": "synnefo-ganeti:owned"},
        )
        async with settings.backends[0].rapi_client(retry=ONCE) as rapi:
            job_id = await rapi.create_instance(
                InstanceSpec(
                    name="sg-orphan", disk_template="diskless", os="noop", tags=["synnefo-ganeti:owned"]
                )
            )
            await rapi.wait_for_job(job_id)
        labels = {"backend": "oslo", "kind": "orphan"}
        before = REGISTRY.get_sample_value("synnefo_ganeti_drift_found_total", labels) or 0.0
        async with Reconciler(settings, store=store) as reconciler:
            report = await reconciler.run_once()
    assert [(d.kind.value, d.instance) for d in report.drifts] == [("orphan", "sg-orphan")]
    assert REGISTRY.get_sample_value("synnefo_ganeti_drift_found_total", labels) == before + 1


def test_the_dispatcher_metrics_exist_with_their_labels() -> None:
    REQUESTS.labels("pending").inc(0)
    SUBMISSIONS.labels("athens", "ok").inc(0)
    BACKEND_UP.labels("athens").set(1)
    JOBS_TRACKED.labels("athens").set(0)
    REQUESTS_PENDING.set(0)
    names = {metric.name for metric in REGISTRY.collect()}
    assert {
        "synnefo_ganeti_rapi_requests",
        "synnefo_ganeti_rapi_request_duration_seconds",
        "synnefo_ganeti_requests",
        "synnefo_ganeti_submissions",
        "synnefo_ganeti_requests_pending",
        "synnefo_ganeti_drift_found",
        "synnefo_ganeti_backend_up",
        "synnefo_ganeti_jobs_tracked",
    } <= names
    assert RAPI_REQUESTS._labelnames == ("backend", "method", "outcome")
    assert RAPI_LATENCY._labelnames == ("backend", "method")
    assert DRIFT_FOUND._labelnames == ("backend", "kind")
    assert RAPI_LATENCY_BUCKETS[0] == 0.01 and RAPI_LATENCY_BUCKETS[-1] == 30.0
    assert REGISTRY.get_sample_value("synnefo_ganeti_backend_up", {"backend": "athens"}) == 1
