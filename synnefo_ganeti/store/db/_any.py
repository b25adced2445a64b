"""``expr IN (a list)`` as one statement text on PostgreSQL, whatever the list's length.

An ``IN`` with an expanding parameter is rendered with one placeholder an element, so a list of
three and a list of four are two statements to PostgreSQL. asyncpg prepares each statement text
it has not seen (a parse and a describe: a round trip, and PostgreSQL's parse and plan) and keeps
a bounded cache of them, and the batches of a burst come in every length: about one prepare a
request was measured (issue 31). :func:`any_of` is rendered ``expr = ANY(CAST(:name AS type[]))``
there: one text a statement, prepared once a connection, and the same index scans (a btree takes
``= ANY`` as it takes ``IN``). Elsewhere (SQLite) it is the expanding ``IN`` it replaces, so the
statement runs with the same parameters, ``{name: [values]}``, on both.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.visitors import InternalTraversal
from sqlalchemy.types import Boolean, NullType, String, TypeEngine

__all__ = ["AnyOf", "any_of"]


class AnyOf(ColumnElement[bool]):
    """``expr`` is one of the list bound as ``name`` (see the module's docstring)."""

    inherit_cache = True
    type = Boolean()
    _is_implicitly_boolean = True  # a comparison: SQLite gets no "= 1" after it
    _traverse_internals = [  # noqa: RUF012 (SQLAlchemy's own attribute, a list)
        ("expr", InternalTraversal.dp_clauseelement),
        ("name", InternalTraversal.dp_string),
        ("element_type", InternalTraversal.dp_type),
    ]

    def __init__(
        self, expr: ColumnElement[Any], name: str, element_type: TypeEngine[Any] | None = None
    ) -> None:
        self.expr = expr
        self.name = name
        if element_type is None:
            element_type = expr.type
        if isinstance(element_type, NullType | String):
            # no length: PostgreSQL's cast to VARCHAR(n)[] cuts longer values silently, and a
            # value cut to n characters could match another row (an untyped SQL function,
            # lower(name), gives text too)
            element_type = String()
        self.element_type = element_type


def any_of(expr: ColumnElement[Any], name: str, element_type: TypeEngine[Any] | None = None) -> AnyOf:
    """``expr`` is in the list given at execution as parameter ``name`` (an empty list: none is)."""
    return AnyOf(expr, name, element_type)


@compiles(AnyOf)
def _expanding_in(element: AnyOf, compiler: Any, **kw: Any) -> str:
    return str(compiler.process(element.expr.in_(bindparam(element.name, expanding=True)), **kw))


@compiles(AnyOf, "postgresql")
def _equals_any(element: AnyOf, compiler: Any, **kw: Any) -> str:
    array = bindparam(element.name, type_=ARRAY(element.element_type))
    return f"{compiler.process(element.expr, **kw)} = ANY({compiler.process(array, **kw)})"
