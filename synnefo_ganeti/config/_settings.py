"""``Settings``: every section together, read from the file and the environment.

Sources, highest priority first: keyword arguments, the environment
(``SYNNEFO_GANETI__...``), the file. Validation errors become one
:class:`~synnefo_ganeti.errors.ConfigError` with a line per bad key.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Self

from pydantic import Field, PrivateAttr, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from synnefo_ganeti.config._errors import describe_errors, describe_settings_error
from synnefo_ganeti.config._loading import (
    ENV_PREFIX,
    file_from_environment,
    loading_file,
    read_toml,
    requested_file,
)
from synnefo_ganeti.config._notify import NotifySettings
from synnefo_ganeti.config._repair import RepairSettings
from synnefo_ganeti.config._sections import (
    BackendSettings,
    DatabaseSettings,
    DispatcherSettings,
    OwnershipSettings,
    ReconcileSettings,
)
from synnefo_ganeti.config._synnefo import SynnefoSettings
from synnefo_ganeti.config._web import WebSettings
from synnefo_ganeti.errors import ConfigError

__all__ = ["Settings"]


class Settings(BaseSettings):
    """All the settings: ``[database]``, ``[[backends]]``, ``[ownership]``, ``[reconcile]``, ``[dispatcher]``,
    ``[notify]``, ``[web]``, ``[repair]``, ``[synnefo]``.

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
    notify: NotifySettings = Field(default_factory=NotifySettings)
    web: WebSettings = Field(default_factory=WebSettings)
    repair: RepairSettings = Field(default_factory=RepairSettings)
    synnefo: SynnefoSettings = Field(default_factory=SynnefoSettings)

    _source: Path | None = PrivateAttr(default=None)

    def __init__(self, **values: Any) -> None:
        path = requested_file.get()
        if path is None:
            path = file_from_environment()
        token = loading_file.set(path)
        try:
            super().__init__(**values)
        except ValidationError as exc:
            errors = exc.errors(include_input=False, include_url=False)
            raise ConfigError(describe_errors(type(self), errors, path)) from None
        except SettingsError as exc:
            raise ConfigError(describe_settings_error(exc)) from None
        finally:
            loading_file.reset(token)
        self._source = path

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Self:
        """The settings of the TOML file ``path``, with the environment's overrides."""
        token = requested_file.set(Path(path).expanduser().absolute())
        try:
            return cls()
        finally:
            requested_file.reset(token)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        path = loading_file.get()
        if path is None:
            return init_settings, env_settings
        return init_settings, env_settings, InitSettingsSource(settings_cls, read_toml(path))

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
