"""Which dispatchers are alive, and who reconciles which backend: locks held in the database.

A dispatcher that dies leaves requests it claimed. Whoever takes them over must know
the claimant is dead, not slow: on PostgreSQL each dispatcher holds a session-level
advisory lock named after its id on a connection of its own for its whole life; the
lock goes when the process (or its connection) does, so ``pg_try_advisory_lock`` on
another's key succeeds exactly when that one is gone. The same connection takes a
per-backend lock around each reconcile pass, so that several dispatchers reconcile a
backend one at a time, the ``webhook`` lock around each batch the change-feed webhook
delivers (and ``amqp`` around each batch the AMQP publisher publishes), so that one
dispatcher at a time POSTs (publishes) the feed, and the ``follow:BACKEND`` leases
(held for as long as the dispatcher follows that backend's recorded jobs: ``_leases``).

SQLite takes one dispatcher per database (its writes serialise anyway): an exclusive
``flock`` on ``<database>.dispatcher.lock`` says so, and every other claimant is dead.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import logging
import os
import socket
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from synnefo_ganeti.errors import ConfigError, StoreError
from synnefo_ganeti.store import Store

__all__ = ["DispatcherLock", "new_dispatcher_id"]

log = logging.getLogger("synnefo_ganeti.dispatch")


def new_dispatcher_id() -> str:
    return f"{socket.gethostname()[:30]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _key(what: str) -> int:
    """A signed 32-bit advisory-lock key for a name (the other half is the database's name: advisory
    locks are the whole server's, and two databases on one server must not share them)."""
    return int.from_bytes(hashlib.blake2b(what.encode(), digest_size=4).digest(), "big", signed=True)


class DispatcherLock:
    """``await lock.acquire()`` at start-up, ``await lock.release()`` at the end."""

    def __init__(self, store: Store, dispatcher_id: str) -> None:
        self.store = store
        self.id = dispatcher_id
        self._conn: AsyncConnection | None = None
        self._file: Any = None
        self._mutex = asyncio.Lock()  # one statement at a time on the lock connection
        #: counts the sessions the locks were taken on (a new one: every other lock is gone)
        self.generation = 0

    def __repr__(self) -> str:
        return f"<DispatcherLock {self.id} {self.store.dialect}>"

    async def acquire(self) -> None:
        if self.store.dialect == "postgresql":
            self._conn = await self._locked_connection()
            return
        database = self.store.url.database
        if not database or database == ":memory:":
            return  # one process by construction
        self._file = _lock_file(database, self.id)

    async def _locked_connection(self) -> AsyncConnection:
        for attempt in (1, 2):
            conn = await self.store.engine.connect()
            try:
                await conn.execute(
                    text("SELECT pg_advisory_lock(hashtext(current_database()), :k)"),
                    {"k": _key(f"dispatcher:{self.id}")},
                )
                await conn.commit()
            except DBAPIError as exc:
                await conn.close()
                # a pooled connection the server dropped (the pool does not ping): once more
                if attempt == 1 and exc.connection_invalidated:
                    continue
                raise
            except Exception:
                await conn.close()
                raise
            return conn
        raise AssertionError("unreachable")

    async def check(self) -> bool:
        """True while the lock's session lives; else it is taken again on a new connection and
        False is returned (PostgreSQL; SQLite's file lock cannot be lost)."""
        if self._conn is None:
            return True
        try:
            async with self._mutex:
                await self._conn.execute(text("SELECT 1"))
                await self._conn.commit()
            return True
        except Exception as exc:
            log.debug("liveness lock connection lost: %s", exc)
        async with self._mutex:
            old, self._conn = self._conn, None
            with contextlib.suppress(Exception):
                await old.invalidate()
            try:
                self._conn = await self._locked_connection()
                self.generation += 1
            except Exception as exc:
                self._conn = old  # keep something to retry on
                raise StoreError(
                    f"database {self.store.display_url}: cannot take the dispatcher lock again: {exc}",
                    url=self.store.display_url,
                ) from None
        return False

    async def release(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            try:
                await conn.execute(text("SELECT pg_advisory_unlock_all()"))
                await conn.commit()
            except Exception as exc:  # the connection going away releases the locks anyway
                log.debug("releasing advisory locks: %s", exc)
            finally:
                await conn.close()
        if self._file is not None:
            handle, self._file = self._file, None
            handle.close()

    async def is_alive(self, other: str) -> bool:
        """Whether dispatcher ``other`` still holds its lock (False: it is gone)."""
        if other == self.id:
            return True
        if self.store.dialect != "postgresql":
            return False  # we hold the only dispatcher lock of this SQLite database
        taken = await self._try(f"dispatcher:{other}")
        if taken:
            await self._unlock(f"dispatcher:{other}")
        return not taken

    async def try_reconcile(self, backend: str) -> bool:
        """Take the right to reconcile ``backend`` now (False: another dispatcher does)."""
        if self.store.dialect != "postgresql":
            return True
        return await self._try(f"reconcile:{backend}")

    async def done_reconciling(self, backend: str) -> None:
        if self.store.dialect == "postgresql":
            await self._unlock(f"reconcile:{backend}")

    async def try_deliver(self, name: str = "webhook") -> bool:
        """Take the right to deliver the change feed to consumer ``name`` now (False: another
        dispatcher does): ``"webhook"`` (the default) or ``"amqp"``, one lock each, so that the two
        deliver side by side and neither waits for the other's receiver."""
        if self.store.dialect != "postgresql":
            return True
        return await self._try(name)

    async def done_delivering(self, name: str = "webhook") -> None:
        if self.store.dialect == "postgresql":
            try:
                await self._unlock(name)
            except Exception as exc:  # a lost connection took the lock with it
                log.debug("releasing the %s lock: %s", name, exc)

    async def try_lease(self, backend: str) -> bool:
        """Take the follow lease of ``backend`` (False: another dispatcher holds it); held until
        :meth:`release_lease` or the session's end (PostgreSQL; SQLite: always True)."""
        if self.store.dialect != "postgresql":
            return True
        return await self._try(f"follow:{backend}")

    async def release_lease(self, backend: str) -> None:
        if self.store.dialect == "postgresql":
            await self._unlock(f"follow:{backend}")

    async def _try(self, name: str) -> bool:
        conn = self._connection()
        try:
            async with self._mutex:
                taken = (
                    await conn.execute(
                        text("SELECT pg_try_advisory_lock(hashtext(current_database()), :k)"),
                        {"k": _key(name)},
                    )
                ).scalar_one()
                await conn.commit()
        except Exception as exc:
            raise StoreError(
                f"database {self.store.display_url}: cannot take advisory lock {name}: {exc}",
                url=self.store.display_url,
            ) from None
        return bool(taken)

    async def _unlock(self, name: str) -> None:
        conn = self._connection()
        async with self._mutex:
            await conn.execute(
                text("SELECT pg_advisory_unlock(hashtext(current_database()), :k)"), {"k": _key(name)}
            )
            await conn.commit()

    def _connection(self) -> AsyncConnection:
        if self._conn is None:
            raise RuntimeError("DispatcherLock is not acquired")
        return self._conn


def _lock_file(database: str, dispatcher_id: str) -> Any:
    """The open, flock'ed ``<database>.dispatcher.lock`` (ConfigError if another dispatcher holds it)."""
    path = Path(f"{database}.dispatcher.lock")
    handle = path.open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise ConfigError(
            f"another dispatcher ({holder}) runs on the SQLite database {database}: SQLite takes one "
            "dispatcher; stop it first, or use PostgreSQL to run several"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(dispatcher_id + "\n")
    handle.flush()
    return handle
