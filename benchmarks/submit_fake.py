"""Submission throughput and client CPU cost against the fake Ganeti.

    python benchmarks/submit_fake.py            # n=500, cpu-n=2000
    python benchmarks/submit_fake.py --n 50 --cpu-n 200

Part 1, throughput: a fake Ganeti in its own process, HTTPS, 20 clients at a time,
200 ms per answer (uniform within ±10%, as a real server varies: with a fixed
latency all 20 connections move in lockstep and every round pays their setup
at once), so the server allows 100 submits/s. ``n`` dry-run creates through
``RapiClient.create_instances``; then a few sequential ``create_instance`` calls.

Part 2, the client's own CPU: a zero-latency fake in its own process, answering as
Ganeti does (TLS, connection closed after each answer). ``cpu-n`` creates through
``create_instances`` and ``cpu-n`` through a bare aiohttp loop with the same
concurrency (20), interleaved in 4 rounds; the CPU time of this (client) process
per submit, for each.

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import ssl
import statistics
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson

from synnefo_ganeti import InstanceSpec, RapiClient

MAX_CLIENTS = 20
LATENCY = 0.2


@asynccontextmanager
async def fake_process(*args: str) -> AsyncIterator[dict[str, Any]]:
    """Run ``synnefo-ganeti fake-ganeti`` in another process; yield its URL and credentials."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "synnefo_ganeti", "fake-ganeti", "--port", "0", "--json", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        text = b""
        while not text.rstrip().endswith(b"}"):
            line = await asyncio.wait_for(process.stdout.readline(), 30)
            if not line:
                _, err = await process.communicate()
                raise SystemExit(f"the fake Ganeti did not start: {err.decode().strip()}")
            text += line
        yield json.loads(text)
    finally:
        if process.returncode is None:
            process.terminate()
            await process.wait()


def specs(n: int, tag: str) -> list[InstanceSpec]:
    return [
        InstanceSpec(
            name=f"bench-{tag}-{i}.fake.test", disk_template="diskless", os="noop", beparams={"memory": 128}
        )
        for i in range(n)
    ]


def client(fake: dict[str, Any]) -> RapiClient:
    return RapiClient(
        fake["url"], username=fake["username"], password=fake["password"], ca_file=fake["ca_file"],
        max_connections=MAX_CLIENTS,
    )  # fmt: skip


async def throughput(n: int, sequential_n: int) -> dict[str, float]:
    args = ("--latency", str(LATENCY), "--jitter", "0.1", "--max-clients", str(MAX_CLIENTS))
    async with fake_process(*args) as fake, client(fake) as rapi:
        await rapi.version()
        started = time.perf_counter()
        results = await rapi.create_instances(specs(n, "t"), dry_run=True)
        seconds = time.perf_counter() - started
        failed = [r for r in results if not isinstance(r, int)]
        if failed:
            raise SystemExit(f"{len(failed)} of {n} creates failed, first: {failed[0]}")
        started = time.perf_counter()
        for spec in specs(sequential_n, "s"):
            await rapi.create_instance(spec, dry_run=True)
        sequential_seconds = time.perf_counter() - started
    limit = MAX_CLIENTS / LATENCY
    return {
        "seconds": round(seconds, 3),
        "ours_per_s": round(n / seconds, 1),
        "limit_per_s": limit,
        "ratio_to_limit": round(n / seconds / limit, 3),
        "sequential_per_s": round(sequential_n / sequential_seconds, 2),
    }


async def bare_loop(session: aiohttp.ClientSession, fake: dict[str, Any], batch: list[InstanceSpec]) -> None:
    auth = "Basic " + base64.b64encode(f"{fake['username']}:{fake['password']}".encode()).decode()
    headers = {"Authorization": auth, "Content-Type": "application/json"}
    url = f"{fake['url']}/2/instances?dry-run=1"

    async def post(spec: InstanceSpec) -> None:
        async with session.post(url, data=orjson.dumps(spec.to_rapi_body()), headers=headers) as response:
            await response.read()
            if response.status != 200:
                raise SystemExit(f"bare loop: HTTP {response.status}")

    await asyncio.gather(*(post(spec) for spec in batch))


async def cpu_cost(n: int, rounds: int = 4) -> dict[str, float]:
    per_round = max(1, n // rounds)
    ours: list[float] = []
    bare: list[float] = []
    async with fake_process("--max-clients", str(MAX_CLIENTS)) as fake:
        context = ssl.create_default_context(cafile=fake["ca_file"])
        context.check_hostname = False
        async with (
            client(fake) as rapi,
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=MAX_CLIENTS, ssl=context)) as session,
        ):
            await rapi.version()
            for round_no in range(rounds):
                for kind in ("ours", "bare") if round_no % 2 == 0 else ("bare", "ours"):
                    batch = specs(per_round, f"{kind}{round_no}")
                    cpu = time.process_time()
                    if kind == "ours":
                        await rapi.create_instances(batch, dry_run=True)
                        ours.append((time.process_time() - cpu) * 1000 / per_round)
                    else:
                        await bare_loop(session, fake, batch)
                        bare.append((time.process_time() - cpu) * 1000 / per_round)
    client_ms = statistics.median(ours)
    bare_ms = statistics.median(bare)
    return {
        "client_cpu_ms_per_submit": round(client_ms, 3),
        "bare_cpu_ms_per_submit": round(bare_ms, 3),
        "client_cpu_ratio_to_bare": round(client_ms / bare_ms, 3),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {"n": args.n}
    figures |= await throughput(args.n, args.sequential_n)
    figures |= await cpu_cost(args.cpu_n)
    return figures


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=500, help="creates for the throughput part (default 500)")
    parser.add_argument("--sequential-n", type=int, default=20, help="sequential creates (default 20)")
    parser.add_argument(
        "--cpu-n", type=int, default=2000, help="creates per client in the CPU part (default 2000)"
    )
    args = parser.parse_args(argv)
    if min(args.n, args.sequential_n, args.cpu_n) < 1:
        parser.error("counts must be >= 1")
    return args


if __name__ == "__main__":
    os.environ.setdefault("SYNNEFO_GANETI_LOG_LEVEL", "error")
    print(orjson.dumps(asyncio.run(main(parse_args()))).decode())
