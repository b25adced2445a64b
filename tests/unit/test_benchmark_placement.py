"""A small run of ``benchmarks/placement.py``, so the benchmark cannot rot; its times are not asserted."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs a benchmark script as a child process

ROOT = Path(__file__).parents[2]

FIELDS = {
    "requests", "makespan_credit_s", "makespan_rr_s", "bound_s", "ratio_to_bound", "ratio_to_rr",
    "capacity_failures_credit", "capacity_failures_rr", "duplicates", "lost", "bound_capacity_s",
    "ratio_to_capacity_bound", "placed_credit", "placed_rr", "scenario",
}  # fmt: skip


@pytest.mark.timeout(90)
@pytest.mark.parametrize("driver", ["dispatcher", "direct"])
async def test_placement_benchmark_creates_every_instance_once(driver: str) -> None:
    # A tenth of the room per node (S 4, M 20, L 96 instances), a quarter of the times.
    process = await asyncio.create_subprocess_exec(
        sys.executable, "benchmarks/placement.py", "--requests", "60", "--time-scale", "0.25",
        "--capacity-scale", "0.1", "--json-only", "--driver", driver,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    assert not err.strip()  # --json-only: no progress
    (line,) = out.decode().splitlines()
    figures = json.loads(line)
    assert set(figures) >= FIELDS
    assert figures["requests"] == 60
    assert figures["duplicates"] == 0 and figures["lost"] == 0
    # fresh node stats and reservations: no create is sent where there is no room
    assert figures["capacity_failures_credit"] == 0
    for strategy in ("credit", "rr"):
        placed = figures[f"placed_{strategy}"]
        assert set(placed) == {"S", "M", "L"} and sum(placed.values()) == 60
        assert placed["S"] <= 4 and placed["M"] <= 20  # never over a backend's room
        assert figures[f"makespan_{strategy}_s"] > 0
    backends = figures["scenario"]["backends"]
    assert {name: b["capacity"] for name, b in backends.items()} == {"S": 4, "M": 20, "L": 96}
    assert {name: b["nodes"] for name, b in backends.items()} == {"S": 2, "M": 4, "L": 8}
    assert figures["scenario"]["create_s"] == 0.05 and figures["scenario"]["start"] is True
    assert figures["scenario"]["driver"] == driver
    # the bound (60 creates over 14 nodes at 0.05 s) and the water-filled one:
    # 60 fit with at most 5 creates per node (S 2 x 2, M 4 x 5, L 8 x 5), so 0.25 s
    assert figures["bound_s"] == pytest.approx(60 * 0.05 / 14, abs=1e-3)
    assert figures["bound_capacity_s"] == pytest.approx(0.25)
