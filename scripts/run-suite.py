#!/usr/bin/env python3
"""Run the whole test suite: the tests that need no Ganeti and the real-Ganeti ones, at once.

tox's ``py`` env runs this. The real-Ganeti tests (markers ``ganeti`` and ``ganeti3``) run one at
a time against one cluster and spend most of their time waiting on Ganeti's jobs; the others are
CPU-bound on ``-n`` workers. Run one after the other they took about 5 minutes each in CI; side by
side the real ones wait while the others compute. The real run's output goes to a file and is
printed once both ended (its failures first if it failed), so the two do not interleave.

    python scripts/run-suite.py [pytest args for the first run]

``SYNNEFO_GANETI_TEST_SERIAL=1`` runs them one after the other instead (to tell a failure that only
shows under load from one that does not). The exit status is non-zero when either run failed.

``SYNNEFO_GANETI_TEST_UNITS_DONE=FILE``: once the tests that need no Ganeti have ended (or this run
stopped before they could), FILE holds their exit status. ``.ci/run`` runs tox's envs two at a
time and the fast envs wait for FILE (``scripts/await-units.py``): they run beside the real-Ganeti
tests' last minutes, when those mostly wait on Ganeti, not beside the CPU-bound tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

UNIT = [sys.executable, "-m", "pytest", "-m", "not ganeti and not ganeti3", "-n", "4"]
REAL = [sys.executable, "-m", "pytest", "-m", "ganeti or ganeti3", "tests/integration", "--durations=15"]


def _say(message: str) -> None:
    print(f"[run-suite {time.strftime('%H:%M:%S')}] {message}", flush=True)


def _units_done(status: int | str) -> None:
    """Tell whoever waits for the tests that need no Ganeti (``SYNNEFO_GANETI_TEST_UNITS_DONE``)."""
    path = os.environ.get("SYNNEFO_GANETI_TEST_UNITS_DONE")
    if not path:
        return
    part = f"{path}.part"
    with open(part, "w") as out:
        out.write(f"{status}\n")
    os.replace(part, path)


def _units(extra: list[str]) -> int:
    """The tests that need no Ganeti; their waiters told when they end, or that they stopped."""
    try:
        status = subprocess.call(UNIT + extra)
    except BaseException:
        _units_done("stopped")
        raise
    _units_done(status)
    return status


def _serial(extra: list[str]) -> int:
    _say("serial: the tests that need no Ganeti, then the real-Ganeti ones")
    first = _units(extra)
    second = subprocess.call(REAL)
    return first or second


def main() -> int:
    extra = sys.argv[1:]
    if os.environ.get("SYNNEFO_GANETI_TEST_SERIAL") == "1":
        return _serial(extra)
    t0 = time.monotonic()
    with tempfile.NamedTemporaryFile("w+", prefix="real-ganeti-tests-", suffix=".log") as log:
        _say(f"real-Ganeti tests started (output: {log.name}, printed when they end)")
        real = subprocess.Popen(REAL, stdout=log, stderr=subprocess.STDOUT)
        try:
            unit = _units(extra)
            _say(f"tests that need no Ganeti: exit {unit} after {time.monotonic() - t0:.0f} s")
            real_rc = real.wait()
        except BaseException:
            real.terminate()
            real.wait()
            raise
        _say(f"real-Ganeti tests: exit {real_rc} after {time.monotonic() - t0:.0f} s; their output:")
        log.flush()
        log.seek(0)
        sys.stdout.write(log.read())
        sys.stdout.flush()
    if unit or real_rc:
        _say(f"FAILED: tests that need no Ganeti exit {unit}, real-Ganeti tests exit {real_rc}")
    return unit or real_rc


if __name__ == "__main__":
    sys.exit(main())
