"""asyncpg connections that share what they learn of PostgreSQL's built-in types.

asyncpg carries the codecs of PostgreSQL's scalar types. For any other type a statement takes or
returns (the arrays of the set-based steps: ``unnest($1::BIGINT[], $2::TIMESTAMPTZ[])``) it asks
the server with a recursive catalog query, once per connection and per new set of types. On this
project's 2-core machine that query costs PostgreSQL about 8 ms of CPU, and a two-dispatcher
burst of 2,000 requests ran it 35-45 times (its connections, a few sets each): 0.15 ms of the
server's CPU a request, as much as a submit record's ``UPDATE``.

The answer for a built-in type (an oid below 16384, PostgreSQL's ``FirstNormalObjectId``) never
changes on a server: built-in types are part of its catalog from ``initdb`` on. So
:class:`SharedTypesConnection` keeps those answers for the process, by the server's version and
the type's oid, and a connection whose types are all known takes them from there instead of
asking again. A set that holds any other oid (an enum, a domain: types that can be dropped and made
again) is asked every time, as asyncpg does.

The hook is asyncpg's own ``Connection._introspect_types`` (asyncpg 0.29 to 0.32 at least). If a
later asyncpg changes it, :func:`connection_class` falls back to asyncpg's plain connection:
slower to warm up, never wrong.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any, Final

import asyncpg  # type: ignore[import-untyped]

__all__ = ["FIRST_NORMAL_OID", "SharedTypesConnection", "connection_class", "type_cache_stats"]

#: PostgreSQL's first oid for objects made after initdb (src/include/access/transam.h)
FIRST_NORMAL_OID: Final = 16384

_lock = threading.Lock()  # (one process may run several event loops: the tests, the CLI)
#: per server version: every built-in type described so far, by oid (with the types they are
#: made of, which the server's answer includes)
_known: dict[tuple[int, ...], dict[int, Any]] = {}
_stats = {"asked": 0, "shared": 0}


class _Answered:
    """What the caller of ``_introspect_types`` takes from its second value: the statement the
    answer came by. It looks only at ``name``: an unnamed one replaced the caller's own unnamed
    statement, which must be prepared again. No statement ran here, so it has a name."""

    name = "synnefo-ganeti-shared-types"


class SharedTypesConnection(asyncpg.Connection):  # type: ignore[misc]
    """An asyncpg connection that asks the server about a built-in type once per process (see
    the module)."""

    async def _introspect_types(self, typeoids: Any, timeout: Any) -> tuple[Any, Any]:
        oids = {int(oid) for oid in typeoids}
        if not oids or max(oids) >= FIRST_NORMAL_OID:
            asked: tuple[Any, Any] = await super()._introspect_types(typeoids, timeout)
            return asked
        version = tuple(self.get_server_version()[:2])
        with _lock:
            known = _known.setdefault(version, {})
            if oids <= known.keys():
                _stats["shared"] += 1
                # every type known, those asked and those they are made of: asyncpg skips
                # the ones the connection has already
                return list(known.values()), _Answered()
        rows, statement = await super()._introspect_types(typeoids, timeout)
        with _lock:
            _stats["asked"] += 1
            for row in rows:
                if int(row["oid"]) < FIRST_NORMAL_OID:
                    known[int(row["oid"])] = row
        return rows, statement


def _hook_fits() -> bool:
    method = getattr(asyncpg.Connection, "_introspect_types", None)
    if method is None or not inspect.iscoroutinefunction(method):
        return False
    return list(inspect.signature(method).parameters) == ["self", "typeoids", "timeout"]


def connection_class() -> type[asyncpg.Connection]:
    """The connection class to give ``asyncpg.connect``: :class:`SharedTypesConnection` while
    asyncpg's hook is the one it was written for, else asyncpg's own."""
    return SharedTypesConnection if _hook_fits() else asyncpg.Connection


def type_cache_stats() -> dict[str, int]:
    """How many sets of built-in types this process asked the server about (``asked``), and how
    many times a connection took an earlier answer instead (``shared``)."""
    with _lock:
        return dict(_stats)
