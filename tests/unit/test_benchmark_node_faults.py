"""A small run of ``benchmarks/node_faults.py``, so the benchmark cannot rot; its times are not asserted."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs a benchmark script as a child process

ROOT = Path(__file__).parents[2]

FIELDS = {
    "requests", "succeeded", "failed", "lost", "sent_twice", "failed_but_exists", "placed_on_dead_after_10s",
    "makespan_s", "makespan_no_crash_s", "ratio",
}  # fmt: skip


@pytest.mark.timeout(120)
async def test_node_faults_benchmark_reports_its_figures_and_invariants() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "benchmarks/node_faults.py", "--requests", "40", "--create-seconds", "0.2",
        "--rpc-timeout", "0.5",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    (line,) = out.decode().splitlines()  # one JSON object, progress on stderr
    figures = json.loads(line)
    assert set(figures) == FIELDS
    assert figures["requests"] == 40
    assert figures["succeeded"] == 40 and figures["failed"] == 0, err.decode()
    assert figures["lost"] == 0 and figures["sent_twice"] == 0 and figures["failed_but_exists"] == 0, (
        err.decode()
    )
    assert figures["makespan_s"] > 0 and figures["makespan_no_crash_s"] > 0
