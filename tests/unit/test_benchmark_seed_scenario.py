"""A small run of ``benchmarks/seed_scenario.py`` (the seed's 100-creates case), so it cannot rot."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs a benchmark script as a child process

ROOT = Path(__file__).parents[2]

FIELDS = [
    "requests", "makespan_ganeti_s", "makespan_opportunistic_s", "makespan_pnode_s", "limit_s",
    "ratio_to_limit_best", "duplicates", "lost",
]  # fmt: skip


@pytest.mark.timeout(300)  # child processes: slow to start on a loaded machine
async def test_seed_scenario_every_create_once_and_placement_beats_the_default() -> None:
    # 28 creates on 2 x 7 nodes, a fifth of the times: 0.2 s locked + 0.4 s unlocked per create
    process = await asyncio.create_subprocess_exec(
        sys.executable, "benchmarks/seed_scenario.py", "--requests", "28", "--time-scale", "0.2",
        "--json-only", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    assert not err.strip()  # --json-only: no progress
    (line,) = out.decode().splitlines()
    figures = json.loads(line)
    assert list(figures)[: len(FIELDS)] == FIELDS
    assert figures["requests"] == 28
    assert figures["duplicates"] == 0 and figures["lost"] == 0
    assert figures["limit_s"] == pytest.approx(2 * 0.2 + 0.4)  # ceil(28 / 14) x 0.2 + 0.4
    best = min(figures[f"makespan_{mode}_s"] for mode in ("ganeti", "opportunistic", "pnode"))
    assert figures["ratio_to_limit_best"] == pytest.approx(best / figures["limit_s"], abs=1e-3)
    # the default iallocator locks every node: a cluster's 14 locked phases one after another, then
    # the last one's unlocked phase; a loaded machine only makes that longer (a floor, not a timing)
    assert figures["makespan_ganeti_s"] >= 0.99 * (14 * 0.2 + 0.4)  # (0.99: the clocks' rounding)
    # the dispatcher's pnode locks one node a create: the phases overlap, far below that floor
    assert figures["makespan_pnode_s"] < figures["makespan_ganeti_s"]
    # (opportunistic locking's gain at this small run's scale is a timing: 15 % on a quiet machine,
    # none in a loaded CI run; the benchmark reports it, docs/benchmarks.md has full-scale figures)
    for mode in ("ganeti", "opportunistic", "pnode"):
        assert sum(figures["placed"][mode].values()) == 28
