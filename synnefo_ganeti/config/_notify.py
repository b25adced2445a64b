"""``[notify]``: where the dispatcher sends every change of the feed: a webhook, AMQP, or both.

.. code-block:: toml

    [notify]
    url = "https://api.example.org/hooks/synnefo-ganeti"   # unset: no webhook
    secret_file = "webhook.secret"   # mode 0600, relative to the config file's folder
    timeout = 10                     # seconds per POST, AMQP connect or confirm
    retry_max = 60                   # the longest wait between retries (seconds)
    amqp_url_file = "amqp.url"       # mode 0600: "amqps://user:password@broker/vhost"; unset: no AMQP
    amqp_exchange = "synnefo_ganeti.changes"   # a durable topic exchange (declared)
    amqp_routing_prefix = "changes"  # routing key "<prefix>.<kind>": changes.request, ...

The secret is read from ``secret_file`` when the settings load and held as a
:class:`~pydantic.SecretStr`: no ``repr``, log line or error message shows it. The AMQP
URL may hold a password: it is held the same way (``amqp_url``, or better read from
``amqp_url_file``), and logged only through :func:`mask_url` (the password as ``***``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from synnefo_ganeti.config._secrets import expand_path, read_password_file

__all__ = ["NotifySettings", "mask_url"]

_AMQP_SCHEMES = ("amqp://", "amqps://")


def mask_url(url: str) -> str:
    """``url`` fit for a log line: its password (if any) as ``***``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    userinfo, at, host = authority.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}{slash}{path}"


class NotifySettings(BaseModel):
    """``[notify]``: POST each change of the feed (JSON, signed with HMAC-SHA256) to ``url``,
    and/or publish it to the AMQP broker at ``amqp_url`` (both may be on, each with its cursor).

    ``secret_file`` is required with ``url``: every POST carries
    ``X-Synnefo-Ganeti-Signature: sha256=<hex HMAC of the body>`` made with its content.
    ``amqp_url`` or ``amqp_url_file`` (one of them) turns the AMQP publisher on; ``timeout``
    and ``retry_max`` apply to it too (connect and confirm waits, the backoff's ceiling).
    """

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    url: str | None = None
    secret_file: Path | None = None
    #: seconds one POST may take (connecting included) before it counts as failed
    timeout: float = Field(default=10.0, gt=0, allow_inf_nan=False)
    #: failed POSTs are retried after 0.5 s, then twice as long each time, at most this long
    retry_max: float = Field(default=60.0, ge=0.5, allow_inf_nan=False)
    #: the secret read from ``secret_file`` (never shown)
    secret: SecretStr | None = Field(default=None, exclude=True, repr=False)
    #: the broker's URL (``amqp://`` or ``amqps://``; it may hold a password: never shown).
    #: Give it here or, better, in ``amqp_url_file``; not both
    amqp_url: SecretStr | None = Field(default=None, repr=False)
    #: a file (mode 0600) holding the broker's URL
    amqp_url_file: Path | None = None
    #: the durable topic exchange every change is published to (the publisher declares it)
    amqp_exchange: str = Field(default="synnefo_ganeti.changes", min_length=1)
    #: routing key of a change: ``<amqp_routing_prefix>.<kind>`` (``changes.request``, ...)
    amqp_routing_prefix: str = Field(default="changes", min_length=1)

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        assert value is not None
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value

    @field_validator("amqp_url")
    @classmethod
    def _check_amqp_url(cls, value: SecretStr | None) -> SecretStr | None:
        return check_amqp_url(value)

    @field_validator("secret_file", "amqp_url_file", mode="before")
    @classmethod
    def _expand_user(cls, value: object) -> object:
        return expand_path(value)

    @model_validator(mode="after")
    def _read_secret(self) -> Self:
        if self.url is not None and self.secret_file is None and self.secret is None:
            raise ValueError("give secret_file with url: every webhook POST is signed with its content")
        if self.secret_file is not None:
            try:
                secret = read_password_file(self.secret_file)
            except ValueError as exc:
                raise ValueError(str(exc).replace("password file", "secret_file", 1)) from None
            self.secret = SecretStr(secret)
        self.amqp_url = amqp_url_from(self.amqp_url, self.amqp_url_file)
        return self

    @property
    def enabled(self) -> bool:
        """Whether the dispatcher runs the webhook (``url`` set)."""
        return self.url is not None

    @property
    def amqp_enabled(self) -> bool:
        """Whether the dispatcher publishes the feed to AMQP (``amqp_url`` or ``amqp_url_file`` set)."""
        return self.amqp_url is not None

    def amqp_url_value(self) -> str:
        """The broker's URL, password included: for the AMQP publisher's connect only."""
        if self.amqp_url is None:
            raise ValueError("[notify] amqp_url (or amqp_url_file) is not set")
        return self.amqp_url.get_secret_value()

    def amqp_display_url(self) -> str:
        """The broker's URL for log lines and reprs: its password as ``***``."""
        return mask_url(self.amqp_url_value()) if self.amqp_url is not None else "(no AMQP)"

    def secret_bytes(self) -> bytes:
        """The HMAC key, for the webhook deliverer only."""
        assert self.secret is not None  # the validators make sure of it when url is set
        return self.secret.get_secret_value().encode()


def amqp_url_from(amqp_url: SecretStr | None, amqp_url_file: Path | None) -> SecretStr | None:
    """The AMQP URL of a section: ``amqp_url``, or what ``amqp_url_file`` holds (one of the two;
    a ValueError naming the key, never the URL)."""
    if amqp_url_file is None:
        return amqp_url
    if amqp_url is not None:
        raise ValueError(
            "give amqp_url or amqp_url_file, not both (amqp_url_file is the better: "
            "the URL may hold a password)"
        )
    try:
        url = read_password_file(amqp_url_file)
    except ValueError as exc:
        raise ValueError(str(exc).replace("password file", "amqp_url_file", 1)) from None
    if not url.startswith(_AMQP_SCHEMES):
        raise ValueError(f"amqp_url_file {amqp_url_file} must hold an amqp:// or amqps:// URL")
    return SecretStr(url)


def check_amqp_url(value: SecretStr | None) -> SecretStr | None:
    """An ``amqp_url`` key's value: unset when empty; a ValueError unless amqp:// or amqps://."""
    if value is None or not value.get_secret_value():
        return None
    if not value.get_secret_value().startswith(_AMQP_SCHEMES):
        raise ValueError("must be an amqp:// or amqps:// URL")
    return value
