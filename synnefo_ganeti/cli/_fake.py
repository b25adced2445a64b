"""``synnefo-ganeti fake-ganeti`` and ``synnefo-ganeti demo``."""

from __future__ import annotations

import asyncio
import random
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from synnefo_ganeti.cli._main import _configure_logging, _print_json, _stdout, json_option, main, stderr
from synnefo_ganeti.errors import GanetiError
from synnefo_ganeti.rapi import CreateProgress, InstanceSpec, RapiClient
from synnefo_ganeti.store import Store
from synnefo_ganeti.testing import FakeGaneti
from synnefo_ganeti.watch import QueueWatcher

DEMO_BACKEND = "demo"


async def _until_stored(store: Store, report: DemoReport, on_progress: Callable[[int], None]) -> None:
    """Wait until the watcher has stored every job's final status (or 30 s passed)."""
    deadline = time.monotonic() + 30
    while True:
        stored = {job.job_id: job.status.value for job in await store.list_jobs(backend=DEMO_BACKEND)}
        report.stored_jobs = sum(1 for job_id in report.final if job_id in stored)
        report.stored_matching = sum(
            1 for job_id, status in report.final.items() if stored.get(job_id) == status
        )
        on_progress(report.stored_matching)
        if report.stored_matching == len(report.final) or time.monotonic() > deadline:
            return
        await asyncio.sleep(0.1)


def jittered(latency: float, jitter: float) -> float | Callable[[], float]:
    """``latency`` seconds, or a uniform draw within ``latency * (1 ± jitter)``."""
    if not jitter or not latency:
        return latency
    low, high = latency * (1 - jitter), latency * (1 + jitter)
    return lambda: random.uniform(low, high)


def _op_times(values: tuple[str, ...]) -> dict[str, float]:
    times: dict[str, float] = {}
    for item in values:
        op_id, sep, seconds = item.partition("=")
        try:
            if not sep:
                raise ValueError
            times[op_id.strip()] = float(seconds)
        except ValueError:
            raise click.BadParameter(f"{item!r} is not OP_ID=SECONDS (e.g. OP_INSTANCE_CREATE=0.5)") from None
        if times[op_id.strip()] < 0:
            raise click.BadParameter(f"{item!r}: seconds must be >= 0")
    return times


@main.command("fake-ganeti")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=5080, show_default=True, help="0 picks a free port."
)
@click.option("--queue-dir", type=click.Path(file_okay=False, path_type=Path), help="Write job files here.")
@click.option("--nodes", type=click.IntRange(min=1), default=3, show_default=True)
@click.option(
    "--latency", type=click.FloatRange(min=0), default=0.0, show_default=True, help="Seconds per answer."
)
@click.option(
    "--jitter", type=click.FloatRange(0, 1), default=0.0, show_default=True,
    help="Spread the latency uniformly by this fraction (0.1: 0.9x to 1.1x).",
)  # fmt: skip
@click.option("--max-clients", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("--max-running-jobs", type=click.IntRange(min=1), default=20, show_default=True)
@click.option(
    "--op-time", "op_times", multiple=True, metavar="OP_ID=SECONDS", help="Run time of an opcode (repeat)."
)
@click.option(
    "--archive-after", type=click.FloatRange(min=0), help="Archive jobs this many seconds after they end."
)
@click.option("--no-tls", is_flag=True, help="Plain HTTP instead of HTTPS.")
@click.option("--username", default="fake", show_default=True)
@click.option(
    "--password-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Password to require (default: random).",
)
@json_option
def fake_ganeti(
    host: str,
    port: int,
    queue_dir: Path | None,
    nodes: int,
    latency: float,
    jitter: float,
    max_clients: int,
    max_running_jobs: int,
    op_times: tuple[str, ...],
    archive_after: float | None,
    no_tls: bool,
    username: str,
    password_file: Path | None,
    as_json: bool,
) -> None:
    """Run a fake Ganeti (RAPI and job queue) in the foreground, until Ctrl-C or SIGTERM."""
    times = _op_times(op_times)
    password = password_file.read_text().strip() if password_file is not None else None

    async def serve() -> None:
        fake = FakeGaneti(
            nodes=nodes, queue_dir=queue_dir, latency=jittered(latency, jitter), max_clients=max_clients, tls=not no_tls, host=host,
            port=port, username=username, password=password, max_running_jobs=max_running_jobs, op_times=times,
            archive_after=archive_after,
        )  # fmt: skip
        try:
            await fake.start()
        except OSError as exc:
            raise click.ClickException(
                f"cannot listen on {host}:{port}: {exc.strerror}; pick another --port"
            ) from None
        try:
            details = {
                "url": fake.url, "username": fake.username, "password": fake.password, "ca_file": fake.ca_file,
                "fingerprint": fake.fingerprint, "queue_dir": str(fake.queue_dir), "nodes": nodes,
            }  # fmt: skip
            if as_json:
                _print_json(details)
            else:
                table = Table(show_header=False, box=None, title="fake Ganeti running (Ctrl-C stops it)")
                for key, value in details.items():
                    table.add_row(key, str(value))
                _stdout().print(table)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()
        finally:
            await fake.stop()

    asyncio.run(serve())


# ---------------------------------------------------------------------- demo


@dataclass
class DemoReport:
    count: int
    submit_seconds: float = 0.0
    wall_seconds: float = 0.0
    job_ids: list[int] = field(default_factory=list)
    submit_errors: list[str] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)
    final: dict[int, str] = field(default_factory=dict)
    stored_jobs: int = 0
    stored_matching: int = 0
    stored_events: int = 0
    database: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "instances": self.count,
            "submitted": len(self.job_ids),
            "submit_seconds": round(self.submit_seconds, 3),
            "submitted_per_s": round(len(self.job_ids) / self.submit_seconds, 1)
            if self.submit_seconds
            else None,
            "succeeded": self.statuses.get("success", 0),
            "failed": sum(self.failures.values()) + len(self.submit_errors),
            "failures": dict(self.failures) | {f"submit: {e}": 1 for e in self.submit_errors},
            "wall_seconds": round(self.wall_seconds, 3),
            "stored_jobs": self.stored_jobs,
            "stored_final_matching": self.stored_matching,
            "stored_events": self.stored_events,
            "database": self.database,
        }


class DemoStepError(click.ClickException):
    def __init__(self, step: str, detail: str) -> None:
        super().__init__(f"demo step '{step}' failed: {detail}")


@main.command()
@click.option("--count", type=click.IntRange(min=1, max=10000), default=100, show_default=True)
@click.option(
    "--latency", type=click.FloatRange(min=0), default=0.2, show_default=True, help="RAPI answer time."
)
@click.option("--nodes", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--job-timeout", type=click.FloatRange(min=1), default=120.0, show_default=True)
@click.option(
    "--db",
    "db_url",
    metavar="URL",
    help="Keep the job events in this database (sqlite:///PATH or postgresql://...); "
    "by default a temporary SQLite file.",
)
@json_option
def demo(
    count: int, latency: float, nodes: int, job_timeout: float, db_url: str | None, as_json: bool
) -> None:
    """Create COUNT instances on a fake Ganeti, end to end, and show what it took.

    Starts a fake Ganeti (HTTPS, --latency per answer, 20 clients at a time, --nodes nodes)
    that writes its job queue the way Ganeti does, and the queue watcher storing every job
    change into SQLite (or --db); submits the creates through RapiClient.create_instances,
    waits for every job, checks that the database holds each job's final status, and
    prints a summary. Needs no root, no config and no network beyond loopback.
    """
    if as_json:
        _configure_logging("error")
    report = asyncio.run(_demo(count, latency, nodes, job_timeout, quiet=as_json, db_url=db_url))
    if as_json:
        _print_json(report.as_dict())
    else:
        data = report.as_dict()
        table = Table(
            title=f"demo: {count} instance creates on a fake Ganeti ({nodes} nodes, {latency:g} s latency)"
        )
        table.add_column("figure")
        table.add_column("value", justify="right")
        table.add_row("submitted", f"{data['submitted']} of {count}")
        table.add_row("submit time", f"{data['submit_seconds']:.2f} s")
        table.add_row("submitted per second", f"{data['submitted_per_s']}")
        table.add_row("succeeded", str(data["succeeded"]))
        table.add_row("failed", str(data["failed"]))
        table.add_row("wall time", f"{data['wall_seconds']:.2f} s")
        table.add_row(
            "final status stored by the watcher", f"{data['stored_final_matching']} of {data['submitted']}"
        )
        table.add_row("job events stored", str(data["stored_events"]))
        _stdout().print(table)
        for reason, times in data["failures"].items():
            _stdout().print(f"  failed x{times}: {reason}", highlight=False)
    if report.failures or report.submit_errors or report.stored_matching != len(report.final):
        raise SystemExit(1)


async def _demo(
    count: int, latency: float, nodes: int, job_timeout: float, *, quiet: bool, db_url: str | None = None
) -> DemoReport:
    with tempfile.TemporaryDirectory(prefix="synnefo-ganeti-demo-") as scratch:
        return await _demo_in(Path(scratch), count, latency, nodes, job_timeout, quiet=quiet, db_url=db_url)


async def _demo_in(
    scratch: Path,
    count: int,
    latency: float,
    nodes: int,
    job_timeout: float,
    *,
    quiet: bool,
    db_url: str | None,
) -> DemoReport:
    report = DemoReport(count=count)
    started = time.perf_counter()
    step = "open the database"
    queue_dir = scratch / "queue"
    try:
        async with (
            Store(db_url or f"sqlite:///{scratch / 'demo.db'}") as store,
            FakeGaneti(nodes=nodes, latency=latency, max_clients=20, tls=True, queue_dir=queue_dir) as fake,
        ):
            report.database = store.display_url if db_url else "a temporary SQLite file"
            step = "watch the job queue"
            watcher = QueueWatcher(queue_dir, store, DEMO_BACKEND)
            watching = asyncio.create_task(watcher.run())
            await watcher.ready.wait()
            try:
                step = "connect"
                async with RapiClient(
                    fake.url, username=fake.username, password=fake.password, ca_file=fake.ca_file,
                    max_connections=20, long_poll_slots=10,
                ) as rapi:  # fmt: skip
                    await rapi.version()
                    specs = [
                        InstanceSpec(
                            name=f"demo-{index:04d}.fake.test", disk_template="diskless", os="noop",
                            beparams={"memory": 512}, iallocator="hail", opportunistic_locking=True,
                        )
                        for index in range(count)
                    ]  # fmt: skip
                    with Progress(
                        TextColumn("{task.description:<12}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=stderr, disable=quiet,
                    ) as progress:  # fmt: skip
                        step = "submit the creates"
                        task = progress.add_task("submitting", total=count)

                        def advance(update: CreateProgress) -> None:
                            progress.advance(task)

                        t0 = time.perf_counter()
                        results = await rapi.create_instances(specs, on_progress=advance)
                        report.submit_seconds = time.perf_counter() - t0
                        for result in results:
                            if isinstance(result, int):
                                report.job_ids.append(result)
                            else:
                                report.submit_errors.append(str(result))
                        step = "wait for the jobs"
                        waiting = progress.add_task("running", total=len(report.job_ids))

                        async def wait(job_id: int) -> None:
                            job = await rapi.wait_for_job(job_id, timeout=job_timeout)
                            report.statuses[job.status.value] += 1
                            report.final[job_id] = job.status.value
                            if job.failure is not None:
                                report.failures[f"{job.failure.type}: {job.failure.message}"] += 1
                            elif job.status.value != "success":
                                report.failures[f"job {job.status.value}"] += 1
                            progress.advance(waiting)

                        async with asyncio.TaskGroup() as group:
                            for job_id in report.job_ids:
                                group.create_task(wait(job_id))
                        step = "store the job events"
                        storing = progress.add_task("stored", total=len(report.final))
                        await _until_stored(
                            store, report, lambda done: progress.update(storing, completed=done)
                        )
            finally:
                watcher.stop()
                await watching
            await store.flush()
            report.stored_events = store.stats.events
    except* GanetiError as group:
        raise DemoStepError(step, str(group.exceptions[0])) from None
    except* OSError as group:
        raise DemoStepError(step, str(group.exceptions[0])) from None
    report.wall_seconds = time.perf_counter() - started
    return report
