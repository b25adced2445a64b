"""Options the commands share, and where they find the settings and the database.

Every command that reads the database takes ``--config FILE`` (else
``$SYNNEFO_GANETI_CONFIG``); the ones that need nothing but the database also take
``--db URL`` (else ``$SYNNEFO_GANETI_DB``), which overrides the file's ``[database] url``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from synnefo_ganeti.cli._output import run
from synnefo_ganeti.config import Settings
from synnefo_ganeti.errors import StoreError
from synnefo_ganeti.store import Store, display_url, normalize_url

__all__ = [
    "config_option",
    "database_options",
    "database_url",
    "existing",
    "json_option",
    "load_settings",
    "with_store",
]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")

_CONFIG_HELP = "The settings file (TOML; else $SYNNEFO_GANETI_CONFIG)."

config_option = click.option(
    "--config",
    "config_file",
    envvar="SYNNEFO_GANETI_CONFIG",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help=_CONFIG_HELP,
)


def database_options(func: F) -> F:
    """``--config FILE`` and ``--db URL`` (which wins over the file's ``[database] url``); one is needed."""
    func = click.option(
        "--db",
        "db_url",
        envvar="SYNNEFO_GANETI_DB",
        metavar="URL",
        help="Database: sqlite:///PATH or postgresql://USER@HOST/DB (else $SYNNEFO_GANETI_DB); "
        "overrides the --config file's [database] url.",
    )(func)
    return click.option(
        "--config",
        "config_file",
        envvar="SYNNEFO_GANETI_CONFIG",
        type=click.Path(dir_okay=False, path_type=Path),
        metavar="FILE",
        help=_CONFIG_HELP + " Its [database] url is used unless --db is given.",
    )(func)


def load_settings(path: Path) -> Settings:
    """The settings of ``path``; a bad file is an ``error:`` line and exit status 2."""

    async def load() -> Settings:
        return Settings.from_file(path)

    return run(load())


def database_url(config_file: Path | None, db_url: str | None) -> str:
    """The database to use: ``--db`` if given, else the ``--config`` file's; a usage error without both."""
    if db_url:
        return db_url
    if config_file is not None:
        return load_settings(config_file).database.url
    raise click.UsageError(
        "no database: give --config FILE (or $SYNNEFO_GANETI_CONFIG) or --db URL (or $SYNNEFO_GANETI_DB)"
    )


def existing(url: str) -> str:
    """Refuse to read a SQLite file that does not exist (opening it would create an empty one)."""
    normalized = normalize_url(url)
    if normalized.drivername.startswith("sqlite") and normalized.database not in (None, "", ":memory:"):
        path = Path(normalized.database or "").expanduser()
        if not path.exists():
            raise StoreError(
                f"database file {path} does not exist; create it with 'synnefo-ganeti db upgrade --db {url}' "
                "or point --db at the watcher's database",
                url=display_url(url),
            )
    return url


def with_store(url: str, call: Callable[[Store], Awaitable[T]], *, create: bool = False) -> T:
    """Run ``call`` with a store on ``url`` (which must exist unless ``create``)."""

    async def go() -> T:
        async with Store(url if create else existing(url), create=create) as store:
            return await call(store)

    return run(go())
