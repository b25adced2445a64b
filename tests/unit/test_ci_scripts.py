"""scripts/run-suite.py, scripts/await-units.py and scripts/ganeti-testbed: what .ci/run runs.

The fast envs wait until run-suite.py's CPU-bound half has ended (its exit status in the file that
``SYNNEFO_GANETI_TEST_UNITS_DONE`` names), and never wait when it is not set (a plain ``tox``).
run-suite.py runs the real-Ganeti tests on 3.0 and the ``ganeti`` ones on 3.1 (after the 3.0 run,
beside it, or not at all: ``SYNNEFO_GANETI_TEST_V31``), with the variables ``scripts/ganeti-testbed
env --version 3.1`` prints; the testbed script's version choice is checked without running Ganeti.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _run_suite() -> ModuleType:
    spec = importlib.util.spec_from_file_location("run_suite", SCRIPTS / "run-suite.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _suite_told_to_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[ModuleType, Path]:
    """run-suite.py loaded, with ``SYNNEFO_GANETI_TEST_UNITS_DONE`` naming a file in ``tmp_path``."""
    marker = tmp_path / "units-done"
    monkeypatch.setenv("SYNNEFO_GANETI_TEST_UNITS_DONE", str(marker))
    return _run_suite(), marker


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNNEFO_GANETI_TEST_UNITS")}
    env.update(extra)
    return env


def test_await_units_returns_at_once_without_the_variable() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "await-units.py")],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (0, "")


def test_await_units_waits_for_the_file_then_says_its_status(tmp_path: Path) -> None:
    marker = tmp_path / "units-done"
    waiter = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "await-units.py")],
        env=_env(SYNNEFO_GANETI_TEST_UNITS_DONE=str(marker)),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert waiter.stdout is not None
        assert "waiting for the py env's tests" in waiter.stdout.readline()
        assert waiter.poll() is None  # it said it waits, and it does: the file is not there yet
        # as run-suite.py writes it: whole, then renamed into place (a file written in place can
        # be seen before its content: "exit " with nothing after, seen in a CI rehearsal)
        part = tmp_path / "units-done.part"
        part.write_text("1\n")
        os.replace(part, marker)
        out, _ = waiter.communicate(timeout=60)
    finally:
        waiter.kill()
    assert waiter.returncode == 0
    assert "they ended (exit 1)" in out


def test_await_units_gives_up_after_its_limit(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "await-units.py")],
        env=_env(SYNNEFO_GANETI_TEST_UNITS_DONE=str(tmp_path / "never"), SYNNEFO_GANETI_TEST_UNITS_WAIT="0"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0
    assert "did not appear within 0 s: running anyway" in done.stdout


def test_run_suite_writes_the_units_status_when_they_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_suite, marker = _suite_told_to_write(tmp_path, monkeypatch)
    calls: list[list[str]] = []

    def call(args: list[str], **_: Any) -> int:
        calls.append(args)
        if args is run_suite.REAL:
            assert marker.read_text() == "3\n"  # written once the units ended, before the real ones
            return 0
        assert not marker.exists()
        return 3

    monkeypatch.setattr(run_suite.subprocess, "call", call)
    monkeypatch.setenv("SYNNEFO_GANETI_TEST_SERIAL", "1")
    monkeypatch.setenv("SYNNEFO_GANETI_TEST_V31", "0")
    monkeypatch.setattr(sys, "argv", ["run-suite.py"])
    assert run_suite.main() == 3
    assert marker.read_text() == "3\n"
    assert not (tmp_path / "units-done.part").exists()
    assert len(calls) == 2


def test_run_suite_stopped_before_the_units_ended_still_frees_the_waiters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_suite, marker = _suite_told_to_write(tmp_path, monkeypatch)

    class Real:
        def __init__(self, *_: Any, **__: Any) -> None:
            self.terminated = False

        def terminate(self) -> None:
            self.terminated = True

        def wait(self) -> int:
            return 0

    def interrupted(*_: Any, **__: Any) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(run_suite.subprocess, "Popen", Real)
    monkeypatch.setattr(run_suite.subprocess, "call", interrupted)
    monkeypatch.delenv("SYNNEFO_GANETI_TEST_SERIAL", raising=False)
    monkeypatch.setenv("SYNNEFO_GANETI_TEST_V31", "0")
    monkeypatch.setattr(sys, "argv", ["run-suite.py"])
    with pytest.raises(KeyboardInterrupt):
        run_suite.main()
    assert marker.read_text() == "stopped\n"


def test_without_the_variable_run_suite_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_suite = _run_suite()
    monkeypatch.delenv("SYNNEFO_GANETI_TEST_UNITS_DONE", raising=False)
    monkeypatch.chdir(tmp_path)
    run_suite._units_done(0)
    assert list(tmp_path.iterdir()) == []


# -- the 3.1 run -------------------------------------------------------------------------------------

V31_ENV = {"SYNNEFO_GANETI_TEST_RAPI_URL": "https://127.0.0.1:5081", "SGTB_VERSION": "3.1"}


class FakeRun:
    """A Popen that ends at once with a given status, and says when it started and was waited for."""

    events: list[str]
    statuses: dict[str, int]

    def __init__(self, argv: list[str], **kwargs: Any) -> None:
        self.version = "3.1" if (kwargs.get("env") or {}).get("SGTB_VERSION") == "3.1" else "3.0"
        self.argv = argv
        self.events.append(f"start {self.version}")

    def wait(self) -> int:
        self.events.append(f"ended {self.version}")
        return self.statuses.get(self.version, 0)

    def poll(self) -> int:
        return self.statuses.get(self.version, 0)

    def terminate(self) -> None:
        self.events.append(f"terminated {self.version}")


def _fake_runs(
    monkeypatch: pytest.MonkeyPatch, mode: str, statuses: dict[str, int] | None = None
) -> tuple[ModuleType, list[str]]:
    """run-suite.py loaded, its Popen and the units' call faked, SYNNEFO_GANETI_TEST_V31=mode."""
    run_suite = _run_suite()
    events: list[str] = []
    fake = type("Run", (FakeRun,), {"events": events, "statuses": statuses or {}})

    def units(args: list[str], **_: Any) -> int:
        assert args[: len(run_suite.UNIT)] == run_suite.UNIT
        events.append("units")
        return statuses.get("units", 0) if statuses else 0

    monkeypatch.setattr(run_suite.subprocess, "Popen", fake)
    monkeypatch.setattr(run_suite.subprocess, "call", units)
    monkeypatch.setattr(run_suite, "v31_env", lambda: os.environ | V31_ENV)
    monkeypatch.setenv("SYNNEFO_GANETI_TEST_V31", mode)
    monkeypatch.delenv("SYNNEFO_GANETI_TEST_SERIAL", raising=False)
    monkeypatch.delenv("SYNNEFO_GANETI_TEST_UNITS_DONE", raising=False)
    monkeypatch.setattr(sys, "argv", ["run-suite.py"])
    return run_suite, events


@pytest.mark.parametrize("mode", ["", "1", "after"])
def test_the_31_run_starts_once_the_30_run_ended(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], mode: str
) -> None:
    run_suite, events = _fake_runs(monkeypatch, mode)
    assert run_suite.main() == 0
    assert events.index("start 3.1") > events.index("ended 3.0") > events.index("start 3.0")
    out = capsys.readouterr().out
    assert out.index("tests on Ganeti 3.0 (ganeti, ganeti3): exit 0") < out.index(
        "tests on Ganeti 3.1 (ganeti and not ganeti3): exit 0"
    )


def test_beside_starts_both_real_runs_before_the_units(monkeypatch: pytest.MonkeyPatch) -> None:
    run_suite, events = _fake_runs(monkeypatch, "beside")
    assert run_suite.main() == 0
    assert events[:3] == ["start 3.0", "start 3.1", "units"]


def test_v31_0_leaves_the_31_run_out(monkeypatch: pytest.MonkeyPatch) -> None:
    run_suite, events = _fake_runs(monkeypatch, "0")
    monkeypatch.setattr(run_suite, "v31_env", lambda: pytest.fail("no 3.1 testbed asked for"))
    assert run_suite.main() == 0
    assert "start 3.1" not in events and events[0] == "start 3.0"


@pytest.mark.parametrize("mode", ["after", "beside"])
def test_a_failed_31_run_fails_the_suite(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], mode: str
) -> None:
    run_suite, _ = _fake_runs(monkeypatch, mode, {"3.1": 1})
    assert run_suite.main() == 1
    assert "FAILED: tests that need no Ganeti exit 0" in capsys.readouterr().out


def test_the_31_run_gets_the_31_testbed_and_its_markers(monkeypatch: pytest.MonkeyPatch) -> None:
    run_suite, _ = _fake_runs(monkeypatch, "after")
    runs, mode = run_suite.real_runs()
    assert mode == "after" and [repr(r) for r in runs] == [
        "<RealRun Ganeti 3.0 (ganeti, ganeti3): not started>",
        "<RealRun Ganeti 3.1 (ganeti and not ganeti3): not started>",
    ]
    assert runs[0].env is None and runs[0].argv is run_suite.REAL
    assert runs[1].env["SYNNEFO_GANETI_TEST_RAPI_URL"] == "https://127.0.0.1:5081"
    assert runs[1].argv[runs[1].argv.index("-m", 2) + 1] == "ganeti and not ganeti3"


def test_serial_runs_the_units_then_30_then_31(monkeypatch: pytest.MonkeyPatch) -> None:
    run_suite, _ = _fake_runs(monkeypatch, "after")
    calls: list[tuple[str, str | None]] = []

    def call(args: list[str], env: dict[str, str] | None = None, **_: Any) -> int:
        marker = args[args.index("-m", 2) + 1]
        calls.append((marker, (env or {}).get("SYNNEFO_GANETI_TEST_RAPI_URL")))
        return 0

    monkeypatch.setattr(run_suite.subprocess, "call", call)
    monkeypatch.setenv("SYNNEFO_GANETI_TEST_SERIAL", "1")
    assert run_suite.main() == 0
    assert calls == [
        ("not ganeti and not ganeti3", None),
        ("ganeti or ganeti3", None),
        ("ganeti and not ganeti3", "https://127.0.0.1:5081"),
    ]


def test_an_unknown_v31_value_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    run_suite = _run_suite()
    monkeypatch.setenv("SYNNEFO_GANETI_TEST_V31", "yes")
    with pytest.raises(SystemExit, match="use 0"):
        run_suite.v31_mode()


# -- scripts/ganeti-testbed: which version, which testbed (no Ganeti needed) ---------------------------

DEBIAN_12 = (
    'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\nVERSION_CODENAME=bookworm\n'
)
DEBIAN_13 = (
    'PRETTY_NAME="Debian GNU/Linux 13 (trixie)"\nID=debian\nVERSION_ID="13"\nVERSION_CODENAME=trixie\n'
)


def _testbed(tmp_path: Path, os_release: str, *args: str) -> subprocess.CompletedProcess[str]:
    release = tmp_path / "os-release"
    release.write_text(os_release)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGTB_", "SYNNEFO_GANETI_TEST_"))}
    return subprocess.run(
        ["bash", str(SCRIPTS / "ganeti-testbed"), *args],
        env=env | {"SGTB_OS_RELEASE": str(release)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_env_of_the_31_testbed_on_debian_12(tmp_path: Path) -> None:
    done = _testbed(tmp_path, DEBIAN_12, "env", "--version", "3.1")
    assert done.returncode == 0, done.stderr
    assert _run_suite().parse_env(done.stdout) == {
        "SGTB_VERSION": "3.1",
        "SYNNEFO_GANETI_TEST_RAPI_URL": "https://127.0.0.1:5081",
        "SYNNEFO_GANETI_TEST_RAPI_USER": "ci",
        "SYNNEFO_GANETI_TEST_RAPI_PASSWORD": "ci",
        "SYNNEFO_GANETI_TEST_RAPI_CA": "/srv/ganeti31-root/var/lib/ganeti/rapi.pem",
        "SYNNEFO_GANETI_TEST_NODE": "node1.g31.test",
        "SYNNEFO_GANETI_TEST_NODES": "node1.g31.test",
        "SYNNEFO_GANETI_TEST_QUEUE": "/srv/ganeti31-root/var/lib/ganeti/queue",
    }


@pytest.mark.parametrize(
    ("os_release", "args", "version"),
    [
        (DEBIAN_12, (), "3.0"),
        (DEBIAN_12, ("--version", "3.0"), "3.0"),
        (DEBIAN_13, (), "3.1"),  # the machine's own 3.1, as 3.0 runs on Debian 12
        (DEBIAN_13, ("--version=3.1",), "3.1"),
        ("ID=ubuntu\nVERSION_ID=24.04\n", (), "3.0"),
    ],
)
def test_the_machines_own_version_serves_5080(
    tmp_path: Path, os_release: str, args: tuple[str, ...], version: str
) -> None:
    done = _testbed(tmp_path, os_release, "env", *args)
    assert done.returncode == 0, done.stderr
    printed = _run_suite().parse_env(done.stdout)
    assert printed["SGTB_VERSION"] == version
    assert printed["SYNNEFO_GANETI_TEST_RAPI_URL"] == "https://127.0.0.1:5080"
    assert printed["SYNNEFO_GANETI_TEST_NODE"] == "node1.ganeti.test"


@pytest.mark.parametrize(
    ("os_release", "args", "said"),
    [
        (DEBIAN_12, ("env", "--version", "2.16"), "unknown Ganeti version '2.16'"),
        (DEBIAN_12, ("up", "--version", "3.2"), "unknown Ganeti version '3.2'"),
        (DEBIAN_12, ("status", "--version"), "--version needs a value"),
        (DEBIAN_13, ("up", "--version", "3.0"), "Ganeti 3.0 needs Debian 12's packages"),
        (DEBIAN_12, ("up", "--version", "3.1", "--nodes", "3"), "has 1 node"),
        (DEBIAN_12, ("down", "--purge-root"), "--purge-root is for the 3.1 testbed"),
        (DEBIAN_12, ("env", "--nodes", "3"), "env: unknown argument --nodes"),
    ],
)
def test_the_testbed_refuses_clearly(
    tmp_path: Path, os_release: str, args: tuple[str, ...], said: str
) -> None:
    done = _testbed(tmp_path, os_release, *args)
    assert done.returncode == 1 and said in done.stderr, (done.returncode, done.stderr)
    assert done.stdout == ""


def test_run_suite_reads_the_31_variables_from_the_testbed_script() -> None:
    env = _run_suite().v31_env()
    assert env["SYNNEFO_GANETI_TEST_RAPI_URL"] in ("https://127.0.0.1:5081", "https://127.0.0.1:5080")
    assert env["SGTB_VERSION"] == "3.1"


def test_ci_brings_up_the_31_testbed_unless_told_not_to() -> None:
    ci = (SCRIPTS.parent / ".ci" / "run").read_text()
    assert "scripts/ganeti-testbed up --version 3.1" in ci
    assert 'SYNNEFO_GANETI_TEST_V31:-1}" != 0' in ci
    done = subprocess.run(
        ["bash", "-n", str(SCRIPTS.parent / ".ci" / "run")], capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


#: a tox env's log as ``.ci/run`` reads it: pytest's output with one failure and one error
_PYTEST_OUTPUT = """\
........F.E.                                                             [100%]
==================================== ERRORS ====================================
________________ ERROR at setup of test_needs_a_database[postgresql] ____________
[gw0] linux -- Python 3.11.7 /x/bin/python

    @pytest.fixture
    def db_url():
>       raise OSError("connection refused")
E       OSError: connection refused

tests/conftest.py:12: OSError
=================================== FAILURES ===================================
___ test_a_broker_away_loses_nothing[postgresql] ___
[gw1] linux -- Python 3.12.1 /x/bin/python

>   await eventually(lambda: last in got.ids(), what="every change")

tests/unit/test_amqp_feed.py:265:
_ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _
>               raise AssertionError(f"gave up after {timeout:g} s")
E               AssertionError: gave up after 30 s waiting for every change
E               assert False

tests/helpers.py:67: AssertionError
------------------------------ Captured log call -------------------------------
E  not an E line of the exception: a log line inside the failure is kept only up to E_LINES
=========================== short test summary info ============================
FAILED tests/unit/test_amqp_feed.py::test_a_broker_away_loses_nothing[postgresql]
=================== 1 failed, 9 passed, 1 error in 12.00s ======================
"""


def _ci_failures() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ci_failures", SCRIPTS / "ci-failures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclass looks its module up there)
    spec.loader.exec_module(module)
    return module


def test_ci_failures_says_each_failed_test_its_exception_and_where(tmp_path: Path) -> None:
    log = tmp_path / ".tox" / "py312-fast" / "log" / "3-commands[0].log"
    log.parent.mkdir(parents=True)
    log.write_text(_PYTEST_OUTPUT)
    quiet = tmp_path / ".tox" / "lint" / "log" / "1-commands[0].log"
    quiet.parent.mkdir(parents=True)
    quiet.write_text("All checks passed!\n")
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "ci-failures.py"), str(quiet), str(log)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert done.stdout.splitlines() == [
        "=== the 2 failure(s) of this run, in short (their whole output is above)",
        "--- py312-fast: ERROR at setup of test_needs_a_database[postgresql] (tests/conftest.py:12)",
        "    OSError: connection refused",
        "--- py312-fast: test_a_broker_away_loses_nothing[postgresql] "
        "(tests/unit/test_amqp_feed.py:265, raised at tests/helpers.py:67)",
        "    AssertionError: gave up after 30 s waiting for every change",
        "    assert False",
        "    not an E line of the exception: a log line inside the failure is kept only up to E_LINES",
    ]


def test_ci_failures_prints_nothing_for_a_run_without_failures(tmp_path: Path) -> None:
    log = tmp_path / "py" / "log" / "2-commands[0].log"
    log.parent.mkdir(parents=True)
    log.write_text("....\n===== 4 passed in 1.00s =====\n")
    missing = tmp_path / "gone.log"
    module = _ci_failures()
    assert module.failures(log.read_text(), "py") == []
    assert module.main([str(log)]) == 0
    assert module.main([str(missing)]) == 0  # (says it cannot read it, fails nothing)


def test_ci_ends_a_failed_run_with_its_failures_in_short() -> None:
    ci = (SCRIPTS.parent / ".ci" / "run").read_text()
    assert "python3 scripts/ci-failures.py .tox/*/log/*commands*.log" in ci
    assert ci.index("scripts/ci-failures.py") > ci.index("tox p -p 2")
