"""``synnefo-ganeti dispatcher``, ``submit``, ``requests`` and ``backends list|events``.

The daemon runs as a real process (signals, logs, exit status) against fake Ganetis
served from the test's event loop; the other commands run through CliRunner in a
thread, so that the fakes keep answering meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner

from synnefo_ganeti.cli import _submit, main
from synnefo_ganeti.errors import GanetiError
from synnefo_ganeti.store import RequestStatus, Store
from synnefo_ganeti.testing import FakeGaneti
from tests.helpers import eventually

# ---------------------------------------------------------------------- helpers


def run(*args: str, stdin: str | None = None):
    return CliRunner().invoke(main, list(args), input=stdin, catch_exceptions=False)


async def arun(*args: str, stdin: str | None = None):
    return await asyncio.to_thread(run, *args, stdin=stdin)


def write_config(path: Path, db_url: str, fakes: dict[str, FakeGaneti], extra: str = "") -> Path:
    text = f'[database]\nurl = "{db_url}"\n\n[dispatcher]\nhealth_interval = 0.5\n{extra}\n'
    for name, fake in fakes.items():
        text += (
            f'[[backends]]\nname = "{name}"\nurl = "{fake.url}"\nusername = "{fake.username}"\n'
            f'password = "{fake.password}"\n\n'
        )
    path.write_text(text)
    return path


def specs(count: int, prefix: str = "vm", **extra: Any) -> list[dict[str, Any]]:
    return [
        {
            "name": f"{prefix}{i}.fake.test",
            "disk_template": "diskless",
            "os": "noop",
            "beparams": {"memory": 128},
            **extra,
        }
        for i in range(count)
    ]


class Daemon:
    """``synnefo-ganeti dispatcher`` as a child process, its stderr collected line by line."""

    def __init__(self, config: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.config = config
        self.args = args
        self.env = env or {}
        self.lines: list[str] = []
        self.process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self.stdout = b""

    async def start(self) -> Daemon:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "synnefo_ganeti", "dispatcher", "--config", str(self.config), *self.args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "COLUMNS": "200", **self.env},
        )  # fmt: skip
        self._reader = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        async for line in self.process.stderr:
            self.lines.append(line.decode(errors="replace").rstrip("\n"))

    @property
    def log(self) -> str:
        return "\n".join(self.lines)

    async def wait_log(self, pattern: str, *, after: int = 0, timeout: float = 60.0) -> str:
        def found() -> str | None:
            for line in self.lines[after:]:
                if re.search(pattern, line):
                    return line
            if self.process is not None and self.process.returncode is not None:
                raise AssertionError(f"the dispatcher exited ({self.process.returncode}):\n{self.log}")
            return None

        try:
            line: str = await eventually(found, timeout=timeout, what=f"a log line matching {pattern!r}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- dispatcher log ---\n{self.log}") from None
        return line

    def send(self, sig: signal.Signals) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    async def stop(self, sig: signal.Signals | None = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Send ``sig`` (None: none, wait for it to exit) and return the exit status."""
        assert self.process is not None and self.process.stdout is not None
        if sig is not None and self.process.returncode is None:
            self.process.send_signal(sig)
        self.stdout = await asyncio.wait_for(self.process.stdout.read(), timeout)
        code = await asyncio.wait_for(self.process.wait(), timeout)
        if self._reader is not None:
            await asyncio.wait_for(self._reader, timeout)
        return code

    async def kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
        if self._reader is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._reader, 10)


# ---------------------------------------------------------------------- the daemon, end to end


@pytest.mark.slow
async def test_dispatcher_process_submit_requests_reload_and_sigterm(tmp_path) -> None:
    db_url = f"sqlite:///{tmp_path / 'dispatch.db'}"
    async with (
        FakeGaneti(tls=False) as a,
        FakeGaneti(tls=False) as b,
        FakeGaneti(tls=False, op_times={"OP_INSTANCE_CREATE": 120.0}) as c,
    ):
        config = write_config(tmp_path / "config.toml", db_url, {"a": a, "b": b})
        daemon = await Daemon(config, "--status-port", "0").start()
        try:
            started = await daemon.wait_log(r"dispatcher \S+ started: 2 backends")
            status = re.search(r"status on (http://127\.0\.0\.1:\d+)", started)
            assert status, started
            assert "event loop uvloop " in started, started  # [dispatcher] event_loop = auto
            async with aiohttp.ClientSession() as session, session.get(status.group(1) + "/healthz") as got:
                assert got.status == 200

            # ten specs, waited for: all succeed, spread over the two backends
            specs_file = tmp_path / "specs.json"
            specs_file.write_text(json.dumps(specs(10)))
            done = await arun(
                "submit", "--config", str(config), str(specs_file), "--json", "--timeout", "120"
            )
            assert done.exit_code == 0, done.output
            rows = json.loads(done.stdout)
            assert len(rows) == 10
            assert {row["status"] for row in rows} == {"succeeded"}, rows
            assert {row["backend"] for row in rows} <= {"a", "b"} and all(row["job_id"] for row in rows)
            assert {"id", "status", "instance", "backend", "job_id", "error"} <= set(rows[0])
            assert sorted(row["instance"] for row in rows) == sorted(s["name"] for s in specs(10))
            assert set(a.cluster.instances) | set(b.cluster.instances) == {s["name"] for s in specs(10)}

            listed = await arun("requests", "list", "--config", str(config), "--json")
            assert listed.exit_code == 0, listed.output
            assert {row["id"] for row in json.loads(listed.stdout)} == {row["id"] for row in rows}
            shown = await arun("requests", "show", rows[3]["id"], "--config", str(config), "--json")
            assert shown.exit_code == 0, shown.output
            one = json.loads(shown.stdout)
            assert one["status"] == "succeeded" and one["spec"]["name"] == rows[3]["instance"]
            assert one["spec"]["beparams"] == {"memory": 128}

            # the dispatcher stored each backend's health: backends list shows it
            async def healthy() -> list[dict[str, Any]] | None:
                result = await arun("backends", "list", "--config", str(config), "--json")
                found = json.loads(result.stdout)["backends"]
                return found if all(row["health"] == "up" for row in found) else None

            backends = await eventually(healthy, timeout=60, what="both backends stored as up")
            assert all(row["health_at"] and row["ok"] for row in backends)

            # SIGHUP with a third backend: it is added, pinned specs go there
            mark = len(daemon.lines)
            write_config(config, db_url, {"a": a, "b": b, "c": c})
            daemon.send(signal.SIGHUP)
            await daemon.wait_log(r"added c", after=mark)

            # a create that runs on c cannot be canceled any more
            pinned = tmp_path / "pinned.yaml"
            pinned.write_text("name: slow.fake.test\ndisk_template: diskless\nos: noop\nbackend: c\n")
            written = await arun("submit", "--config", str(config), str(pinned), "--no-wait", "--json")
            assert written.exit_code == 0, written.output
            (slow,) = json.loads(written.stdout)
            assert slow["status"] == "pending"

            def running() -> bool:
                job = c.cluster.jobs.get(1)
                return job is not None and job.status.value == "running"

            await eventually(running, timeout=60, what="the create job on c running")

            async def submitted() -> bool:
                result = await arun("requests", "show", slow["id"], "--config", str(config), "--json")
                return json.loads(result.stdout)["status"] == "submitted"

            await eventually(submitted, timeout=60, what="the request on c submitted")
            refused = await arun("requests", "cancel", slow["id"], "--config", str(config), "--json")
            assert refused.exit_code == 1, refused.output
            answer = json.loads(refused.stdout)
            assert answer["outcome"] == "not_canceled" and "could not be canceled" in answer["reason"]
            assert answer["backend"] == "c" and answer["status"] == "submitted"

            # SIGHUP with a broken file: an error in the log, the daemon goes on with the old one
            mark = len(daemon.lines)
            config.write_text("[database\nurl = broken")
            daemon.send(signal.SIGHUP)
            failed = await daemon.wait_log(r"reload failed", after=mark)
            assert '"level": "error"' in failed or '"level":"error"' in failed, failed
            assert daemon.process is not None and daemon.process.returncode is None
            write_config(config, db_url, {"a": a, "b": b, "c": c})  # for the commands below
            more = tmp_path / "more.json"
            more.write_text(json.dumps(specs(2, prefix="late")))
            after = await arun("submit", "--config", str(config), str(more), "--json", "--timeout", "120")
            assert after.exit_code == 0, after.output
            assert {row["status"] for row in json.loads(after.stdout)} == {"succeeded"}
        except BaseException:
            await daemon.kill()
            raise
        code = await daemon.stop(signal.SIGTERM)
        assert code == 0, daemon.log
        assert daemon.stdout == b""  # logs only, on stderr
        assert re.search(r"dispatcher \S+ stopped", daemon.log), daemon.log
        assert all(line.startswith("{") for line in daemon.lines), daemon.log  # JSON lines off a terminal

        # no dispatcher now: a request stays pending and is canceled at once
        late = tmp_path / "late.json"
        late.write_text(json.dumps(specs(1, prefix="never")[0]))
        written = await arun("submit", "--config", str(config), str(late), "--no-wait", "--json")
        assert written.exit_code == 0, written.output
        (pending,) = json.loads(written.stdout)
        assert pending["status"] == "pending" and pending["backend"] is None
        canceled = await arun("requests", "cancel", pending["id"], "--config", str(config), "--json")
        assert canceled.exit_code == 0, canceled.output
        assert json.loads(canceled.stdout)["status"] == "canceled"
        assert json.loads(canceled.stdout)["outcome"] == "canceled"
        assert "never0.fake.test" not in a.cluster.instances | b.cluster.instances


@pytest.mark.slow
async def test_dispatcher_sigint_stops_cleanly_and_no_status(tmp_path) -> None:
    async with FakeGaneti(tls=False) as a:
        config = write_config(
            tmp_path / "config.toml", f"sqlite:///{tmp_path / 'd.db'}", {"a": a}, 'event_loop = "asyncio"'
        )
        daemon = await Daemon(config, "--no-status").start()
        try:
            line = await daemon.wait_log(r"dispatcher \S+ started: 1 backends")
            assert "status on" not in line
            assert "event loop asyncio" in line, line  # [dispatcher] event_loop = "asyncio"
        except BaseException:
            await daemon.kill()
            raise
        assert await daemon.stop(signal.SIGINT) == 0, daemon.log


@pytest.mark.slow
async def test_dispatcher_cannot_start_exits_2(tmp_path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[database]\nurl = 42\n")
    daemon = await Daemon(bad).start()
    assert await daemon.stop(None) == 2
    assert "error:" in daemon.log and str(bad) in daemon.log

    missing = tmp_path / "missing.toml"
    daemon = await Daemon(missing).start()
    assert await daemon.stop(None) == 2
    assert "error:" in daemon.log

    no_folder = write_config(tmp_path / "nofolder.toml", f"sqlite:///{tmp_path / 'no' / 'such' / 'd.db'}", {})
    daemon = await Daemon(no_folder).start()
    assert await daemon.stop(None) == 2, daemon.log
    assert "error:" in daemon.log and "does not exist" in daemon.log

    # event_loop = "uvloop" where uvloop cannot be imported: says so, and how to go on
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "uvloop.py").write_text("raise ImportError('no uvloop on this machine')\n")
    insists = write_config(
        tmp_path / "uvloop.toml", f"sqlite:///{tmp_path / 'u.db'}", {}, 'event_loop = "uvloop"'
    )
    daemon = await Daemon(
        insists, env={"PYTHONPATH": f"{hidden}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    ).start()
    assert await daemon.stop(None) == 2, daemon.log
    assert "uvloop cannot be imported" in daemon.log and "pip install uvloop" in daemon.log, daemon.log


# ---------------------------------------------------------------------- submit and requests


def _config(tmp_path: Path, db_url: str, names: tuple[str, ...] = ("a", "b")) -> Path:
    """A config naming backends that need not answer (nothing here talks to them)."""
    text = f'[database]\nurl = "{db_url}"\n\n'
    for port, name in enumerate(names, start=1):
        text += f'[[backends]]\nname = "{name}"\nurl = "http://127.0.0.1:{port}"\nusername = "u"\npassword = "p"\n\n'
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


async def _stored(db_url: str) -> list[Any]:
    async with Store(db_url) as store:
        return await store.list_requests()


async def test_submit_refuses_bad_specs_and_writes_nothing(tmp_path) -> None:
    db_url = f"sqlite:///{tmp_path / 'r.db'}"
    config = _config(tmp_path, db_url)
    good = specs(3)
    cases: list[tuple[str, Any, str]] = [
        ("missing.json", [good[0], good[1], {"name": "x.fake.test", "os": "noop"}], r"spec 2 \(x\.fake\.test\): disk_template: Field required"),
        ("unknown-key.json", [good[0], {**good[1], "memroy": 1}], r"spec 1 \(vm1\.fake\.test\): memroy: Extra inputs"),
        ("wrong-type.yaml", [{**good[0], "disks": "big"}], r"spec 0 \(vm0\.fake\.test\): disks: "),
        ("backend.json", [good[0], {**good[1], "backend": "nope"}], r"spec 1 \(vm1\.fake\.test\): backend: unknown backend 'nope'"),
        ("twice.json", [good[0], good[1], good[0]], r"spec 2 \(vm0\.fake\.test\): name: .* spec 0"),
        ("scalar.json", [good[0], "vm9"], r"spec 1: must be a mapping"),
        ("not-a-list.json", 42, r"must hold a list of instance specs \(or one spec\), not int"),
        ("empty.json", [], r"the list of specs is empty"),
    ]  # fmt: skip
    for name, document, message in cases:
        path = tmp_path / name
        path.write_text(json.dumps(document) if name.endswith(".json") else _yaml(document))
        result = await arun("submit", "--config", str(config), str(path), "--no-wait")
        assert result.exit_code == 2, (name, result.output)
        assert re.search(message, result.stderr), (name, result.stderr)
        if message.startswith("spec"):
            assert "nothing was submitted" in result.stderr, (name, result.stderr)
    several = tmp_path / "several.json"
    several.write_text(json.dumps([{"name": "a"}, {"name": "b"}]))
    result = await arun("submit", "--config", str(config), str(several))
    assert result.exit_code == 2 and "and 1 more bad specs" in result.stderr
    broken = tmp_path / "broken.json"
    broken.write_text('[{"name": ')
    result = await arun("submit", "--config", str(config), str(broken))
    assert result.exit_code == 2 and "not valid JSON" in result.stderr
    result = await arun("submit", "--config", str(config), "-", stdin="name: [unclosed\n")
    assert result.exit_code == 2 and "valid YAML" in result.stderr
    result = await arun("submit", "--config", str(config), str(tmp_path / "none.json"))
    assert result.exit_code == 2 and "cannot read it" in result.stderr
    assert not (tmp_path / "r.db").exists()  # nothing opened, nothing written


def _yaml(document: Any) -> str:
    import yaml

    return yaml.safe_dump(document)


async def test_submit_stdin_yaml_and_json_list_show_cancel(tmp_path, db_url) -> None:
    config = _config(tmp_path, db_url)
    yaml_text = _yaml([*specs(2, prefix="y"), {**specs(1, prefix="pinned")[0], "backend": "b"}])
    first = await arun("submit", "--config", str(config), "-", "--no-wait", "--json", stdin=yaml_text)
    assert first.exit_code == 0, first.output
    from_yaml = json.loads(first.stdout)
    assert [row["instance"] for row in from_yaml] == ["y0.fake.test", "y1.fake.test", "pinned0.fake.test"]
    assert {row["status"] for row in from_yaml} == {"pending"}
    assert "spec" not in from_yaml[0]
    one_json = json.dumps({**specs(1, prefix="j")[0], "tags": ["t1"], "start": False})
    second = await arun("submit", "--config", str(config), "-", "--no-wait", stdin=one_json)
    assert second.exit_code == 0, second.output
    assert "j0.fake.test" in second.stdout and "pending" in second.stdout

    listed = await arun("requests", "list", "--config", str(config), "--json")
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.stdout)
    assert [row["instance"] for row in rows] == [
        "j0.fake.test", "pinned0.fake.test", "y1.fake.test", "y0.fake.test"
    ]  # fmt: skip
    assert {"id", "status", "instance", "backend", "job_id", "error", "created_at"} <= set(rows[0])
    limited = json.loads(
        (await arun("requests", "list", "--config", str(config), "--json", "--limit", "1")).stdout
    )
    assert [row["instance"] for row in limited] == ["j0.fake.test"]
    table = await arun("requests", "list", "--config", str(config))
    assert table.exit_code == 0 and "y0.fake.test" in table.stdout and "pending" in table.stdout

    pinned = from_yaml[2]["id"]
    shown = await arun("requests", "show", pinned, "--config", str(config), "--json")
    assert shown.exit_code == 0, shown.output
    request = json.loads(shown.stdout)
    assert request["want_backend"] == "b" and request["spec"]["name"] == "pinned0.fake.test"
    assert request["spec"]["disk_template"] == "diskless" and "backend" not in request["spec"]
    j0 = rows[0]["id"]
    shown_table = await arun("requests", "show", j0, "--config", str(config))
    assert shown_table.exit_code == 0 and '"t1"' in shown_table.stdout and "pending" in shown_table.stdout
    missing = await arun("requests", "show", "no-such-id", "--config", str(config))
    assert missing.exit_code == 1 and "not in the database" in missing.stderr

    # cancel: pending and free -> canceled; again -> still canceled; held -> handed over; ended -> 1
    canceled = await arun("requests", "cancel", j0, "--config", str(config))
    assert canceled.exit_code == 0 and "is canceled" in canceled.stdout
    again = await arun("requests", "cancel", j0, "--config", str(config), "--json")
    assert again.exit_code == 0 and json.loads(again.stdout)["outcome"] == "canceled"
    async with Store(db_url) as store:
        held = await store.claim_requests("test-dispatcher", limit=1)  # the oldest: y0
        assert [r.instance for r in held] == ["y0.fake.test"]
        await store.finish_request(from_yaml[1]["id"], RequestStatus.FAILED, error="no room")
    handed = await arun("requests", "cancel", held[0].id, "--config", str(config), "--json")
    assert handed.exit_code == 0, handed.output
    assert json.loads(handed.stdout)["outcome"] == "cancel_requested"
    assert json.loads(handed.stdout)["cancel_requested"] is True
    ended = await arun("requests", "cancel", from_yaml[1]["id"], "--config", str(config))
    assert ended.exit_code == 1 and "ended already (failed)" in ended.stderr
    unknown = await arun("requests", "cancel", "no-such-id", "--config", str(config))
    assert unknown.exit_code == 1 and "not in the database" in unknown.stderr

    by_status = await arun(
        "requests", "list", "--config", str(config), "--json", "--status", "canceled", "--status", "failed"
    )
    assert sorted(row["instance"] for row in json.loads(by_status.stdout)) == ["j0.fake.test", "y1.fake.test"]
    none_there = await arun("requests", "list", "--config", str(config), "--backend", "a")
    assert none_there.exit_code == 0 and "no requests stored matching the filters" in none_there.stdout


async def test_submit_waits_hints_without_a_dispatcher_and_times_out(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(_submit, "HINT_AFTER", 0.2)
    db_url = f"sqlite:///{tmp_path / 'w.db'}"
    config = _config(tmp_path, db_url)
    path = tmp_path / "specs.yml"
    path.write_text(_yaml(specs(2)))
    result = await arun("submit", "--config", str(config), str(path), "--timeout", "1.5")
    assert result.exit_code == 3, result.output
    assert result.stderr.count("no dispatcher seems to run") == 1
    assert f"synnefo-ganeti dispatcher --config {config}" in result.stderr
    assert "2 of 2 requests have not ended within 1.5 s" in result.stderr
    stored = await _stored(db_url)
    assert all(request.id in result.stderr for request in stored) and len(stored) == 2
    as_json = await arun(
        "submit",
        "--config",
        str(config),
        "-",
        "--json",
        "--timeout",
        "0.5",
        stdin=json.dumps(specs(1, prefix="k")),
    )
    assert as_json.exit_code == 3
    assert [row["status"] for row in json.loads(as_json.stdout)] == ["pending"]


async def test_submit_exit_1_when_a_request_fails(tmp_path) -> None:
    """A request that ends other than succeeded (here: failed by someone else) makes exit 1."""
    db_url = f"sqlite:///{tmp_path / 'f.db'}"
    config = _config(tmp_path, db_url)
    path = tmp_path / "one.json"
    path.write_text(json.dumps(specs(1)))

    async def written() -> list[Any] | None:
        try:  # submit may be creating the schema right now: read only, and try again
            async with Store(db_url, create=False) as store:
                return await store.list_requests()
        except GanetiError:
            return None

    async def fail_it() -> None:
        found: list[Any] = await eventually(written, timeout=60, what="the request written")
        async with Store(db_url) as store:
            await store.finish_request(found[0].id, RequestStatus.FAILED, error="no backend has room")

    failer = asyncio.create_task(fail_it())
    result = await arun("submit", "--config", str(config), str(path), "--timeout", "60")
    await failer
    assert result.exit_code == 1, result.output
    assert "failed" in result.stdout and "no backend has room" in result.stdout


# ---------------------------------------------------------------------- backends list and events


async def test_backends_list_health_and_events(tmp_path, db_url) -> None:
    async with FakeGaneti(tls=False) as fake:
        config = tmp_path / "config.toml"
        config.write_text(
            f'[database]\nurl = "{db_url}"\n\n[[backends]]\nname = "f1"\nurl = "{fake.url}"\n'
            f'username = "{fake.username}"\npassword = "{fake.password}"\n\n'
            f'[[backends]]\nname = "f2"\nurl = "{fake.url}"\n'
            f'username = "{fake.username}"\npassword = "{fake.password}"\n'
        )
        async with Store(db_url) as store:
            await store.set_backend_health("f1", True)
            await store.set_backend_health(
                "f1", False, detail="3 probes failed", event="health checks failed"
            )
        listed = await arun("backends", "list", "--config", str(config), "--json")
        assert listed.exit_code == 0, listed.output
        rows = {row["name"]: row for row in json.loads(listed.stdout)["backends"]}
        assert rows["f1"]["health"] == "down" and rows["f1"]["health_detail"] == "3 probes failed"
        assert rows["f1"]["health_at"] is not None and rows["f1"]["ok"] is True
        assert rows["f2"]["health"] == "unknown" and rows["f2"]["health_at"] is None
        assert {"drained", "free_memory", "version", "instances"} <= set(rows["f1"])
        table = await arun("backends", "list", "--config", str(config))
        assert "down: 3 probes failed" in table.stdout and "unknown" in table.stdout

        async with Store(db_url) as store:
            await store.set_backend_health("f1", True, event="health checks pass again")
            await store.add_backend_event("f2", "down", "no answer")
        events = await arun("backends", "events", "--config", str(config), "--json")
        assert events.exit_code == 0, events.output
        found = json.loads(events.stdout)
        assert [(e["backend"], e["kind"], e["message"]) for e in found] == [
            ("f2", "down", "no answer"),
            ("f1", "up", "health checks pass again"),
            ("f1", "down", "health checks failed"),
        ]
        assert all(e["at"] for e in found)
        only = json.loads(
            (
                await arun(
                    "backends", "events", "--config", str(config), "--json", "--backend", "f1", "--limit", "1"
                )
            ).stdout
        )
        assert [(e["backend"], e["kind"]) for e in only] == [("f1", "up")]
        shown = await arun("backends", "events", "--config", str(config))
        assert shown.exit_code == 0 and "health checks pass again" in shown.stdout
        nothing = await arun("backends", "events", "--config", str(config), "--backend", "f9")
        assert nothing.exit_code == 0 and "no backend events stored for backend f9" in nothing.stdout
