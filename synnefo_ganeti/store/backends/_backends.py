"""Backends in the database: their ids (cached), drain marks, health, backend events, their
nodes as the dispatcher last read them (``backend_nodes``: up, down or offline, since when, why)
and their latest whole node stats (``backend_stats``, written by the holder of the follow lease).

:class:`Backends` keeps the name <-> id map every other repository uses; functions
taking a ``Connection`` run inside a writer transaction.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import Table, delete, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection

from synnefo_ganeti.store.backends._rows import Backend, BackendEvent, BackendNode, BackendStats
from synnefo_ganeti.store.db._engine import Database
from synnefo_ganeti.store.db._writer import Writer

__all__ = [
    "Backends",
    "NodeRow",
    "add_backend_event",
    "backend_events_t",
    "backend_nodes_t",
    "backend_stats_t",
    "backends_t",
    "set_health",
    "store_nodes",
]

backends_t = cast(Table, Backend.__table__)
backend_events_t = cast(Table, BackendEvent.__table__)
backend_nodes_t = cast(Table, BackendNode.__table__)
backend_stats_t = cast(Table, BackendStats.__table__)

#: the states of ``backend_nodes.state``
NODE_ROW_STATES = ("up", "down", "offline")


@dataclass(frozen=True, slots=True)
class NodeRow:
    """A node of a backend as the dispatcher read it: ``state`` "up", "down" or "offline";
    ``since`` when it entered that state (None: now, or kept when the row has that state
    already); ``detail`` the first sign of a node not up."""

    state: str
    since: datetime | None = None
    detail: str | None = None


class Backends:
    """The backends repository, and the name <-> id cache of the store."""

    def __init__(self, db: Database, writer: Writer) -> None:
        self.db = db
        self.writer = writer
        self.ids: dict[str, int] = {}
        self.names: dict[int, str] = {}

    async def read_names(self, conn: AsyncConnection) -> dict[int, str]:
        """Every backend's name by id, read again (and cached)."""
        rows = await conn.execute(select(backends_t.c.id, backends_t.c.name))
        for row in rows:
            self.names[row.id] = row.name
            self.ids[row.name] = row.id
        return self.names

    async def ensure_many(self, names: Iterable[str], *, in_writer: bool = False) -> None:
        """Rows (and cached ids) for every backend of ``names``.

        The rows are written by the writer: on a SQLite file in its thread, which ends the
        transaction even when the caller is cancelled meanwhile. (Written on a connection of
        the async engine, a caller cancelled between its INSERT and its COMMIT left the write
        transaction open, and SQLite's write lock held, until the connection was collected:
        every other write waited.) ``in_writer``: the writer task itself asks (its batches).
        """
        missing = sorted({name for name in names if name not in self.ids})
        if not missing:
            return
        add = functools.partial(_add_backends, names=missing, dialect=self.db.dialect)
        found = await (self.db.run_transaction(add) if in_writer else self.writer.call(add))
        for name, backend_id in found.items():
            self.ids[name] = backend_id
            self.names[backend_id] = name

    async def ensure(self, name: str) -> int:
        """The id of backend ``name``, creating its row if needed."""
        await self.ensure_many([name])
        return self.ids[name]

    async def id_of(self, name: str) -> int | None:
        """The id of backend ``name``; None when the database has no such backend."""
        if name in self.ids:
            return self.ids[name]
        await self.db.read(self.read_names)
        return self.ids.get(name)

    async def all_names(self) -> list[str]:
        async def run(conn: AsyncConnection) -> list[str]:
            return sorted((await self.read_names(conn)).values())

        return await self.db.read(run)

    # -- drain and health ----------------------------------------------------------------------------

    async def set_drained(self, name: str, drained: bool) -> bool:
        backend_id = await self.ensure(name)

        def run(conn: Connection) -> bool:
            row = conn.execute(select(backends_t.c.drained).where(backends_t.c.id == backend_id)).one()
            if bool(row.drained) == drained:
                return False
            conn.execute(
                update(backends_t)
                .where(backends_t.c.id == backend_id)
                .values(drained=drained, drained_at=datetime.now(UTC) if drained else None)
            )
            return True

        return await self.writer.call(run)

    async def drained(self) -> set[str]:
        async def run(conn: AsyncConnection) -> set[str]:
            rows = await conn.execute(select(backends_t.c.name).where(backends_t.c.drained))
            return {row.name for row in rows}

        return await self.db.read(run)

    async def set_health(self, name: str, up: bool, *, detail: str | None, event: str | None) -> None:
        backend_id = await self.ensure(name)
        await self.writer.call(lambda conn: set_health(conn, backend_id, up, detail, event=event))

    async def add_event(self, name: str, kind: str, message: str) -> None:
        backend_id = await self.ensure(name)
        await self.writer.call(lambda conn: add_backend_event(conn, backend_id, kind, message))

    async def states(self) -> dict[str, dict[str, Any]]:
        async def run(conn: AsyncConnection) -> dict[str, dict[str, Any]]:
            rows = await conn.execute(
                select(
                    backends_t.c.name,
                    backends_t.c.drained,
                    backends_t.c.drained_at,
                    backends_t.c.health,
                    backends_t.c.health_at,
                    backends_t.c.health_detail,
                )
            )
            return {row.name: {k: v for k, v in row._mapping.items() if k != "name"} for row in rows}

        return await self.db.read(run)

    # -- nodes ---------------------------------------------------------------------------------------

    async def set_nodes(
        self, name: str, nodes: Mapping[str, NodeRow], *, complete: bool = False
    ) -> dict[str, str]:
        """Write the state of these nodes of backend ``name`` (``complete``: every node it has;
        the rows of the others go); the nodes whose state changed, with their new state (a node
        new in the table only when it is not up). Each change is a backend event."""
        for row in nodes.values():
            if row.state not in NODE_ROW_STATES:
                raise ValueError(f"node state {row.state!r} is not one of {', '.join(NODE_ROW_STATES)}")
        backend_id = await self.ensure(name)
        snapshot = dict(nodes)
        return await self.writer.call(lambda conn: store_nodes(conn, backend_id, snapshot, complete=complete))

    async def nodes(self, name: str | None = None) -> dict[str, list[dict[str, Any]]]:
        """Per backend (or only ``name``), its nodes by name: name, state, since, seen_at, detail."""

        async def run(conn: AsyncConnection) -> dict[str, list[dict[str, Any]]]:
            query = (
                select(
                    backends_t.c.name.label("backend"),
                    backend_nodes_t.c.name,
                    backend_nodes_t.c.state,
                    backend_nodes_t.c.since,
                    backend_nodes_t.c.seen_at,
                    backend_nodes_t.c.detail,
                )
                .join(backends_t, backends_t.c.id == backend_nodes_t.c.backend_id)
                .order_by(backends_t.c.name, backend_nodes_t.c.name)
            )
            if name is not None:
                query = query.where(backends_t.c.name == name)
            out: dict[str, list[dict[str, Any]]] = {}
            for row in await conn.execute(query):
                values = dict(row._mapping)
                out.setdefault(values.pop("backend"), []).append(values)
            return out

        return await self.db.read(run)

    # -- whole node stats ----------------------------------------------------------------------------

    async def set_stats(self, name: str, stats: dict[str, Any], *, read_at: datetime | None = None) -> None:
        """Keep ``stats`` as backend ``name``'s latest (read at ``read_at``, default now), the
        ones before replaced."""
        backend_id = await self.ensure(name)
        values = {"backend_id": backend_id, "stats": stats, "read_at": read_at or datetime.now(UTC)}
        add = pg_insert if self.db.dialect == "postgresql" else sqlite_insert

        def run(conn: Connection) -> None:
            upsert = add(backend_stats_t).values(values)
            conn.execute(
                upsert.on_conflict_do_update(
                    index_elements=["backend_id"],
                    set_={"stats": upsert.excluded.stats, "read_at": upsert.excluded.read_at},
                )
            )

        await self.writer.call(run)

    async def stats(self, name: str) -> tuple[dict[str, Any], datetime] | None:
        """Backend ``name``'s latest stats and when their read began; None when none is kept."""

        async def run(conn: AsyncConnection) -> tuple[dict[str, Any], datetime] | None:
            row = (
                await conn.execute(
                    select(backend_stats_t.c.stats, backend_stats_t.c.read_at)
                    .join(backends_t, backends_t.c.id == backend_stats_t.c.backend_id)
                    .where(backends_t.c.name == name)
                )
            ).first()
            return None if row is None else (dict(row.stats), row.read_at)

        return await self.db.read(run)

    async def events(self, *, backend: str | None, limit: int) -> list[dict[str, Any]]:
        async def run(conn: AsyncConnection) -> list[dict[str, Any]]:
            query = (
                select(
                    backends_t.c.name.label("backend"),
                    backend_events_t.c.kind,
                    backend_events_t.c.message,
                    backend_events_t.c.at,
                )
                .join(backends_t, backends_t.c.id == backend_events_t.c.backend_id)
                .order_by(backend_events_t.c.id.desc())
                .limit(limit)
            )
            if backend is not None:
                query = query.where(backends_t.c.name == backend)
            return [dict(row._mapping) for row in await conn.execute(query)]

        return await self.db.read(run)


def add_backend_event(conn: Connection, backend_id: int, kind: str, message: str) -> None:
    conn.execute(
        insert(backend_events_t).values(
            backend_id=backend_id, kind=kind, message=message, at=datetime.now(UTC)
        )
    )


def _add_backends(conn: Connection, *, names: list[str], dialect: str) -> dict[str, int]:
    """Inside a write transaction: a row for each of ``names`` that has none; every one's id."""
    add = pg_insert if dialect == "postgresql" else sqlite_insert
    now = datetime.now(UTC)
    conn.execute(
        add(backends_t).on_conflict_do_nothing(index_elements=["name"]),
        [{"name": name, "created_at": now} for name in names],
    )
    rows = conn.execute(select(backends_t.c.id, backends_t.c.name).where(backends_t.c.name.in_(names)))
    return {row.name: row.id for row in rows}


def set_health(conn: Connection, backend_id: int, up: bool, detail: str | None, *, event: str | None) -> None:
    now = datetime.now(UTC)
    conn.execute(
        update(backends_t)
        .where(backends_t.c.id == backend_id)
        .values(health="up" if up else "down", health_at=now, health_detail=detail)
    )
    if event is not None:
        add_backend_event(conn, backend_id, "up" if up else "down", event)


def store_nodes(
    conn: Connection,
    backend_id: int,
    nodes: Mapping[str, NodeRow],
    *,
    complete: bool = False,
    now: datetime | None = None,
) -> dict[str, str]:
    """Inside a write transaction: upsert the ``backend_nodes`` rows of ``nodes`` (``seen_at``
    now; ``since`` kept while the state stays); ``complete``: delete the backend's other rows.
    Each change of state is a backend event ("node-down", "node-offline", "node-up"). Returns
    the nodes whose state changed and their new state (a node new in the table when not up)."""
    now = now or datetime.now(UTC)
    rows = {
        row.name: row
        for row in conn.execute(
            select(backend_nodes_t.c.name, backend_nodes_t.c.state).where(
                backend_nodes_t.c.backend_id == backend_id
            )
        )
    }
    changed: dict[str, str] = {}
    for name, node in nodes.items():
        old = rows.get(name)
        if old is not None and old.state == node.state:  # confirmed: since and the first sign stay
            conn.execute(
                update(backend_nodes_t)
                .where(backend_nodes_t.c.backend_id == backend_id, backend_nodes_t.c.name == name)
                .values(seen_at=now)
            )
            continue
        since = node.since or now
        detail = None if node.state == "up" else node.detail
        if old is None:
            conn.execute(
                insert(backend_nodes_t).values(
                    backend_id=backend_id,
                    name=name,
                    state=node.state,
                    since=since,
                    seen_at=now,
                    detail=detail,
                )
            )
        else:
            conn.execute(
                update(backend_nodes_t)
                .where(backend_nodes_t.c.backend_id == backend_id, backend_nodes_t.c.name == name)
                .values(state=node.state, since=since, seen_at=now, detail=detail)
            )
        if old is not None or node.state != "up":
            changed[name] = node.state
            why = f": {node.detail}" if node.detail else ""
            add_backend_event(conn, backend_id, f"node-{node.state}", f"node {name} is {node.state}{why}")
    if complete:
        gone = set(rows) - set(nodes)
        if gone:
            conn.execute(
                delete(backend_nodes_t).where(
                    backend_nodes_t.c.backend_id == backend_id, backend_nodes_t.c.name.in_(sorted(gone))
                )
            )
    return changed
