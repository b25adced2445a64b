#!/usr/bin/env python3
"""Wait until run-suite.py's tests that need no Ganeti have ended, when told to.

tox's fast envs run this first. Without ``SYNNEFO_GANETI_TEST_UNITS_DONE`` (a plain ``tox``, one
env after the other) it returns at once. ``.ci/run`` sets it and runs tox's envs two at a time
(``tox p``): then the fast envs wait until ``scripts/run-suite.py`` has written that file, so that
they run beside the real-Ganeti tests' last minutes (which mostly wait on Ganeti), never beside the
CPU-bound tests of the ``py`` env (which would double the machine's load under them).

It gives up waiting after ``SYNNEFO_GANETI_TEST_UNITS_WAIT`` seconds (default 1,800), with a
message, and lets the fast tests run: a ``py`` env that failed before it could write the file
fails the run on its own.
"""

from __future__ import annotations

import os
import sys
import time


def main() -> int:
    path = os.environ.get("SYNNEFO_GANETI_TEST_UNITS_DONE")
    if not path:
        return 0
    limit = float(os.environ.get("SYNNEFO_GANETI_TEST_UNITS_WAIT", "1800"))
    t0 = time.monotonic()
    print(f"[await-units] waiting for the py env's tests that need no Ganeti to end ({path})", flush=True)
    while not os.path.exists(path):
        if time.monotonic() - t0 > limit:
            print(f"[await-units] {path} did not appear within {limit:.0f} s: running anyway", flush=True)
            return 0
        time.sleep(1)  # a CI scheduling poll, not a test: the other env writes the file once
    with open(path) as status:
        said = status.read().strip()
    print(
        f"[await-units] they ended (exit {said}) after {time.monotonic() - t0:.0f} s of waiting", flush=True
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
