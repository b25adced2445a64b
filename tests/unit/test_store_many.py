"""``execute_many``: an ``executemany`` run as one statement on PostgreSQL (``store/db/_many.py``),
on SQLite and PostgreSQL, leaving the rows as the ``executemany`` it replaces leaves them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import (
    JSON,
    Column,
    Connection,
    DateTime,
    Integer,
    MetaData,
    String,
    Table,
    bindparam,
    event,
    insert,
    select,
    update,
)
from sqlalchemy.exc import DBAPIError, StatementError

from synnefo_ganeti.store.db._engine import Database
from synnefo_ganeti.store.db._many import execute_many

_meta = MetaData()
_things = Table(
    "many_things",
    _meta,
    Column("id", Integer, primary_key=True),
    Column("name", String(8)),
    Column("doc", JSON),
    Column("at", DateTime(timezone=True)),
    Column("count", Integer, nullable=False, server_default="7"),
)
_INSERT = insert(_things)
_RENAME = (
    update(_things)
    .where(_things.c.id == bindparam("b_id"), _things.c.name != "locked")
    .values(name=bindparam("b_name"), doc=bindparam("b_doc"), count=_things.c.count + 1)
)
_BY_COLUMNS = update(_things).where(_things.c.id == bindparam("b_id"))  # values: the rows' column keys
_T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)

_docs = st.one_of(
    st.none(),
    st.text(max_size=4),  # (no bare number: SQLite's JSON column stores it as a number, unread)
    st.lists(st.integers(0, 3), max_size=3),
    st.dictionaries(st.sampled_from(["a", "é", "k"]), st.one_of(st.none(), st.integers(0, 3)), max_size=2),
)
_rows = st.lists(
    st.fixed_dictionaries(
        {"id": st.integers(0, 30), "name": st.sampled_from(["a", "bb", "locked", "Ünï", ""]), "doc": _docs}
    ),
    min_size=1,
    max_size=12,
    unique_by=lambda row: row["id"],
)
_renames = st.lists(
    st.fixed_dictionaries(
        {"b_id": st.integers(0, 35), "b_name": st.sampled_from(["x", "yy", "locked"]), "b_doc": _docs}
    ),
    min_size=1,
    max_size=12,
)


def _read(conn: Connection) -> list[tuple[Any, ...]]:
    query = select(_things, _things.c.doc.is_(None).label("sql_null")).order_by(_things.c.id)
    return [tuple(row) for row in conn.execute(query)]


def _fresh(conn: Connection) -> None:
    _meta.drop_all(conn)
    _meta.create_all(conn)


@pytest.fixture
async def db(db_url: str) -> Any:
    database = Database(db_url)
    await database.open()
    try:
        yield database
    finally:

        def drop(conn: Connection) -> None:
            _meta.drop_all(conn)

        await database.run_transaction(drop)
        await database.close()


async def test_execute_many_leaves_the_rows_as_executemany_does(db: Database) -> None:
    cases: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = []

    @settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(_rows, _renames)
    def collect(rows: list[dict[str, Any]], renames: list[dict[str, Any]]) -> None:
        cases.append((rows, renames))

    collect()

    def both(conn: Connection) -> None:
        for rows, renames in cases:
            rows = [{**row, "at": _T0 + timedelta(seconds=row["id"])} for row in rows]
            answers = []
            for run in (
                lambda statement, params, **kw: conn.execute(statement, params),
                lambda statement, params, **kw: execute_many(conn, statement, params, **kw),
            ):
                _fresh(conn)
                run(_INSERT, rows)
                run(_RENAME, renames, key=("b_id",))  # (repeated ids: as the executemany)
                moved = [{"b_id": row["id"], "at": None, "doc": {"n": row["id"]}} for row in rows[::2]]
                run(_BY_COLUMNS, moved, key=("b_id",))
                answers.append(_read(conn))
            assert answers[0] == answers[1], (rows, renames)

    await db.run_transaction(both)


async def test_execute_many_is_one_statement_on_postgresql_whatever_the_rows(db: Database) -> None:
    statements: list[tuple[str, bool]] = []

    def seen(_conn: Any, _cursor: Any, statement: str, _params: Any, _context: Any, many: bool) -> None:
        if "many_things" in statement and statement.lstrip().upper().startswith(("INSERT", "UPDATE")):
            statements.append((statement, many))

    def write(conn: Connection) -> None:
        _fresh(conn)
        for count in (2, 5, 9):
            start = len(_read(conn))
            rows = [{"id": start + i, "name": f"n{i}", "doc": [i], "at": _T0} for i in range(count)]
            execute_many(conn, _INSERT, rows)
            execute_many(
                conn,
                _RENAME,
                [{"b_id": row["id"], "b_name": "r", "b_doc": None} for row in rows],
                key=("b_id",),
            )

    event.listen(db.engine.sync_engine, "before_cursor_execute", seen)
    try:
        await db.run_transaction(write)
    finally:
        event.remove(db.engine.sync_engine, "before_cursor_execute", seen)
    if db.engine.dialect.name == "postgresql":
        assert len(statements) == 6 and not any(many for _, many in statements)  # one each, no executemany
        assert len({text for text, _ in statements}) == 2  # one text whatever the number of rows
        assert all("unnest(" in text for text, _ in statements)
    else:
        assert all(many for _, many in statements)  # SQLite: the executemany as before


async def test_execute_many_fails_as_executemany_on_a_value_too_long(db: Database) -> None:
    """No silent cut: an array of ``VARCHAR(8)`` would cut a longer name to 8 characters."""

    def too_long(conn: Connection) -> None:
        _fresh(conn)
        execute_many(
            conn, _INSERT, [{"id": i, "name": "longer-than-eight", "doc": None, "at": None} for i in range(3)]
        )

    if db.engine.dialect.name == "sqlite":
        await db.run_transaction(too_long)  # (SQLite keeps any length: the executemany's own answer)
        return
    with pytest.raises((DBAPIError, StatementError), match="too long"):
        await db.run_transaction(too_long)


def test_execute_many_asks_an_update_for_the_key_of_its_rows() -> None:
    with pytest.raises(ValueError, match="key"):
        execute_many(None, _RENAME, [{"b_id": 1, "b_name": "x", "b_doc": None}])  # type: ignore[arg-type]
