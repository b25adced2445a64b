"""A small run of ``benchmarks/faults.py``, so the benchmark cannot rot; its times are not asserted."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs a benchmark script as a child process

ROOT = Path(__file__).parents[2]

FIELDS = {
    "attempts", "seen_by_server", "error_type", "names_backend", "seconds_to_error", "recovered", "create_posts",
    "create_instances", "duplicates", "other_backend_ok", "lost", "on_healthy", "dispatcher_seconds",
    "faulty_failures",
}  # fmt: skip


@pytest.mark.timeout(60)
async def test_faults_benchmark_reports_every_case_and_its_invariants() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "benchmarks/faults.py", "--cases", "503,reset,401", "--requests", "3",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    (line,) = out.decode().splitlines()  # one JSON object, progress on stderr
    figures = json.loads(line)
    assert figures["policy"]["attempts"] == 3 and figures["requests"] == 3
    cases = figures["cases"]
    assert list(cases) == ["503", "reset", "401"]
    for name, row in cases.items():
        assert set(row) == FIELDS, name
        assert row["duplicates"] == 0 and row["lost"] == 0, name
        assert row["other_backend_ok"] is True and row["names_backend"] is True, name
        assert row["recovered"] is True and row["create_instances"] == 1, name
        assert row["faulty_failures"] > 0, name
    assert [cases[n]["attempts"] for n in cases] == [3, 3, 1]
    assert [cases[n]["error_type"] for n in cases] == [
        "UnavailableError",
        "RapiConnectionError",
        "AuthenticationError",
    ]
    assert cases["reset"]["create_posts"] == 1  # the reset answer's job was found, not sent again
