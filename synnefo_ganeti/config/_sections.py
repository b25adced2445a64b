"""The sections of the config file: ``[database]``, ``[[backends]]``, ``[ownership]``, ``[reconcile]``, ``[dispatcher]``.

Each is a pydantic model that refuses unknown keys and never shows its input in an
error; :class:`~synnefo_ganeti.config.Settings` puts them together.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal, Self
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from synnefo_ganeti.config._secrets import expand_path, read_password_file
from synnefo_ganeti.rapi import RapiClient, RetryPolicy, parse_fingerprint
from synnefo_ganeti.store import display_url, normalize_url

__all__ = [
    "DEFAULT_OWNERSHIP_TAG",
    "BackendSettings",
    "DatabaseSettings",
    "DispatcherSettings",
    "EventLoop",
    "NodePlacement",
    "OwnershipSettings",
    "ReconcileSettings",
    "Repair",
    "Strategy",
    "UniqueNames",
]

DEFAULT_OWNERSHIP_TAG = "synnefo-ganeti:owned"

Strategy = Literal["credits", "round_robin"]
"""The placement strategies of ``[dispatcher] strategy``."""

EventLoop = Literal["auto", "uvloop", "asyncio"]
"""The daemon's event loop (``[dispatcher] event_loop``): uvloop's where it can be imported
(``auto``), uvloop's or fail (``uvloop``), or the standard library's (``asyncio``)."""

NodePlacement = Literal["pnode", "opportunistic", "ganeti"]
"""Who chooses the node inside a backend (``[dispatcher] node_placement``): the dispatcher
(``pnode``), Ganeti's iallocator on the node locks that are free (``opportunistic``), or
Ganeti's iallocator holding every node lock (``ganeti``)."""

Repair = Literal["start", "migrate", "failover"]
"""A repair ``[repair] allow`` (or a backend's ``repair_allow``) may name: ``start`` (an instance
stopped or in error while it should run, on a node that is up), ``migrate`` (live, off a node that is
up), ``failover`` (off a node that is offline, or fenced by ``fence_command`` then marked offline)."""

UniqueNames = Literal["global", "backend"]
"""Where an instance name is unique while its instance is not DESTROYED (``[ownership]
unique_names``): across all backends (``global``) or on each backend (``backend``)."""

_BACKEND_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_INSTANCE_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_GANETI_TAG = re.compile(r"^[\w.+*/:@-]{1,128}$")


class _Section(BaseModel):
    """A table of the config file: unknown keys are errors, inputs never appear in errors."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)


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
    #: the repairs allowed on this backend, replacing ``[repair] allow`` (None: that one)
    repair_allow: list[Repair] | None = None
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
        return expand_path(value)

    @field_validator("password_file")
    @classmethod
    def _check_password_file(cls, value: Path | None) -> Path | None:
        if value is not None:
            read_password_file(value)
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
            self.password = SecretStr(read_password_file(self.password_file))
        return self

    def password_value(self) -> str:
        """The password in clear, for the RAPI client only."""
        assert self.password is not None  # the validators make sure of it
        return self.password.get_secret_value()

    def rapi_client(self, *, timeout: float | None = None, retry: RetryPolicy | None = None) -> RapiClient:
        """A :class:`~synnefo_ganeti.rapi.RapiClient` for this backend (use it with ``async with``).

        ``timeout`` is the per-request HTTP timeout (default: the backend's ``timeout``, else
        the client's default).
        """
        extra: dict[str, Any] = {}
        if timeout is None:
            timeout = self.timeout
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

    ``unique_names``: a name is unique across all backends (``"global"``, the default) or
    on each backend (``"backend"``) while its instance is not DESTROYED; a create or
    request that clashes is a ``ConflictError``. ``tag_namespace``: the tags under it are
    this control plane's to store and compare (an operator's other tags are left alone).
    """

    prefix: str | None = None
    tag: str | None = DEFAULT_OWNERSHIP_TAG
    unique_names: UniqueNames = "global"
    tag_namespace: str = "synnefo-ganeti:"

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
    strategy: Strategy = "credits"
    #: "pnode" (the dispatcher picks the node from its node stats), "opportunistic" (Ganeti's
    #: iallocator with opportunistic_locking) or "ganeti" (neither: the iallocator locks every node)
    node_placement: NodePlacement = "pnode"
    health_interval: float = Field(default=10.0, gt=0, allow_inf_nan=False)
    health_timeout: float = Field(default=5.0, gt=0, allow_inf_nan=False)
    #: probes failed in a row before a backend is down; succeeded in a row before it is up again
    fail_after: int = Field(default=3, ge=1)
    recover_after: int = Field(default=2, ge=1)
    #: POST each health change (JSON) here; off when unset
    webhook: str | None = None
    #: seconds between node-stats refreshes of a backend (also refreshed after placements run)
    stats_interval: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    #: seconds between the dispatcher's reports of itself in the database (alive, root tasks,
    #: claims and queue per backend: what a console or CLI of its own reads); 3 missed: not alive
    report_interval: float = Field(default=5.0, gt=0, allow_inf_nan=False)
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
    #: creates of one request that may fail in Ganeti for a reason of their backend or node (no
    #: room, the OS missing, the node down, offline or drained) before it fails; each such failure
    #: places it again (elsewhere), its error kept in ``Request.attempt_errors``
    max_attempts: int = Field(default=3, ge=1, le=100)
    #: a create whose answer was lost (a timeout, a broken connection, a 504) is looked for in
    #: Ganeti's job list for this long (seconds) before it may be sent again: ganeti-rapi puts a
    #: POST it accepted into the queue even after the client gave up, and its wait on the master
    #: daemon alone may last 60 s (luxi's read timeout) while a node is down
    unknown_outcome_wait: float = Field(default=90.0, ge=0, allow_inf_nan=False)
    #: seconds SIGTERM leaves in-flight calls to finish
    shutdown_timeout: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    #: the status server (/metrics, /healthz, /readyz); port 0 picks a free one, None: off
    status_host: str = "127.0.0.1"
    status_port: int | None = Field(default=9180, ge=0, le=65535)
    #: the daemon's event loop: "auto" (uvloop where it can be imported, else asyncio's), "uvloop"
    #: or "asyncio" (``synnefo_ganeti/daemon/_loop.py``); a Dispatcher built in a cloud API's
    #: process runs on that process's loop, whatever this says
    event_loop: EventLoop = "auto"

    @field_validator("webhook")
    @classmethod
    def _check_webhook(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value
