"""Many new rows of one table in one statement: PostgreSQL's ``COPY`` where the driver is asyncpg,
an ``executemany`` of the table's insert elsewhere (SQLite).

An ``executemany`` of an insert is, on PostgreSQL, one statement execution per row (bind,
execute, the executor started and ended each time) after SQLAlchemy has processed every row's
parameters; ``COPY ... FROM STDIN`` (asyncpg's ``copy_records_to_table``, binary) is one statement
for all of them, the rows sent as they are. A burst writes about ten job events a create: this is
where they go (issue 31: a request's cost in PostgreSQL and in the dispatcher).

The rows go through the transaction's own connection (the caller's: it runs in the writer's
transaction, a synchronous function on the async engine's greenlet), so they commit or roll back
with the rest. Columns the rows leave out take their defaults (a serial id).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Table, insert
from sqlalchemy.engine import Connection
from sqlalchemy.util import await_only

__all__ = ["insert_rows"]


def insert_rows(
    conn: Connection, table: Table, columns: Sequence[str], rows: Sequence[Sequence[Any]]
) -> None:
    """Insert ``rows`` (tuples in the order of ``columns``) into ``table`` in the caller's transaction."""
    if not rows:
        return
    if conn.dialect.name == "postgresql" and conn.dialect.driver == "asyncpg":
        raw = conn.connection.driver_connection
        # SQLAlchemy's asyncpg adapter begins its transaction at the first statement: the caller
        # has run one (its locks, its reads) before, so the COPY is inside it
        if raw is not None and raw.is_in_transaction():
            await_only(raw.copy_records_to_table(table.name, records=rows, columns=list(columns)))
            return
    conn.execute(insert(table), [dict(zip(columns, row, strict=True)) for row in rows])
