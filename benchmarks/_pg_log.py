"""PostgreSQL's statement log, summed: where a benchmark's PostgreSQL time went, statement by statement.

Run a benchmark with ``SYNNEFO_GANETI_BENCH_PG_LOG=1`` (its scratch database then logs every
statement with its duration: ``log_min_duration_statement = 0``, on that database alone), note the
log's size before, then::

    python benchmarks/_pg_log.py /var/log/postgresql/postgresql-15-main.log --from-byte N [--top 30]

It prints one JSON object: per phase (parse, bind, execute, simple statements) the count and the
milliseconds, and the statements of most time with their counts. A tool for finding costs, not a
benchmark: logging every statement costs PostgreSQL time of its own.

With ``SYNNEFO_GANETI_BENCH_PG_LOG=cpu`` the database also logs each message's CPU
(``log_statement_stats``: user + system seconds, from ``getrusage``); ``--cpu`` then sums that CPU,
per phase and per statement, instead of the durations: where PostgreSQL's CPU goes, not its wall
time (a duration also counts waits: a lock, a commit's flush, the CPU given to another process).
A statement's CPU is its parse, bind and execute messages' (or its simple query's) together.
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


_STATS = re.compile(
    r"^(\S+ \S+) UTC \[(\d+)\] (?:\S+ )?LOG:  (PARSE MESSAGE|BIND MESSAGE|EXECUTE MESSAGE|QUERY) STATISTICS"
)
_USAGE = re.compile(r"!\t([0-9.]+) s user, ([0-9.]+) s system, ")
_PHASES = {
    "PARSE MESSAGE": "parse",
    "BIND MESSAGE": "bind",
    "EXECUTE MESSAGE": "execute",
    "QUERY": "statement",
}


def cpu_summary(lines: list[str], top: int, since: str = "") -> dict[str, object]:
    """``log_statement_stats`` blocks summed: CPU ms per phase, and per statement (its messages
    together) with its executions (execute messages and simple queries) and its CPU each."""
    phases: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    statements: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    index = 0
    while index < len(lines):
        found = _STATS.match(lines[index])
        index += 1
        if not found:
            continue
        at, _pid, kind = found.groups()
        seconds = 0.0
        while index < len(lines) and " STATEMENT:  " not in lines[index]:
            usage = _USAGE.search(lines[index])
            if usage:
                seconds = float(usage.group(1)) + float(usage.group(2))
            index += 1
        if index >= len(lines):
            break
        text = [lines[index].split(" STATEMENT:  ", 1)[1]]
        index += 1
        while index < len(lines) and lines[index].startswith("\t"):
            text.append(lines[index])
            index += 1
        if at.split(" ")[-1] < since:
            continue
        phase, ms = _PHASES[kind], seconds * 1000
        phases[phase][0] += 1
        phases[phase][1] += ms
        entry = statements[_normal(" ".join(text))]
        entry[0] += phase in ("execute", "statement")
        entry[1] += ms
    ranked = sorted(statements.items(), key=lambda item: -item[1][1])[:top]
    return {
        "phases": {
            phase: {"count": int(c), "cpu_ms": round(ms, 1)} for phase, (c, ms) in sorted(phases.items())
        },
        "cpu_ms": round(sum(ms for _c, ms in phases.values()), 1),
        "statements": [
            {
                "count": int(c),
                "cpu_ms": round(ms, 1),
                "cpu_us_each": round(1000 * ms / c, 1) if c else None,
                "text": text,
            }
            for text, (c, ms) in ranked
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--from-byte", type=int, default=0)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--since", default="", help="a time of day (HH:MM:SS): the lines from then on")
    parser.add_argument("--cpu", action="store_true", help="sum log_statement_stats' CPU (PG_LOG=cpu runs)")
    args = parser.parse_args()
    with args.log.open("rb") as handle:
        handle.seek(args.from_byte)
        lines = handle.read().decode(errors="replace").splitlines()
    found = (cpu_summary if args.cpu else summary)(lines, args.top, args.since)
    print(orjson.dumps(found, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
