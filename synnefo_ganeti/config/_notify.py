"""``[notify]``: the change-feed webhook the dispatcher POSTs every change to.

.. code-block:: toml

    [notify]
    url = "https://api.example.org/hooks/synnefo-ganeti"   # unset: no webhook
    secret_file = "webhook.secret"   # mode 0600, relative to the config file's folder
    timeout = 10                     # seconds per POST
    retry_max = 60                   # the longest wait between retries (seconds)

The secret is read from ``secret_file`` when the settings load and held as a
:class:`~pydantic.SecretStr`: no ``repr``, log line or error message shows it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from synnefo_ganeti.config._secrets import expand_path, read_password_file

__all__ = ["NotifySettings"]


class NotifySettings(BaseModel):
    """``[notify]``: POST each change of the feed (JSON, signed with HMAC-SHA256) to ``url``.

    ``secret_file`` is required with ``url``: every POST carries
    ``X-Synnefo-Ganeti-Signature: sha256=<hex HMAC of the body>`` made with its content.
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

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        assert value is not None
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value

    @field_validator("secret_file", mode="before")
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
        return self

    @property
    def enabled(self) -> bool:
        """Whether the dispatcher runs the webhook (``url`` set)."""
        return self.url is not None

    def secret_bytes(self) -> bytes:
        """The HMAC key, for the webhook deliverer only."""
        assert self.secret is not None  # the validators make sure of it when url is set
        return self.secret.get_secret_value().encode()
