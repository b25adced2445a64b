"""PostgreSQL's statement log, summed: where a benchmark's PostgreSQL time went, statement by statement.

Run a benchmark with ``SYNNEFO_GANETI_BENCH_PG_LOG=1`` (its scratch database then logs every
statement with its duration: ``log_min_duration_statement = 0``, on that database alone), note the
log's size before, then::

    python benchmarks/_pg_log.py /var/log/postgresql/postgresql-15-main.log --from-byte N [--top 30]

It prints one JSON object: per phase (parse, bind, execute, simple statements) the count and the
milliseconds, and the statements of most time with their counts. A tool for finding costs, not a
benchmark: logging every statement costs PostgreSQL time of its own.
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path

import orjson

_LINE = re.compile(
    r"^(\S+ \S+) UTC \[(\d+)\] (?:\S+ )?LOG:  duration: ([0-9.]+) ms  (parse|bind|execute|statement)([^:]*): ?(.*)$"
)


def _normal(text: str) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    text = re.sub(r"\$\d+", "$n", text)
    return text[:160]


def summary(lines: list[str], top: int, since: str = "") -> dict[str, object]:
    phases: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    statements: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    current: tuple[str, float, list[str]] | None = None

    def close() -> None:
        if current is None:
            return
        phase, ms, text = current
        key = (phase, _normal(" ".join(text)))
        statements[key][0] += 1
        statements[key][1] += ms

    for line in lines:
        found = _LINE.match(line)
        if found:
            close()
            at, _pid, ms, phase, _name, text = found.groups()
            if at.split(" ")[-1] < since:
                current = None
                continue
            phases[phase][0] += 1
            phases[phase][1] += float(ms)
            current = (phase, float(ms), [text])
        elif line.startswith("\t") and current is not None:
            current[2].append(line)
        else:
            close()
            current = None
    close()
    ranked = sorted(statements.items(), key=lambda item: -item[1][1])[:top]
    return {
        "phases": {phase: {"count": int(c), "ms": round(ms, 1)} for phase, (c, ms) in sorted(phases.items())},
        "statements": [
            {"phase": phase, "count": int(c), "ms": round(ms, 1), "text": text}
            for (phase, text), (c, ms) in ranked
        ],
        "distinct_parsed": len({text for (phase, text) in statements if phase == "parse"}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--from-byte", type=int, default=0)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--since", default="", help="a time of day (HH:MM:SS): the lines from then on")
    args = parser.parse_args()
    with args.log.open("rb") as handle:
        handle.seek(args.from_byte)
        lines = handle.read().decode(errors="replace").splitlines()
    print(orjson.dumps(summary(lines, args.top, args.since), option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
