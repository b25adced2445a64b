"""``synnefo-ganeti fake-ganeti``: a fake Ganeti (RAPI and job queue) in the foreground."""

from __future__ import annotations

import asyncio
import random
import signal
from collections.abc import Callable
from pathlib import Path

import click
from rich.table import Table

from synnefo_ganeti.cli._main import main
from synnefo_ganeti.cli._options import json_option
from synnefo_ganeti.cli._output import print_json, stdout
from synnefo_ganeti.testing import DEFAULT_VERSION, VERSIONS, FakeGaneti

__all__ = ["fake_ganeti", "jittered"]


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


def _host_entries(values: tuple[str, ...]) -> dict[str, str]:
    hosts: dict[str, str] = {}
    for item in values:
        name, sep, address = item.partition("=")
        if not sep or not name.strip() or not address.strip():
            raise click.BadParameter(f"{item!r} is not NAME=IP (e.g. vm1.example.org=192.0.2.10)")
        hosts[name.strip()] = address.strip()
    return hosts


@main.command("fake-ganeti")
@click.option(
    "--version", "--ganeti-version", "version", type=click.Choice(list(VERSIONS)), default=DEFAULT_VERSION,
    show_default=True, help="The Ganeti it answers as: its /2/info, defaults, refusals and routes.",
)  # fmt: skip
@click.option(
    "--host-entry", "host_entries", multiple=True, metavar="NAME=IP",
    help="A name the cluster's resolver knows (repeat): a create with name_check (3.0's and 2.16's "
    "default) needs its name resolvable.",
)  # fmt: skip
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
@click.option(
    "--rpc-timeout", type=click.FloatRange(min=0), default=0.0, show_default=True,
    help="Seconds an RPC to a crashed node takes to fail (Ganeti: 5); crash one with "
    "POST /__fake__/nodes/NAME/crash.",
)  # fmt: skip
@click.option(
    "--slow-submit", type=click.FloatRange(min=0), metavar="SECONDS",
    help="Answer create POSTs only after this many seconds (as ganeti-rapi with a master candidate down).",
)  # fmt: skip
@click.option(
    "--slow-submit-job-after", type=click.FloatRange(min=0), metavar="SECONDS",
    help="With --slow-submit: the create's job reaches the queue after this many seconds, whether "
    "or not the client still waits (default: when it is answered).",
)  # fmt: skip
@click.option(
    "--slow-submit-queued-for", type=click.FloatRange(min=0), metavar="SECONDS",
    help="With --slow-submit: the create's job stays listed but out of the scheduler this many seconds "
    "more (luxid writing it to a dead master candidate): a cancel meanwhile is 'not found in queue'.",
)  # fmt: skip
@click.option("--no-tls", is_flag=True, help="Plain HTTP instead of HTTPS.")
@click.option(
    "--tls-dir", type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
    help="Keep the certificate here: rapi.pem and rapi.key are reused if present, else made here "
    "and kept (default: a new one at each start).",
)  # fmt: skip
@click.option("--username", default="fake", show_default=True)
@click.option(
    "--password-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Password to require (default: random).",
)
@json_option
def fake_ganeti(
    version: str,
    host_entries: tuple[str, ...],
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
    rpc_timeout: float,
    slow_submit: float | None,
    slow_submit_job_after: float | None,
    slow_submit_queued_for: float | None,
    no_tls: bool,
    tls_dir: Path | None,
    username: str,
    password_file: Path | None,
    as_json: bool,
) -> None:
    """Run a fake Ganeti (RAPI and job queue) in the foreground, until Ctrl-C or SIGTERM."""
    times = _op_times(op_times)
    hosts = _host_entries(host_entries)
    for given, hint in (
        (slow_submit_job_after, "--slow-submit-job-after"),
        (slow_submit_queued_for, "--slow-submit-queued-for"),
    ):
        if given is not None and slow_submit is None:
            raise click.BadParameter("needs --slow-submit", param_hint=hint)
    if tls_dir is not None and no_tls:
        raise click.BadParameter("cannot be used with --no-tls", param_hint="--tls-dir")
    password = password_file.read_text().strip() if password_file is not None else None

    async def serve() -> None:
        fake = FakeGaneti(
            nodes=nodes, queue_dir=queue_dir, latency=jittered(latency, jitter), max_clients=max_clients, tls=not no_tls, host=host,
            port=port, username=username, password=password, max_running_jobs=max_running_jobs, op_times=times,
            archive_after=archive_after, tls_dir=tls_dir, version=version, hosts=hosts,
        )  # fmt: skip
        try:
            await fake.start()
        except ValueError as exc:  # a --tls-dir whose certificate cannot be used
            raise click.BadParameter(str(exc), param_hint="--tls-dir") from None
        except OSError as exc:
            raise click.ClickException(
                f"cannot listen on {host}:{port}: {exc.strerror}; pick another --port"
            ) from None
        fake.rpc_timeout = rpc_timeout
        if slow_submit is not None:
            fake.slow_submit(
                slow_submit, job_after=slow_submit_job_after, queued_for=slow_submit_queued_for or 0.0
            )
        try:
            # the signals first: a stop asked while the details are written stops it cleanly
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            details = {
                "url": fake.url, "username": fake.username, "password": fake.password, "ca_file": fake.ca_file,
                "fingerprint": fake.fingerprint, "queue_dir": str(fake.queue_dir), "nodes": nodes,
                "version": fake.version, "software_version": fake.cluster.model.version.software_version,
            }  # fmt: skip
            if as_json:
                print_json(details)
            else:
                table = Table(show_header=False, box=None, title="fake Ganeti running (Ctrl-C stops it)")
                for key, value in details.items():
                    table.add_row(key, str(value))
                stdout().print(table)
            await stop.wait()
        finally:
            await fake.stop()

    asyncio.run(serve())
