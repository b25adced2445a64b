"""scripts/run-suite.py and scripts/await-units.py: how .ci/run orders tox's envs two at a time.

The fast envs wait until run-suite.py's CPU-bound half has ended (its exit status in the file that
``SYNNEFO_GANETI_TEST_UNITS_DONE`` names), and never wait when it is not set (a plain ``tox``).
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
        marker.write_text("1\n")
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
