"""The benchmarks' databases: SQLite in a folder, or a scratch PostgreSQL database dropped after."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

PG_ADMIN_URL = os.environ.get(
    "SYNNEFO_GANETI_BENCH_PG",
    os.environ.get("SYNNEFO_GANETI_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres"),
)


async def _pg_admin(statement: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(PG_ADMIN_URL, timeout=10)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


def _with_database(url: str, name: str) -> str:
    """``url`` naming database ``name`` instead (its query, a Unix socket's ``host=``, kept)."""
    base, sep, query = url.partition("?")
    return base.rsplit("/", 1)[0] + f"/{name}" + sep + query


@asynccontextmanager
async def database(db: str, folder: str) -> AsyncIterator[str]:
    """A fresh database: SQLite in ``folder``, a scratch PostgreSQL one (dropped after), or ``db`` itself."""
    if db == "sqlite":
        yield f"sqlite:///{folder}/store-{uuid.uuid4().hex[:8]}.db"
        return
    if db != "postgresql":
        yield db
        return
    name = f"sg_bench_{uuid.uuid4().hex[:12]}"
    await _pg_admin(f'CREATE DATABASE "{name}"')
    if os.environ.get("SYNNEFO_GANETI_BENCH_PG_LOG"):
        # every statement of this database in PostgreSQL's log, with its time (see
        # benchmarks/_pg_log.py): for finding where PostgreSQL's time goes, not for figures
        await _pg_admin(f'ALTER DATABASE "{name}" SET log_min_duration_statement = 0')
        if os.environ["SYNNEFO_GANETI_BENCH_PG_LOG"] == "cpu":  # and each statement's CPU
            await _pg_admin(f'ALTER DATABASE "{name}" SET log_statement_stats = on')
    keep = bool(os.environ.get("SYNNEFO_GANETI_BENCH_KEEP_DB"))
    try:
        yield _with_database(PG_ADMIN_URL, name)
    finally:
        if keep:  # for reading a run's rows after it (drop it yourself)
            print(f"[benchmark] database {name} kept (SYNNEFO_GANETI_BENCH_KEEP_DB)", file=sys.stderr)
        else:
            await _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
