"""Faults from Ganeti, measured once each: the figures of docs/reliability.md.

    python benchmarks/faults.py                     # every case
    python benchmarks/faults.py --cases 503,reset   # some of them

The same matrix as tests/unit/test_faults.py: HTTP faults from the fake Ganeti
(``inject_fault``), network faults from a ``ChaosProxy`` between client and fake.
Every client is made from a backend's settings (``BackendSettings.rapi_client``, so
it carries the backend's name), with ``RetryPolicy(attempts=3, backoff=0.01,
max_backoff=0.02)`` and a ``--timeout`` of 0.3 s per request.

Per case (one JSON object on stdout, progress on stderr):

* ``attempts``: tries of one failing read (``GET /2/info``), as the client's
  ``synnefo_ganeti_rapi_requests_total`` counts them; ``seen_by_server``: those that
  reached the fake or the proxy (0 when the port refuses);
* ``error_type``: the class of the read's error; ``names_backend``: its message holds
  the backend's name and URL; ``seconds_to_error``: the read's wall time;
* ``create_posts``: ``POST /2/instances`` sent for one create whose first try meets the
  fault (a fault no retry gets past: the create fails, the fault clears, it is sent again;
  a fault after which the create may have reached Ganeti, with no job found: the client
  raises ``CreateOutcomeUnknownError`` and the caller sends it again, as the dispatcher does
  after ``unknown_outcome_wait``, here 1 s);
* ``duplicates``: create jobs beyond one per request id, over the create and a
  dispatcher run of ``--requests`` requests on two backends, one faulty;
* ``other_backend_ok``: in that run every request succeeded, none was lost;
  ``dispatcher_seconds``: the run's wall time; ``faulty_failures``: the faulty
  backend's failed RAPI requests (metrics).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AsyncExitStack, suppress
from pathlib import Path
from typing import Any

import orjson

from synnefo_ganeti import ControlPlane, CreateOutcomeUnknownError, GanetiError
from synnefo_ganeti.config import Settings
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.store import RequestStatus, Store
from synnefo_ganeti.testing import FakeGaneti

HERE = Path(__file__).resolve()
sys.path[:0] = [str(HERE.parent.parent)]  # the checkout, for the matrix the tests share

from tests._fault_matrix import CASES, POLICY, QUICK, create_jobs, scene, spec  # noqa: E402
from tests._fault_matrix import rapi_requests as requests_of  # noqa: E402

CASE = {case.name: case for case in CASES}

ONCE_FAULTS = ("502", "503", "504", "reset", "hang", "slow_body")  # retrying gets past one of these


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


async def until(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not reached within {timeout:g} s")
        await asyncio.sleep(0.02)


async def read_case(case: str, timeout: float) -> dict[str, Any]:
    name = f"bench-read-{case}"
    async with scene(CASE[case], timeout=timeout) as s, s.client(name) as rapi:
        await rapi.info()
        connections, before = s.proxy.connections, requests_of(name, "GET")
        s.break_()
        started = time.perf_counter()
        error: GanetiError | None = None
        try:
            await rapi.info()
        except GanetiError as exc:
            error = exc
        seconds = time.perf_counter() - started
        attempts = int(requests_of(name, "GET") - before)
        seen = sum(f.hits for f in s.faults) if s.faults else s.proxy.connections - connections
        s.mend()
        recovered = (await rapi.info()).name == "cluster.fake.test"
    message = str(error) if error is not None else ""
    return {
        "attempts": attempts,
        "seen_by_server": seen,
        "error_type": type(error).__name__ if error is not None else None,
        "names_backend": name in message and rapi.url in message,
        "seconds_to_error": round(seconds, 3),
        "recovered": recovered,
    }


async def create_case(case: str, timeout: float) -> dict[str, Any]:
    name, rid = f"bench-create-{case}", f"bench-{case}"
    async with scene(CASE[case], timeout=timeout) as s, s.client(name) as rapi:
        posts = requests_of(name, "POST")
        if case in ONCE_FAULTS:
            s.break_(method="POST", path="/2/instances", times=1)
            try:
                job_id = await rapi.create_instance(spec("vm1"), request_id=rid)
            except CreateOutcomeUnknownError:
                # the answer lost and no job yet: never sent again by the client; the caller
                # (here, as the dispatcher does after unknown_outcome_wait) looks and sends it again
                job_id = await rapi.create_instance(spec("vm1"), request_id=rid)
        else:
            s.break_(method="POST", path="/2/instances")
            with suppress(GanetiError):  # the fault's typed error: retrying cannot get past it
                await rapi.create_instance(spec("vm1"), request_id=rid)
            s.mend()
            job_id = await rapi.create_instance(spec("vm1"), request_id=rid)
        s.mend()
        await rapi.wait_for_job(job_id, timeout=5)
        return {
            "create_posts": int(requests_of(name, "POST") - posts),
            "create_duplicates": create_jobs(rid, *s.fakes()) - 1,
            "create_instances": sum(len(f.cluster.instances) for f in s.fakes()),
        }


async def dispatcher_case(case: str, timeout: float, count: int, folder: Path) -> dict[str, Any]:
    faulty, healthy = f"bench-faulty-{case}", f"bench-healthy-{case}"
    db_url = f"sqlite:///{folder / f'{case}.db'}"
    async with (
        scene(CASE[case], timeout=timeout) as s,
        FakeGaneti(tls=s.case.tls, op_times=QUICK) as other,
        AsyncExitStack() as stack,
    ):
        good = {"name": healthy, "url": other.url, "username": other.username, "password": other.password,
                "fingerprint": other.fingerprint, "timeout": timeout}  # fmt: skip
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
        failed_before = requests_of(faulty, failed=True)
        clients = {
            b.name: await stack.enter_async_context(b.rapi_client(timeout=timeout, retry=POLICY))
            for b in settings.backends
        }
        store = await stack.enter_async_context(Store(db_url))
        cp = await stack.enter_async_context(ControlPlane(settings, store=store))
        dispatcher = Dispatcher(settings, store=store, clients=clients, status_server=False)
        task = asyncio.create_task(dispatcher.run(), name="bench dispatcher")
        started = time.perf_counter()
        try:
            await asyncio.wait_for(dispatcher.ready.wait(), 10)
            await until(
                lambda: all(dispatcher.allocator.view(n).stats_at is not None for n in (faulty, healthy))
            )
            # the requests' checks have both backends' catalogs before the fault (fetched after
            # it, the faulty one's answer could take long enough for its health to fail first)
            await cp.validate(spec("vm0.example"))
            if s.case.fake_kind is not None:
                s.break_(method="POST", path="/2/instances")
            else:
                s.break_()
            started = time.perf_counter()
            ids = [await cp.request_instance(spec(f"vm{i}.example")) for i in range(count)]
            if s.case.sent:  # creates whose fate is unknown wait for the backend to answer again
                await until(lambda: requests_of(faulty, "POST", failed=True) > 0)
                s.mend()
            done = [await cp.wait_request(rid, timeout=30) for rid in ids]
            seconds = time.perf_counter() - started
        finally:
            dispatcher.stop()
            await task
        fakes = [*s.fakes(), other]
        return {
            "other_backend_ok": all(r.status is RequestStatus.SUCCEEDED for r in done)
            and sum(len(f.cluster.instances) for f in fakes) == count,
            "dispatcher_duplicates": sum(max(0, create_jobs(rid, *fakes) - 1) for rid in ids),
            "lost": sum(1 for rid in ids if create_jobs(rid, *fakes) == 0),
            "on_healthy": sum(1 for r in done if r.backend == healthy),
            "dispatcher_seconds": round(seconds, 3),
            "faulty_failures": int(requests_of(faulty, failed=True) - failed_before),
        }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="faults-bench-") as folder:
        for case in args.cases:
            progress(f"{case}: read, create, dispatcher")
            row = await read_case(case, args.timeout)
            row |= await create_case(case, args.timeout)
            row |= await dispatcher_case(case, args.timeout, args.requests, Path(folder))
            row["duplicates"] = row.pop("create_duplicates") + row.pop("dispatcher_duplicates")
            figures[case] = row
    return {
        "policy": {"attempts": POLICY.attempts, "backoff": POLICY.backoff, "max_backoff": POLICY.max_backoff},
        "timeout": args.timeout,
        "requests": args.requests,
        "cases": figures,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASE), help=f"comma-separated, of: {', '.join(CASE)}")
    parser.add_argument("--timeout", type=float, default=0.3, help="seconds per request (default 0.3)")
    parser.add_argument("--requests", type=int, default=6, help="requests through the dispatcher (default 6)")
    args = parser.parse_args(argv)
    args.cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in args.cases if c not in CASE]
    if unknown or not args.cases:
        parser.error(f"unknown case(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(CASE)}")
    if args.requests < 1 or args.timeout <= 0:
        parser.error("--requests must be >= 1 and --timeout > 0")
    return args


if __name__ == "__main__":
    os.environ.setdefault("SYNNEFO_GANETI_LOG_LEVEL", "error")
    print(orjson.dumps(asyncio.run(main(parse_args()))).decode())
