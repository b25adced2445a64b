"""configure_logging: JSON lines off a terminal, console lines on one, secrets redacted, stdlib intact."""

from __future__ import annotations

import io
import json
import logging
import socket
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import structlog
from click.testing import CliRunner

from synnefo_ganeti._logging import REDACTED, configure_logging, get_logger, redact
from synnefo_ganeti.cli import main

MARK = "_synnefo_ganeti_handler"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    ours = logging.getLogger("synnefo_ganeti")
    handlers, level, our_level = list(root.handlers), root.level, ours.level
    try:
        yield
    finally:
        for handler in root.handlers:
            if handler not in handlers:
                root.removeHandler(handler)
                handler.close()
        root.setLevel(level)
        ours.setLevel(our_level)
        structlog.reset_defaults()


def lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def records(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in lines(stream)]


def test_json_lines_when_the_stream_is_no_terminal() -> None:
    stream = io.StringIO()
    configure_logging(level="info", stream=stream)
    logging.getLogger("synnefo_ganeti.rapi").info("submitted %d creates", 3, extra={"backend": "athens"})
    (record,) = records(stream)
    assert list(record)[:4] == ["timestamp", "level", "logger", "event"]
    assert record["level"] == "info"
    assert record["logger"] == "synnefo_ganeti.rapi"
    assert record["event"] == "submitted 3 creates"
    assert record["backend"] == "athens"
    stamp = datetime.fromisoformat(str(record["timestamp"]))
    assert stamp.utcoffset() is not None and stamp.utcoffset() == UTC.utcoffset(None)
    assert abs((datetime.now(UTC) - stamp).total_seconds()) < 60


def test_console_lines_when_forced_and_on_a_terminal() -> None:
    forced = io.StringIO()
    configure_logging(level="info", json=False, stream=forced)
    logging.getLogger("synnefo_ganeti.watch").warning("rescan", extra={"backend": "athens"})
    (line,) = lines(forced)
    assert not line.startswith("{")
    assert "rescan" in line and "backend=athens" in line and "warning" in line
    assert "\x1b[" not in line  # no colours off a terminal

    terminal = Terminal()
    configure_logging(level="info", stream=terminal)  # auto: a terminal gets console lines
    logging.getLogger("synnefo_ganeti.watch").warning("rescan")
    (line,) = lines(terminal)
    assert not line.startswith("{") and "rescan" in line


def test_json_can_be_forced_on_a_terminal() -> None:
    terminal = Terminal()
    configure_logging(json=True, stream=terminal)
    logging.getLogger("synnefo_ganeti").info("hello")
    assert records(terminal)[0]["event"] == "hello"


def test_secrets_are_redacted_in_extra_fields_urls_and_events() -> None:
    stream = io.StringIO()
    configure_logging(level="debug", stream=stream)
    log = logging.getLogger("synnefo_ganeti.store")
    log.info(
        "connecting to postgresql://sg:hunter2@db.example.org/sg",
        extra={
            "password": "hunter2",
            "db_url": "postgresql://sg:hunter2@db.example.org:5432/sg",
            "headers": {"Authorization": "Basic c2c6aHVudGVyMg==", "Accept": "application/json"},
            "rapi_token": "hunter2",
            "attempts": 3,
        },
    )
    output = stream.getvalue()
    assert "hunter2" not in output and "c2c6aHVudGVyMg" not in output
    (record,) = records(stream)
    assert record["password"] == REDACTED
    assert record["rapi_token"] == REDACTED
    assert record["db_url"] == f"postgresql://sg:{REDACTED}@db.example.org:5432/sg"
    assert record["event"] == f"connecting to postgresql://sg:{REDACTED}@db.example.org/sg"
    assert record["headers"] == {"Authorization": REDACTED, "Accept": "application/json"}
    assert record["attempts"] == 3


def test_secrets_are_redacted_in_tracebacks_and_console_lines() -> None:
    stream = io.StringIO()
    configure_logging(stream=stream)
    try:
        raise ValueError("cannot connect to https://synnefo:hunter2@ganeti:5080")
    except ValueError:
        logging.getLogger("synnefo_ganeti").exception("failed")
    (record,) = records(stream)
    assert "ValueError" in str(record["exception"]) and "hunter2" not in stream.getvalue()

    console = io.StringIO()
    configure_logging(json=False, stream=console)
    try:
        raise ValueError("cannot connect to https://synnefo:hunter2@ganeti:5080")
    except ValueError:
        logging.getLogger("synnefo_ganeti").exception("failed", extra={"password": "hunter2"})
    assert "ValueError" in console.getvalue() and "hunter2" not in console.getvalue()


def test_redact_leaves_prose_alone() -> None:
    assert redact("check the username and password (on the master)") == (
        "check the username and password (on the master)"
    )
    assert redact("Basic authentication failed") == "Basic authentication failed"
    assert redact("https://ganeti.example.org:5080/2/info") == "https://ganeti.example.org:5080/2/info"
    assert redact("dsn host=db password=hunter2 user=sg") == f"dsn host=db password={REDACTED} user=sg"
    assert redact("postgresql://sg:p@ss@db/sg") == f"postgresql://sg:{REDACTED}@db/sg"


def test_stdlib_records_pass_through_with_levels() -> None:
    stream = io.StringIO()
    configure_logging(level="debug", stream=stream)
    logging.getLogger("synnefo_ganeti.rapi").debug("ours at debug")
    logging.getLogger("aiohttp.client").info("theirs at info")  # below WARNING: dropped
    logging.getLogger("aiohttp.client").warning("theirs at warning")
    logging.getLogger().error("the root's own")
    assert [(r["logger"], r["event"]) for r in records(stream)] == [
        ("synnefo_ganeti.rapi", "ours at debug"),
        ("aiohttp.client", "theirs at warning"),
        ("root", "the root's own"),
    ]
    configure_logging(level="error", stream=stream)
    logging.getLogger("synnefo_ganeti.rapi").warning("now dropped")
    assert len(records(stream)) == 3


def test_configure_is_idempotent_and_keeps_other_handlers() -> None:
    root = logging.getLogger()
    other = logging.StreamHandler(io.StringIO())
    root.addHandler(other)
    first, second = io.StringIO(), io.StringIO()
    configure_logging(stream=first)
    configure_logging(stream=second)
    configure_logging(stream=second)
    assert sum(bool(getattr(h, MARK, False)) for h in root.handlers) == 1
    assert other in root.handlers
    logging.getLogger("synnefo_ganeti").warning("once")
    assert first.getvalue() == ""
    assert [r["event"] for r in records(second)] == ["once"]


def test_get_logger_key_values_become_fields() -> None:
    stream = io.StringIO()
    configure_logging(stream=stream)
    log = get_logger("synnefo_ganeti.dispatcher")
    log.info("submitted", backend="athens", job_id=12, name="sg-a", token="hunter2")
    log.debug("not shown")
    (record,) = records(stream)
    assert record["logger"] == "synnefo_ganeti.dispatcher"
    assert record["event"] == "submitted"
    assert record["backend"] == "athens" and record["job_id"] == 12
    assert record["name_"] == "sg-a"  # 'name' is a LogRecord attribute
    assert record["token"] == REDACTED
    # structlog's own loggers go the same way once configured
    structlog.get_logger("synnefo_ganeti.other").warning("plain", backend="b")
    assert records(stream)[-1] == records(stream)[-1] | {"event": "plain", "backend": "b", "level": "warning"}


def test_get_logger_works_without_configure(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="synnefo_ganeti"):
        get_logger("synnefo_ganeti.x").info("hello", backend="athens")
    (record,) = caplog.records
    assert record.getMessage() == "hello"
    assert record.backend == "athens"  # type: ignore[attr-defined]


def test_the_cli_logs_json_lines_with_log_format_json() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = CliRunner().invoke(
        main,
        [
            *("--log-level", "info", "--log-format", "json", "rapi", "--url", f"http://127.0.0.1:{port}"),
            *("--username", "u", "--timeout", "1", "info"),
        ],
        env={"SYNNEFO_GANETI_RAPI_PASSWORD": "hunter2"},
    )
    assert result.exit_code == 1
    logged = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    assert logged and all(r["logger"] == "synnefo_ganeti.rapi" for r in logged)
    assert any("retrying" in str(r["event"]) for r in logged)
    assert "hunter2" not in result.stderr

    bad = CliRunner().invoke(main, ["--log-format", "xml", "rapi"])
    assert bad.exit_code == 2 and "'auto', 'console', 'json'" in bad.output
