"""``synnefo-ganeti dispatcher``: the daemon that places, submits and follows durable requests.

Exit status 0 after SIGTERM/SIGINT (drained and flushed), 2 when it cannot start
(settings, database), 1 when it fails later.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass
from pathlib import Path

import click
from click.core import ParameterSource

from synnefo_ganeti.cli._main import configure_cli_logging, main
from synnefo_ganeti.cli._options import config_option, load_settings
from synnefo_ganeti.cli._output import fail, stderr
from synnefo_ganeti.config import Settings
from synnefo_ganeti.console import Console
from synnefo_ganeti.daemon import run_daemon
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.errors import ConfigError, GanetiError, StoreError

__all__ = ["dispatcher"]

log = logging.getLogger("synnefo_ganeti.cli")


@main.command()
@config_option
@click.option(
    "--status-port",
    type=click.IntRange(0, 65535),
    metavar="PORT",
    help="Serve /metrics, /healthz and /readyz here (0: a free port); overrides [dispatcher] status_port.",
)
@click.option("--no-status", is_flag=True, help="No status server at all.")
def dispatcher(config_file: Path, status_port: int | None, no_status: bool) -> None:
    """Run the dispatcher daemon: place, submit and follow durable requests, until SIGTERM/SIGINT.

    SIGHUP re-reads FILE: backends added, changed, drained or removed take effect at
    once; a bad file is logged as an error and the configuration in force stays. Logs
    go to stderr (JSON lines unless on a terminal; --log-level info unless given);
    nothing is printed on stdout. Exit status 0 after a clean stop, 2 when it cannot
    start (bad settings, database unusable), 1 when it fails later.
    """
    root = click.get_current_context().find_root()
    if root.get_parameter_source("log_level") in (ParameterSource.DEFAULT, None):
        configure_cli_logging("info")  # a daemon tells what it does unless asked otherwise
    settings = load_settings(config_file)
    if status_port is not None:
        settings = settings.model_copy(
            update={"dispatcher": settings.dispatcher.model_copy(update={"status_port": status_port})}
        )
    daemon = _Daemon(settings, config_file, status=not no_status)
    try:
        # the loop [dispatcher] event_loop names: uvloop's where installed, by default (daemon/_loop.py)
        code = run_daemon(daemon.serve(), settings.dispatcher.event_loop)
    except (ConfigError, StoreError) as exc:
        fail(str(exc), 1 if daemon.started else 2)
    except GanetiError as exc:
        fail(str(exc), 1)
    except KeyboardInterrupt:  # before the signal handlers were installed
        stderr.print("interrupted")
        raise SystemExit(130) from None
    if code:  # a root task failed (logged with its traceback); everything was stopped in order
        raise SystemExit(code)


@dataclass
class _Daemon:
    settings: Settings
    config_file: Path
    status: bool
    started: bool = False

    async def serve(self) -> int:
        """Run the dispatcher until SIGTERM/SIGINT; its exit status (1: a root task failed)."""
        daemon = Dispatcher(
            self.settings, config_path=self.config_file, status_server=self.status, freeze_gc=True
        )
        if self.settings.web.enabled:  # the console on the status server too (docs/console.md)
            Console(self.settings).attach(daemon)
        loop = asyncio.get_running_loop()
        reloads: set[asyncio.Task[None]] = set()

        def stop(name: str) -> None:
            log.info("%s: stopping (drain, flush, exit)", name)
            for task in reloads:  # a reload must not add backends behind the shutdown
                task.cancel()
            daemon.stop()

        def reload() -> None:
            task = loop.create_task(self._reload(daemon), name="dispatch reload")
            reloads.add(task)
            task.add_done_callback(reloads.discard)

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop, sig.name)
        loop.add_signal_handler(signal.SIGHUP, reload)
        ready = asyncio.create_task(self._mark_started(daemon), name="dispatch started")
        try:
            return await daemon.run()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)
            ready.cancel()
            for task in list(reloads):
                task.cancel()
            await asyncio.gather(ready, *reloads, return_exceptions=True)

    async def _mark_started(self, daemon: Dispatcher) -> None:
        await daemon.ready.wait()
        self.started = True

    async def _reload(self, daemon: Dispatcher) -> None:
        """SIGHUP: apply the file again; whatever goes wrong is logged, the daemon goes on."""
        await daemon.ready.wait()
        log.info("SIGHUP: reloading %s", self.config_file)
        try:
            await daemon.reload()  # logs what changed ("configuration reloaded: added c")
        except ConfigError as exc:
            log.error("reload failed, the configuration in force stays: %s", exc)
        except GanetiError as exc:
            log.error("reload failed: %s", exc)
        except Exception:  # a daemon does not die of a reload
            log.exception("reload failed")
