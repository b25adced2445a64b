#!/usr/bin/env python3
"""The failed tests of a CI run, in short, for the end of its output.

``.ci/run`` prints every tox env's output after ``tox p``, one env after the other; a failure of
the ``py`` env's real-Ganeti tests ends up in the middle of an hour's output, far from its end,
which is all a reader of a CI summary may get. When the run failed, ``.ci/run`` calls this with
the envs' command logs (``.tox/<env>/log/*commands*.log``): for each failed or errored test of
each log, its header, its first ``E`` lines (the exception and its message) and where it was
raised, so that the last screen of the output says what failed and why.

Usage: ``ci-failures.py LOG [LOG ...]`` (an env's name is the directory above ``log/``). Prints
nothing for logs without a pytest ``FAILURES`` or ``ERRORS`` section; exits 0 in every case.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

#: a pytest section line: ``==== FAILURES ====``, ``==== short test summary info ====`` ...
_SECTION = re.compile(r"^=+ (.+?) =+$")
#: a failed test's header inside FAILURES or ERRORS: ``____ test_name[param] ____``
_HEADER = re.compile(r"^_{3,} (.+?) _{3,}$")
#: a frame's place in a traceback: ``tests/unit/test_x.py:265: `` or ``tests/helpers.py:67: AssertionError``
_WHERE = re.compile(r"^(\S+\.py):(\d+):(?: \w[\w.]*)?\s*$")
#: the ``E`` lines kept of each failure (the exception's first lines)
E_LINES = 6


@dataclass
class Failure:
    env: str
    test: str
    errors: list[str] = field(default_factory=list)
    where: list[str] = field(default_factory=list)  # (the traceback's frames: the test's first)


def failures(text: str, env: str) -> list[Failure]:
    """Each failure of the FAILURES and ERRORS sections of pytest's output ``text``."""
    found: list[Failure] = []
    inside = False
    current: Failure | None = None
    for line in text.splitlines():
        section = _SECTION.match(line)
        if section:
            inside = section.group(1) in ("FAILURES", "ERRORS")
            current = None
            continue
        if not inside:
            continue
        header = _HEADER.match(line)
        if header:
            current = Failure(env, header.group(1))
            found.append(current)
        elif current is not None and line.startswith("E ") and len(current.errors) < E_LINES:
            current.errors.append(line[1:].strip())
        elif current is not None and (where := _WHERE.match(line)):
            current.where.append(f"{where.group(1)}:{where.group(2)}")
    return found


def env_of(log: Path) -> str:
    """``.tox/py312-fast/log/3-commands[0].log`` -> ``py312-fast``."""
    return log.parent.parent.name if log.parent.name == "log" else log.parent.name


def main(argv: list[str]) -> int:
    everything = []
    for name in argv:
        path = Path(name)
        try:
            text = path.read_text(errors="replace")
        except OSError as exc:
            print(f"ci-failures: cannot read {path}: {exc}")
            continue
        everything.extend(failures(text, env_of(path)))
    if not everything:
        return 0
    print(f"=== the {len(everything)} failure(s) of this run, in short (their whole output is above)")
    for failure in everything:
        where = ""
        if failure.where:  # the test's own line, and where it was raised if elsewhere
            where = (
                failure.where[0]
                if len(failure.where) == 1
                else f"{failure.where[0]}, raised at {failure.where[-1]}"
            )
            where = f" ({where})"
        print(f"--- {failure.env}: {failure.test}{where}")
        for line in failure.errors:
            print(f"    {line[:300]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
