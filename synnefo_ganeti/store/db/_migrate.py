"""Alembic, driven from code: where the migrations are, which revision a database is at, upgrading it.

The migrations live in the project's top-level ``alembic/`` folder; the wheel ships
that folder as ``synnefo_ganeti/_alembic`` so that ``synnefo-ganeti db upgrade``
works from an installed package (an editable install or a checkout uses
``alembic/`` itself).
"""

from __future__ import annotations

import asyncio
import weakref
from functools import cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from synnefo_ganeti.errors import StoreError

__all__ = ["alembic_config", "current_revision", "head_revision", "script_location", "upgrade"]


@cache
def script_location() -> Path:
    package = Path(__file__).resolve().parent.parent.parent
    for candidate in (package / "_alembic", package.parent / "alembic"):
        # (an installed package's parent is site-packages, whose alembic/ is the library itself)
        if (candidate / "env.py").is_file() and (candidate / "versions").is_dir():
            return candidate
    raise StoreError(
        f"the database migrations are missing (looked in {package / '_alembic'} and "
        f"{package.parent / 'alembic'}); reinstall synnefo-ganeti"
    )


def alembic_config(url: URL | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(script_location()))
    if url is not None:
        config.set_main_option("sqlalchemy.url", url.render_as_string(hide_password=False).replace("%", "%%"))
    return config


@cache
def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise StoreError(f"no migrations in {script_location()}; reinstall synnefo-ganeti")
    return head


def _current(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


async def current_revision(engine: AsyncEngine) -> str | None:
    """The revision the database is at; None for a database without our tables."""
    async with engine.connect() as connection:
        return await connection.run_sync(_current)


def _upgrade(connection: Connection, config: Config, revision: str) -> None:
    config.attributes["connection"] = connection
    command.upgrade(config, revision)


_upgrade_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
    weakref.WeakKeyDictionary()
)

#: pg_advisory_xact_lock key of schema changes, with the database's name hashed: "sgmi"
_MIGRATE_LOCK_KEY = int.from_bytes(b"sgmi", "big")


async def upgrade(engine: AsyncEngine, revision: str = "head") -> None:
    """Bring the database to ``revision`` (by default the latest), in one transaction.

    On PostgreSQL the transaction first takes an advisory lock, so that processes
    started together on a fresh database (a dispatcher and a CLI command) create the
    schema once: the second waits, then finds it at the revision and does nothing.
    """
    # Alembic keeps its migration context in module globals: one upgrade at a time per process.
    loop = asyncio.get_running_loop()
    lock = _upgrade_locks.get(loop)
    if lock is None:
        lock = _upgrade_locks[loop] = asyncio.Lock()
    async with lock, engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            await connection.execute(
                text("SELECT pg_advisory_xact_lock(hashtext(current_database()), :key)"),
                {"key": _MIGRATE_LOCK_KEY},
            )
        await connection.run_sync(_upgrade, alembic_config(), revision)
