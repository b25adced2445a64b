"""One CLI shape: --config on every command that reads the database, --json on every listing,
no emoji or markup read into what is printed, empty listings said on a line, watch supervised."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from synnefo_ganeti.cli import main
from synnefo_ganeti.jobs import parse_job_file
from synnefo_ganeti.store import InstanceStatus, Store
from synnefo_ganeti.watch import QueueWatcher
from tests.helpers import PASSWORD, QUEUE_FIXTURES, USER, StubRapi

FINGERPRINT = "6B:5D:EA:CD:20:" + ":".join(["AB"] * 27)


def needs_main_thread() -> None:
    """The command installs signal handlers (only the main thread can) and the test sends itself SIGTERM."""
    if threading.current_thread() is not threading.main_thread():
        if os.environ.get("CI"):
            pytest.fail("signal handlers need the main thread, and CI must run this test")
        pytest.skip("signal handlers need the main thread")


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


async def arun(*args: str) -> Result:
    return await asyncio.to_thread(run, *args)


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("SYNNEFO_GANETI") or name == "NOTIFY_SOCKET":
            monkeypatch.delenv(name)


@pytest.fixture
def database(tmp_path: Path) -> tuple[str, Path]:
    """(an upgraded SQLite database's URL, a config file naming it)."""
    url = f"sqlite:///{tmp_path / 'sg.db'}"
    config = tmp_path / "sg.toml"
    config.write_text(f'[database]\nurl = "{url}"\n')
    return url, config


def _leaves(group: click.Group, prefix: str = "") -> list[tuple[str, click.Command]]:
    found = []
    for name, command in sorted(group.commands.items()):
        path = f"{prefix} {name}".strip()
        if isinstance(command, click.Group):
            found += _leaves(command, path)
        else:
            found.append((path, command))
    return found


def _options(command: click.Command) -> set[str]:
    return {opt for param in command.params for opt in getattr(param, "opts", [])}


# -- --config --------------------------------------------------------------------------------------


async def test_config_on_jobs_and_db_commands(database: tuple[str, Path]) -> None:
    url, config = database
    upgraded = await arun("db", "upgrade", "--config", str(config), "--json")
    assert upgraded.exit_code == 0, upgraded.output
    assert json.loads(upgraded.output)["to"] is not None
    async with Store(url) as store:
        job = parse_job_file((QUEUE_FIXTURES / "job-11.op_instance_create.success.json").read_bytes())
        await store.record("b1", job)
    listed = await arun("jobs", "list", "--config", str(config), "--json")
    assert listed.exit_code == 0 and [j["job_id"] for j in json.loads(listed.output)] == [11]
    shown = await arun("jobs", "show", "b1", "11", "--config", str(config), "--json")
    assert shown.exit_code == 0 and json.loads(shown.output)["job_id"] == 11
    pruned = await arun("db", "prune", "--config", str(config), "--older-than", "30d", "--json")
    assert pruned.exit_code == 0 and json.loads(pruned.output)["jobs"] == 0


async def test_db_overrides_the_config_file(database: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = database
    assert (await arun("db", "upgrade", "--db", url)).exit_code == 0
    elsewhere = tmp_path / "elsewhere.toml"
    elsewhere.write_text(f'[database]\nurl = "sqlite:///{tmp_path / "missing.db"}"\n')
    from_file = await arun("jobs", "list", "--config", str(elsewhere))
    assert from_file.exit_code == 1 and "missing.db does not exist" in from_file.output
    overridden = await arun("jobs", "list", "--config", str(elsewhere), "--db", url, "--json")
    assert overridden.exit_code == 0 and json.loads(overridden.output) == []
    assert not (tmp_path / "missing.db").exists()


def test_config_from_the_environment(database: tuple[str, Path]) -> None:
    url, config = database
    assert run("db", "upgrade", "--db", url).exit_code == 0
    listed = run("jobs", "list", "--json", env={"SYNNEFO_GANETI_CONFIG": str(config)})
    assert listed.exit_code == 0 and json.loads(listed.output) == []


def test_no_config_and_no_db_is_a_usage_error() -> None:
    for command in (["jobs", "list"], ["jobs", "show", "b", "1"], ["db", "upgrade"], ["db", "prune"]):
        extra = ["--older-than", "1d"] if command == ["db", "prune"] else []
        result = run(*command, *extra)
        assert result.exit_code == 2, (command, result.output)
        assert "--config FILE" in result.output and "--db URL" in result.output


def test_a_bad_config_file_is_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[database]\nurl = 5\n")
    result = run("jobs", "list", "--config", str(bad))
    assert result.exit_code == 2 and f"config file {bad}: database.url" in result.output


def test_every_command_that_reads_the_database_takes_config() -> None:
    readers = {
        "backends drain", "backends events", "backends list", "backends undrain", "db prune", "db upgrade",
        "dispatcher", "instances list", "instances show", "jobs list", "jobs show", "reconcile",
        "requests cancel", "requests list", "requests show", "submit", "watch",
    }  # fmt: skip
    leaves = dict(_leaves(main))
    assert readers <= set(leaves)
    for name in readers:
        assert "--config" in _options(leaves[name]), name
    for name in ("db prune", "db upgrade", "jobs list", "jobs show", "watch"):
        assert "--db" in _options(leaves[name]), name


# -- --json ----------------------------------------------------------------------------------------


def test_every_listing_has_json() -> None:
    not_listings = {"dispatcher", "watch"}  # daemons: they print no listing
    for name, command in _leaves(main):
        if name not in not_listings:
            assert "--json" in _options(command), name


async def test_empty_listings_as_json_are_empty_lists(database: tuple[str, Path]) -> None:
    url, config = database
    assert (await arun("db", "upgrade", "--db", url)).exit_code == 0
    for command in (
        ["jobs", "list"], ["instances", "list"], ["requests", "list"], ["backends", "events"],
    ):  # fmt: skip
        result = await arun(*command, "--config", str(config), "--json")
        assert result.exit_code == 0 and json.loads(result.stdout) == [], command


# -- empty listings --------------------------------------------------------------------------------


async def test_empty_listings_say_so_on_a_line(database: tuple[str, Path]) -> None:
    url, config = database
    assert (await arun("db", "upgrade", "--db", url)).exit_code == 0
    for command, line in (
        (["jobs", "list"], "no jobs stored"),
        (["jobs", "list", "--backend", "x"], "no jobs stored matching the filters"),
        (["instances", "list"], "no instances stored"),
        (["requests", "list"], "no requests stored"),
        (["backends", "events"], "no backend events stored"),
    ):
        result = await arun(*command, "--config", str(config))
        assert result.exit_code == 0, (command, result.output)
        assert result.stdout.splitlines() == [line], (command, result.stdout)


@pytest.fixture
def password_file(tmp_path: Path) -> Path:
    path = tmp_path / "rapi-password"
    path.write_text(PASSWORD + "\n")
    path.chmod(0o600)
    return path


async def test_empty_rapi_listings_say_so(password_file: Path) -> None:
    async with StubRapi() as stub:
        for path in ("/2/instances", "/2/nodes", "/2/jobs"):
            stub.route("GET", path, [])
        base = ["rapi", "--url", stub.url, "--username", USER, "--password-file", str(password_file)]
        for command, line in (
            ("nodes", "no nodes"),
            ("instances", "no instances"),
            ("jobs", "no unarchived jobs"),
        ):
            result = await arun(*base, command)
            assert result.exit_code == 0 and result.stdout.splitlines() == [line], (command, result.output)
            as_json = await arun(*base, command, "--json")
            assert json.loads(as_json.stdout) == []


# -- no emoji, no markup ---------------------------------------------------------------------------


class _StubFake:
    """Stands in for FakeGaneti in ``fake-ganeti``: a fingerprint with ``:CD:`` in it, and SIGTERM soon."""

    def __init__(self, **_: Any) -> None:
        self.url = "https://127.0.0.1:5080"
        self.username = "fake"
        self.password = "pw"
        self.ca_file = "/tmp/ca.pem"
        self.fingerprint = FINGERPRINT
        self.queue_dir = "/tmp/queue"
        self.version = "3.0"
        self.cluster = SimpleNamespace(
            model=SimpleNamespace(version=SimpleNamespace(software_version="3.0.2"))
        )

    async def start(self) -> None:
        # the command installs its SIGTERM handler before it awaits anything after start()
        asyncio.get_running_loop().call_soon(os.kill, os.getpid(), signal.SIGTERM)

    async def stop(self) -> None:
        pass


def test_fake_table_shows_the_fingerprint_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    needs_main_thread()
    from synnefo_ganeti.cli import _fake

    monkeypatch.setattr(_fake, "FakeGaneti", _StubFake)
    result = run("fake-ganeti", "--port", "0")
    assert result.exit_code == 0, result.output
    assert FINGERPRINT in result.stdout and "💿" not in result.stdout


async def test_tables_print_emoji_codes_and_brackets_as_they_are(database: tuple[str, Path]) -> None:
    url, config = database
    async with Store(url) as store:
        await store.add_instance(
            "b1", "vm1", status=InstanceStatus.STARTED, tags=["EA:CD:20", "[bold]x[/]", ":smile:"]
        )
    listed = await arun("instances", "list", "--config", str(config))
    assert listed.exit_code == 0, listed.output
    assert "EA:CD:20" in listed.stdout and "[bold]x[/]" in listed.stdout and ":smile:" in listed.stdout
    shown = await arun("instances", "show", "b1", "vm1", "--config", str(config))
    assert shown.exit_code == 0 and "EA:CD:20" in shown.stdout and "[bold]x[/]" in shown.stdout
    missing = await arun("instances", "show", "b1", "[red]:cd:", "--config", str(config))
    assert missing.exit_code == 1 and "instance [red]:cd: of backend 'b1'" in missing.stderr


# -- watch under its supervisor --------------------------------------------------------------------


def test_watch_exits_1_with_the_traceback_when_a_root_task_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    needs_main_thread()

    async def broken(self: QueueWatcher) -> None:
        await asyncio.sleep(0.05)  # a stub watcher: runs a moment, then fails
        raise RuntimeError("boom in the watcher")

    monkeypatch.setattr(QueueWatcher, "run", broken)
    queue = tmp_path / "queue"
    queue.mkdir()
    url = f"sqlite:///{tmp_path / 'w.db'}"
    result = run(
        "--log-format", "json", "watch", "--queue-dir", str(queue), "--db", url, "--backend", "c1",
        "--metrics-port", "0",
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    records = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    failed = [r for r in records if "root task watch queue failed" in r.get("event", "")]
    assert failed, result.stderr
    assert (
        "Traceback" in failed[0]["exception"]
        and "RuntimeError: boom in the watcher" in failed[0]["exception"]
    )
    assert "error: the watcher stopped: watch queue ended: RuntimeError: boom in the watcher" in result.stderr
    assert "stopped after" in result.stderr


def test_watch_stops_cleanly_on_sigterm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    needs_main_thread()
    started = QueueWatcher.run

    async def run_then_sigterm(self: QueueWatcher) -> None:
        async def terminate_once_ready() -> None:
            await self.ready.wait()  # the first scan is done: the command is running for real
            os.kill(os.getpid(), signal.SIGTERM)

        killer = asyncio.get_running_loop().create_task(terminate_once_ready())
        try:
            await started(self)
        finally:
            killer.cancel()

    monkeypatch.setattr(QueueWatcher, "run", run_then_sigterm)
    queue = tmp_path / "queue"
    queue.mkdir()
    url = f"sqlite:///{tmp_path / 'w.db'}"
    result = run("watch", "--queue-dir", str(queue), "--db", url, "--backend", "c1")
    assert result.exit_code == 0, result.output
    assert "stopped after" in result.stderr and "error" not in result.stderr
