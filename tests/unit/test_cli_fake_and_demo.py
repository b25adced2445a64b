"""``synnefo-ganeti fake-ganeti`` and ``synnefo-ganeti demo``, run as a user runs them."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from synnefo_ganeti import RapiClient
from synnefo_ganeti.cli import main

ROOT = Path(__file__).parents[2]


@pytest.mark.slow
async def test_fake_ganeti_command_serves_until_sigterm(tmp_path) -> None:
    queue = tmp_path / "q"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "synnefo_ganeti", "fake-ganeti", "--port", "0", "--queue-dir", str(queue),
        "--nodes", "2", "--op-time", "OP_INSTANCE_CREATE=0.01", "--json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        text = b""
        while not text.rstrip().endswith(b"}"):
            text += await asyncio.wait_for(process.stdout.readline(), 30)
        details = json.loads(text)
        assert details["url"].startswith("https://127.0.0.1:") and details["queue_dir"] == str(queue)
        async with RapiClient(
            details["url"],
            username=details["username"],
            password=details["password"],
            ca_file=details["ca_file"],
        ) as rapi:
            assert len(await rapi.list_nodes()) == 2
        assert (queue / "version").exists()
    finally:
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 10) == 0


def test_fake_ganeti_refuses_bad_knobs() -> None:
    result = CliRunner().invoke(main, ["fake-ganeti", "--op-time", "create"])
    assert result.exit_code == 2 and "OP_ID=SECONDS" in result.output
    result = CliRunner().invoke(main, ["fake-ganeti", "--latency", "-1"])
    assert result.exit_code == 2 and "--latency" in result.output


async def test_fake_ganeti_reports_a_busy_port() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        result = await asyncio.to_thread(CliRunner().invoke, main, ["fake-ganeti", "--port", str(port)])
    finally:
        server.close()
    assert result.exit_code == 1 and f"cannot listen on 127.0.0.1:{port}" in result.output


@pytest.mark.slow
@pytest.mark.timeout(150)
async def test_demo_end_to_end_json() -> None:
    """Three fake clusters, the dispatcher, durable requests, an outage and a drift: every promise kept."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "synnefo_ganeti", "demo", "--count", "40", "--speed", "4", "--json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=os.environ | {"COLUMNS": "120"},
    )  # fmt: skip
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    report = json.loads(out)
    assert report["requests"] == report["succeeded"] == 40
    assert report["failed"] == report["canceled"] == 0
    # counted from the fake clusters' own state, not from the dispatcher's bookkeeping
    assert report["instances_in_ganeti"] == 40 and report["duplicates"] == 0 and report["lost"] == 0
    assert set(report["per_backend"]) <= {"small", "medium", "large"}
    assert sum(sum(counts.values()) for counts in report["per_backend"].values()) == 40
    # the outage: seen by the health checks, stored as backend events, nothing placed there meanwhile
    assert report["backend_down_seen"] and report["backend_up_again_seen"]
    assert report["placed_on_down_backend"] == 0
    assert any(line.startswith("small down:") for line in report["backend_events"])
    assert any(line.startswith("small up:") for line in report["backend_events"])
    # the drift injected at the end was found and repaired by the reconciler
    assert report["drift_repaired"] and "operstate" in report["drift"]
    # every create job's final status is in the database (watcher for small/large, /wait for medium)
    assert report["stored_final_matching"] == 40
    assert report["stored_events"] >= 40 * 3


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_demo_table_and_summary() -> None:
    result = CliRunner().invoke(main, ["demo", "--count", "20", "--speed", "4"])
    assert result.exit_code == 0, result.output
    assert "demo summary" in result.output and "duplicates (created twice)" in result.output
    assert "drift: demo-" in result.output and "backend event: small down" in result.output


def test_demo_names_the_failing_step(monkeypatch) -> None:
    from synnefo_ganeti.rapi import RapiClient

    async def broken(self) -> int:
        from synnefo_ganeti import RapiConnectionError

        raise RapiConnectionError("https://x: cannot connect", url="https://x")

    monkeypatch.setattr(RapiClient, "version", broken)
    result = CliRunner().invoke(main, ["demo", "--count", "10"])
    assert result.exit_code == 1
    assert "demo step 'connect' failed" in result.output and "cannot connect" in result.output


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_submit_fake_benchmark_runs() -> None:
    """A small run, so the benchmark cannot rot; its figures are not asserted."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "benchmarks/submit_fake.py", "--n", "40", "--sequential-n", "3", "--cpu-n", "80",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    figures = json.loads(out)
    assert set(figures) == {
        "n", "seconds", "ours_per_s", "limit_per_s", "ratio_to_limit", "sequential_per_s",
        "client_cpu_ms_per_submit", "bare_cpu_ms_per_submit", "client_cpu_ratio_to_bare",
    }  # fmt: skip
    assert figures["n"] == 40 and figures["limit_per_s"] == 100.0 and figures["ours_per_s"] > 0
