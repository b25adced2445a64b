"""``synnefo-ganeti db``, ``watch`` and ``jobs``: real databases, a real watcher process, JSON contracts."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import zipfile
from datetime import timedelta
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from synnefo_ganeti.cli import main
from synnefo_ganeti.cli._db import parse_duration
from synnefo_ganeti.jobs import parse_job_file
from synnefo_ganeti.store import Store, head_revision
from tests.helpers import QUEUE_FIXTURES, eventually

ROOT = Path(__file__).parents[2]


def run(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


async def arun(*args: str):
    return await asyncio.to_thread(run, *args)


def fixture(name: str):
    return parse_job_file((QUEUE_FIXTURES / name).read_bytes())


async def fill(url: str) -> None:
    async with Store(url) as store:
        for backend, name in (
            ("b2", "job-12.op_instance_shutdown.success.json"),
            ("b1", "job-24.multi_op.error.json"),
            ("b1", "job-11.op_instance_create.success.json"),
            ("b1", "job-21.op_instance_shutdown.queued.json"),
        ):
            await store.record(backend, fixture(name))


async def test_db_upgrade_creates_then_reports_latest(db_url) -> None:
    first = await arun("db", "upgrade", "--db", db_url, "--json")
    assert first.exit_code == 0, first.output
    created = json.loads(first.output)
    assert created["from"] is None and created["to"] == created["head"] == head_revision()
    again = await arun("db", "upgrade", "--db", db_url)
    assert again.exit_code == 0 and "latest revision" in again.output
    async with Store(db_url, create=False) as store:  # the schema is there: no create needed
        assert await store.list_jobs() == []


async def test_jobs_list_json_contract_and_filters(db_url) -> None:
    await fill(db_url)
    result = await arun("jobs", "list", "--db", db_url, "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [(row["backend"], row["job_id"]) for row in rows] == [
        ("b1", 11),
        ("b1", 21),
        ("b1", 24),
        ("b2", 12),
    ]
    by_id = {row["job_id"]: row for row in rows}
    for row in rows:
        assert {"backend", "job_id", "status", "ops", "instance"} <= set(row)
        assert all({"op_id", "status"} <= set(op) for op in row["ops"])
    assert by_id[11]["status"] == "success" and by_id[11]["instance"] == "inst4.ganeti.test"
    assert by_id[11]["ops"][0]["op_id"] == "OP_INSTANCE_CREATE"
    assert by_id[21]["status"] == "queued"
    assert [op["status"] for op in by_id[24]["ops"]] == ["success", "error", "error"]
    limited = json.loads((await arun("jobs", "list", "--db", db_url, "--json", "--limit", "2")).output)
    assert [row["job_id"] for row in limited] == [11, 21]
    b2 = json.loads((await arun("jobs", "list", "--db", db_url, "--json", "--backend", "b2")).output)
    assert [row["job_id"] for row in b2] == [12]
    failed = json.loads((await arun("jobs", "list", "--db", db_url, "--json", "--status", "error")).output)
    assert [row["job_id"] for row in failed] == [24]
    table = await arun("jobs", "list", "--db", db_url)
    assert table.exit_code == 0 and "OP_INSTANCE_CREATE:success" in table.output


async def test_jobs_show_json_and_table(db_url) -> None:
    await fill(db_url)
    result = await arun("jobs", "show", "b1", "24", "--db", db_url, "--json")
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["backend"] == "b1" and shown["job_id"] == 24 and shown["status"] == "error"
    assert "Instance 'nosuch.ganeti.test' not known" in shown["ops"][1]["error"]
    assert [event["seq"] for event in shown["events"]] == list(range(1, len(shown["events"]) + 1))
    assert shown["events"][-1]["kind"] == "job_status" and shown["events"][-1]["status"] == "error"
    table = await arun("jobs", "show", "b1", "11", "--db", db_url)
    assert table.exit_code == 0 and "OP_INSTANCE_CREATE" in table.output and "log" in table.output
    missing = await arun("jobs", "show", "b1", "999", "--db", db_url)
    assert missing.exit_code == 1 and "job 999 of backend 'b1' is not in the database" in missing.output


async def test_db_prune_by_age(db_url) -> None:
    await fill(db_url)
    kept = json.loads((await arun("db", "prune", "--db", db_url, "--older-than", "30d", "--json")).output)
    assert kept == {"events": 0, "jobs": 0, "older_than_s": 30 * 86400}
    gone = await arun("db", "prune", "--db", db_url, "--older-than", "0s")
    assert gone.exit_code == 0 and "3 jobs" in gone.output  # the queued job 21 stays
    left = json.loads((await arun("jobs", "list", "--db", db_url, "--json")).output)
    assert [(row["job_id"], row["status"]) for row in left] == [(21, "queued")]


def test_parse_duration() -> None:
    assert parse_duration("30d") == timedelta(days=30)
    assert parse_duration("1d12h") == timedelta(hours=36)
    assert parse_duration("90m") == timedelta(minutes=90)
    assert parse_duration("2w") == timedelta(weeks=2)
    for bad in ("", "30", "3x", "d", "1d junk"):
        with pytest.raises(click.BadParameter, match="not a duration"):
            parse_duration(bad)
    result = run("db", "prune", "--db", "sqlite:///x.db", "--older-than", "soon")
    assert result.exit_code == 2 and "30d" in result.output


def test_clear_errors(tmp_path) -> None:
    missing = run("jobs", "list", "--db", f"sqlite:///{tmp_path / 'none.db'}")
    assert missing.exit_code == 1 and "does not exist" in missing.output and "db upgrade" in missing.output
    assert not (tmp_path / "none.db").exists()
    scheme = run("jobs", "list", "--db", "mysql://u:pw@host/db")
    assert scheme.exit_code == 2 and "not supported" in scheme.output and "pw" not in scheme.output
    down = run("db", "upgrade", "--db", "postgresql://admin:S3cretPW@127.0.0.1:1/db")
    assert down.exit_code == 1 and "127.0.0.1:1" in down.output and "S3cretPW" not in down.output
    folder = run("db", "upgrade", "--db", f"sqlite:///{tmp_path / 'no' / 'such' / 'x.db'}")
    assert folder.exit_code == 1 and "does not exist" in folder.output
    no_db = run("jobs", "list", env={"SYNNEFO_GANETI_DB": ""})
    assert no_db.exit_code == 2 and "--db" in no_db.output


@pytest.mark.slow
async def test_watch_command_stores_and_stops_cleanly_on_sigterm(tmp_path) -> None:
    queue = tmp_path / "queue"
    (queue / "archive").mkdir(parents=True)
    url = f"sqlite:///{tmp_path / 'w.db'}"
    (queue / "job-11").write_bytes((QUEUE_FIXTURES / "job-11.op_instance_create.success.json").read_bytes())
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "synnefo_ganeti", "watch", "--queue-dir", str(queue), "--db", url,
        "--backend", "c1", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    try:
        assert process.stderr is not None
        line = await asyncio.wait_for(process.stderr.readline(), 30)
        assert b"watching" in line
        # a job written the way Ganeti does, while the watcher runs
        for version in sorted((QUEUE_FIXTURES / "lifecycle-job-20").iterdir()):
            temp = queue / "job-20-1-1.tmp"
            temp.write_bytes(version.read_bytes())
            temp.rename(queue / "job-20")
        rows: list[dict[str, object]] = []

        async def both_ended() -> bool:
            nonlocal rows
            shown = await arun("jobs", "list", "--db", url, "--json")
            rows = json.loads(shown.output) if shown.exit_code == 0 else []
            return [row["status"] for row in rows] == ["success", "success"]

        await eventually(both_ended, interval=0.1, what="both jobs listed as ended")
        assert [(row["job_id"], row["status"]) for row in rows] == [(11, "success"), (20, "success")]
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, err
    assert b"stopped after" in err


@pytest.mark.slow
def test_wheel_ships_the_migrations(tmp_path) -> None:
    """`db upgrade` from an installed package needs alembic/ inside the wheel."""
    import subprocess

    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if built.returncode != 0 and "No module named" in built.stderr and "hatchling" in built.stderr:
        built = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path), str(ROOT)],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = tmp_path.glob("synnefo_ganeti-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "synnefo_ganeti/_alembic/env.py" in names
    assert any(name.startswith("synnefo_ganeti/_alembic/versions/0001") for name in names)


@pytest.mark.slow
async def test_watch_serves_metrics_and_notifies_systemd(tmp_path) -> None:
    import re
    import socket as socket_module

    import aiohttp

    queue = tmp_path / "queue"
    (queue / "archive").mkdir(parents=True)
    (queue / "job-11").write_bytes((QUEUE_FIXTURES / "job-11.op_instance_create.success.json").read_bytes())
    notify_path = str(tmp_path / "notify")
    systemd = socket_module.socket(socket_module.AF_UNIX, socket_module.SOCK_DGRAM)
    systemd.bind(notify_path)
    systemd.setblocking(False)
    loop = asyncio.get_running_loop()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "synnefo_ganeti", "watch", "--queue-dir", str(queue),
        "--db", f"sqlite:///{tmp_path / 'w.db'}", "--backend", "c1", "--metrics-port", "0",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "300", "NOTIFY_SOCKET": notify_path},
    )  # fmt: skip
    try:
        assert process.stderr is not None
        line = (await asyncio.wait_for(process.stderr.readline(), 30)).decode()
        found = re.search(r"metrics on (http://127\.0\.0\.1:\d+)/metrics", line)
        assert found, line
        ready = await asyncio.wait_for(loop.sock_recv(systemd, 1024), 30)
        assert ready.startswith(b"READY=1")
        async with aiohttp.ClientSession() as session:

            async def ready() -> bool:
                async with session.get(found.group(1) + "/readyz") as response:
                    return response.status == 200

            await eventually(ready, interval=0.1, what="/readyz to answer 200")
            async with session.get(found.group(1) + "/metrics") as response:
                text = await response.text()
        assert 'synnefo_ganeti_watch_versions_total{backend="c1"} 1.0' in text
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.communicate(), 30)
    stopping = await asyncio.wait_for(loop.sock_recv(systemd, 1024), 10)
    systemd.close()
    assert process.returncode == 0 and stopping == b"STOPPING=1"
