"""The installed command and the benchmark against the real Ganeti testbed."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ganeti, pytest.mark.timeout(300)]

ROOT = Path(__file__).parents[2]


async def run(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env, cwd=ROOT
    )
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def cli_env(testbed) -> dict[str, str]:
    return os.environ | {
        "SYNNEFO_GANETI_RAPI_URL": testbed.url,
        "SYNNEFO_GANETI_RAPI_USERNAME": testbed.username,
        "SYNNEFO_GANETI_RAPI_PASSWORD": testbed.password,
        "SYNNEFO_GANETI_RAPI_CA_FILE": testbed.ca_file,
    }


async def test_cli_against_ganeti(testbed) -> None:
    cli = [sys.executable, "-m", "synnefo_ganeti"]
    env = cli_env(testbed)
    code, out, err = await run(*cli, "rapi", "info", "--json", env=env)
    assert code == 0, err
    assert json.loads(out)["name"] == testbed.cluster

    names = [f"sg-cli{i}-{uuid.uuid4().hex[:6]}.ganeti.test" for i in range(3)]
    code, out, err = await run(
        *cli, "rapi", "create", *names, "--os", "noop", "-t", "diskless", "--memory", "128",
        "--pnode", testbed.node, "--dry-run", "--wait", "--json", env=env,
    )  # fmt: skip
    assert code == 0, err
    rows = json.loads(out)
    assert [r["name"] for r in rows] == names
    assert all(r["status"] == "success" and isinstance(r["job_id"], int) for r in rows)

    code, out, err = await run(*cli, "rapi", "job", str(rows[0]["job_id"]), "--json", env=env)
    assert code == 0, err
    assert json.loads(out)["ops"][0]["instance_name"] == names[0]

    code, out, err = await run(*cli, "rapi", "info", env=env | {"SYNNEFO_GANETI_RAPI_PASSWORD": "Wr0ng-Pa55"})
    assert code == 1 and "HTTP 401" in err
    assert "Wr0ng-Pa55" not in out + err


async def test_submit_benchmark_runs(testbed) -> None:
    """A small run, so the benchmark cannot rot; its figures are not asserted."""
    env = os.environ | {
        "SYNNEFO_GANETI_TEST_RAPI_URL": testbed.url,
        "SYNNEFO_GANETI_TEST_RAPI_USER": testbed.username,
        "SYNNEFO_GANETI_TEST_RAPI_PASSWORD": testbed.password,
        "SYNNEFO_GANETI_TEST_RAPI_CA": testbed.ca_file,
        "SYNNEFO_GANETI_TEST_NODE": testbed.node,
        "SGTB_VERSION": testbed.series,  # its `scripts/ganeti-testbed ns` goes to this cluster
    }
    code, out, err = await run(
        sys.executable, "benchmarks/submit_real.py", "--n", "5", "--rounds", "1", env=env
    )
    assert code == 0, err
    figures = json.loads(out)
    assert set(figures) == {"n", "rounds", "ours_per_s", "sequential_per_s", "bare_per_s", "ratio_to_bare"}
    assert figures["n"] == 5 and figures["rounds"] == 1
    assert figures["ours_per_s"] > 0 and figures["bare_per_s"] > 0 and figures["ratio_to_bare"] > 0
