"""A small run of ``benchmarks/deletes.py``, so the benchmark cannot rot; its times are not asserted."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs a benchmark script as a child process

ROOT = Path(__file__).parents[2]

FIELDS = {
    "db", "requests", "deleted", "destroyed", "came_back", "kept_started", "refused_busy", "delete_call_p50_ms",
    "delete_call_p99_ms", "delete_call_max_ms", "delete_call_p50_ms_by_stage", "create_s", "ratio",
    "to_destroyed_p50_s", "to_destroyed_p99_s",
}  # fmt: skip


@pytest.mark.timeout(180)
async def test_deletes_benchmark_reports_its_figures_and_invariants() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "benchmarks/deletes.py", "--requests", "20", "--create-seconds", "0.5",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    (line,) = out.decode().splitlines()  # one JSON object, progress on stderr
    figures = json.loads(line)
    assert set(figures) == FIELDS
    assert (figures["requests"], figures["deleted"]) == (20, 15)
    assert figures["destroyed"] == 15 and figures["came_back"] == 0, err.decode()
    assert figures["refused_busy"] == 0 and figures["kept_started"] == 5, err.decode()
    assert set(figures["delete_call_p50_ms_by_stage"]) == {"pending", "sent", "stopping"}
