"""``[web]``: the operator console (``synnefo-ganeti web``, or the dispatcher's status server).

.. code-block:: toml

    [web]
    enabled = true                 # also serve the console from the dispatcher's status server
    host = "127.0.0.1"             # synnefo-ganeti web: where to listen (loopback unless told)
    port = 9190
    users_file = "console.users"   # lines "name:role:$argon2id$..." (role: viewer or operator)
    tokens_file = "console.tokens" # optional: lines "name:role:sha256:<hex of the token's SHA-256>"
    secure_cookies = true          # false only behind plain HTTP on loopback (the demo)
    session_hours = 8              # a session ends after this long without a request

Relative paths are taken from the config file's folder. The files hold hashes, never
passwords; they are read when the console starts (and again on each login, so an edit
takes effect without a restart).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from synnefo_ganeti.config._secrets import expand_path

__all__ = ["WebSettings"]


class WebSettings(BaseModel):
    """``[web]``: the operator console's listener, its users and its cookies."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    #: serve the console from the dispatcher's status server too
    enabled: bool = False
    #: where ``synnefo-ganeti web`` listens (loopback unless told otherwise)
    host: str = "127.0.0.1"
    port: int = Field(default=9190, ge=0, le=65535)
    #: "name:role:<argon2 hash>" per line; role ``viewer`` (reads) or ``operator`` (also acts)
    users_file: Path | None = None
    #: "name:role:sha256:<hex>" per line: login with a long random token instead of a password
    tokens_file: Path | None = None
    #: the session cookie's ``Secure`` flag (browsers send it over HTTPS only)
    secure_cookies: bool = True
    #: a session ends after this many hours without a request
    session_hours: float = Field(default=8.0, gt=0, allow_inf_nan=False)

    @field_validator("users_file", "tokens_file", mode="before")
    @classmethod
    def _expand_user(cls, value: object) -> object:
        return expand_path(value)
