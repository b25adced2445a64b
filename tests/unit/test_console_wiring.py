"""The console's wiring: ``[web]`` settings and users files, the dispatcher's status server with
``[web] enabled``, the ``web`` command (a real process) and ``web --hash-password``."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sys
from pathlib import Path

import aiohttp
import pytest
from argon2 import PasswordHasher
from click.testing import CliRunner

from synnefo_ganeti.cli import main
from synnefo_ganeti.config import Settings
from synnefo_ganeti.console import Console, hash_password, read_users
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.errors import ConfigError
from synnefo_ganeti.store import Store
from synnefo_ganeti.testing import FakeGaneti


def test_web_settings_defaults_and_paths_relative_to_the_file(tmp_path: Path) -> None:
    defaults = Settings().web
    assert (defaults.enabled, defaults.host, defaults.secure_cookies, defaults.users_file) == (
        False,
        "127.0.0.1",
        True,
        None,
    )
    config = tmp_path / "sg.toml"
    config.write_text('[web]\nenabled = true\nport = 9999\nusers_file = "console.users"\n')
    web = Settings.from_file(config).web
    assert web.enabled and web.port == 9999 and web.users_file == tmp_path / "console.users"
    config.write_text("[web]\nusers = 'x'\n")
    with pytest.raises(ConfigError, match=r"web\.users"):
        Settings.from_file(config)


def test_a_users_file_is_read_line_by_line_with_clear_errors(tmp_path: Path) -> None:
    users = tmp_path / "console.users"
    users.write_text(f"# operators\n\nann:operator:{hash_password('long-enough')}\nbo:viewer:$argon2id$x\n")
    found = read_users(users)
    assert {name: user.role for name, user in found.items()} == {"ann": "operator", "bo": "viewer"}
    assert "argon2" not in repr(found["ann"])  # the hash stays out of reprs
    users.write_text("ann:admin:$argon2id$x\n")
    with pytest.raises(
        ConfigError, match=r"line 1: role 'admin' is neither viewer, operator nor operator@BACKEND"
    ):
        read_users(users)
    users.write_text("just-a-name\n")
    with pytest.raises(ConfigError, match="line 1: expected name:role:hash"):
        read_users(users)
    with pytest.raises(ConfigError, match="does not exist"):
        read_users(tmp_path / "missing")


def test_hash_password_prints_an_argon2_hash_and_refuses_short_ones() -> None:
    result = CliRunner().invoke(main, ["web", "--hash-password"], input="correct horse\n")
    assert result.exit_code == 0, result.output
    digest = result.output.strip()
    assert digest.startswith("$argon2id$") and PasswordHasher().verify(digest, "correct horse")
    short = CliRunner().invoke(main, ["web", "--hash-password"], input="short\n")
    assert short.exit_code == 2 and "at least 8 characters" in short.output


def test_web_refuses_a_config_where_nobody_could_log_in(tmp_path: Path) -> None:
    config = tmp_path / "sg.toml"
    config.write_text("[web]\nport = 0\n")
    result = CliRunner().invoke(main, ["web", "--config", str(config)])
    assert result.exit_code == 2 and "neither users_file nor tokens_file" in result.output


async def test_the_dispatchers_status_server_serves_the_console(tmp_path: Path) -> None:
    users = tmp_path / "console.users"
    users.write_text(f"ops:operator:{hash_password('ops-password')}\n")
    db_url = f"sqlite:///{tmp_path / 'store.db'}"
    async with FakeGaneti(tls=False) as fake:
        settings = Settings(
            database={"url": db_url},
            backends=[{"name": "b1", "url": fake.url, "username": fake.username, "password": fake.password}],
            dispatcher={"status_port": 0, "poll_interval": 0.05, "shutdown_timeout": 5.0},
            web={"enabled": True, "users_file": str(users), "secure_cookies": False},
        )
        async with Store(db_url) as store:
            dispatcher = Dispatcher(settings, store=store)
            console = Console(settings)
            console.attach(dispatcher)  # what `synnefo-ganeti dispatcher` does with [web] enabled
            running = asyncio.create_task(dispatcher.run())
            await dispatcher.ready.wait()
            try:
                assert dispatcher.status is not None
                url = dispatcher.status.url
                # (unsafe: the jar keeps cookies of an IP address such as 127.0.0.1)
                async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
                    async with http.get(url + "/metrics") as metrics:  # still without a login
                        assert metrics.status == 200
                    async with http.get(url + "/readyz") as ready:
                        assert ready.status in (200, 503)
                    async with http.get(url + "/", allow_redirects=False) as page:
                        assert page.status == 303 and page.headers["Location"] == "/login?next=/"
                    form = {"username": "ops", "password": "ops-password"}
                    async with http.post(url + "/login", data=form) as logged_in:
                        assert logged_in.status == 200 and "b1" in await logged_in.text()
                await dispatcher.reconcile_once()
                assert "b1" in console.reports.last and console.reports.last["b1"][2] == "dispatcher"
            finally:
                dispatcher.stop()
                await running


@pytest.mark.slow
async def test_the_web_command_serves_until_sigterm(tmp_path: Path) -> None:
    users = tmp_path / "console.users"
    users.write_text(f"ops:viewer:{hash_password('ops-password')}\n")
    config = tmp_path / "sg.toml"
    config.write_text(
        f'[database]\nurl = "sqlite:///{tmp_path / "store.db"}"\n'
        '[web]\nport = 0\nusers_file = "console.users"\nsecure_cookies = false\n'
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "synnefo_ganeti", "web", "--config", str(config), "--json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stdout is not None
    try:
        printed = ""
        async with asyncio.timeout(30):  # {"url": ...} on stdout once it listens
            while not printed.rstrip().endswith("}"):
                line = (await process.stdout.readline()).decode()
                assert line, "the web command ended before printing its URL"
                printed += line
        url = json.loads(printed)["url"]
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url), url
        async with aiohttp.ClientSession() as http, http.get(url + "/login") as login:
            assert login.status == 200 and "Content-Security-Policy" in login.headers
    finally:
        process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), 30)
    assert code == 0


@pytest.mark.slow
async def test_demo_web_holds_the_world_open_with_a_one_time_login() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "synnefo_ganeti", "demo", "--count", "10", "--speed", "20", "--web",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stderr is not None and process.stdout is not None
    seen = ""

    async def read_until(pattern: str) -> re.Match[str]:
        nonlocal seen
        assert process.stderr is not None
        while (found := re.search(pattern, seen)) is None:
            chunk = await process.stderr.read(4096)
            assert chunk, f"the demo ended before printing {pattern!r}: {seen[-2000:]}"
            seen += chunk.decode(errors="replace")
        return found

    try:
        async with asyncio.timeout(90):
            once = (await read_until(r"(http://127\.0\.0\.1:\d+)(/login/once/[\w-]+)")).groups()
            async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
                async with http.get(once[0] + once[1]) as page:
                    text = await page.text()
                    assert page.status == 200 and all(name in text for name in ("small", "medium", "large"))
                async with http.get(once[0] + once[1], allow_redirects=False) as again:
                    assert again.status == 403  # one time only
            await read_until(r"the scenario is done; the world keeps running")
            async with aiohttp.ClientSession() as http, http.get(once[0] + "/login") as login:
                assert login.status == 200  # still served after the scenario
    finally:
        process.send_signal(signal.SIGINT)
        out, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, seen[-2000:]
    assert "demo summary" in out.decode()
