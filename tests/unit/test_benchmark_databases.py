"""``benchmarks/_databases.py``: a scratch database's URL keeps the admin URL's query (a Unix
socket's ``host=``), and such a URL reaches PostgreSQL through the socket."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from benchmarks._databases import _with_database
from sqlalchemy import text

from synnefo_ganeti.store import Store

SOCKET_DIR = Path("/var/run/postgresql")


def test_the_database_is_named_before_the_query_not_inside_the_sockets_path() -> None:
    assert _with_database("postgresql://postgres@127.0.0.1:5432/postgres", "sg_x") == (
        "postgresql://postgres@127.0.0.1:5432/sg_x"
    )
    assert _with_database("postgresql://postgres@/postgres?host=/var/run/postgresql", "sg_x") == (
        "postgresql://postgres@/sg_x?host=/var/run/postgresql"
    )


async def test_a_url_with_the_sockets_host_connects_through_the_socket(pg_url: str) -> None:
    if not (SOCKET_DIR / ".s.PGSQL.5432").exists():
        if os.environ.get("CI"):
            pytest.fail(f"no PostgreSQL socket in {SOCKET_DIR} (CI runs PostgreSQL on this machine)")
        pytest.skip(f"no PostgreSQL socket in {SOCKET_DIR}")
    name = pg_url.split("?", 1)[0].rsplit("/", 1)[1]
    url = _with_database(f"postgresql://postgres@/postgres?host={SOCKET_DIR}", name)
    async with Store(url) as store:
        # (inet_client_addr() is NULL on a Unix socket's connection)
        assert (
            await store.call_read(lambda conn: conn.execute(text("SELECT inet_client_addr()")).scalar())
            is None
        )
