"""Where the settings come from: the TOML file, the environment, and what a reload changes.

``Settings()`` reads the file that ``SYNNEFO_GANETI_CONFIG`` names; ``Settings.from_file``
the one it is given (it wins). Relative paths written in the file (``[[backends]]``'
``password_file``, ``ca_file``, ``queue_dir``, ``[notify] secret_file`` and ``amqp_url_file``,
``[web]``'s files, and
the file of a SQLite ``[database] url``) are taken from the file's folder; paths given by the
environment or on the command line are taken from the working directory, as a shell user expects. :func:`diff_backends` tells what a new configuration changes in the
backends (what a SIGHUP reload applies).
"""

from __future__ import annotations

import os
import tomllib
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from synnefo_ganeti.config._synnefo import SYNNEFO_PATH_KEYS
from synnefo_ganeti.errors import ConfigError

if TYPE_CHECKING:
    from synnefo_ganeti.config._settings import Settings

__all__ = ["CONFIG_ENV_VAR", "ENV_PREFIX", "BackendChanges", "diff_backends", "read_toml"]

CONFIG_ENV_VAR = "SYNNEFO_GANETI_CONFIG"
"""The environment variable naming the config file that ``Settings()`` reads."""

ENV_PREFIX = "SYNNEFO_GANETI__"
"""The prefix of the environment variables that override the file's values."""

# The keys of [[backends]] that hold paths: relative ones are taken from the file's folder.
_BACKEND_PATH_KEYS = ("password_file", "ca_file", "queue_dir")

# The file the Settings being built reads: set by Settings.__init__ for settings_customise_sources.
loading_file: ContextVar[Path | None] = ContextVar("synnefo_ganeti_config_loading", default=None)
# The file Settings.from_file() asked for; wins over SYNNEFO_GANETI_CONFIG.
requested_file: ContextVar[Path | None] = ContextVar("synnefo_ganeti_config_requested", default=None)


def file_from_environment() -> Path | None:
    """The absolute path ``SYNNEFO_GANETI_CONFIG`` names (``None`` when it is unset or empty)."""
    value = os.environ.get(CONFIG_ENV_VAR, "")
    if not value:
        return None
    return Path(value).expanduser().absolute()


def read_toml(path: Path) -> dict[str, Any]:
    """The TOML file ``path`` as a dict, its backends' relative paths made absolute.

    Raises :class:`~synnefo_ganeti.errors.ConfigError` naming the file for every problem.
    """
    try:
        with path.open("rb") as file:
            data = tomllib.load(file)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path} is a directory, not a file") from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text") from None
    _resolve_relative_paths(data, path.parent)
    return data


def _resolve_relative_paths(data: dict[str, Any], folder: Path) -> None:
    """Make the backends' (and [notify]'s, [synnefo]'s, [web]'s, [database]'s) relative paths
    relative to the config file's folder (in place)."""
    database = data.get("database")
    if isinstance(database, dict) and isinstance(database.get("url"), str):
        database["url"] = sqlite_url_from(database["url"], folder)
    notify = data.get("notify")
    if isinstance(notify, dict):
        for key in ("secret_file", "amqp_url_file"):
            if isinstance(notify.get(key), str) and notify[key]:
                path = Path(notify[key]).expanduser()
                notify[key] = str(path if path.is_absolute() else folder / path)
    synnefo = data.get("synnefo")
    if isinstance(synnefo, dict):
        for key in SYNNEFO_PATH_KEYS:
            if isinstance(synnefo.get(key), str) and synnefo[key]:
                path = Path(synnefo[key]).expanduser()
                synnefo[key] = str(path if path.is_absolute() else folder / path)
    web = data.get("web")
    if isinstance(web, dict):
        for key in ("users_file", "tokens_file"):
            if isinstance(web.get(key), str) and web[key]:
                path = Path(web[key]).expanduser()
                web[key] = str(path if path.is_absolute() else folder / path)
    backends = data.get("backends")
    if not isinstance(backends, list):
        return
    for backend in backends:
        if not isinstance(backend, dict):
            continue
        for key in _BACKEND_PATH_KEYS:
            value = backend.get(key)
            if isinstance(value, str) and value:
                path = Path(value).expanduser()
                backend[key] = str(path if path.is_absolute() else folder / path)


def sqlite_url_from(url: str, folder: Path) -> str:
    """``url`` with a relative SQLite file path taken from ``folder`` (``~`` expanded).

    Anything else is returned as written: other schemes, absolute paths, in-memory SQLite
    (``sqlite://``, ``sqlite:///:memory:``), ``file:`` URIs (``?uri=true``) and URLs that do not
    parse (the ``[database]`` section reports those).
    """
    try:
        parsed = make_url(url)
    except ArgumentError:
        return url
    if not parsed.drivername.startswith("sqlite") or parsed.query.get("uri") == "true":
        return url
    database = parsed.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return url
    path = Path(database).expanduser()
    if path.is_absolute() and str(path) == database:
        return url
    resolved = path if path.is_absolute() else folder / path
    return parsed.set(database=str(resolved)).render_as_string(hide_password=False)


@dataclass(frozen=True, slots=True)
class BackendChanges:
    """What a new configuration changes in the backends, by name (each list sorted)."""

    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    #: URL, credentials, TLS, queue_dir, timeouts: the backend's clients must restart
    changed: list[str] = field(default_factory=list)
    drained: list[str] = field(default_factory=list)
    undrained: list[str] = field(default_factory=list)
    #: ``[database]`` differs (it takes effect on restart only)
    database: bool = False

    def __bool__(self) -> bool:
        return bool(
            self.added or self.removed or self.changed or self.drained or self.undrained or self.database
        )

    def describe(self) -> list[str]:
        """The changes in words: ``removed a``, ``added b``, ``changed c``, ``drained d``, ``undrained e``."""
        return (
            [f"removed {name}" for name in self.removed]
            + [f"added {name}" for name in self.added]
            + [f"changed {name}" for name in self.changed]
            + [f"drained {name}" for name in self.drained]
            + [f"undrained {name}" for name in self.undrained]
        )


def diff_backends(old: Settings, new: Settings) -> BackendChanges:
    """What going from ``old`` to ``new`` changes in the backends (``drained`` alone is no change)."""
    before = {backend.name: backend for backend in old.backends}
    after = {backend.name: backend for backend in new.backends}
    changed: list[str] = []
    drained: list[str] = []
    undrained: list[str] = []
    for name in sorted(before.keys() & after.keys()):
        was, now = before[name], after[name]
        if was.model_dump(exclude={"drained"}) != now.model_dump(exclude={"drained"}):
            changed.append(name)
        elif was.drained != now.drained:
            (drained if now.drained else undrained).append(name)
    return BackendChanges(
        added=sorted(after.keys() - before.keys()),
        removed=sorted(before.keys() - after.keys()),
        changed=changed,
        drained=drained,
        undrained=undrained,
        database=old.database.url != new.database.url,
    )
