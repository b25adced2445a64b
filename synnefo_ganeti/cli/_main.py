"""The ``synnefo-ganeti`` command: thin click commands over the library.

Each command loads its options, configures logging, and runs one coroutine with
``asyncio.run()`` at the edge. Tables go to stdout through rich; ``--json`` prints
machine-readable JSON instead; errors go to stderr as ``error: ...`` with exit
status 1 (2 for bad usage or settings).

This module holds the root group; each command group lives in its own module
(``_rapi``, ``_db``, ``_watch``, ``_jobs``, ``_instances``, ``_requests``,
``_submit``, ``_dispatch``, ``_reconcile``, ``_backends``, ``_fake``, ``_demo``, ``_web``),
shared options in ``_options`` and output helpers in ``_output``.
"""

from __future__ import annotations

import click

from synnefo_ganeti._logging import configure_logging
from synnefo_ganeti._version import __version__

__all__ = ["LOG_FORMATS", "configure_cli_logging", "main"]

LOG_FORMATS = {"auto": None, "json": True, "console": False}


def configure_cli_logging(level: str, log_format: str | None = None) -> None:
    """Log to stderr at ``level``: JSON lines, console lines, or (auto) JSON unless on a terminal.

    ``log_format`` defaults to the top-level ``--log-format`` of the running command.
    """
    if log_format is None:
        context = click.get_current_context(silent=True)
        log_format = context.find_root().params.get("log_format") if context is not None else None
    configure_logging(level=level, json=LOG_FORMATS[log_format or "auto"])


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="synnefo-ganeti")
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="warning",
    show_default=True,
    envvar="SYNNEFO_GANETI_LOG_LEVEL",
    help="Log detail on stderr.",
)
@click.option(
    "--log-format",
    type=click.Choice(sorted(LOG_FORMATS), case_sensitive=False),
    default="auto",
    show_default=True,
    envvar="SYNNEFO_GANETI_LOG_FORMAT",
    help="Logs on stderr as JSON lines, as console key-value lines, or (auto) JSON unless on a terminal.",
)
def main(log_level: str, log_format: str) -> None:
    """synnefo-ganeti: an asyncio control plane for Ganeti clusters."""
    configure_cli_logging(log_level, log_format.lower())
