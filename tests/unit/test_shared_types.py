"""asyncpg connections share what they learn of PostgreSQL's built-in types (store/db/_types.py).

asyncpg asks the server about every type outside its own codecs (the arrays of the set-based
steps), once per connection: a recursive catalog query of ~8 ms of the server's CPU, 35-45 times
in a two-dispatcher burst. A built-in type never changes on a server, so the first connection's
answer serves the process. Proven on PostgreSQL with asyncpg's own query logger, which sees
every statement a connection sends, the catalog query included.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from synnefo_ganeti.store import Store
from synnefo_ganeti.store.db import _types
from synnefo_ganeti.store.db._types import SharedTypesConnection, connection_class, type_cache_stats
from tests.unit.test_keyed_locks import asyncpg_url

ARRAYS = "SELECT $1::BIGINT[] AS ids, $2::TIMESTAMPTZ[] AS times, ARRAY['a', 'b']::VARCHAR[] AS names"
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@pytest.fixture
def no_types_known(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process as if no connection had asked about a type yet."""
    monkeypatch.setattr(_types, "_known", {})


async def connected(url: str) -> tuple[asyncpg.Connection, list[str]]:
    """A shared-types connection and the statements it sends (asyncpg's query logger)."""
    conn = await asyncpg.connect(asyncpg_url(url), connection_class=SharedTypesConnection)
    sent: list[str] = []
    conn.add_query_logger(lambda record: sent.append(record.query))
    return conn, sent


def catalog_queries(sent: list[str]) -> int:
    return sum("typeinfo_tree" in query for query in sent)


async def test_a_second_connection_takes_the_types_the_first_asked_about(
    pg_url: str, no_types_known: None
) -> None:
    before = type_cache_stats()
    first, first_sent = await connected(pg_url)
    second, second_sent = await connected(pg_url)
    try:
        row = await first.fetchrow(ARRAYS, [1, 2], [NOW])
        assert catalog_queries(first_sent) == 1
        again = await second.fetchrow(ARRAYS, [3], [NOW, NOW])
        assert catalog_queries(second_sent) == 0  # the server was not asked again
        # and the codecs it took work both ways, as the first connection's do
        assert (row["ids"], row["times"], row["names"]) == ([1, 2], [NOW], ["a", "b"])
        assert (again["ids"], again["times"], again["names"]) == ([3], [NOW, NOW], ["a", "b"])
        after = type_cache_stats()
        assert after["asked"] - before["asked"] == 1
        assert after["shared"] - before["shared"] == 1
        # a statement of types partly new is asked about (those it needs that are not known)
        await second.fetchval("SELECT $1::INT2[]", [7])
        assert catalog_queries(second_sent) == 1
    finally:
        await first.close()
        await second.close()


async def test_a_type_made_after_initdb_is_asked_about_by_every_connection(
    pg_url: str, no_types_known: None
) -> None:
    """An enum can be dropped and made again under the same name with a new oid: never shared."""
    setup = await asyncpg.connect(asyncpg_url(pg_url))
    await setup.execute("DROP TYPE IF EXISTS sg_test_mood; CREATE TYPE sg_test_mood AS ENUM ('ok', 'sad')")
    first, first_sent = await connected(pg_url)
    second, second_sent = await connected(pg_url)
    try:
        for conn in (first, second):
            assert await conn.fetchval("SELECT $1::sg_test_mood[]", ["ok", "sad"]) == ["ok", "sad"]
        assert (catalog_queries(first_sent), catalog_queries(second_sent)) == (1, 1)
    finally:
        await first.close()
        await second.close()
        await setup.execute("DROP TYPE IF EXISTS sg_test_mood")
        await setup.close()


async def test_the_store_connects_with_shared_types(pg_url: str) -> None:
    async with Store(pg_url) as store, store.engine.connect() as conn:
        raw: Any = await conn.get_raw_connection()
        assert isinstance(raw.driver_connection, SharedTypesConnection)


def test_an_asyncpg_whose_hook_changed_gets_its_plain_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    assert connection_class() is SharedTypesConnection

    async def changed(self: Any, typeoids: Any, timeout: Any, *, more: bool = False) -> Any:
        raise AssertionError("never called")

    monkeypatch.setattr(asyncpg.Connection, "_introspect_types", changed)
    assert connection_class() is asyncpg.Connection
