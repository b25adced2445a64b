"""A small run of ``benchmarks/burst.py`` (issue 31 item 4): one dispatcher, then two, on
PostgreSQL in one run; every request ends once, and each run's line carries the CPU a request
of each process and the control-to-fake ratio, and the last line the two runs side by side."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs a benchmark script and its child processes

ROOT = Path(__file__).parents[2]


@pytest.mark.timeout(400)
def test_one_then_two_dispatchers_side_by_side(postgres_available: None) -> None:
    done = subprocess.run(
        [sys.executable, "benchmarks/burst.py", "--requests", "120", "--dispatchers", "1,2"],
        capture_output=True, text=True, cwd=ROOT, timeout=380, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    runs, scale = lines[:-1], lines[-1]
    assert [run["dispatchers"] for run in runs] == [1, 2]
    for run in runs:
        assert run["offered_per_s"] is None and run["written_per_s"] > 0, run
        assert run["requests"] == 120 and run["lost"] == 0 and run["duplicates"] == 0, run
        # the dispatchers run as ``synnefo-ganeti dispatcher`` does: on uvloop (event_loop = auto)
        assert run["event_loop"].startswith("uvloop "), run
        cpu = run["cpu_ms_per_request"]
        assert set(cpu) == {"dispatchers", "api", "fake", "postgresql"}, cpu
        assert all(isinstance(cpu[k], float | int) and cpu[k] > 0 for k in ("dispatchers", "api", "fake")), (
            cpu
        )
        # the end's way to the feed, leg by leg: each leg's [p50, p99], in order on one clock
        path = run["end_path_ms"]
        assert set(path) == {"stored", "settled", "feed"}, path
        assert all(0 <= p50 <= p99 for p50, p99 in path.values()), path
        ratio = (cpu["dispatchers"] + cpu["api"] + (cpu["postgresql"] or 0)) / cpu["fake"]
        assert run["control_cpu_ratio"] == pytest.approx(ratio, rel=0.02), run
    assert scale["benchmark"] == "burst-scale"
    assert scale["scale_2_to_1"] == pytest.approx(
        runs[1]["submitted_per_s"] / runs[0]["submitted_per_s"], rel=0.02
    )
    assert scale["lost"] == 0 and scale["duplicates"] == 0
    assert set(scale["met"]) >= {"scale_2_to_1", "control_cpu_ratio", "lost", "duplicates"}


@pytest.mark.timeout(300)
def test_the_api_paced(postgres_available: None) -> None:
    """``--rate``: request k is written no sooner than k / rate seconds after the first; and
    ``--dispatcher-loop asyncio``: the dispatchers on asyncio's own loop."""
    requests, rate = 60, 40.0
    done = subprocess.run(
        [sys.executable, "benchmarks/burst.py", "--requests", str(requests), "--dispatchers", "1",
         "--rate", str(rate), "--history", "0", "--dispatcher-loop", "asyncio"],
        capture_output=True, text=True, cwd=ROOT, timeout=280, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    (run,) = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert run["lost"] == 0 and run["duplicates"] == 0, run
    assert run["offered_per_s"] == rate
    assert run["event_loop"] == "asyncio", run  # --dispatcher-loop: the standard library's loop
    # the last request came (requests - 1) / rate s after the first, at the earliest
    assert 0 < run["written_per_s"] <= round(rate * requests / (requests - 1), 1) + 0.1, run
