"""``[synnefo]``: the settings of ``watch --eventd-compat`` in the config file (issue 32 item 2).

The section is read like the others (relative paths from the file's folder, the AMQP URL
from a 0600 file and never shown, a line per bad key); the flags win over its keys; and
``synnefo-ganeti watch --config FILE`` runs as eventd when it says ``eventd_compat = true``,
with JSON log lines only on stderr and ``/metrics`` on its ``status_port``.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from click.testing import CliRunner

from synnefo_ganeti.cli import main
from synnefo_ganeti.cli._eventd_options import DEFAULT_QUEUE_DIR, EventdOptions, eventd_config
from synnefo_ganeti.config import Settings, SynnefoSettings
from synnefo_ganeti.dispatch import DEFAULT_EXCHANGE
from synnefo_ganeti.errors import ConfigError
from tests.helpers import eventually
from tests.unit import test_amqp_feed
from tests.unit.test_amqp_feed import consumer
from tests.unit.test_eventd_messages import CLUSTER
from tests.unit.test_eventd_publish import (
    NODE,
    _ssconf,
    _versions,
    as_pairs,
    expected,
    received,
    write_like_ganeti,
)

#: the RabbitMQ fixture of test_amqp_feed.py
rabbitmq = test_amqp_feed.rabbitmq

PASSWORD = "eventd-amqp-pass-never-shown"
URL = f"amqp://eventd:{PASSWORD}@broker.example.org:5672/synnefo"


def secret(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text + "\n")
    path.chmod(mode)
    return path


def config(tmp_path: Path, body: str, name: str = "sg.toml") -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


def _cli(*args: str, env: dict[str, str] | None = None) -> Any:
    base = {"SYNNEFO_GANETI_AMQP_URL": "", "SYNNEFO_GANETI_CONFIG": ""}
    return CliRunner().invoke(main, ["watch", *args], catch_exceptions=False, env={**base, **(env or {})})


def _options(**given: Any) -> EventdOptions:
    """The options as click passes them when nothing was given."""
    values: dict[str, Any] = {
        "amqp": None,
        "amqp_url_file": None,
        "exchange": DEFAULT_EXCHANGE,
        "cluster_name": None,
        "ssconf_dir": Path("/var/lib/ganeti"),
        "node_name": None,
        "rapi": None,
        "rapi_username": None,
        "rapi_password_file": None,
        "rapi_ca_file": None,
        "rapi_fingerprint": None,
        "rapi_insecure": False,
        "max_pending": None,
    }
    return EventdOptions(**{**values, **given})


# -- the section --------------------------------------------------------------------------------


def test_the_section_reads_its_files_from_the_config_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret(tmp_path / "eventd-amqp.url", URL)
    secret(tmp_path / "rapi.password", "rapi-pass")
    (tmp_path / "rapi.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    path = config(
        tmp_path,
        '[synnefo]\neventd_compat = true\namqp_url_file = "eventd-amqp.url"\nqueue_dir = "queue"\n'
        'cluster_name = "ganeti.example.org"\nnode_name = "node1.example.org"\n'
        'rapi_url = "https://ganeti.example.org:5080/"\nrapi_username = "eventd"\n'
        'rapi_password_file = "rapi.password"\nrapi_ca_file = "rapi.pem"\nmax_pending = 500\n'
        "status_port = 9181\n",
    )
    section = Settings.from_file(path).synnefo
    assert section.eventd_compat and section.amqp_url_value() == URL
    assert section.amqp_url_file == tmp_path / "eventd-amqp.url" and section.queue_dir == tmp_path / "queue"
    assert section.rapi_password_file == tmp_path / "rapi.password"
    assert (
        section.rapi_ca_file == tmp_path / "rapi.pem"
        and section.rapi_url == "https://ganeti.example.org:5080"
    )
    assert section.max_pending == 500 and section.status_port == 9181 and section.status_host == "127.0.0.1"
    assert section.exchange == DEFAULT_EXCHANGE == "ganeti" and section.ssconf_dir == Path("/var/lib/ganeti")
    assert section.amqp_display_url() == "amqp://eventd:***@broker.example.org:5672/synnefo"
    for shown in (repr(section), str(section), repr(Settings.from_file(path))):
        assert PASSWORD not in shown and "rapi-pass" not in shown
    # the environment overrides a key, as for every section
    monkeypatch.setenv("SYNNEFO_GANETI__SYNNEFO__EXCHANGE", "cyclades")
    assert Settings.from_file(path).synnefo.exchange == "cyclades"
    # defaults: nothing needed until watch --eventd-compat runs
    empty = SynnefoSettings()
    assert not empty.eventd_compat and empty.amqp_url_value() is None and empty.max_pending == 100_000
    assert empty.status_port is None and empty.amqp_display_url() == "(no AMQP)"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("max_pending = 0", "synnefo.max_pending: Input should be greater than or equal to 1"),
        ('amqp_url = "http://x/"', "synnefo.amqp_url: must be an amqp:// or amqps:// URL"),
        ('amqp_url_file = "loose"', "synnefo: amqp_url_file {tmp}/loose is readable by others"),
        ('amqp_url_file = "missing"', "synnefo: amqp_url_file {tmp}/missing does not exist"),
        (
            'amqp_url_file = "url"\namqp_url = "amqp://h/"',
            "synnefo: give amqp_url or amqp_url_file, not both",
        ),
        (
            'amqp_url_file = "notamqp"',
            "synnefo: amqp_url_file {tmp}/notamqp must hold an amqp:// or amqps:// URL",
        ),
        ("bogus = 1", "synnefo.bogus: unknown key; the keys here are: eventd_compat, queue_dir"),
        ('rapi_url = "https://u:p@h:5080"', "synnefo.rapi_url: must not carry credentials"),
        ('rapi_url = "ftp://h"', "synnefo.rapi_url: must start with https://"),
        ('rapi_fingerprint = "zz"', "synnefo.rapi_fingerprint: fingerprint 'zz' is not a SHA-256 digest"),
        ('rapi_password_file = "loose"', "synnefo.rapi_password_file: password file {tmp}/loose is readable"),
        ('rapi_ca_file = "url"\nrapi_insecure = true', "not rapi_ca_file and rapi_insecure"),
        ('rapi_ca_file = "nothere.pem"', "synnefo.rapi_ca_file: {tmp}/nothere.pem does not exist"),
        ('cluster_name = " "', "synnefo.cluster_name: must not be empty"),
        ("status_port = 70000", "synnefo.status_port: Input should be less than or equal to 65535"),
        ('exchange = ""', "synnefo.exchange: String should have at least 1 character"),
    ],
)
def test_a_bad_key_is_named_and_no_secret_shown(tmp_path: Path, body: str, message: str) -> None:
    secret(tmp_path / "url", URL)
    secret(tmp_path / "loose", URL, 0o644)
    secret(tmp_path / "notamqp", f"https://eventd:{PASSWORD}@h/")
    path = config(tmp_path, f"[synnefo]\n{body}\n")
    with pytest.raises(ConfigError) as caught:
        Settings.from_file(path)
    text = str(caught.value)
    assert text.startswith(f"config file {path}: ") and message.format(tmp=tmp_path) in text
    assert PASSWORD not in text
    # the command says the same, with exit status 2
    result = _cli("--config", str(path), "--eventd-compat")
    assert result.exit_code == 2 and message.format(tmp=tmp_path) in result.output
    assert PASSWORD not in result.output


# -- which mode, and flags over keys --------------------------------------------------------------


def test_the_mode_follows_the_flag_then_the_section(tmp_path: Path) -> None:
    on = config(tmp_path, "[synnefo]\neventd_compat = true\n", "on.toml")
    off = config(tmp_path, '[synnefo]\nexchange = "x"\n', "off.toml")
    assert eventd_config(None, None, None) is None  # the store watcher (it asks for --backend)
    assert eventd_config(True, None, None) == SynnefoSettings()
    assert eventd_config(True, None, off) == SynnefoSettings(exchange="x")
    assert eventd_config(None, None, on) == SynnefoSettings(eventd_compat=True)
    assert eventd_config(None, None, off) is None
    assert eventd_config(None, "c1", on) is None  # --backend: store job events
    assert eventd_config(False, None, on) is None  # --no-eventd-compat


def test_flags_win_over_keys_and_keys_over_defaults(tmp_path: Path) -> None:
    ssconf = _ssconf(tmp_path, NODE)
    secret(tmp_path / "flag.url", "amqp://flag:flagpass@flag/")
    section = SynnefoSettings(
        amqp_url=URL,
        exchange="from-file",
        queue_dir=tmp_path / "file-queue",
        ssconf_dir=ssconf,
        node_name="file-node",
        rapi_url="https://file-rapi:5080",
        rapi_username="file-user",
        rapi_insecure=True,
        max_pending=7,
        status_port=9181,
        status_host="0.0.0.0",
    )
    nothing: set[str] = set()
    plan = _options().plan(
        section, queue_dir=DEFAULT_QUEUE_DIR, metrics_port=None, metrics_host="127.0.0.1", explicit=nothing
    )
    assert plan.url == URL and PASSWORD not in repr(plan) and PASSWORD not in plan.display_url
    assert plan.exchange == "from-file" and plan.queue_dir == tmp_path / "file-queue"
    assert (
        plan.cluster == CLUSTER and plan.ssconf_dir == ssconf
    )  # (ssconf_cluster_name of the file's ssconf_dir)
    assert plan.node_name == "file-node" and plan.max_pending == 7
    assert plan.metrics_port == 9181 and plan.metrics_host == "0.0.0.0"
    assert plan.rapi is not None and plan.rapi.url == "https://file-rapi:5080" and plan.rapi.insecure
    flags = _options(
        amqp_url_file=tmp_path / "flag.url",
        exchange="from-flag",
        cluster_name="flag-cluster",
        node_name="flag-node",
        rapi="https://flag-rapi:5080",
        rapi_fingerprint="AB" * 32,
        max_pending=3,
    )
    plan = flags.plan(
        section,
        queue_dir=tmp_path / "flag-queue",
        metrics_port=0,
        metrics_host="::1",
        explicit={"queue_dir", "exchange", "metrics_port", "metrics_host"},
    )
    assert plan.url == "amqp://flag:flagpass@flag/" and plan.exchange == "from-flag"
    assert plan.queue_dir == tmp_path / "flag-queue" and plan.cluster == "flag-cluster"
    assert plan.node_name == "flag-node" and plan.max_pending == 3
    assert plan.metrics_port == 0 and plan.metrics_host == "::1"
    # the RAPI's user from the file, its trust from the command line alone (not insecure)
    assert plan.rapi is not None and plan.rapi.url == "https://flag-rapi:5080"
    assert plan.rapi.username == "file-user" and plan.rapi.fingerprint == "AB" * 32 and not plan.rapi.insecure


def test_what_is_missing_is_named_as_a_flag_and_a_key(tmp_path: Path) -> None:
    queue = tmp_path / "queue"
    queue.mkdir()
    ssconf = _ssconf(tmp_path, NODE)
    secret(tmp_path / "url", URL)
    base = ["--queue-dir", str(queue), "--ssconf-dir", str(ssconf)]
    cases = [
        (
            "[synnefo]\neventd_compat = true\n",
            [],
            "give --amqp amqp://USER:PASS@HOST:5672/ or --amqp-url-file FILE (mode 0600, the URL on one "
            "line), or amqp_url_file in the --config file's [synnefo]",
        ),
        (
            '[synnefo]\neventd_compat = true\namqp_url_file = "url"\nrapi_username = "u"\n',
            [],
            "need --rapi URL or rapi_url in the --config file's [synnefo]",
        ),
        (
            '[synnefo]\namqp_url_file = "url"\nrapi_url = "https://h:5080"\n',
            ["--eventd-compat"],
            "--rapi URL needs --rapi-username USER (and --rapi-password-file FILE), or rapi_username",
        ),
        (
            f'[synnefo]\neventd_compat = true\namqp_url_file = "url"\nssconf_dir = "{tmp_path / "none"}"\n',
            ["--ssconf-dir", str(tmp_path / "none")],
            "or cluster_name or ssconf_dir in the --config file's [synnefo]",
        ),
        ("[synnefo]\neventd_compat = true\n", ["--no-eventd-compat"], "Missing option '--backend'"),
        ("[synnefo]\n", ["--max-pending", "5"], "--max-pending: only with --eventd-compat"),
        ('[synnefo]\namqp_url_file = "url"\n', ["--eventd-compat", "--backend", "c1"], "drop --backend"),
        ('[synnefo]\namqp_url_file = "url"\n', ["--eventd-compat", "--max-pending", "0"], "--max-pending"),
    ]
    for body, args, message in cases:
        path = config(tmp_path, body)
        cli_base = base if "--ssconf-dir" not in args else ["--queue-dir", str(queue)]
        result = _cli(*cli_base, "--config", str(path), *args)
        assert result.exit_code == 2, (body, args, result.output)
        assert message in result.output, (body, args, result.output)
        assert PASSWORD not in result.output


# -- the command, from the file alone -------------------------------------------------------------


async def test_watch_config_runs_eventd_from_the_section_with_json_logs_and_metrics(
    rabbitmq: str, tmp_path: Path
) -> None:
    """``synnefo-ganeti --log-format json watch --config FILE``: no flag but the file; every
    stderr line a JSON log line; /metrics on the section's status_port counts what was published."""
    queue = tmp_path / "queue"
    queue.mkdir()
    _ssconf(tmp_path, NODE)  # (tmp_path/ssconf: the section's relative ssconf_dir)
    secret(tmp_path / "eventd-amqp.url", rabbitmq)
    exchange = f"test.eventd.{uuid.uuid4().hex}"
    path = config(
        tmp_path,
        f'[synnefo]\neventd_compat = true\nqueue_dir = "queue"\namqp_url_file = "eventd-amqp.url"\n'
        f'exchange = "{exchange}"\nssconf_dir = "ssconf"\nnode_name = "{NODE}"\nmax_pending = 1000\n'
        "status_port = 0\n",
    )
    paths = _versions("lifecycle-job-12")
    want = as_pairs(expected(paths[-1:], info=False))
    lines: list[dict[str, Any]] = []
    async with consumer(rabbitmq, exchange) as got:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "synnefo_ganeti", "--log-format", "json", "watch", "--config", str(path),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert process.stderr is not None

        async def read_stderr() -> None:
            assert process.stderr is not None
            while line := await process.stderr.readline():
                lines.append(orjson.loads(line))  # every line JSON

        reader = asyncio.create_task(read_stderr())
        try:
            start: dict[str, Any] = await eventually(
                lambda: next((line for line in lines if "metrics on http" in line["event"]), {}),
                what="the start line",
            )
            metrics_url = start["event"].split("metrics on ", 1)[1].split()[0]
            write_like_ganeti(queue, paths[-1], 0)
            await eventually(lambda: len(got.messages) >= len(want), what="the command's messages")
            async with aiohttp.ClientSession() as session:

                async def scrape() -> str:
                    async with session.get(metrics_url) as response:
                        return await response.text()

                def value(text: str, name: str) -> float:
                    (line,) = [x for x in text.splitlines() if x.startswith(name + " ")]
                    return float(line.split()[1])

                async def published() -> str:
                    text = await scrape()
                    return text if value(text, "synnefo_ganeti_eventd_published_total") >= len(want) else ""

                text: str = await eventually(published, what="the published counter on /metrics")
                assert value(text, "synnefo_ganeti_eventd_pending") == 0
                assert value(text, "synnefo_ganeti_eventd_master") == 1
                assert value(text, "synnefo_ganeti_eventd_last_publish_timestamp_seconds") > 0
                async with session.get(metrics_url.replace("/metrics", "/readyz")) as response:
                    assert response.status == 200, await response.text()
            process.send_signal(signal.SIGTERM)
            await asyncio.wait_for(process.wait(), 30)
            await reader
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
            reader.cancel()
    assert process.returncode == 0, lines
    assert received(got) == want
    assert f"cluster {CLUSTER}" in start["event"] and start["level"] == "info"
    (stop,) = [line for line in lines if line["event"].startswith("stopped after")]
    assert stop["messages_published"] == len(want) and stop["not_confirmed"] == 0
    assert "guest:guest" not in orjson.dumps(lines).decode()
