"""``any_of``: ``IN (a list)`` that PostgreSQL sees as one statement whatever the list's length
(``store/db/_any.py``), on SQLite and PostgreSQL, with the answers of the ``IN`` it replaces."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Column, Connection, Integer, MetaData, String, Table, event, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from synnefo_ganeti.store.db._any import any_of
from synnefo_ganeti.store.db._engine import Database
from synnefo_ganeti.store.requests._batch_reads import REQUESTS as _REQUESTS

_meta = MetaData()
_things = Table("any_of_things", _meta, Column("id", Integer, primary_key=True), Column("name", String(8)))
_BY_NAME = select(_things.c.id).where(any_of(func.lower(_things.c.name), "names")).order_by(_things.c.id)
_BY_ID = select(_things.c.id).where(any_of(_things.c.id, "ids")).order_by(_things.c.id)
_NAMES = [f"Thing{i}" for i in range(8)]  # 6 characters: the column holds 8


async def test_any_of_answers_as_in_and_is_one_statement_on_postgresql(db_url: str) -> None:
    statements: list[str] = []
    db = Database(db_url)
    await db.open()
    try:

        def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
            if "any_of_things" in statement and statement.lstrip().upper().startswith("SELECT"):
                statements.append(statement)

        event.listen(db.engine.sync_engine, "before_cursor_execute", seen)

        def setup(conn: Connection) -> None:
            _meta.create_all(conn)
            conn.execute(_things.insert(), [{"id": i, "name": name} for i, name in enumerate(_NAMES)])

        await db.run_transaction(setup)

        async def ask(query: Any, params: dict[str, Any]) -> list[int]:
            async def run(conn: AsyncConnection) -> list[int]:
                return list((await conn.execute(query, params)).scalars())

            return await db.read(run)

        assert await ask(_BY_NAME, {"names": ["thing1", "thing3"]}) == [1, 3]
        assert await ask(_BY_NAME, {"names": ["thing5"]}) == [5]
        assert await ask(_BY_NAME, {"names": []}) == []
        assert await ask(_BY_ID, {"ids": [7, 0, 99]}) == [0, 7]
        # a value longer than the column is not cut to the column's length (a cast to VARCHAR(8)[]
        # would cut "thing1-and-more" to "thing1-a", and "Thing12x" longer still to a stored name)
        assert await ask(_BY_NAME, {"names": ["thing1xyz", "thing2-and-more"]}) == []

        @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
        @given(st.lists(st.sampled_from([*(n.lower() for n in _NAMES), "other", "thing"]), max_size=10))
        def same_as_in(names: list[str]) -> None:
            wanted = sorted(i for i, name in enumerate(_NAMES) if name.lower() in names)
            answers.append((names, wanted))

        answers: list[tuple[list[str], list[int]]] = []
        same_as_in()
        for names, wanted in answers:
            assert await ask(_BY_NAME, {"names": names}) == wanted, names
        if db.engine.dialect.name == "postgresql":
            # one text whatever the length: asyncpg prepares it once a connection, not once a length
            assert len({s for s in statements if "lower(" in s}) == 1, set(statements)
            assert "= ANY(" in statements[0]
        else:
            assert " IN (" in statements[0]
        event.remove(db.engine.sync_engine, "before_cursor_execute", seen)
    finally:
        await db.close()


def test_the_hot_statements_bind_arrays_without_a_length_on_postgresql() -> None:
    from sqlalchemy.dialects.postgresql.asyncpg import dialect

    sql = str(_REQUESTS.compile(dialect=dialect()))
    assert "requests.id = ANY($1::VARCHAR[])" in sql, sql
