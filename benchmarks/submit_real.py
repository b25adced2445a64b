"""Submission throughput against a real Ganeti: our client, sequential calls, a bare aiohttp loop.

Run as root beside a running testbed (``scripts/ganeti-testbed up``)::

    python benchmarks/submit_real.py --n 50 --rounds 4

Each round submits ``n`` dry-run instance creates three ways, in an order that
rotates from round to round, with Ganeti's queue drained (every job finished,
then ``gnt-job autoarchive 0``) before each batch:

* ``ours``: ``RapiClient.create_instances`` (20 connections);
* ``sequential``: ``await RapiClient.create_instance`` one after another;
* ``bare``: aiohttp with a 20-connection connector, one POST per create, nothing else.

For the whole run a PAUSE job filter (``POST /2/filters``) keeps the submitted
jobs queued, and after each batch they are canceled, not run: otherwise Ganeti starts
up to 20 job processes within the batch, they take the machine's 2 cores from
ganeti-rapi, the rate of a batch swings between 40 and 100/s depending on how
soon that happens, and draining 50 jobs takes 20 s (2.5 jobs/s). The queue is
empty (every job final, then archived) before each batch.

Prints one JSON object: medians of submits per second, and ``ratio_to_bare``,
the median of the per-round ratios ours / bare. Details per batch go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import ssl
import statistics
import sys
import time
import uuid
from pathlib import Path

import aiohttp
import orjson

from synnefo_ganeti import InstanceSpec, RapiClient

TESTBED = Path(__file__).resolve().parents[1] / "scripts" / "ganeti-testbed"


def specs(n: int, node: str, tag: str) -> list[InstanceSpec]:
    return [
        InstanceSpec(
            name=f"bench-{tag}-{i}.ganeti.test",
            disk_template="diskless",
            os="noop",
            beparams={"memory": 128},
            pnode=node,
        )
        for i in range(n)
    ]


async def run(*argv: str) -> None:
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    _, err = await process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {err.decode().strip()}")


async def drain(rapi: RapiClient, archive: bool) -> None:
    """Cancel what is still queued, wait until every job is final, archive them all.

    Polls the job list rather than long-polling each job: 50 ``/wait`` calls in a
    row keep luxid busy for a while after, and slow the next batch down.
    """
    while True:
        pending = [job.id for job in await rapi.list_jobs() if not job.is_final]
        if not pending:
            break
        await asyncio.gather(*(rapi.cancel_job(job_id) for job_id in pending))
        await asyncio.sleep(0.2)
    if archive:
        await run(str(TESTBED), "ns", "gnt-job", "autoarchive", "0")


async def pause_jobs(rapi: RapiClient) -> str:
    """A PAUSE job filter: submitted jobs stay queued (and are canceled after the batch)."""
    return str(await rapi._write("POST", "/2/filters", {"priority": 0, "predicates": [], "action": "PAUSE"}))


async def resume_jobs(rapi: RapiClient, uuid_: str) -> None:
    await rapi._write("DELETE", f"/2/filters/{uuid_}")


async def run_ours(rapi: RapiClient, batch: list[InstanceSpec]) -> int:
    results = await rapi.create_instances(batch, dry_run=True)
    return sum(1 for r in results if not isinstance(r, int))


async def run_sequential(rapi: RapiClient, batch: list[InstanceSpec]) -> int:
    for spec in batch:
        await rapi.create_instance(spec, dry_run=True)
    return 0


async def run_bare(session: aiohttp.ClientSession, url: str, auth: str, batch: list[InstanceSpec]) -> int:
    headers = {"Authorization": auth, "Content-Type": "application/json"}

    async def post(spec: InstanceSpec) -> bool:
        async with session.post(
            f"{url}/2/instances?dry-run=1", data=orjson.dumps(spec.to_rapi_body()), headers=headers
        ) as response:
            await response.read()
            return response.status == 200

    answers = await asyncio.gather(*(post(spec) for spec in batch))
    return sum(1 for ok in answers if not ok)


async def main(args: argparse.Namespace) -> dict[str, object]:
    context = ssl.create_default_context(cafile=args.ca_file)
    context.check_hostname = False
    auth = "Basic " + base64.b64encode(f"{args.user}:{args.password}".encode()).decode()
    rates: dict[str, list[float]] = {"ours": [], "sequential": [], "bare": []}
    ratios: list[float] = []
    archive = os.geteuid() == 0 and TESTBED.exists() and not args.no_archive
    order = ["ours", "sequential", "bare"]
    async with (
        RapiClient(args.url, username=args.user, password=args.password, ca_file=args.ca_file) as rapi,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=20, ssl=context)) as session,
    ):
        await drain(rapi, archive)
        # One filter for the whole run: adding or removing one rewrites the cluster
        # config, which keeps Ganeti busy for a while and would slow the next batch.
        paused = await pause_jobs(rapi)
        try:
            for round_no in range(args.rounds):
                this_round: dict[str, float] = {}
                for kind in order[round_no % 3 :] + order[: round_no % 3]:
                    await drain(rapi, archive)
                    batch = specs(args.n, args.node, f"{kind[:3]}{round_no}-{uuid.uuid4().hex[:4]}")
                    started = time.perf_counter()
                    if kind == "ours":
                        errors = await run_ours(rapi, batch)
                    elif kind == "sequential":
                        errors = await run_sequential(rapi, batch)
                    else:
                        errors = await run_bare(session, args.url, auth, batch)
                    elapsed = time.perf_counter() - started
                    if errors:
                        raise SystemExit(f"round {round_no}, {kind}: {errors} of {args.n} submits failed")
                    this_round[kind] = args.n / elapsed
                    rates[kind].append(this_round[kind])
                    print(f"round {round_no} {kind:>10}: {this_round[kind]:7.1f} submits/s", file=sys.stderr)
                ratios.append(this_round["ours"] / this_round["bare"])
            await drain(rapi, archive)
        finally:
            await resume_jobs(rapi, paused)
    return {
        "n": args.n,
        "rounds": args.rounds,
        "ours_per_s": round(statistics.median(rates["ours"]), 1),
        "sequential_per_s": round(statistics.median(rates["sequential"]), 1),
        "bare_per_s": round(statistics.median(rates["bare"]), 1),
        "ratio_to_bare": round(statistics.median(ratios), 3),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50, help="creates per batch (default 50)")
    parser.add_argument("--rounds", type=int, default=8, help="interleaved rounds (default 8)")
    parser.add_argument(
        "--url", default=os.environ.get("SYNNEFO_GANETI_TEST_RAPI_URL", "https://127.0.0.1:5080")
    )
    parser.add_argument("--user", default=os.environ.get("SYNNEFO_GANETI_TEST_RAPI_USER", "ci"))
    parser.add_argument("--password", default=os.environ.get("SYNNEFO_GANETI_TEST_RAPI_PASSWORD", "ci"))
    parser.add_argument(
        "--ca-file", default=os.environ.get("SYNNEFO_GANETI_TEST_RAPI_CA", "/var/lib/ganeti/rapi.pem")
    )
    parser.add_argument("--node", default=os.environ.get("SYNNEFO_GANETI_TEST_NODE", "node1.ganeti.test"))
    parser.add_argument(
        "--no-archive", action="store_true", help="do not run gnt-job autoarchive between batches"
    )
    args = parser.parse_args(argv)
    if args.n < 1 or args.rounds < 1:
        parser.error("--n and --rounds must be >= 1")
    return args


if __name__ == "__main__":
    print(orjson.dumps(asyncio.run(main(parse_args()))).decode())
