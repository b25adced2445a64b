"""A run of ``benchmarks/db_faults.py``, so the figures of docs/reliability.md cannot rot.

Its shape and invariants are asserted (nothing lost, no secret found), not its timings.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from tests._private_pg import require_private_pg

pytestmark = pytest.mark.slow  # runs a benchmark script as a child process

ROOT = Path(__file__).parents[2]


@pytest.mark.timeout(300)  # child processes: slow to start on a loaded machine
@pytest.mark.usefixtures("postgres_available")
async def test_db_faults_benchmark_prints_its_figures() -> None:
    require_private_pg()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "benchmarks/db_faults.py", "--creates", "100",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    (line,) = out.decode().splitlines()
    figures = json.loads(line)
    assert set(figures) == {"pg_restart", "sqlite_locked", "security"}

    pg = figures["pg_restart"]
    assert set(pg) >= {"versions", "jobs", "events_stored", "events_expected_min", "lost", "retries",
                       "outage_s", "recovered_after_s"}  # fmt: skip
    assert "problems" not in pg
    assert pg["jobs"] == 100 and pg["versions"] >= 100 * 7
    assert pg["lost"] == 0 and pg["retries"] > 0
    assert pg["events_expected_min"] <= pg["events_stored"] <= pg["events_expected_max"]
    assert pg["outage_s"] > 0 and pg["recovered_after_s"] is not None

    locked = figures["sqlite_locked"]
    assert set(locked) >= {"waited_s", "error", "lost"}
    assert locked["lost"] == 0 and locked["held"] > 0
    assert "is locked by another process" in locked["error"]
    assert locked["waited_s"] >= locked["busy_timeout_s"]

    security = figures["security"]
    assert security["secrets_found"] == 0 and "where" not in security
    assert security["lines_scanned"] > 500
