"""Database URLs: the forms users write, normalised to the async drivers, and masked for display."""

from __future__ import annotations

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from synnefo_ganeti.errors import ConfigError

__all__ = ["display_url", "normalize_url"]

_DRIVERS = {
    "sqlite": "sqlite+aiosqlite",
    "sqlite+aiosqlite": "sqlite+aiosqlite",
    "postgresql": "postgresql+asyncpg",
    "postgres": "postgresql+asyncpg",
    "postgresql+asyncpg": "postgresql+asyncpg",
}


def _parse(url: str | URL) -> URL:
    if isinstance(url, URL):
        return url
    try:
        return make_url(url)
    except ArgumentError:
        # Never echo the string itself: it may carry a password.
        raise ConfigError(
            "the database URL is not a URL; use sqlite:///PATH or postgresql://USER@HOST/DB"
        ) from None


def normalize_url(url: str | URL) -> URL:
    """``sqlite:///PATH`` / ``postgresql://...`` and their async forms, as async-driver URLs."""
    parsed = _parse(url)
    driver = _DRIVERS.get(parsed.drivername)
    if driver is None:
        raise ConfigError(
            f"database URL scheme {parsed.drivername!r} is not supported; use sqlite:///PATH, "
            "sqlite+aiosqlite:///PATH, postgresql://... or postgresql+asyncpg://..."
        )
    parsed = parsed.set(drivername=driver)
    if driver.startswith("sqlite") and not parsed.database:
        parsed = parsed.set(database=":memory:")
    return parsed


def display_url(url: str | URL) -> str:
    """The URL with its password masked, for logs, errors and reprs."""
    try:
        return _parse(url).render_as_string(hide_password=True)
    except ConfigError:
        return "<unparsable database URL>"
