"""The control plane's settings: one TOML file plus ``SYNNEFO_GANETI__...`` environment overrides.

``Settings()`` reads the file that ``SYNNEFO_GANETI_CONFIG`` names (no file when it is
unset); ``Settings.from_file(path)`` reads the given one (the CLI's ``--config FILE``).
Sources, highest priority first: keyword arguments, the environment, the file. In the
environment, ``__`` separates the levels: ``SYNNEFO_GANETI__DATABASE__URL``,
``SYNNEFO_GANETI__RECONCILE__INTERVAL``; lists (``backends``) are given whole, as JSON.

.. code-block:: toml

    [database]
    url = "postgresql://sg@db.example.org/synnefo_ganeti"

    [[backends]]
    name = "athens"
    url = "https://ganeti-master.athens.example.org:5080"
    username = "synnefo"
    password_file = "athens.password"   # mode 0600; relative to this file's folder
    ca_file = "athens-rapi.pem"         # or fingerprint = "6B:5D:...", or insecure = true
    queue_dir = "/var/lib/ganeti/queue" # optional: watch the job queue (on the master node)
    drained = false                     # true: take no new instances on this backend
    timeout = 120                       # optional: this backend's reconcile timeout

    [ownership]
    prefix = "sg-"                      # instances whose names start with it ...
    tag = "synnefo-ganeti:owned"        # ... and that carry this tag are ours ("" turns it off)

    [reconcile]
    interval = 300                      # seconds between reconcile passes
    timeout = 60                        # seconds per backend per pass

    [dispatcher]                        # the daemon (synnefo-ganeti dispatcher); all optional
    strategy = "credits"                # or "round_robin"
    health_interval = 10                # seconds between health probes of each backend
    fail_after = 3                      # failed probes in a row: down (no new placements)
    recover_after = 2                   # good probes in a row: up again
    webhook = "https://ops.example.org/hooks/ganeti"   # POSTed each health change
    status_port = 9180                  # /metrics, /healthz, /readyz on status_host

Every problem raises :class:`~synnefo_ganeti.errors.ConfigError`, one line per bad key:
``config file /etc/synnefo-ganeti.toml: backends.1.url: must start with https://...``.
No message and no ``repr`` shows a password, a password file's content, or a database
URL's password.
"""

from __future__ import annotations

import difflib
import os
import re
import stat
import tomllib
from collections.abc import Iterable, Iterator, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Self, get_args, get_origin
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from synnefo_ganeti.errors import ConfigError
from synnefo_ganeti.rapi import RapiClient, RetryPolicy, parse_fingerprint
from synnefo_ganeti.store import display_url, normalize_url

__all__ = [
    "CONFIG_ENV_VAR",
    "ENV_PREFIX",
    "BackendSettings",
    "DatabaseSettings",
    "DispatcherSettings",
    "OwnershipSettings",
    "ReconcileSettings",
    "Settings",
]

CONFIG_ENV_VAR = "SYNNEFO_GANETI_CONFIG"
"""The environment variable naming the config file that ``Settings()`` reads."""

ENV_PREFIX = "SYNNEFO_GANETI__"
"""The prefix of the environment variables that override the file's values."""

DEFAULT_OWNERSHIP_TAG = "synnefo-ganeti:owned"

_BACKEND_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_INSTANCE_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_GANETI_TAG = re.compile(r"^[\w.+*/:@-]{1,128}$")

# The keys of [[backends]] that hold paths: relative ones are taken from the file's folder.
_BACKEND_PATH_KEYS = ("password_file", "ca_file", "queue_dir")

# The file the Settings being built reads: set by Settings.__init__ for settings_customise_sources.
_loading_file: ContextVar[Path | None] = ContextVar("synnefo_ganeti_config_loading", default=None)
# The file Settings.from_file() asked for; wins over SYNNEFO_GANETI_CONFIG.
_requested_file: ContextVar[Path | None] = ContextVar("synnefo_ganeti_config_requested", default=None)


class _Section(BaseModel):
    """A table of the config file: unknown keys are errors, inputs never appear in errors."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)


def _expand_path(value: object) -> object:
    if isinstance(value, str) and value:
        return Path(value).expanduser()
    if isinstance(value, Path):
        return value.expanduser()
    return value


def _read_password_file(path: Path) -> str:
    """The password in ``path`` (without its trailing newline); refuses files others may read."""
    try:
        info = path.stat()
    except FileNotFoundError:
        raise ValueError(f"password file {path} does not exist") from None
    except OSError as exc:
        raise ValueError(f"password file {path} cannot be read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"password file {path} is not a regular file")
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise ValueError(f"password file {path} is readable by others (mode {mode:04o}); chmod 600 it")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"password file {path} cannot be read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"password file {path} is not UTF-8 text") from None
    password = text.rstrip("\r\n")
    if not password:
        raise ValueError(f"password file {path} is empty")
    return password


class DatabaseSettings(_Section):
    """``[database]``: where the job store lives.

    ``url`` is kept as written (``sqlite:///PATH`` or ``postgresql://USER:PASSWORD@HOST/DB``);
    ``repr`` and ``str`` show it with its password masked.
    """

    url: str = "sqlite:///synnefo-ganeti.db"

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the database URL is empty; use sqlite:///PATH or postgresql://USER@HOST/DB")
        normalize_url(value)  # ConfigError (a ValueError) for unparsable URLs and unsupported schemes
        return value

    @property
    def display_url(self) -> str:
        """The URL with its password masked, for logs and messages."""
        return display_url(self.url)

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        yield "url", display_url(self.url)


class BackendSettings(_Section):
    """``[[backends]]``: one Ganeti cluster, reached through its RAPI.

    Give exactly one of ``password`` and ``password_file`` (read when the settings load;
    it must be mode 0600 or stricter), and at most one of ``ca_file``, ``fingerprint`` and
    ``insecure``; none of them means the system trust store.
    """

    name: str
    url: str
    username: str
    password: SecretStr | None = None
    password_file: Path | None = None
    ca_file: Path | None = None
    fingerprint: str | None = None
    insecure: bool = False
    queue_dir: Path | None = None
    drained: bool = False
    timeout: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    max_connections: int = Field(default=20, ge=1)

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not value:
            raise ValueError("the backend name is empty")
        if not _BACKEND_NAME.match(value):
            raise ValueError(
                f"backend name {value!r} may hold only letters, digits, '_', '.' and '-', "
                "and must start with a letter or a digit"
            )
        return value

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        # Never echo the URL: a wrong one may carry credentials.
        if not value.startswith(("https://", "http://")):
            raise ValueError(
                "the RAPI URL must start with https:// (or http:// for a test server), "
                "e.g. https://ganeti-master.example.org:5080"
            )
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018  (raises ValueError for a bad port)
        except ValueError:
            raise ValueError("the RAPI URL is not a valid URL") from None
        if "@" in parts.netloc:
            raise ValueError("the RAPI URL must not carry credentials; use username and password_file")
        if not parts.hostname:
            raise ValueError("the RAPI URL has no host name")
        if parts.query or parts.fragment:
            raise ValueError("the RAPI URL must be a base URL, without ?query or #fragment")
        return value.rstrip("/")

    @field_validator("username")
    @classmethod
    def _check_username(cls, value: str) -> str:
        if not value:
            raise ValueError("the username is empty; ganeti-rapi requires authentication")
        return value

    @field_validator("password")
    @classmethod
    def _check_password(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value():
            raise ValueError("the password is empty")
        return value

    @field_validator("password_file", "ca_file", "queue_dir", mode="before")
    @classmethod
    def _expand_user(cls, value: object) -> object:
        return _expand_path(value)

    @field_validator("password_file")
    @classmethod
    def _check_password_file(cls, value: Path | None) -> Path | None:
        if value is not None:
            _read_password_file(value)
        return value

    @field_validator("ca_file")
    @classmethod
    def _check_ca_file(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            what = "is not a file" if value.exists() else "does not exist"
            raise ValueError(
                f"ca_file {value} {what}; copy /var/lib/ganeti/rapi.pem from the cluster's master node, "
                "or pin the certificate with fingerprint"
            )
        return value

    @field_validator("fingerprint")
    @classmethod
    def _check_fingerprint(cls, value: str | None) -> str | None:
        if value is not None:
            parse_fingerprint(value)  # ConfigError (a ValueError) naming the expected form
        return value

    @model_validator(mode="after")
    def _check_together(self) -> Self:
        if self.password is not None and self.password_file is not None:
            raise ValueError("give either password or password_file, not both")
        if self.password is None and self.password_file is None:
            raise ValueError("give password_file (or password); ganeti-rapi requires authentication")
        trust = [
            key
            for key, on in (
                ("ca_file", self.ca_file is not None),
                ("fingerprint", self.fingerprint is not None),
                ("insecure", self.insecure),
            )
            if on
        ]
        if len(trust) > 1:
            raise ValueError(f"give only one of ca_file, fingerprint or insecure, not {' and '.join(trust)}")
        if trust and not self.url.startswith("https://"):
            raise ValueError(f"{trust[0]} needs an https:// URL (ganeti-rapi serves HTTPS on :5080)")
        if self.password_file is not None:
            self.password = SecretStr(_read_password_file(self.password_file))
        return self

    def password_value(self) -> str:
        """The password in clear, for the RAPI client only."""
        assert self.password is not None  # the validators make sure of it
        return self.password.get_secret_value()

    def rapi_client(self, *, timeout: float | None = None, retry: RetryPolicy | None = None) -> RapiClient:
        """A :class:`~synnefo_ganeti.rapi.RapiClient` for this backend (use it with ``async with``).

        ``timeout`` is the per-request HTTP timeout (the client's default when ``None``).
        """
        extra: dict[str, Any] = {}
        if timeout is not None:
            extra["timeout"] = timeout
        assert self.password is not None  # the validators make sure of it
        return RapiClient(
            self.url,
            username=self.username,
            password=self.password,
            ca_file=self.ca_file,
            fingerprint=self.fingerprint,
            insecure=self.insecure,
            max_connections=self.max_connections,
            retry=retry,
            name=self.name,
            **extra,
        )


class OwnershipSettings(_Section):
    """``[ownership]``: how to tell the instances this control plane owns.

    An instance is owned when it matches every configured marker: its name starts with
    ``prefix``, and it carries ``tag``. An empty string turns a marker off; with no marker
    at all, nothing is owned.
    """

    prefix: str | None = None
    tag: str | None = DEFAULT_OWNERSHIP_TAG

    @field_validator("prefix", "tag", mode="before")
    @classmethod
    def _empty_is_off(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("prefix")
    @classmethod
    def _check_prefix(cls, value: str | None) -> str | None:
        if value is not None and not _INSTANCE_PREFIX.match(value):
            raise ValueError(
                f"prefix {value!r} cannot start an instance name; use letters, digits, '.', '_' and '-', "
                "starting with a letter or a digit"
            )
        return value

    @field_validator("tag")
    @classmethod
    def _check_tag(cls, value: str | None) -> str | None:
        if value is not None and not _GANETI_TAG.match(value):
            raise ValueError(f"tag {value!r} is not a Ganeti tag: 1 to 128 of letters, digits and '_.+*/:@-'")
        return value

    def owns(self, name: str, tags: Iterable[str]) -> bool:
        """Whether the instance ``name`` carrying ``tags`` belongs to this control plane."""
        if self.prefix is None and self.tag is None:
            return False
        if self.prefix is not None and not name.startswith(self.prefix):
            return False
        return self.tag is None or self.tag in set(tags)

    def tags_for_new(self) -> list[str]:
        """The tags to give an instance this control plane creates."""
        return [self.tag] if self.tag is not None else []


class ReconcileSettings(_Section):
    """``[reconcile]``: how often to compare the store with the clusters, and for how long at most."""

    interval: float = Field(default=300.0, gt=0, allow_inf_nan=False)
    timeout: float = Field(default=60.0, gt=0, allow_inf_nan=False)


class DispatcherSettings(_Section):
    """``[dispatcher]``: the daemon's health checks, placement, submission and status server."""

    #: "credits" (weighs free capacity and how fast each backend drains) or "round_robin"
    strategy: str = Field(default="credits", pattern=r"^(credits|round_robin)$")
    health_interval: float = Field(default=10.0, gt=0, allow_inf_nan=False)
    health_timeout: float = Field(default=5.0, gt=0, allow_inf_nan=False)
    #: probes failed in a row before a backend is down; succeeded in a row before it is up again
    fail_after: int = Field(default=3, ge=1)
    recover_after: int = Field(default=2, ge=1)
    #: POST each health change (JSON) here; off when unset
    webhook: str | None = None
    #: seconds between node-stats refreshes of a backend (also refreshed after placements run)
    stats_interval: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    #: creates in flight to one backend at once (Ganeti's RAPI serves 20 clients)
    submit_concurrency: int = Field(default=8, ge=1, le=20)
    #: RAPI /wait long-polls at once per backend, for backends without a local queue_dir
    track_concurrency: int = Field(default=4, ge=1, le=16)
    #: how many requests one claim takes
    claim_batch: int = Field(default=50, ge=1, le=1000)
    #: seconds between looks for new requests when nothing wakes the dispatcher
    poll_interval: float = Field(default=0.5, gt=0, allow_inf_nan=False)
    #: a request no backend can take is tried again until it is this old (seconds), then failed
    placement_timeout: float = Field(default=600.0, gt=0, allow_inf_nan=False)
    #: seconds SIGTERM leaves in-flight calls to finish
    shutdown_timeout: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    #: the status server (/metrics, /healthz, /readyz); port 0 picks a free one, None: off
    status_host: str = "127.0.0.1"
    status_port: int | None = Field(default=9180, ge=0, le=65535)

    @field_validator("webhook")
    @classmethod
    def _check_webhook(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value


class Settings(BaseSettings):
    """All the settings: ``[database]``, ``[[backends]]``, ``[ownership]``, ``[reconcile]``, ``[dispatcher]``.

    ``Settings()`` reads the file named by ``SYNNEFO_GANETI_CONFIG`` (if set);
    :meth:`from_file` reads a given one. ``SYNNEFO_GANETI__...`` environment variables
    override the file; keyword arguments override both. Any problem raises
    :class:`~synnefo_ganeti.errors.ConfigError` naming the file and the keys.
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        case_sensitive=False,
        extra="forbid",
        hide_input_in_errors=True,
    )

    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    backends: list[BackendSettings] = Field(default_factory=list)
    ownership: OwnershipSettings = Field(default_factory=OwnershipSettings)
    reconcile: ReconcileSettings = Field(default_factory=ReconcileSettings)
    dispatcher: DispatcherSettings = Field(default_factory=DispatcherSettings)

    _source: Path | None = PrivateAttr(default=None)

    def __init__(self, **values: Any) -> None:
        path = _requested_file.get()
        if path is None:
            path = _file_from_environment()
        token = _loading_file.set(path)
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise ConfigError(
                _describe_errors(exc.errors(include_input=False, include_url=False), path)
            ) from None
        except SettingsError as exc:
            raise ConfigError(_describe_settings_error(exc)) from None
        finally:
            _loading_file.reset(token)
        self._source = path

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Self:
        """The settings of the TOML file ``path``, with the environment's overrides."""
        token = _requested_file.set(Path(path).expanduser().absolute())
        try:
            return cls()
        finally:
            _requested_file.reset(token)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        path = _loading_file.get()
        if path is None:
            return init_settings, env_settings
        return init_settings, env_settings, InitSettingsSource(settings_cls, _read_toml(path))

    @field_validator("backends")
    @classmethod
    def _unique_names(cls, backends: list[BackendSettings]) -> list[BackendSettings]:
        seen: dict[str, int] = {}
        for index, backend in enumerate(backends):
            first = seen.setdefault(backend.name, index)
            if first != index:
                raise ValueError(
                    f"backend name {backend.name!r} is used twice (backends.{first} and backends.{index}); "
                    "names must be unique"
                )
        return backends

    @property
    def source(self) -> Path | None:
        """The config file these settings were read from (``None``: no file)."""
        return self._source

    def backend(self, name: str) -> BackendSettings:
        """The backend called ``name``; :class:`ConfigError` listing the known ones otherwise."""
        for backend in self.backends:
            if backend.name == name:
                return backend
        where = f"the config file {self._source}" if self._source is not None else "the settings"
        known = ", ".join(b.name for b in self.backends)
        defines = f"defines: {known}" if known else "defines no backends"
        raise ConfigError(f"unknown backend {name!r}; {where} {defines}")

    def reconcile_timeout(self, backend: BackendSettings | str) -> float:
        """The reconcile timeout of ``backend``: its own ``timeout``, else ``[reconcile] timeout``."""
        if isinstance(backend, str):
            backend = self.backend(backend)
        return backend.timeout if backend.timeout is not None else self.reconcile.timeout


# -- loading -------------------------------------------------------------------------------------------


def _file_from_environment() -> Path | None:
    value = os.environ.get(CONFIG_ENV_VAR, "")
    if not value:
        return None
    return Path(value).expanduser().absolute()


def _read_toml(path: Path) -> dict[str, Any]:
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
    """Make the backends' relative paths relative to the config file's folder (in place)."""
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


# -- error messages ------------------------------------------------------------------------------------


def _dotted(loc: Sequence[int | str]) -> str:
    return ".".join(str(part) for part in loc)


def _env_var_for(loc: Sequence[int | str]) -> str | None:
    """The ``SYNNEFO_GANETI__...`` variable that set the value at ``loc`` (or a table above it)."""
    names = {key.upper() for key in os.environ}
    for end in range(len(loc), 0, -1):
        parts = loc[:end]
        if any(isinstance(part, int) for part in parts):
            continue
        name = ENV_PREFIX + "__".join(str(part).upper() for part in parts)
        if name in names:
            return name
    return None


def _model_at(loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The settings model that holds the value at ``loc``."""
    model: type[BaseModel] = Settings
    parts = list(loc)
    while parts:
        part = parts.pop(0)
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            return None
        annotation = field.annotation
        if get_origin(annotation) is list:
            if not parts or not isinstance(parts[0], int):
                return None
            parts.pop(0)
            (annotation,) = get_args(annotation)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return model


def _message(error: ErrorDetails) -> str:
    loc = error["loc"]
    kind = error["type"]
    if kind == "missing":
        return "this key is required"
    if kind == "extra_forbidden" and loc:
        model = _model_at(loc[:-1])
        if model is None:
            return "unknown key"
        known = list(model.model_fields)
        hint = difflib.get_close_matches(str(loc[-1]), known, n=1)
        did_you_mean = f"did you mean {hint[0]!r}? " if hint else ""
        return f"unknown key; {did_you_mean}the keys here are: {', '.join(known)}"
    if kind == "value_error":
        return error["msg"].removeprefix("Value error, ")
    return error["msg"]


def _describe_errors(errors: Iterable[ErrorDetails], path: Path | None) -> str:
    lines = []
    for error in errors:
        loc = error["loc"]
        env_var = _env_var_for(loc)
        if env_var is not None:
            where = f"environment variable {env_var}"
        elif path is not None:
            where = f"config file {path}"
        else:
            where = "settings"
        key = _dotted(loc)
        lines.append(f"{where}: {key}: {_message(error)}" if key else f"{where}: {_message(error)}")
    return "\n".join(lines)


def _describe_settings_error(exc: SettingsError) -> str:
    match = re.search(r'field "([^"]+)"', str(exc))
    if match is None:
        return f"settings from the environment: {exc}"
    field = match.group(1)
    return (
        f"environment variable {ENV_PREFIX}{field.upper()}: {field}: cannot be parsed; "
        "lists and tables given in the environment must be JSON"
    )
