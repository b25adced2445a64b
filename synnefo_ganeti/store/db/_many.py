"""An ``executemany`` as one statement on PostgreSQL: the rows' values bound as arrays and unnested.

A batch's updates and inserts (a burst's requests placed, submitted and ended, their instances and
jobs) are statements run once a row: ``conn.execute(statement, rows)``. On PostgreSQL an
``executemany`` is one statement execution per row (bind, plan, executor start and end each time),
and measured in a 2,000-request burst those per-row executions were half of PostgreSQL's time
(issue 31). :func:`execute_many` runs the same statement, given the same rows, as one: each
parameter the rows give becomes an array, ``unnest``-ed into a derived table ``v``, and the
statement reads its values from ``v``'s columns::

    UPDATE requests SET status = v.b_status ... FROM unnest($1::VARCHAR[], $2::VARCHAR[]) AS v(b_id, b_status)
    WHERE requests.id = v.b_id AND requests.status = 'submitted'

    INSERT INTO jobs (backend_id, job_id, ...) SELECT v.backend_id, v.job_id, ... FROM unnest(...) AS v(...)

One statement text whatever the number of rows (prepared once a connection), the rows' values
encoded by asyncpg's array codecs. SQLite, and a single row, run the ``executemany`` as before.

The statements are the callers' own, unchanged: an update whose where and values name
parameters (``bindparam("b_id")``), or whose values are the rows' column keys (``update(table)
.where(...)`` with no ``.values``), or an insert of a table given rows of its column keys. The
set-based form of each is built once per statement and set of keys and kept.

Where two rows of one ``executemany`` update the same row, the second sees the first's write; in
one ``UPDATE ... FROM`` a target row is updated once, by one of them: an update's caller names the
parameters that pick its target row (``key``), and rows that repeat one run as the
``executemany``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import Insert, Update, bindparam, cast, column, func, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.sql import visitors
from sqlalchemy.sql.elements import BindParameter
from sqlalchemy.types import JSON, NullType, String, TypeEngine

__all__ = ["execute_many"]

#: the rows' parameter names, each with the function that makes its array's values (JSON: text)
Names = tuple[tuple[str, Callable[[Any], Any] | None], ...]
_BUILT: dict[tuple[int, frozenset[str]], tuple[Any, Names, Any]] = {}
_MOST = 512


def execute_many(
    conn: Connection,
    statement: Update | Insert,
    rows: Sequence[Mapping[str, Any]],
    *,
    key: tuple[str, ...] = (),
) -> None:
    """``conn.execute(statement, rows)``, as one statement on PostgreSQL (see the module's docstring).

    Every row gives the same keys. An update names in ``key`` the parameters that pick its
    target row: rows that repeat a key run as the ``executemany``, one after the other."""
    if not rows:
        return
    if isinstance(statement, Update) and not key:
        raise ValueError("execute_many: an update needs the key of its target rows (key=...)")
    if (
        conn.dialect.name != "postgresql"
        or len(rows) == 1
        or (key and len({tuple(row[name] for name in key) for row in rows}) < len(rows))
    ):
        conn.execute(statement, list(rows))
        return
    keys = frozenset(rows[0])
    if len(_BUILT) > _MOST:
        _BUILT.clear()  # (statements are the callers' constants: a handful; this is a guard)
    built = _BUILT.get((id(statement), keys))
    if built is None or built[2] is not statement:
        unnested, names = _unnested(statement, keys, conn.dialect)
        built = (unnested, names, statement)  # (the statement kept: its id is never reused meanwhile)
        _BUILT[(id(statement), keys)] = built
    unnested, names, _ = built
    params: dict[str, list[Any]] = {}
    for name, process in names:
        values = [row[name] for row in rows]
        params[f"a_{name}"] = values if process is None else [process(value) for value in values]
    conn.execute(unnested, params)


def _unnested(statement: Update | Insert, keys: frozenset[str], dialect: Dialect) -> tuple[Any, Names]:
    table = statement.table
    types: dict[str, TypeEngine[Any]] = {}

    def found(bind: BindParameter[Any]) -> None:
        if bind.key in keys:
            types.setdefault(bind.key, bind.type)

    visitors.traverse(statement, {}, {"bindparam": found})
    if isinstance(statement, Update):
        # a value's parameter takes its column's type (``.values(x=bindparam("b_x"))`` is untyped)
        for target, value in (statement._values or {}).items():
            key = getattr(value, "key", None)
            if key in types and isinstance(types[key], NullType):
                types[key] = table.c[target if isinstance(target, str) else str(target.key)].type
    columns = sorted(keys - set(types))  # the rest are the rows' column keys
    for name in columns:
        if name not in table.c:
            raise ValueError(f"execute_many: {name!r} is neither a parameter of the statement nor a column")
        types[name] = table.c[name].type
    names = tuple(sorted(keys))
    # JSON has no array of its own here (a list value would be an array's dimension): it goes
    # as text, made by the type's own bind processing (as the executemany would), cast back
    as_text = {name for name in names if isinstance(types[name].dialect_impl(dialect), JSON)}
    elements = {name: String() if name in as_text else _element(types[name]) for name in names}
    derived = (
        func.unnest(*(bindparam(f"a_{name}", type_=ARRAY(elements[name])) for name in names))
        .table_valued(*(column(name, elements[name]) for name in names))
        .render_derived(name="v")
    )
    by_name: dict[str, Any] = {
        name: cast(derived.c[name], types[name]) if name in as_text else derived.c[name] for name in names
    }
    processed: Names = tuple(
        (name, types[name].dialect_impl(dialect).bind_processor(dialect) if name in as_text else None)
        for name in names
    )
    if isinstance(statement, Insert):
        if types.keys() - set(columns):
            raise ValueError("execute_many: an insert takes rows of its table's column keys only")
        return statement.from_select(columns, select(*(by_name[name] for name in columns))), processed
    if columns:
        statement = statement.values({name: bindparam(name, type_=types[name]) for name in columns})

    def replace(element: Any) -> Any:
        if isinstance(element, BindParameter) and element.key in by_name:
            return by_name[element.key]
        return None

    unnested = visitors.replacement_traverse(statement, {}, replace)  # type: ignore[call-overload]
    return unnested, processed


def _element(kind: TypeEngine[Any]) -> TypeEngine[Any]:
    """An array's element type for a parameter of type ``kind``."""
    if isinstance(kind, NullType | String):
        # no length: an explicit cast to VARCHAR(n)[] cuts a longer value silently, where the
        # executemany's insert or update of it fails (the column's own check stays: v.x is text)
        return String()
    return kind
