"""``synnefo-ganeti rapi ...``: talk to one cluster's RAPI directly (info, nodes, instances, jobs, create, cancel)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from synnefo_ganeti.cli._main import main
from synnefo_ganeti.cli._options import json_option
from synnefo_ganeti.cli._output import dump, empty, print_json, run, stderr, stdout
from synnefo_ganeti.config import read_password_file
from synnefo_ganeti.errors import ConfigError
from synnefo_ganeti.rapi import CreateProgress, InstanceSpec, Job, RapiClient

__all__ = ["rapi"]

T = TypeVar("T")


@dataclass
class Connection:
    url: str
    username: str
    password_file: Path | None
    ca_file: Path | None
    fingerprint: str | None
    insecure: bool
    timeout: float
    max_connections: int

    def password(self) -> str:
        if self.password_file is not None:
            try:
                return read_password_file(self.password_file)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        value = os.environ.get("SYNNEFO_GANETI_RAPI_PASSWORD")
        if value is None:
            raise ConfigError(
                "no RAPI password: pass --password-file FILE (mode 0600) or set SYNNEFO_GANETI_RAPI_PASSWORD"
            )
        return value

    def client(self) -> RapiClient:
        return RapiClient(
            self.url,
            username=self.username,
            password=self.password(),
            ca_file=self.ca_file,
            fingerprint=self.fingerprint,
            insecure=self.insecure,
            timeout=self.timeout,
            max_connections=self.max_connections,
        )


@main.group()
@click.option(
    "--url", envvar="SYNNEFO_GANETI_RAPI_URL", required=True, help="RAPI base URL, https://HOST:5080."
)
@click.option("--username", envvar="SYNNEFO_GANETI_RAPI_USERNAME", required=True, help="RAPI user.")
@click.option(
    "--password-file",
    envvar="SYNNEFO_GANETI_RAPI_PASSWORD_FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    help="File holding the RAPI password (else $SYNNEFO_GANETI_RAPI_PASSWORD).",
)
@click.option(
    "--ca-file",
    envvar="SYNNEFO_GANETI_RAPI_CA_FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The cluster's certificate (/var/lib/ganeti/rapi.pem on the master).",
)
@click.option(
    "--fingerprint", envvar="SYNNEFO_GANETI_RAPI_FINGERPRINT", help="Pinned SHA-256 of the certificate."
)
@click.option("--insecure", is_flag=True, help="Do not verify TLS at all (logged as a warning).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=30.0, show_default=True)
@click.option("--max-connections", type=click.IntRange(min=1), default=20, show_default=True)
@click.pass_context
def rapi(
    ctx: click.Context,
    url: str,
    username: str,
    password_file: Path | None,
    ca_file: Path | None,
    fingerprint: str | None,
    insecure: bool,
    timeout: float,
    max_connections: int,
) -> None:
    """Talk to one cluster's RAPI directly (the password never goes on the command line)."""
    ctx.obj = Connection(
        url, username, password_file, ca_file, fingerprint, insecure, timeout, max_connections
    )


def _with_client(ctx: click.Context, call: Callable[[RapiClient], Awaitable[T]]) -> T:
    connection: Connection = ctx.obj

    async def go() -> T:
        async with connection.client() as client:
            return await call(client)

    return run(go())


@rapi.command()
@json_option
@click.pass_context
def info(ctx: click.Context, as_json: bool) -> None:
    """Cluster name, version and capabilities."""
    result = _with_client(ctx, lambda c: c.info())
    if as_json:
        print_json(dump(result))
        return
    table = Table(show_header=False, box=None)
    for key in ("name", "master", "software_version", "default_hypervisor"):
        table.add_row(key, str(getattr(result, key)))
    table.add_row("enabled_hypervisors", ", ".join(result.enabled_hypervisors))
    table.add_row("enabled_disk_templates", ", ".join(result.enabled_disk_templates))
    stdout().print(table)


@rapi.command()
@json_option
@click.pass_context
def nodes(ctx: click.Context, as_json: bool) -> None:
    """Nodes with their free and total capacity."""
    result = _with_client(ctx, lambda c: c.list_nodes())
    if as_json:
        print_json([dump(n) for n in result])
        return
    if not result:
        empty("no nodes")
        return
    table = Table("node", "state", "mem free/total MiB", "disk free/total MiB", "cpus", "instances")
    for n in result:
        state = "offline" if n.offline else "drained" if n.drained else "online"
        table.add_row(
            n.name, state, f"{n.mfree}/{n.mtotal}", f"{n.dfree}/{n.dtotal}", str(n.ctotal), str(n.pinst_cnt)
        )
    stdout().print(table)


@rapi.command()
@json_option
@click.pass_context
def instances(ctx: click.Context, as_json: bool) -> None:
    """Instances with their admin and operational state."""
    result = _with_client(ctx, lambda c: c.list_instances())
    if as_json:
        print_json([dump(i) for i in result])
        return
    if not result:
        empty("no instances")
        return
    table = Table("instance", "status", "admin", "running", "node", "template", "memory")
    for i in sorted(result, key=lambda i: i.name):
        table.add_row(
            i.name, str(i.status), str(i.admin_state), str(i.oper_state), str(i.pnode), str(i.disk_template),
            str(i.beparams.get("maxmem", "")),
        )  # fmt: skip
    stdout().print(table)


def _job_row(job: Job) -> tuple[str, ...]:
    failure = job.failure
    return (
        str(job.id),
        job.status.value,
        ", ".join(job.summary),
        f"{failure.type}: {failure.message}" + (f" ({failure.ecode})" if failure.ecode else "")
        if failure
        else "",
    )


@rapi.command()
@json_option
@click.pass_context
def jobs(ctx: click.Context, as_json: bool) -> None:
    """Unarchived jobs."""
    result = _with_client(ctx, lambda c: c.list_jobs())
    if as_json:
        print_json([dump(j) for j in result])
        return
    if not result:
        empty("no unarchived jobs")
        return
    table = Table("job", "status", "summary", "failure")
    for job in sorted(result, key=lambda j: j.id):
        table.add_row(*_job_row(job))
    stdout().print(table)


@rapi.command()
@click.argument("job_id", type=click.IntRange(min=0))
@click.option("--wait", is_flag=True, help="Wait until the job ends (long-poll).")
@click.option(
    "--timeout", "wait_timeout", type=click.FloatRange(min=0, min_open=True), help="Give up waiting after S."
)
@json_option
@click.pass_context
def job(ctx: click.Context, job_id: int, wait: bool, wait_timeout: float | None, as_json: bool) -> None:
    """Show one job (also archived ones); exit 1 if it failed."""
    if wait:
        result = _with_client(ctx, lambda c: c.wait_for_job(job_id, timeout=wait_timeout))
    else:
        result = _with_client(ctx, lambda c: c.get_job(job_id))
    if as_json:
        print_json(dump(result) | {"failure": dump(result.failure) if result.failure else None})
    else:
        table = Table("job", "status", "summary", "failure")
        table.add_row(*_job_row(result))
        stdout().print(table)
        for entry in result.log:
            stdout().print(f"  {entry.serial:>3} {entry.message}", highlight=False)
    if result.failure is not None:
        raise SystemExit(1)


@rapi.command()
@click.argument("names", nargs=-1, required=True)
@click.option("--os", "os_name", required=True, help="OS provider, e.g. noop or debootstrap+default.")
@click.option("--disk-template", "-t", required=True, help="diskless, file, plain, drbd, ...")
@click.option(
    "--disk", "disks", type=click.IntRange(min=1), multiple=True, help="A disk of SIZE MiB (repeat)."
)
@click.option("--memory", type=click.IntRange(min=1), help="Memory in MiB (beparams memory).")
@click.option("--vcpus", type=click.IntRange(min=1), help="Virtual CPUs.")
@click.option("--pnode", help="Primary node (else --iallocator).")
@click.option("--iallocator", help="Let this allocator place the instances, e.g. hail.")
@click.option("--hypervisor", help="Hypervisor (cluster default if not given).")
@click.option("--tag", "tags", multiple=True, help="Instance tag (repeat).")
@click.option("--no-start", is_flag=True, help="Create the instances stopped.")
@click.option("--dry-run", is_flag=True, help="Ask Ganeti to check, not create.")
@click.option("--wait", is_flag=True, help="Wait until every job ends.")
@json_option
@click.pass_context
def create(
    ctx: click.Context,
    names: tuple[str, ...],
    os_name: str,
    disk_template: str,
    disks: tuple[int, ...],
    memory: int | None,
    vcpus: int | None,
    pnode: str | None,
    iallocator: str | None,
    hypervisor: str | None,
    tags: tuple[str, ...],
    no_start: bool,
    dry_run: bool,
    wait: bool,
    as_json: bool,
) -> None:
    """Submit instance creates, all at once; print their job ids."""
    beparams: dict[str, Any] = {}
    if memory is not None:
        beparams["memory"] = memory
    if vcpus is not None:
        beparams["vcpus"] = vcpus
    try:
        specs = [
            InstanceSpec(
                name=name, os=os_name, disk_template=disk_template, disks=[{"size": s} for s in disks],
                beparams=beparams, pnode=pnode, iallocator=iallocator, hypervisor=hypervisor, tags=list(tags),
                start=not no_start, opportunistic_locking=iallocator is not None and len(names) > 1,
            )
            for name in names
        ]  # fmt: skip
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None

    async def submit(client: RapiClient) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = [{"name": spec.name} for spec in specs]
        with Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=stderr, transient=True, disable=as_json or len(specs) < 2,
        ) as progress:  # fmt: skip
            task = progress.add_task("submitting", total=len(specs))

            def advance(update: CreateProgress) -> None:
                progress.advance(task)

            results = await client.create_instances(specs, dry_run=dry_run, on_progress=advance)
            for row, result in zip(rows, results, strict=True):
                if isinstance(result, int):
                    row["job_id"] = result
                else:
                    row["error"] = str(result)
            if wait:
                progress.reset(task, description="waiting", total=len(specs))
                waiting = [row for row in rows if "job_id" in row]
                progress.advance(task, len(specs) - len(waiting))

                async def wait_one(row: dict[str, Any]) -> None:
                    done = await client.wait_for_job(row["job_id"])
                    row["status"] = done.status.value
                    if done.failure is not None:
                        row["error"] = f"{done.failure.type}: {done.failure.message}"
                        row["ecode"] = done.failure.ecode
                    progress.advance(task)

                async with asyncio.TaskGroup() as group:
                    for row in waiting:
                        group.create_task(wait_one(row))
        return rows

    rows = _with_client(ctx, submit)
    if as_json:
        print_json(rows)
    else:
        table = Table("instance", "job", *(("status",) if wait else ()), "error")
        for row in rows:
            status = (row.get("status", ""),) if wait else ()
            table.add_row(row["name"], str(row.get("job_id", "")), *status, row.get("error", ""))
        stdout().print(table)
    if any("error" in row for row in rows):
        raise SystemExit(1)


@rapi.command()
@click.argument("job_id", type=click.IntRange(min=0))
@json_option
@click.pass_context
def cancel(ctx: click.Context, job_id: int, as_json: bool) -> None:
    """Cancel a job that has not started running."""
    result = _with_client(ctx, lambda c: c.cancel_job(job_id))
    if as_json:
        print_json({"job_id": job_id, "success": result.success, "message": result.message})
    else:
        stdout().print(result.message, highlight=False)
    if not result.success:
        raise SystemExit(1)
