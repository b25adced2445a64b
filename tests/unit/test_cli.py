"""The CLI over an in-process RAPI stub: output, --json, exit codes, secrets handling."""

from __future__ import annotations

import asyncio
import json
import os

import orjson
import pytest
from aiohttp import web
from click.testing import CliRunner

from synnefo_ganeti import __version__
from synnefo_ganeti.cli import main
from tests.helpers import PASSWORD, USER, StubRapi, ganeti_error, json_response, rapi_fixture


@pytest.fixture
def password_file(tmp_path):
    path = tmp_path / "rapi-password"
    path.write_text(PASSWORD + "\n")
    path.chmod(0o600)
    return path


async def invoke(stub: StubRapi, password_file, *args: str, env: dict[str, str] | None = None):
    """Run the CLI in a thread (it calls asyncio.run) while the stub serves in this loop."""
    runner = CliRunner()
    base = ["rapi", "--url", stub.url, "--username", USER, "--password-file", str(password_file)]
    return await asyncio.to_thread(runner.invoke, main, [*base, *args], env=env, catch_exceptions=False)


def test_version() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output


async def test_info_table_and_json(password_file) -> None:
    async with StubRapi() as stub:
        stub.route("GET", "/2/info", rapi_fixture("info.json"))
        table = await invoke(stub, password_file, "info")
        as_json = await invoke(stub, password_file, "info", "--json")
    assert table.exit_code == 0 and "cluster.ganeti.test" in table.output
    assert json.loads(as_json.output)["name"] == "cluster.ganeti.test"


async def test_listings(password_file) -> None:
    async with StubRapi() as stub:
        stub.route("GET", "/2/instances", rapi_fixture("instances_bulk.json"))
        stub.route("GET", "/2/nodes", rapi_fixture("nodes_bulk.json"))
        stub.route("GET", "/2/jobs", rapi_fixture("jobs_bulk.json"))
        instances = await invoke(stub, password_file, "instances", "--json")
        nodes = await invoke(stub, password_file, "nodes")
        jobs = await invoke(stub, password_file, "jobs")
    assert len(json.loads(instances.output)) == 43
    assert json.loads(instances.output)[0]["nic.macs"] == ["aa:00:00:67:94:e3"]
    assert "node1.ganeti.test" in nodes.output and "18397/24105" in nodes.output
    assert "1014" in jobs.output and "already in the cluster" not in jobs.output  # bulk has no opresult


async def test_job_failure_exits_1_with_reason(password_file) -> None:
    async with StubRapi() as stub:
        stub.route("GET", "/2/jobs/1014", rapi_fixture("job_create_error_already_exists.json"))
        result = await invoke(stub, password_file, "job", "1014", "--json")
    assert result.exit_code == 1
    data = json.loads(result.output)
    assert data["status"] == "error" and data["failure"]["ecode"] == "already_exists"


async def test_create_many_with_wait(password_file) -> None:
    next_id = iter(range(500, 600))
    bodies = []

    async def create(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        bodies.append(body)
        if body["name"] == "taken":
            return ganeti_error(400, "Instance 'taken' is already in the cluster")
        return json_response(next(next_id))

    async def wait(request: web.Request) -> web.StreamResponse:
        return json_response({"job_info": ["success"], "log_entries": []})

    async with StubRapi() as stub:
        stub.route("POST", "/2/instances", create)
        for job_id in range(500, 503):
            stub.route("GET", f"/2/jobs/{job_id}/wait", wait)
            stub.route("GET", f"/2/jobs/{job_id}", {**rapi_fixture("job_create_success.json"), "id": job_id})
        result = await invoke(
            stub, password_file, "create", "a", "b", "taken", "c", "--os", "noop", "-t", "file",
            "--disk", "1024", "--memory", "256", "--pnode", "node1", "--tag", "owner:me", "--wait", "--json",
        )  # fmt: skip
    assert result.exit_code == 1  # one create failed
    rows = json.loads(result.output)
    assert [r["name"] for r in rows] == ["a", "b", "taken", "c"]
    assert [r.get("status") for r in rows] == ["success", "success", None, "success"]
    assert "already in the cluster" in rows[2]["error"]
    assert bodies[0]["disks"] == [{"size": 1024}] and bodies[0]["beparams"] == {"memory": 256}
    assert bodies[0]["tags"] == ["owner:me"] and bodies[0]["disk_template"] == "file"


async def test_errors_are_one_clear_line(password_file) -> None:
    async with StubRapi() as stub:
        url = stub.url
    runner = CliRunner()
    result = await asyncio.to_thread(
        runner.invoke,
        main,
        ["rapi", "--url", url, "--username", USER, "--password-file", str(password_file), "info"],
    )
    assert result.exit_code == 1
    assert "error:" in result.output and "cannot connect" in result.output
    assert PASSWORD not in result.output


def test_password_file_readable_by_others_is_refused(password_file) -> None:
    password_file.chmod(0o644)
    result = CliRunner().invoke(
        main,
        [
            "rapi",
            "--url",
            "https://x:5080",
            "--username",
            USER,
            "--password-file",
            str(password_file),
            "info",
        ],
    )
    assert result.exit_code == 2
    assert "readable by others" in result.output and "chmod 600" in result.output


def test_missing_password_says_how_to_give_it() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNNEFO_GANETI_RAPI")}
    result = CliRunner(env=env).invoke(main, ["rapi", "--url", "https://x:5080", "--username", USER, "info"])
    assert result.exit_code == 2
    assert "--password-file" in result.output


async def test_password_from_environment(password_file) -> None:
    async with StubRapi() as stub:
        stub.route("GET", "/2/info", rapi_fixture("info.json"))
        runner = CliRunner()
        args = ["rapi", "--url", stub.url, "--username", USER, "info", "--json"]
        result = await asyncio.to_thread(
            runner.invoke, main, args, env={"SYNNEFO_GANETI_RAPI_PASSWORD": PASSWORD}
        )
    assert result.exit_code == 0, result.output
