"""A small run of ``benchmarks/reconcile.py``, so the benchmark cannot rot; its times are not asserted."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs a benchmark script as a child process

ROOT = Path(__file__).parents[2]

FIELDS = {
    "backends", "instances", "cycle_s", "serial_estimate_s", "db_queries", "drifts_found", "drifts_expected",
    "drifts_unexpected", "db_queries_small", "db_queries_2_backends", "gc_s", "cycle_cpu_s",
    "bytes_per_instance", "bytes_per_instance_bulk", "peak_rss_mb", "settled",
}  # fmt: skip


@pytest.mark.timeout(60)
async def test_reconcile_benchmark_finds_every_drift() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "benchmarks/reconcile.py", "--backends", "3", "--instances", "50", "--latency", "0.05",
        "--drift", "0.2",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    (line,) = out.decode().splitlines()  # one JSON object, progress on stderr
    figures = json.loads(line)
    assert set(figures) >= FIELDS
    assert figures["backends"] == 3 and figures["instances"] == 150
    # 10 drifts per backend, 30 in all: every kind (9) at least three times
    assert figures["drifts_expected"] == 30
    assert figures["drifts_found"] == figures["drifts_expected"]
    assert figures["drifts_unexpected"] == 0 and figures["backends_failed"] == 0
    assert figures["cycle_s"] > 0 and figures["serial_estimate_s"] > 0
    # the statements grow with the backends, not with the instances
    assert figures["db_queries"] > 0
    # a few per backend, however many instances: its reads (the live rows, the jobs not final,
    # the DESTROYED rows of orphans if any) and one write of Ganeti's values if some row's
    # differ; which of these a backend needs depends on its drifts' kinds, not on its size
    per_backend = 12
    assert figures["db_queries"] <= per_backend * figures["backends"]
    assert figures["db_queries_small"] <= per_backend * figures["backends"]
    assert figures["db_queries_2_backends"] < figures["db_queries"]
    # the fields compared, not the bulk listing: at most half its bytes (issue 15 part 4)
    assert 0 < figures["bytes_per_instance"] <= figures["bytes_per_instance_bulk"] / 2
    assert figures["peak_rss_mb"] > 0 and figures["cycle_cpu_s"] > 0
    # every instance without a drift settles by its cells (120 of 150), and those whose only
    # drift is a job's (the instance itself is as its row expects)
    assert figures["instances"] - figures["drifts_expected"] <= figures["settled"] < figures["instances"]
