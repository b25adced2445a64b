"""``synnefo-ganeti watch``: store every change of Ganeti's job queue as job events.

The watcher and the systemd pings run as root tasks of a
:class:`~synnefo_ganeti.daemon.Supervisor`: if one of them fails, its traceback is
logged, ``/readyz`` answers 503, the other is stopped, what was read is stored, and the
command exits 1.

With ``--eventd-compat --amqp URL`` (or a ``--config`` file whose ``[synnefo]`` says
``eventd_compat = true``) it needs no database: it publishes Synnefo snf-ganeti-eventd's
messages instead (:mod:`synnefo_ganeti.cli._eventd`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from synnefo_ganeti.cli._eventd import EventdOptions, eventd_config, eventd_options, run_eventd
from synnefo_ganeti.cli._main import main
from synnefo_ganeti.cli._options import database_options, database_url
from synnefo_ganeti.cli._output import error, run, stderr
from synnefo_ganeti.daemon import StatusServer, Supervisor, SystemdNotifier
from synnefo_ganeti.store import Store
from synnefo_ganeti.watch import QueueWatcher

__all__ = ["watch"]

log = logging.getLogger("synnefo_ganeti.cli")

#: seconds the root tasks have to stop (the watcher stores what it has read meanwhile)
SHUTDOWN_TIMEOUT = 30.0


@dataclass
class _Outcome:
    watched: Any
    written: Any
    seconds: float
    failure: str | None


@main.command()
@click.option(
    "--queue-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/var/lib/ganeti/queue"),
    show_default=True,
    help="Ganeti's job-queue directory on this (master) node.",
)
@database_options
@click.option("--backend", help="Name of this Ganeti cluster in the database (not with --eventd-compat).")
@click.option(
    "--retry-interval",
    type=click.FloatRange(min=0.1),
    default=2.0,
    show_default=True,
    help="Seconds between attempts when the queue directory is missing or unreadable.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(min=0, max=65535),
    help="Serve /metrics, /healthz and /readyz on this port (0: any free one).",
)
@click.option("--metrics-host", default="127.0.0.1", show_default=True, help="Address for --metrics-port.")
@eventd_options
def watch(
    queue_dir: Path,
    config_file: Path | None,
    db_url: str | None,
    backend: str | None,
    retry_interval: float,
    metrics_port: int | None,
    metrics_host: str,
    eventd_compat: bool | None,
    **eventd: Any,
) -> None:
    """Store every job-file change of Ganeti's queue as job events, until SIGINT/SIGTERM.

    Catches up at start (a full scan), rescans after an inotify overflow, skips bad
    files (logged once), and on SIGINT/SIGTERM stores what it has read and exits 0.
    Under systemd (Type=notify) it sends READY=1 once the first scan is queued,
    WATCHDOG=1 when asked for, and STOPPING=1 on the way out. If the watcher fails,
    the traceback is logged, what was read is stored, and it exits 1.

    With --eventd-compat --amqp URL: no database; Synnefo snf-ganeti-eventd's messages
    are published to the --exchange while this node is the master (docs/eventd.md). The
    --config file's [synnefo] section gives the same settings (the flags win over it);
    with [synnefo] eventd_compat = true, --eventd-compat is not needed.
    """
    options = EventdOptions(**eventd)
    section = eventd_config(eventd_compat, backend, config_file)
    if section is not None:
        if backend is not None:
            raise click.UsageError("--eventd-compat stores nothing: drop --backend")
        run_eventd(
            queue_dir, options, section, retry_interval, metrics_port=metrics_port, metrics_host=metrics_host
        )
        return
    if options.given:
        raise click.UsageError(f"{', '.join(options.given)}: only with --eventd-compat")
    if backend is None:
        raise click.UsageError("Missing option '--backend' (or give --eventd-compat --amqp URL)")
    if not backend.strip():
        raise click.BadParameter("must not be empty", param_hint="--backend")
    url = database_url(config_file, db_url)
    outcome = run(_watch(url, queue_dir, backend, retry_interval, metrics_port, metrics_host))
    watched, written = outcome.watched, outcome.written
    stderr.print(
        f"stopped after {outcome.seconds:.1f} s: read {watched.versions} job-file versions "
        f"({watched.bad_files} bad files skipped, {watched.scans} scans), stored {written.applied} "
        f"changes as {written.events} events"
    )
    if outcome.failure is not None:
        error(f"the watcher stopped: {outcome.failure}")
        raise SystemExit(1)


async def _watch(
    url: str,
    queue_dir: Path,
    backend: str,
    retry_interval: float,
    metrics_port: int | None,
    metrics_host: str,
) -> _Outcome:
    notifier = SystemdNotifier()
    supervisor = Supervisor("watch", logger=log)
    async with contextlib.AsyncExitStack() as stack:
        store = await stack.enter_async_context(Store(url))
        watcher = QueueWatcher(queue_dir, store, backend, retry_interval=retry_interval)
        where = ""
        if metrics_port is not None:

            async def scanned() -> str | None:
                return None if watcher.stats.scans else f"queue directory {queue_dir} not scanned yet"

            async def database() -> str | None:
                await store.count_jobs(backend=backend)
                return None

            async def tasks() -> str | None:
                return supervisor.problem()

            server = await stack.enter_async_context(
                StatusServer(
                    host=metrics_host,
                    port=metrics_port,
                    checks={"queue": scanned, "database": database, "tasks": tasks},
                )
            )
            where = f"; metrics on {server.url}/metrics"
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        started = time.monotonic()
        stderr.print(
            f"watching {queue_dir} as backend {backend!r} into {store.display_url}{where} (Ctrl-C to stop)"
        )
        try:
            supervisor.start("watch queue", watcher.run())
            if notifier.enabled:
                supervisor.start("watch systemd", _tell_systemd(notifier, watcher, backend))
            await supervisor.wait(stop)
        finally:
            # cancelling the watcher makes it read what is pending and hand it to the store
            await supervisor.stop(SHUTDOWN_TIMEOUT)
            notifier.stopping()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        await store.flush()
        failure = None if supervisor.healthy else supervisor.problem()
        return _Outcome(watcher.stats, store.stats, time.monotonic() - started, failure)


async def _tell_systemd(notifier: SystemdNotifier, watcher: QueueWatcher, backend: str) -> None:
    """READY=1 once the first scan is queued, then WATCHDOG=1 as often as systemd asks (until stopped)."""
    await watcher.ready.wait()
    notifier.ready(f"watching backend {backend}")
    interval = notifier.watchdog_interval()
    if not interval:
        await asyncio.Event().wait()  # nothing more to tell; run until stopped
    while interval:
        await asyncio.sleep(interval)
        notifier.watchdog()
