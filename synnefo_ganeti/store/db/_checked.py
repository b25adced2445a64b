"""A column a statement only checks on the rows it finds by key, never finds rows by (pure code).

PostgreSQL plans a statement from the statistics its last ``ANALYZE`` took, and a burst outruns
them: autovacuum looks at a database once a minute, and a burst of 2,000 creates is over in
fifteen seconds. Analyzed before it, ``requests`` had no row ``pending`` and ``instances`` no row
but DESTROYED ones, so for PostgreSQL ``status = 'pending'`` found one row and the partial
index of live names (``uq_instances_backend_id_name_live``) held none. Statements that find their
rows by key and check their status chose to read those instead, the more rows the burst had made
(``auto_explain`` in ``benchmarks/burst.py``, issue 31): a batch of submit records read every
pending request, in a nested loop over the batch (2.5 ms a batch, two dispatchers); a batch of
ends every submitted one; a check of live names every live instance (1.2 ms).

:func:`checked` is the column as ``column || ''``: the same value, but no index has it and no
partial index's predicate follows from it, so the row is found by its key and the column checked
on it, whatever the statistics say. SQLite takes no index for an expression either.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import literal_column
from sqlalchemy.sql.elements import ColumnElement

__all__ = ["checked"]


def checked(column: ColumnElement[Any]) -> ColumnElement[Any]:
    """``column``, to be compared on rows found otherwise (see the module)."""
    return column.op("||", return_type=column.type)(literal_column("''"))
