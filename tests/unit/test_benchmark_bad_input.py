"""A run of ``benchmarks/bad_input.py``, so the benchmark cannot rot; its invariants, never its times."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_bad_input import BAD_FILES, CONFIGS, GOOD_BEFORE

pytestmark = pytest.mark.slow  # runs a benchmark script as a child process

ROOT = Path(__file__).parents[2]

WATCHER_FIELDS = {
    "bad_versions", "bad_files_counted", "log_lines", "good_jobs_before", "good_jobs_after_intact",
    "new_job_stored", "rescans",
}  # fmt: skip
CONFIG_CASES = {f"config_{name}" for name in [*CONFIGS, "unknown_backend"]}
OTHER_CASES = {"unknown_names", "temp_names", "queue_dir_recreated", "permission_denied", "inotify_overflow"}


async def run_benchmark(*args: str) -> dict[str, Any]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "benchmarks/bad_input.py", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    figures: dict[str, Any] = json.loads(out)  # one JSON object
    return figures


@pytest.mark.timeout(60)
async def test_bad_input_benchmark_runs() -> None:
    cases = await run_benchmark("--retry-interval", "0.2")
    assert set(cases) == {*BAD_FILES, *OTHER_CASES, *CONFIG_CASES}
    for name in [*BAD_FILES, *OTHER_CASES]:
        figures = cases[name]
        assert set(figures) >= WATCHER_FIELDS, name
        # nothing stored is lost, and the watcher still works
        assert figures["good_jobs_before"] == figures["good_jobs_after_intact"] == len(GOOD_BEFORE), name
        assert figures["new_job_stored"] is True, name
    for name in [*BAD_FILES, "permission_denied", "inotify_overflow"]:
        figures = cases[name]
        # one count and one line per bad version, none more when a rescan reads it again
        assert figures["bad_files_counted"] == figures["bad_versions"] == figures["log_lines"] >= 1, name
        assert figures["recounted_on_rescan"] == 0, name
        assert "skipping job file" in figures["message"] or name == "inotify_overflow", name
    for name in [*BAD_FILES, "permission_denied"]:
        assert cases[name]["stored_after_fix"] is True, name
    for name in ("unknown_names", "temp_names"):
        assert cases[name]["bad_files_counted"] == cases[name]["log_lines"] == cases[name]["junk_stored"] == 0
    assert cases["temp_names"]["stored_after_rename"] is True
    overflow = cases["inotify_overflow"]
    assert overflow["rescans"] == {"overflow": 1, "watch_lost": 0}
    assert overflow["events_lost"] > 0 and overflow["lost_jobs_stored_after_rescan"] == 2
    recreated = cases["queue_dir_recreated"]
    assert recreated["rescans"] == {"overflow": 0, "watch_lost": 1} and recreated["log_lines"] == 3
    assert isinstance(recreated["recovered_seconds"], float) and recreated["retry_interval"] == 0.2
    for name in CONFIG_CASES:
        figures = cases[name]
        assert figures["exit_code"] == 2 and figures["message_lines"] >= 1, name
        assert figures["names_file"] is True and figures["names_key"] is True, name
        assert figures["secrets_in_output"] == figures["db_rows_changed"] == 0 < figures["db_rows_before"], (
            name
        )
