"""A small run of ``benchmarks/watch.py``, so the benchmark cannot rot; its figures are not asserted."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs a benchmark script as a child process

ROOT = Path(__file__).parents[2]

FIELDS = {
    "db", "fs", "versions", "writer_per_s", "versions_per_s", "keeps_up", "p50_ms", "p99_ms", "lost",
    "cpu_us_per_version",
}  # fmt: skip


async def run_benchmark(*args: str) -> list[dict[str, object]]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "benchmarks/watch.py", "--versions", "400", "--paced-versions", "100", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    return [json.loads(line) for line in out.decode().splitlines()]


def check(figures: dict[str, object], db: str) -> None:
    assert set(figures) >= FIELDS
    assert figures["db"] == db and figures["fs"] == "tmpfs" and figures["versions"] == 400
    assert figures["lost"] == 0
    assert figures["paced_versions"] == 100 and figures["paced_rate"] == 1000.0
    for name in ("writer_per_s", "versions_per_s", "keeps_up", "p50_ms", "p99_ms", "cpu_us_per_version"):
        assert isinstance(figures[name], float) and figures[name] > 0, name


@pytest.mark.timeout(60)
async def test_watch_benchmark_runs_on_sqlite() -> None:
    (figures,) = await run_benchmark("--db", "sqlite", "--fs", "tmpfs")
    check(figures, "sqlite")


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("postgres_available")
async def test_watch_benchmark_runs_on_postgresql() -> None:
    (figures,) = await run_benchmark("--db", "postgresql", "--fs", "tmpfs")
    check(figures, "postgresql")
