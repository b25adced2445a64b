"""The options of ``watch --eventd-compat`` and the ``[synnefo]`` section, merged into one plan.

Decide in pure code, then do the I/O: :meth:`EventdOptions.plan` takes what the command
line said, the ``[synnefo]`` section of ``--config`` (when there is one) and which
parameters were given rather than defaulted, and returns an :class:`EventdPlan` or raises
a :class:`click.UsageError` (exit status 2) naming both the flag and the key. A flag given
on the command line or through its environment variable wins over the key; a key wins over
a flag's default.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import click

from synnefo_ganeti.cli._options import load_settings
from synnefo_ganeti.cli._rapi import Connection
from synnefo_ganeti.config import SynnefoSettings, read_password_file
from synnefo_ganeti.config._notify import mask_url
from synnefo_ganeti.dispatch import DEFAULT_EXCHANGE

__all__ = ["DEFAULT_QUEUE_DIR", "EventdOptions", "EventdPlan", "eventd_config", "eventd_options"]

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_QUEUE_DIR = Path("/var/lib/ganeti/queue")
_IN_CONFIG = "in the --config file's [synnefo]"


def eventd_config(flag: bool | None, backend: str | None, config_file: Path | None) -> SynnefoSettings | None:
    """The ``[synnefo]`` section to run ``watch`` as eventd with, or None: store job events.

    ``--eventd-compat`` (``flag`` True) runs it, with the section of ``--config`` if given
    (else the defaults); ``--no-eventd-compat`` never does; without either, ``[synnefo]
    eventd_compat = true`` in ``--config`` runs it unless ``--backend`` was given.
    """
    if flag is False or (flag is None and (backend is not None or config_file is None)):
        return None
    section = load_settings(config_file).synnefo if config_file is not None else SynnefoSettings()
    if flag or section.eventd_compat:
        return section
    return None


@dataclass(frozen=True, kw_only=True)
class EventdPlan:
    """What ``watch --eventd-compat`` runs with, every flag and key resolved."""

    url: str = field(repr=False)
    queue_dir: Path
    exchange: str
    cluster: str
    ssconf_dir: Path
    node_name: str | None
    rapi: Connection | None
    max_pending: int
    metrics_port: int | None
    metrics_host: str

    @property
    def display_url(self) -> str:
        return mask_url(self.url)


@dataclass(kw_only=True)
class EventdOptions:
    """What ``--eventd-compat``'s flags were given (see :func:`eventd_options`)."""

    amqp: str | None
    amqp_url_file: Path | None
    exchange: str
    cluster_name: str | None
    ssconf_dir: Path
    node_name: str | None
    rapi: str | None
    rapi_username: str | None
    rapi_password_file: Path | None
    rapi_ca_file: Path | None
    rapi_fingerprint: str | None
    rapi_insecure: bool
    max_pending: int | None

    @property
    def given(self) -> list[str]:
        """The eventd options given (an error without ``--eventd-compat``)."""
        flags = {
            "--amqp": self.amqp,
            "--amqp-url-file": self.amqp_url_file,
            "--cluster-name": self.cluster_name,
            "--node-name": self.node_name,
            "--rapi": self.rapi,
            "--rapi-username": self.rapi_username,
            "--rapi-password-file": self.rapi_password_file,
            "--max-pending": self.max_pending,
        }
        return [flag for flag, value in flags.items() if value]

    def plan(
        self,
        section: SynnefoSettings,
        *,
        queue_dir: Path,
        metrics_port: int | None,
        metrics_host: str,
        explicit: Container[str],
    ) -> EventdPlan:
        """Flags over ``[synnefo]`` keys over defaults; ``explicit`` names the parameters given
        on the command line or by environment (``queue_dir``, ``exchange``, ...)."""
        ssconf_dir = self.ssconf_dir if "ssconf_dir" in explicit else section.ssconf_dir
        if "queue_dir" not in explicit and section.queue_dir is not None:
            queue_dir = section.queue_dir
        if "metrics_port" not in explicit and metrics_port is None:
            metrics_port = section.status_port
        return EventdPlan(
            url=self._amqp_url(section),
            queue_dir=queue_dir,
            exchange=self.exchange if "exchange" in explicit else section.exchange,
            cluster=self._cluster(section, ssconf_dir),
            ssconf_dir=ssconf_dir,
            node_name=self.node_name or section.node_name,
            rapi=self._rapi_connection(section),
            max_pending=self.max_pending if self.max_pending is not None else section.max_pending,
            metrics_port=metrics_port,
            metrics_host=metrics_host if "metrics_host" in explicit else section.status_host,
        )

    def _amqp_url(self, section: SynnefoSettings) -> str:
        if self.amqp and self.amqp_url_file:
            raise click.UsageError("give --amqp URL or --amqp-url-file FILE, not both")
        if self.amqp_url_file is not None:
            try:
                url = read_password_file(self.amqp_url_file)
            except ValueError as exc:
                raise click.BadParameter(str(exc), param_hint="--amqp-url-file") from None
        elif self.amqp:
            url = self.amqp
        elif (configured := section.amqp_url_value()) is not None:
            return configured  # (its scheme checked when the settings loaded)
        else:
            raise click.UsageError(
                "--eventd-compat publishes to RabbitMQ: give --amqp amqp://USER:PASS@HOST:5672/ "
                "or --amqp-url-file FILE (mode 0600, the URL on one line), "
                f"or amqp_url_file {_IN_CONFIG}"
            )
        if not url.startswith(("amqp://", "amqps://")):
            raise click.BadParameter("must be an amqp:// or amqps:// URL", param_hint="--amqp")
        return url

    def _cluster(self, section: SynnefoSettings, ssconf_dir: Path) -> str:
        if self.cluster_name is not None:
            if not self.cluster_name.strip():
                raise click.BadParameter("must not be empty", param_hint="--cluster-name")
            return self.cluster_name.strip()
        if section.cluster_name is not None:
            return section.cluster_name
        path = ssconf_dir / "ssconf_cluster_name"
        try:
            name = path.read_text().strip()
        except OSError as exc:
            raise click.UsageError(
                f"cannot read the cluster's name from {path} ({exc.strerror or exc}): "
                "give --cluster-name NAME or --ssconf-dir DIR (Ganeti's /var/lib/ganeti), "
                f"or cluster_name or ssconf_dir {_IN_CONFIG}"
            ) from None
        if not name:
            raise click.UsageError(f"{path} is empty: give --cluster-name NAME or cluster_name {_IN_CONFIG}")
        return name

    def _rapi_connection(self, section: SynnefoSettings) -> Connection | None:
        url = self.rapi or section.rapi_url
        username = self.rapi_username or section.rapi_username
        password_file = self.rapi_password_file or section.rapi_password_file
        if url is None:
            if username or password_file:
                raise click.UsageError(
                    "--rapi-username and --rapi-password-file (rapi_username, rapi_password_file) "
                    f"need --rapi URL or rapi_url {_IN_CONFIG}"
                )
            return None
        if not username:
            raise click.UsageError(
                "--rapi URL needs --rapi-username USER (and --rapi-password-file FILE), "
                f"or rapi_username (and rapi_password_file) {_IN_CONFIG}"
            )
        # the command line's trust (a CA, a fingerprint or none) replaces the file's, whole
        trust = self.rapi_ca_file is not None or self.rapi_fingerprint is not None or self.rapi_insecure
        return Connection(
            url,
            username,
            password_file,
            self.rapi_ca_file if trust else section.rapi_ca_file,
            self.rapi_fingerprint if trust else section.rapi_fingerprint,
            self.rapi_insecure if trust else section.rapi_insecure,
            30.0,
            4,
        )


def eventd_options(func: F) -> F:
    """The options of ``watch --eventd-compat`` (each passed as a keyword argument)."""
    path = click.Path(dir_okay=False, path_type=Path)
    options = [
        click.option(
            "--eventd-compat/--no-eventd-compat",
            default=None,
            help="Publish Synnefo snf-ganeti-eventd's messages to --amqp instead of storing job "
            "events (no database; only while this node is the master). Unset: as the --config "
            "file's [synnefo] eventd_compat says, unless --backend is given.",
        ),
        click.option(
            "--amqp",
            envvar="SYNNEFO_GANETI_AMQP_URL",
            metavar="URL",
            help="RabbitMQ for --eventd-compat, amqp://USER:PASS@HOST:5672/ (else $SYNNEFO_GANETI_AMQP_URL, "
            "else [synnefo] amqp_url_file).",
        ),
        click.option(
            "--amqp-url-file",
            type=path,
            help="File (mode 0600) holding the --amqp URL: keeps the password off the command line.",
        ),
        click.option(
            "--exchange",
            default=DEFAULT_EXCHANGE,
            show_default=True,
            help="Topic exchange to publish to (Synnefo's settings.EXCHANGE_GANETI).",
        ),
        click.option("--cluster-name", help="The cluster's name in messages (default: ssconf_cluster_name)."),
        click.option(
            "--ssconf-dir",
            type=click.Path(file_okay=False, path_type=Path),
            default=Path("/var/lib/ganeti"),
            show_default=True,
            help="Ganeti's ssconf files (ssconf_master_node, ssconf_cluster_name).",
        ),
        click.option("--node-name", help="This node's name as Ganeti knows it (default: its FQDN)."),
        click.option("--rapi", metavar="URL", help="RAPI for the instances' NICs, disks and hvparams."),
        click.option("--rapi-username", envvar="SYNNEFO_GANETI_RAPI_USERNAME", help="RAPI user."),
        click.option(
            "--rapi-password-file",
            envvar="SYNNEFO_GANETI_RAPI_PASSWORD_FILE",
            type=path,
            help="File holding the RAPI password (else $SYNNEFO_GANETI_RAPI_PASSWORD).",
        ),
        click.option("--rapi-ca-file", type=path, help="The cluster's certificate (rapi.pem)."),
        click.option("--rapi-fingerprint", help="Pinned SHA-256 of the RAPI certificate."),
        click.option("--rapi-insecure", is_flag=True, help="Do not verify the RAPI's TLS (a warning)."),
        click.option(
            "--max-pending",
            type=click.IntRange(min=1),
            metavar="N",
            help="Job-file versions plus messages held in memory while the broker does not confirm "
            "(default 100000, or [synnefo] max_pending); past it the queue is read again once they "
            "are published.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func
