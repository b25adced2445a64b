"""The new requests' checks on PostgreSQL (migration 0018, ``synnefo_ganeti_add_checks``) read
indexes however the tables have grown since the session's first call: the function keeps one
plan for the session, and a plan made on empty tables must not read them whole once they fill.

The plans are read from ``auto_explain`` (PostgreSQL's contrib module, loaded in the session),
which reports the statements a function runs with their plans to the client."""

from __future__ import annotations

import asyncpg
import pytest

_CALL = "SELECT * FROM synnefo_ganeti_add_checks($1::text[], $2::text[])"


async def test_a_session_whose_first_checks_saw_empty_tables_still_reads_indexes(pg_url: str) -> None:
    from synnefo_ganeti.store import Store

    async with Store(pg_url):  # the schema, by the migrations
        pass
    conn = await asyncpg.connect(pg_url.replace("postgresql+asyncpg://", "postgresql://"))
    plans: list[str] = []
    conn.add_log_listener(lambda _conn, message: plans.append(str(message.message)))
    try:
        try:
            await conn.execute("LOAD 'auto_explain'")
        except asyncpg.PostgresError as exc:  # contrib not installed: a machine fact, said plainly
            pytest.fail(f"PostgreSQL's auto_explain is needed to read the plans: {exc}")
        for _ in range(6):  # PL/pgSQL keeps its plan from the first call: the tables are empty
            assert await conn.fetch(_CALL, ["nobody"], ["nothing.example"]) == []
        await conn.execute(
            "INSERT INTO requests (id, status, name, spec, attempts, cancel_requested, created_at, updated_at)"
            " SELECT md5(g::text), 'succeeded', 'past-' || g || '.example', '{}', 0, false, now(), now()"
            " FROM generate_series(1, 5000) g"
        )
        await conn.execute(
            "SET client_min_messages = log; SET auto_explain.log_min_duration = 0;"
            " SET auto_explain.log_nested_statements = on"
        )
        rows = await conn.fetch(_CALL, [], ["past-7.example"])
        assert [(r["c_kind"], r["c_name"]) for r in rows] == [("request", "past-7.example")]
        nested = [plan for plan in plans if "FROM requests r" in plan]
        assert nested, plans
        assert (
            "Index Scan on ix_requests_name_lower" in nested[-1]
            or "Index Scan using ix_requests_name_lower" in nested[-1]
        ), nested[-1]
        assert "Seq Scan on requests" not in nested[-1], nested[-1]
    finally:
        await conn.close()
