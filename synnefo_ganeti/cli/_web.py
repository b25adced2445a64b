"""``synnefo-ganeti web``: the operator console in the browser (see docs/console.md).

Serves the console on ``[web] host:port`` (``--host``/``--port`` override them; loopback
unless told otherwise) until SIGTERM or SIGINT. ``--hash-password`` reads a password on
stdin and prints the argon2 hash a users file line takes (``name:role:<hash>``).
Exit status 0 after a stop, 2 for bad settings or a port that cannot be bound.
"""

from __future__ import annotations

import asyncio
import getpass
import logging
import signal
import sys
from pathlib import Path

import click
from click.core import ParameterSource

from synnefo_ganeti.cli._main import configure_cli_logging, main
from synnefo_ganeti.cli._options import config_option, json_option, load_settings
from synnefo_ganeti.cli._output import fail, print_json, stderr
from synnefo_ganeti.config import Settings
from synnefo_ganeti.console import Console, hash_password
from synnefo_ganeti.errors import ConfigError, GanetiError

__all__ = ["web"]

log = logging.getLogger("synnefo_ganeti.cli")


def _hash_password(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    if sys.stdin.isatty():
        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            fail("the two passwords differ", 2)
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if len(password) < 8:
        fail("a console password has at least 8 characters", 2)
    click.echo(hash_password(password))
    ctx.exit(0)


@main.command()
@config_option
@click.option("--host", metavar="HOST", help="Listen here (default: [web] host, 127.0.0.1).")
@click.option(
    "--port", type=click.IntRange(0, 65535), metavar="PORT", help="Listen here (default: [web] port)."
)
@click.option(
    "--hash-password",
    is_flag=True,
    is_eager=True,
    expose_value=False,
    callback=_hash_password,
    help="Read a password (stdin) and print its argon2 hash for a [web] users_file line, then exit.",
)
@json_option
def web(config_file: Path, host: str | None, port: int | None, as_json: bool) -> None:
    """Serve the operator console (pages, live updates, actions for operators) until SIGTERM/SIGINT.

    Nothing is served without a login: users come from [web] users_file (name:role:hash lines,
    role viewer or operator) or [web] tokens_file. Logs go to stderr; the URL too, and with
    --json as {"url": ...} on stdout once it listens (for scripts, with --port 0).
    """
    root = click.get_current_context().find_root()
    if root.get_parameter_source("log_level") in (ParameterSource.DEFAULT, None):
        configure_cli_logging("info")
    settings = load_settings(config_file)
    if settings.web.users_file is None and settings.web.tokens_file is None:
        fail(
            f"config file {config_file}: [web] sets neither users_file nor tokens_file: nobody could log in "
            "(see docs/console.md; 'synnefo-ganeti web --hash-password' makes a hash)",
            2,
        )
    try:
        asyncio.run(_serve(settings, host, port, as_json=as_json))
    except ConfigError as exc:
        fail(str(exc), 2)
    except OSError as exc:
        fail(str(exc), 2)
    except GanetiError as exc:
        fail(str(exc), 1)


async def _serve(settings: Settings, host: str | None, port: int | None, *, as_json: bool) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        console = Console(settings)
        async with console.serve(host, port) as url:
            stderr.print(f"synnefo-ganeti console on {url} (Ctrl-C stops it)")
            if as_json:
                print_json({"url": url})
                sys.stdout.flush()
            if not settings.web.secure_cookies and not url.startswith(("http://127.", "http://[::1]")):
                log.warning(
                    "console: secure_cookies is off on a non-loopback address: sessions travel in clear"
                )
            await stop.wait()
            log.info("console: stopping")
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
