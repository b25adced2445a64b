"""Alembic environment (async template), for synnefo-ganeti's database.

Run from code (``synnefo-ganeti db upgrade``, ``Store``), which hands over an open
connection in ``config.attributes["connection"]``; or from the ``alembic`` command
with ``-x url=...`` or ``sqlalchemy.url`` set, when it opens its own async engine.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import Connection, pool
from sqlalchemy.ext.asyncio import async_engine_from_config

from synnefo_ganeti.store.db._schema import metadata
from synnefo_ganeti.store.db._urls import normalize_url

config = context.config
target_metadata = metadata


def _url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("give the database URL: alembic -x url=sqlite:///PATH upgrade head")
    return normalize_url(url).render_as_string(hide_password=False)


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def do_run_migrations(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


async def run_async_migrations() -> None:
    section = config.get_section(config.config_ini_section, {})
    section["sqlalchemy.url"] = _url()
    engine = async_engine_from_config(section, prefix="sqlalchemy.", poolclass=pool.NullPool)
    async with engine.connect() as connection:
        await connection.run_sync(do_run_migrations)
        await connection.commit()
    await engine.dispose()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is None:
        asyncio.run(run_async_migrations())
    else:
        do_run_migrations(connection)


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
