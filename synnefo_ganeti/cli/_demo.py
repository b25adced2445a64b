"""``synnefo-ganeti demo``: the whole loop on loopback, with three fake Ganeti clusters.

The scenario (the fake clusters, the dispatcher, the outage, the drift) lives next to
the fake, in :mod:`synnefo_ganeti.testing._demo`; this module runs it, shows a live
table per backend on stderr while it runs, and prints its summary.

``--web`` also opens the operator console (:mod:`synnefo_ganeti.console`) on the demo's
world, prints its URL and a one-time login, and keeps the world running after the
scenario until Ctrl-C (or SIGTERM).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import signal
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import click
from rich.live import Live
from rich.table import Table
from rich.text import Text

from synnefo_ganeti.cli._main import configure_cli_logging, main
from synnefo_ganeti.cli._options import json_option
from synnefo_ganeti.cli._output import fail, print_json, stderr, stdout
from synnefo_ganeti.config import WebSettings
from synnefo_ganeti.console import Console, hash_password
from synnefo_ganeti.testing._demo import (
    BACKENDS,
    DOWN_BACKEND,
    DemoProgress,
    DemoReport,
    DemoStepError,
    DemoWorld,
    run_demo,
)

__all__ = ["demo"]


@main.command()
@click.option("--count", type=click.IntRange(min=10, max=5000), default=200, show_default=True)
@click.option(
    "--speed",
    type=click.FloatRange(min=0.1, max=20),
    default=1.0,
    show_default=True,
    help="Run the fake clusters this many times faster (RAPI latency and create times divided by it).",
)
@click.option(
    "--db",
    "db_url",
    metavar="URL",
    help="Keep everything in this database (sqlite:///PATH or postgresql://...); "
    "by default a temporary SQLite file.",
)
@click.option(
    "--timeout", type=click.FloatRange(min=10), default=110.0, show_default=True, help="Give up after this."
)
@click.option(
    "--web",
    is_flag=True,
    help="Open the operator console on the demo's world (a printed URL and one-time login) and keep "
    "the world running after the scenario until Ctrl-C.",
)
@click.option(
    "--web-port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="The console's port on 127.0.0.1 with --web (0: a free one).",
)
@json_option
def demo(
    count: int, speed: float, db_url: str | None, timeout: float, web: bool, web_port: int, as_json: bool
) -> None:
    """The whole control plane on loopback: three fake Ganeti clusters, the dispatcher,
    COUNT durable create requests, a backend failing its health checks, a drift repaired.

    Prints a live table per backend (placed, running, done, failed) while it runs, then a
    summary; --json prints the summary as JSON only. Exits 1 if any promise was broken
    (a request not succeeded, a duplicate or lost create, the outage or the drift unseen).
    """
    configure_cli_logging("error")
    view = None if as_json else _LiveTable()
    console = _DemoConsole(web_port) if web else None
    try:
        try:
            report = asyncio.run(
                run_demo(
                    count,
                    speed=speed,
                    db_url=db_url,
                    timeout=timeout,
                    on_progress=view.update if view is not None else None,
                    around=console.around if console is not None else None,
                    hold=console.hold if console is not None else None,
                )
            )
        finally:
            if view is not None:
                view.close()
    except DemoStepError as exc:
        fail(str(exc), 1)
    if as_json:
        print_json(report.as_dict())
    else:
        _print_summary(report)
    if not report.ok:
        raise SystemExit(1)


class _DemoConsole:
    """``demo --web``: the console on the world while the demo runs, then until Ctrl-C."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = ""

    @contextlib.asynccontextmanager
    async def around(self, world: DemoWorld) -> AsyncIterator[None]:
        with tempfile.TemporaryDirectory(prefix="synnefo-ganeti-console-") as scratch:
            password = secrets.token_urlsafe(12)
            users = Path(scratch) / "console.users"
            users.write_text(f"demo:operator:{hash_password(password)}\n")
            users.chmod(0o600)
            # plain HTTP on loopback: a Secure cookie would not come back over http://127.0.0.1
            web = WebSettings(users_file=users, secure_cookies=False, port=self.port)
            console = Console(world.settings.model_copy(update={"web": web}), store=world.store)
            world.dispatcher.on_reconcile.append(console.reports.record)
            async with console.serve("127.0.0.1", self.port) as url:
                self.url = url
                stderr.print(f"console: {url}{console.one_time_login('demo', 'operator')}  (one-time login)")
                stderr.print(f"console: or log in at {url}/login as demo, password {password}")
                yield

    async def hold(self, world: DemoWorld) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        stderr.print(f"console: the scenario is done; the world keeps running at {self.url} until Ctrl-C")
        try:
            await stop.wait()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)


class _LiveTable:
    """The live table on stderr: started at the first progress, stopped by :meth:`close`."""

    def __init__(self) -> None:
        self.live: Live | None = None

    def update(self, progress: DemoProgress) -> None:
        if self.live is None:
            self.live = Live(
                _table(DemoProgress.starting(progress.count)), console=stderr, refresh_per_second=4
            )
            self.live.start()
        self.live.update(_table(progress))

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
            stderr.print()


def _table(progress: DemoProgress) -> Table:
    counts, health = progress.counts, progress.health
    table = Table(title=f"synnefo-ganeti demo: {progress.count} durable requests", caption=progress.status)
    for column in ("backend", "health", "placed", "running", "done", "failed"):
        table.add_column(column, justify="left" if column in ("backend", "health") else "right")
    for backend in BACKENDS:
        name = backend.name
        running = counts.get((name, "submitted"), 0) + counts.get((name, "pending"), 0)
        done = counts.get((name, "succeeded"), 0)
        failed = counts.get((name, "failed"), 0) + counts.get((name, "canceled"), 0)
        state = health.get(name, "?")
        table.add_row(
            f"{name} ({backend.nodes} nodes)",
            Text(state, style="green" if state == "up" else "bold red"),
            str(running + done + failed),
            str(running),
            str(done),
            str(failed),
        )
    waiting = counts.get((None, "pending"), 0)
    table.add_row("(not placed yet)", "", "", str(waiting), "", "")
    return table


def _print_summary(report: DemoReport) -> None:
    data = report.as_dict()
    out = stdout()
    table = Table(title="demo summary")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_row("requests", str(data["requests"]))
    table.add_row("succeeded", str(data["succeeded"]))
    table.add_row("failed / canceled", f"{data['failed']} / {data['canceled']}")
    for name, counts in data["per_backend"].items():
        table.add_row(f"  on {name}", ", ".join(f"{n} {status}" for status, n in sorted(counts.items())))
    table.add_row("instances in the fake clusters", str(data["instances_in_ganeti"]))
    table.add_row("duplicates (created twice)", str(data["duplicates"]))
    table.add_row("lost (never created)", str(data["lost"]))
    table.add_row(
        f"{DOWN_BACKEND} seen down / up again",
        f"{data['backend_down_seen']} / {data['backend_up_again_seen']}",
    )
    table.add_row(f"placed on {DOWN_BACKEND} while down", str(data["placed_on_down_backend"]))
    table.add_row("job final states stored", str(data["stored_final_matching"]))
    table.add_row("job events stored", str(data["stored_events"]))
    table.add_row("drift repaired", str(data["drift_repaired"]))
    table.add_row("wall time", f"{data['wall_seconds']:.1f} s")
    out.print(table)
    out.print(f"drift: {report.drift}")
    for line in report.backend_events:
        out.print(f"backend event: {line}")
    out.print(f"database: {report.database}")
