"""``benchmarks/_pg_log.py``: PostgreSQL's statement log summed by phase and statement."""

from __future__ import annotations

from benchmarks._pg_log import cpu_summary, summary

_LOG = """\
2026-11-29 13:06:33.412 UTC [14898] postgres@sg_bench_1 LOG:  duration: 2.500 ms  parse __asyncpg_stmt_1__: SELECT pg_backend_pid()
2026-11-29 13:06:40.000 UTC [14898] postgres@sg_bench_1 LOG:  duration: 0.500 ms  parse __asyncpg_stmt_2__: UPDATE requests
\tSET status = $1 WHERE id = $2
2026-11-29 13:06:40.001 UTC [14898] postgres@sg_bench_1 LOG:  duration: 0.250 ms  bind __asyncpg_stmt_2__: UPDATE requests
\tSET status = $1 WHERE id = $2
2026-11-29 13:06:40.001 UTC [14898] postgres@sg_bench_1 DETAIL:  parameters: $1 = 'x', $2 = 'y'
2026-11-29 13:06:40.002 UTC [14898] postgres@sg_bench_1 LOG:  duration: 1.000 ms  execute __asyncpg_stmt_2__: UPDATE requests
\tSET status = $1 WHERE id = $2
2026-11-29 13:06:40.003 UTC [14898] postgres@sg_bench_1 LOG:  duration: 2.000 ms  execute __asyncpg_stmt_2__: UPDATE requests
\tSET status = $1 WHERE id = $2
2026-11-29 13:06:40.004 UTC [14899] LOG:  duration: 1.250 ms  statement: COMMIT;
2026-11-29 13:06:41.000 UTC [2226] LOG:  checkpoint starting: time
"""


def test_the_log_is_summed_by_phase_and_statement_from_a_time_on() -> None:
    found = summary(_LOG.splitlines(), top=10, since="13:06:40")
    assert found["phases"] == {
        "bind": {"count": 1, "ms": 0.2},
        "execute": {"count": 2, "ms": 3.0},
        "parse": {"count": 1, "ms": 0.5},
        "statement": {"count": 1, "ms": 1.2},
    }
    statements = found["statements"]
    assert isinstance(statements, list)
    assert statements[0] == {
        "phase": "execute",
        "count": 2,
        "ms": 3.0,
        "text": "UPDATE requests SET status = $n WHERE id = $n",
    }
    assert found["distinct_parsed"] == 1  # (the parse before 13:06:40 is left out)


_CPU_LOG = """\
2026-11-29 23:08:31.273 UTC [9469] postgres@sg_bench_1 LOG:  duration: 0.156 ms  parse __asyncpg_stmt_1__: SELECT pg_backend_pid()
2026-11-29 23:08:31.273 UTC [9469] postgres@sg_bench_1 LOG:  PARSE MESSAGE STATISTICS
2026-11-29 23:08:31.273 UTC [9469] postgres@sg_bench_1 DETAIL:  ! system usage stats:
\t!\t0.000177 s user, 0.000000 s system, 0.000177 s elapsed
\t!\t[0.003039 s user, 0.000000 s system total]
2026-11-29 23:08:31.273 UTC [9469] postgres@sg_bench_1 STATEMENT:  SELECT pg_backend_pid()
2026-11-29 23:08:40.000 UTC [9469] postgres@sg_bench_1 LOG:  BIND MESSAGE STATISTICS
2026-11-29 23:08:40.000 UTC [9469] postgres@sg_bench_1 DETAIL:  ! system usage stats:
\t!\t0.000300 s user, 0.000100 s system, 0.000400 s elapsed
2026-11-29 23:08:40.000 UTC [9469] postgres@sg_bench_1 STATEMENT:  UPDATE requests
\tSET status = $1 WHERE id = $2
2026-11-29 23:08:40.001 UTC [9469] postgres@sg_bench_1 LOG:  EXECUTE MESSAGE STATISTICS
2026-11-29 23:08:40.001 UTC [9469] postgres@sg_bench_1 DETAIL:  ! system usage stats:
\t!\t0.000500 s user, 0.000100 s system, 0.000700 s elapsed
2026-11-29 23:08:40.001 UTC [9469] postgres@sg_bench_1 STATEMENT:  UPDATE requests
\tSET status = $1 WHERE id = $2
2026-11-29 23:08:40.002 UTC [9470] LOG:  QUERY STATISTICS
2026-11-29 23:08:40.002 UTC [9470] DETAIL:  ! system usage stats:
\t!\t0.000150 s user, 0.000050 s system, 0.000900 s elapsed
2026-11-29 23:08:40.002 UTC [9470] STATEMENT:  COMMIT;
"""


def test_the_cpu_of_each_message_is_summed_by_phase_and_by_statement_from_a_time_on() -> None:
    found = cpu_summary(_CPU_LOG.splitlines(), top=10, since="23:08:40")
    assert found["phases"] == {
        "bind": {"count": 1, "cpu_ms": 0.4},
        "execute": {"count": 1, "cpu_ms": 0.6},
        "statement": {"count": 1, "cpu_ms": 0.2},
    }  # (the parse before 23:08:40 is left out; a commit's CPU, not its 0.9 ms of waiting)
    assert found["cpu_ms"] == 1.2
    assert found["statements"] == [
        {
            "count": 1,
            "cpu_ms": 1.0,
            "cpu_us_each": 1000.0,
            "text": "UPDATE requests SET status = $n WHERE id = $n",
        },
        {"count": 1, "cpu_ms": 0.2, "cpu_us_each": 200.0, "text": "COMMIT;"},
    ]
