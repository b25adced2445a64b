#!/usr/bin/env python3
"""Run the whole test suite: the tests that need no Ganeti and the real-Ganeti ones, at once.

tox's ``py`` env runs this. The real-Ganeti tests run one at a time against one cluster and spend
most of their time waiting on Ganeti's jobs; the others are CPU-bound on ``-n`` workers. Run one
after the other they took about 5 minutes each in CI; side by side the real ones wait while the
others compute. There are two real runs:

* on Ganeti 3.0, the testbed the ``SYNNEFO_GANETI_TEST_*`` variables name (CI: the 3-node one):
  every test marked ``ganeti`` or ``ganeti3``;
* on Ganeti 3.1, the testbed of ``scripts/ganeti-testbed env --version 3.1`` (its variables for this
  run only): the tests marked ``ganeti`` and not ``ganeti3`` (the 3.1 testbed has one node).

Each real run's output goes to a file and is printed once it has ended and the tests that need no
Ganeti have ended too (its failures first if it failed), so that nothing interleaves.

    python scripts/run-suite.py [pytest args for the tests that need no Ganeti]

``SYNNEFO_GANETI_TEST_V31``: ``0`` leaves the 3.1 run out (a laptop without the 3.1 testbed);
``after`` (the default, also ``1``) starts it when the 3.0 run has ended; ``beside`` starts it with
the 3.0 run (docs/ganeti-testbed.md has the figures that chose ``after``).

``SYNNEFO_GANETI_TEST_SERIAL=1`` runs everything one after the other instead (to tell a failure that
only shows under load from one that does not). The exit status is non-zero when any run failed.

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
import threading
import time
from pathlib import Path
from typing import IO

PYTEST = [sys.executable, "-m", "pytest"]
#: the CPU-bound tests' workers: one per core, at most 4 (SYNNEFO_GANETI_TEST_WORKERS says otherwise).
#: On CI's two cores, 4 workers beside the real-Ganeti tests and their clusters made a load of 7-10
#: and timed tests out for want of CPU (a 9 s test took over 40 s); 2 keep each test near its pace.
WORKERS = os.environ.get("SYNNEFO_GANETI_TEST_WORKERS") or str(min(4, os.cpu_count() or 2))
UNIT = [*PYTEST, "-m", "not ganeti and not ganeti3", "-n", WORKERS]
REAL = [*PYTEST, "-m", "ganeti or ganeti3", "tests/integration", "--durations=15"]
REAL31 = [*PYTEST, "-m", "ganeti and not ganeti3", "tests/integration", "--durations=15"]
TESTBED = Path(__file__).resolve().parent / "ganeti-testbed"
V31_MODES = {"0": "off", "1": "after", "after": "after", "beside": "beside"}


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


def v31_mode() -> str:
    """``off``, ``after`` or ``beside``, from ``SYNNEFO_GANETI_TEST_V31`` (default ``after``)."""
    value = os.environ.get("SYNNEFO_GANETI_TEST_V31", "").strip().lower() or "1"
    if value not in V31_MODES:
        raise SystemExit(f"SYNNEFO_GANETI_TEST_V31={value!r}: use 0 (no 3.1 run), after (or 1), or beside")
    return V31_MODES[value]


def parse_env(text: str) -> dict[str, str]:
    """The ``export NAME=VALUE`` lines ``scripts/ganeti-testbed env`` prints (its values have no spaces)."""
    found = {}
    for line in text.splitlines():
        name, sep, value = line.removeprefix("export ").partition("=")
        if sep and name.isidentifier():
            found[name] = value
    return found


def v31_env() -> dict[str, str]:
    """This environment with the 3.1 testbed's variables (``scripts/ganeti-testbed env --version 3.1``)."""
    printed = subprocess.run(
        [str(TESTBED), "env", "--version", "3.1"], capture_output=True, text=True, check=True
    ).stdout
    return os.environ | parse_env(printed)


class RealRun:
    """One real-Ganeti pytest run, its output in a file until it is printed."""

    def __init__(self, label: str, argv: list[str], env: dict[str, str] | None) -> None:
        self.label = label
        self.argv = argv
        self.env = env
        self.log: IO[str] | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.started = self.ended = 0.0
        self.status: int | None = None

    def __repr__(self) -> str:
        if self.process is None:
            return f"<RealRun {self.label}: not started>"
        return f"<RealRun {self.label}: {'running' if self.status is None else f'exit {self.status}'}>"

    def start(self, *, say: bool = True) -> None:
        """Start it; ``say=False`` from another thread (its report tells when it started)."""
        self.log = tempfile.NamedTemporaryFile("w+", prefix="real-ganeti-tests-", suffix=".log")  # noqa: SIM115
        if say:
            _say(
                f"real-Ganeti tests on {self.label} started (output: {self.log.name}, printed when they end)"
            )
        self.started = time.monotonic()
        self.process = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT, env=self.env)

    def wait(self) -> int:
        assert self.process is not None
        if self.status is None:
            self.status = self.process.wait()
            self.ended = time.monotonic()
        return self.status

    def stop(self) -> None:
        if self.process is not None and self.status is None:
            self.process.terminate()  # nothing when it has ended meanwhile
            self.process.wait()
        if self.log is not None:
            self.log.close()

    def report(self, t0: float) -> None:
        """Its exit status and times, then its output."""
        assert self.log is not None
        _say(
            f"real-Ganeti tests on {self.label}: exit {self.status} after {self.ended - self.started:.0f} s "
            f"(from +{self.started - t0:.0f} s to +{self.ended - t0:.0f} s); their output:"
        )
        self.log.flush()
        self.log.seek(0)
        sys.stdout.write(self.log.read())
        sys.stdout.flush()
        self.log.close()


def real_runs() -> tuple[list[RealRun], str]:
    mode = v31_mode()
    runs = [RealRun("Ganeti 3.0 (ganeti, ganeti3)", REAL, None)]
    if mode != "off":
        runs.append(RealRun("Ganeti 3.1 (ganeti and not ganeti3)", REAL31, v31_env()))
    return runs, mode


def _serial(extra: list[str], runs: list[RealRun]) -> int:
    order = ", then ".join(run.label for run in runs)
    _say(f"serial: the tests that need no Ganeti, then the real-Ganeti ones on {order}")
    statuses = [_units(extra)]
    for run in runs:
        _say(f"real-Ganeti tests on {run.label}")
        statuses.append(subprocess.call(run.argv, env=run.env))
    return next((s for s in statuses if s), 0)


def main() -> int:
    extra = sys.argv[1:]
    runs, mode = real_runs()
    if os.environ.get("SYNNEFO_GANETI_TEST_SERIAL") == "1":
        return _serial(extra, runs)
    t0 = time.monotonic()
    stopping = threading.Event()
    chain: threading.Thread | None = None
    try:
        runs[0].start()
        if mode == "beside":
            runs[1].start()
        elif mode == "after":
            _say(f"real-Ganeti tests on {runs[1].label}: to start when those on {runs[0].label} have ended")

            def after_the_first() -> None:
                runs[0].wait()
                if not stopping.is_set():
                    runs[1].start(say=False)  # the units' pytest may be writing to the same stdout

            chain = threading.Thread(target=after_the_first, name="3.1 after 3.0", daemon=True)
            chain.start()
        unit = _units(extra)
        _say(f"tests that need no Ganeti: exit {unit} after {time.monotonic() - t0:.0f} s")
        for run in runs:
            if chain is not None and run is runs[-1]:
                chain.join()
            run.wait()
            run.report(t0)
    except BaseException:
        stopping.set()
        runs[0].stop()
        if chain is not None:
            chain.join(timeout=30)  # it starts no run once told to stop; one it was starting is stopped
        for run in runs[1:]:
            run.stop()
        raise
    statuses = [run.status for run in runs]
    if unit or any(statuses):
        said = ", ".join(f"{run.label} exit {run.status}" for run in runs)
        _say(f"FAILED: tests that need no Ganeti exit {unit}, real-Ganeti tests: {said}")
    return unit or next((s for s in statuses if s), 0)


if __name__ == "__main__":
    sys.exit(main())
