"""``benchmarks/_pg_log.py``: PostgreSQL's statement log summed by phase and statement."""

from __future__ import annotations

from benchmarks._pg_log import summary

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
