"""``[synnefo]``: the drop-in for Synnefo's snf-ganeti-eventd (``synnefo-ganeti watch --eventd-compat``).

.. code-block:: toml

    [synnefo]
    eventd_compat = true                # `synnefo-ganeti watch --config FILE` runs as eventd
    queue_dir = "/var/lib/ganeti/queue" # Ganeti's job queue on this node
    amqp_url_file = "eventd-amqp.url"   # mode 0600: "amqp://user:password@broker:5672/" (or amqp_url)
    exchange = "ganeti"                 # Synnefo's settings.EXCHANGE_GANETI (a durable topic exchange)
    cluster_name = "ganeti.example.org" # unset: ssconf_cluster_name in ssconf_dir
    ssconf_dir = "/var/lib/ganeti"      # ssconf_master_node: publish only on the master
    node_name = "node1.example.org"     # unset: this host's FQDN
    rapi_url = "https://ganeti.example.org:5080"   # the instances' NICs, disks, hvparams
    rapi_username = "eventd"
    rapi_password_file = "eventd-rapi.password"    # mode 0600
    rapi_ca_file = "rapi.pem"           # or rapi_fingerprint = "6B:5D:...", or rapi_insecure = true
    max_pending = 100000                # versions plus messages held while the broker is away
    status_port = 9181                  # /metrics, /healthz, /readyz on status_host (unset: none)

Every key is optional and matches a flag of ``watch --eventd-compat`` (``rapi_url`` is
``--rapi``, ``status_port`` and ``status_host`` are ``--metrics-port`` and
``--metrics-host``); a flag given on the command line (or through its environment
variable) wins over the key. Relative paths are taken from the config file's folder.
The dispatcher does not read this section: the eventd publisher runs on Ganeti's master
node, as ``watch --eventd-compat`` (docs/eventd.md).

The AMQP URL may hold a password: it is held as a :class:`~pydantic.SecretStr` (read from
``amqp_url_file`` when the settings load), shown only through
:func:`~synnefo_ganeti.config._notify.mask_url`. The RAPI password stays in its file,
which is checked (mode 0600, not empty) when the settings load and read again when the
RAPI client starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Self
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from synnefo_ganeti.config._notify import amqp_url_from, check_amqp_url, mask_url
from synnefo_ganeti.config._secrets import expand_path, read_password_file
from synnefo_ganeti.rapi import parse_fingerprint

__all__ = ["DEFAULT_EVENTD_EXCHANGE", "DEFAULT_MAX_PENDING", "SYNNEFO_PATH_KEYS", "SynnefoSettings"]

#: Synnefo's ``settings.EXCHANGE_GANETI``
DEFAULT_EVENTD_EXCHANGE = "ganeti"
#: job-file versions plus messages held in memory while the broker does not confirm
DEFAULT_MAX_PENDING = 100_000
#: the keys holding paths (relative ones are taken from the config file's folder)
SYNNEFO_PATH_KEYS = ("queue_dir", "ssconf_dir", "amqp_url_file", "rapi_password_file", "rapi_ca_file")


class SynnefoSettings(BaseModel):
    """``[synnefo]``: what ``watch --eventd-compat`` publishes Synnefo's eventd messages with.

    ``amqp_url`` or ``amqp_url_file`` (one of them) is needed to run it, here or as
    ``--amqp``/``--amqp-url-file``; the CLI says which key is missing. Give at most one of
    ``rapi_ca_file``, ``rapi_fingerprint`` and ``rapi_insecure``.
    """

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    #: ``synnefo-ganeti watch --config FILE`` publishes eventd messages without ``--eventd-compat``
    eventd_compat: bool = False
    #: Ganeti's job-queue directory (unset: ``/var/lib/ganeti/queue``, or ``--queue-dir``)
    queue_dir: Path | None = None
    #: the broker's URL (``amqp://`` or ``amqps://``; it may hold a password: never shown).
    #: Give it here or, better, in ``amqp_url_file``; not both
    amqp_url: SecretStr | None = Field(default=None, repr=False)
    #: a file (mode 0600) holding the broker's URL
    amqp_url_file: Path | None = None
    #: the durable topic exchange (Synnefo's ``settings.EXCHANGE_GANETI``)
    exchange: str = Field(default=DEFAULT_EVENTD_EXCHANGE, min_length=1)
    #: the cluster's name in the messages (unset: ``ssconf_cluster_name``)
    cluster_name: str | None = None
    #: Ganeti's ssconf files (``ssconf_master_node``, ``ssconf_cluster_name``)
    ssconf_dir: Path = Path("/var/lib/ganeti")
    #: this node's name as Ganeti knows it (unset: its FQDN)
    node_name: str | None = None
    #: the RAPI asked for the instances' NICs, disks and hvparams (unset: sent without them)
    rapi_url: str | None = None
    rapi_username: str | None = None
    #: a file (mode 0600) holding the RAPI password
    rapi_password_file: Path | None = None
    rapi_ca_file: Path | None = None
    rapi_fingerprint: str | None = None
    rapi_insecure: bool = False
    #: job-file versions read plus messages not yet confirmed, at most: past it the queue's
    #: events are not taken in until the backlog drains, then the queue directory is read again
    max_pending: int = Field(default=DEFAULT_MAX_PENDING, ge=1)
    #: serve /metrics, /healthz and /readyz on this port (unset: no status server; 0: any free port)
    status_port: int | None = Field(default=None, ge=0, le=65535)
    status_host: str = "127.0.0.1"

    @field_validator("amqp_url")
    @classmethod
    def _check_amqp_url(cls, value: SecretStr | None) -> SecretStr | None:
        return check_amqp_url(value)

    @field_validator("cluster_name", "node_name", "rapi_username")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be empty (leave the key out instead)")
        return value.strip() if value is not None else None

    @field_validator("rapi_url")
    @classmethod
    def _check_rapi_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        # never echoed: a wrong URL may carry credentials
        if not value.startswith(("https://", "http://")):
            raise ValueError(
                "must start with https:// (or http:// for a test server), e.g. https://HOST:5080"
            )
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018  (raises ValueError for a bad port)
        except ValueError:
            raise ValueError("is not a valid URL") from None
        if "@" in parts.netloc:
            raise ValueError("must not carry credentials; use rapi_username and rapi_password_file")
        if not parts.hostname:
            raise ValueError("has no host name")
        return value.rstrip("/")

    @field_validator("rapi_fingerprint")
    @classmethod
    def _check_fingerprint(cls, value: str | None) -> str | None:
        if value is not None:
            parse_fingerprint(value)  # ConfigError (a ValueError) naming the expected form
        return value

    @field_validator(*SYNNEFO_PATH_KEYS, mode="before")
    @classmethod
    def _expand_user(cls, value: object) -> object:
        return expand_path(value)

    @field_validator("rapi_ca_file")
    @classmethod
    def _check_ca_file(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            what = "is not a file" if value.exists() else "does not exist"
            raise ValueError(f"{value} {what}; copy /var/lib/ganeti/rapi.pem from the master node")
        return value

    @field_validator("rapi_password_file")
    @classmethod
    def _check_password_file(cls, value: Path | None) -> Path | None:
        if value is not None:
            read_password_file(value)  # (a ValueError naming the file, never its content)
        return value

    @model_validator(mode="after")
    def _check_together(self) -> Self:
        self.amqp_url = amqp_url_from(self.amqp_url, self.amqp_url_file)
        trust = [
            key
            for key, on in (
                ("rapi_ca_file", self.rapi_ca_file is not None),
                ("rapi_fingerprint", self.rapi_fingerprint is not None),
                ("rapi_insecure", self.rapi_insecure),
            )
            if on
        ]
        if len(trust) > 1:
            raise ValueError(
                f"give only one of rapi_ca_file, rapi_fingerprint or rapi_insecure, not {' and '.join(trust)}"
            )
        return self

    def amqp_url_value(self) -> str | None:
        """The broker's URL, password included (for the publisher's connect only), or None."""
        return self.amqp_url.get_secret_value() if self.amqp_url is not None else None

    def amqp_display_url(self) -> str:
        """The broker's URL for log lines and reprs: its password as ``***``."""
        url = self.amqp_url_value()
        return mask_url(url) if url is not None else "(no AMQP)"
