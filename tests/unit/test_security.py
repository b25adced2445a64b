"""Security: no password or database credential in any output of a full run; TLS verified unless
``insecure`` (then a warning); a password file others may read is refused.

The full run (:func:`tests._fault_runs.security_run`) gives two fake Ganetis known RAPI
passwords (read from 0600 password files) and the database URL a known password (the
test server trusts local users, so any password works): the dispatcher daemon and
the CLI run as processes with debug JSON logs, then the library's objects run in this
process. Every stdout and stderr line, every log record and every ``repr``/``str`` is
searched for each secret, its URL-encoded forms and its Basic authorization header.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from urllib.parse import quote

import pytest

from synnefo_ganeti import ConfigError, RapiClient, RetryPolicy, TLSError
from synnefo_ganeti.config import Settings
from synnefo_ganeti.testing import FakeGaneti
from tests._fault_runs import DB_SECRET, RAPI_SECRETS, secret_forms, security_run


@pytest.mark.slow
@pytest.mark.timeout(300)  # child processes: slow to start on a loaded machine
async def test_a_full_run_shows_no_password_anywhere(pg_url: str, tmp_path: Path) -> None:
    run = await security_run(tmp_path, pg_url)
    commands = run.commands

    # the run did what it was asked, with the secrets in use: a secret that leaks nowhere
    # because nothing ran would prove nothing
    for name, command in commands.items():
        print(f"--- {name}: exit {command.code}\n{command.stdout[-2000:]}\n{command.stderr[-3000:]}")
    submitted = json.loads(commands["submit"].stdout)
    assert commands["submit"].code == 0 and [r["status"] for r in submitted] == ["succeeded"] * 6
    assert {r["backend"] for r in submitted} <= {"a", "b"}
    listed = json.loads(commands["requests list"].stdout)
    assert commands["requests list"].code == 0 and len(listed) == 6
    backends = json.loads(commands["backends list"].stdout)["backends"]
    assert [(b["name"], b["ok"]) for b in backends] == [("a", True), ("b", True)]
    reconciled = json.loads(commands["reconcile"].stdout)["backends"]
    assert commands["reconcile"].code == 0 and all(b["ok"] for b in reconciled)
    jobs = json.loads(commands["jobs list --json"].stdout)
    assert len(jobs) == 6 and {job["status"] for job in jobs} == {"success"}
    assert commands["jobs list"].code == 0 and "sec0.fake.test" in commands["jobs list"].stdout
    assert commands["dispatcher"].code == 0
    daemon_log = [json.loads(line) for line in run.dispatcher_log]
    assert {"debug", "info"} <= {entry["level"] for entry in daemon_log}
    # the errors an operator sees for a wrong password and for a database that is down
    wrong = commands["rapi wrong password"]
    assert (
        wrong.code != 0 and "HTTP 401" in wrong.stderr and "check the username and password" in wrong.stderr
    )
    down = commands["jobs list db down"]
    assert (
        down.code != 0
        and "cannot open database postgresql+asyncpg://postgres:***@127.0.0.1:1/nowhere" in down.stderr
    )
    assert "AuthenticationError" in run.in_process["401 error"]
    assert "StoreError" in run.in_process["db down error"]
    assert "***" in run.in_process["Store repr"] and "**********" in run.in_process["Settings repr"]
    assert run.in_process["counts"] == "6 jobs, 6 requests"

    # and no secret, in any form, in anything any of it printed, logged or showed
    assert {DB_SECRET, quote(DB_SECRET, safe=""), *RAPI_SECRETS.values()} <= set(secret_forms())
    assert run.found == []
    assert run.lines > 500, f"only {run.lines} lines scanned"


# -- TLS -----------------------------------------------------------------------------------------------


async def test_tls_is_verified_by_default() -> None:
    async with FakeGaneti(tls=True) as fake:
        async with RapiClient(
            fake.url,
            username=fake.username,
            password=fake.password,
            name="athens",
            retry=RetryPolicy(attempts=1),
        ) as client:
            with pytest.raises(TLSError) as caught:
                await client.info()
        assert fake.requests == 0  # nothing, the credentials included, reached the server
    message = str(caught.value)
    assert "athens" in message and fake.url in message
    assert "certificate" in message
    assert fake.password not in message and fake.password not in repr(caught.value)


async def test_insecure_works_and_logs_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    async with FakeGaneti(tls=True) as fake:
        settings = Settings(
            backends=[
                {
                    "name": "athens",
                    "url": fake.url,
                    "username": fake.username,
                    "password": fake.password,
                    "insecure": True,
                }
            ]
        )
        async with settings.backend("athens").rapi_client() as client:
            info = await client.info()
    assert info.name == "cluster.fake.test"
    warnings = [
        r
        for r in caplog.records
        if r.levelno == logging.WARNING and "TLS verification is OFF" in r.getMessage()
    ]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    assert fake.url in warnings[0].getMessage() and "insecure" in warnings[0].getMessage()
    assert fake.password not in caplog.text


async def test_verified_tls_logs_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    async with FakeGaneti(tls=True) as fake:
        assert fake.ca_file is not None
        async with RapiClient(
            fake.url, username=fake.username, password=fake.password, ca_file=fake.ca_file
        ) as c:
            await c.info()
    assert not [r for r in caplog.records if "TLS" in r.getMessage()]


# -- the password file ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o640])
def test_a_password_file_readable_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    secret = "S3cr3t-file-Vb3"
    password_file = tmp_path / "athens.password"
    password_file.write_text(secret + "\n")
    password_file.chmod(mode)
    config = tmp_path / "sg.toml"
    config.write_text(
        '[[backends]]\nname = "athens"\nurl = "https://ganeti.example.org:5080"\nusername = "sg"\n'
        'password_file = "athens.password"\n'
    )
    with pytest.raises(ConfigError) as caught:
        Settings.from_file(config)
    message = str(caught.value)
    assert str(password_file) in message
    assert f"(mode {mode:04o}); chmod 600 it" in message
    assert secret not in message and secret not in repr(caught.value)
