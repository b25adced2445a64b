"""``synnefo-ganeti instances list|show``: instances as the database holds them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.table import Table

from synnefo_ganeti.cli._main import _print_json, _run, _stdout, json_option, main, stderr
from synnefo_ganeti.cli._reconcile import _settings, config_option
from synnefo_ganeti.store import InstanceStatus, Store, StoredInstance

_STATUSES = [status.value for status in InstanceStatus]


@main.group()
def instances() -> None:
    """Instances as the database holds them (their state follows job events)."""


@instances.command("list")
@config_option
@click.option("--backend", help="Only this backend's instances.")
@click.option(
    "--status", "statuses", multiple=True, type=click.Choice(_STATUSES), help="Only this status (repeat)."
)
@json_option
def instances_list(config_file: Path, backend: str | None, statuses: tuple[str, ...], as_json: bool) -> None:
    """Every instance, ordered by backend and name."""
    settings = _settings(config_file)

    async def read() -> list[StoredInstance]:
        async with Store(settings.database.url, create=False) as store:
            return await store.list_instances(backend=backend, status=statuses or None)

    found = _run(read())
    if as_json:
        _print_json([instance.to_json() for instance in found])
        return
    table = Table("backend", "name", "status", "memory", "vcpus", "tags", "create job")
    for instance in found:
        beparams = instance.beparams or {}
        table.add_row(
            instance.backend,
            instance.name,
            instance.status.value,
            str(beparams.get("maxmem", "")),
            str(beparams.get("vcpus", "")),
            ", ".join(instance.tags or []),
            "" if instance.create_job_id is None else str(instance.create_job_id),
        )
    _stdout().print(table)
    if not found:
        stderr.print("no instances stored" + (" matching the filters" if backend or statuses else ""))


@instances.command("show")
@click.argument("backend")
@click.argument("name")
@config_option
@json_option
def instances_show(backend: str, name: str, config_file: Path, as_json: bool) -> None:
    """One instance with the jobs recorded for it."""
    settings = _settings(config_file)

    async def read() -> tuple[StoredInstance | None, list[dict[str, Any]]]:
        async with Store(settings.database.url, create=False) as store:
            instance = await store.get_instance(backend, name)
            return instance, (await store.instance_jobs(backend, name) if instance else [])

    instance, jobs = _run(read())
    if instance is None:
        stderr.print(
            f"[bold red]error:[/] instance {name} of backend {backend!r} is not in the database",
            highlight=False,
        )
        raise SystemExit(1)
    recorded = [
        {
            "job_id": job["job_id"],
            "action": job["action"],
            "result": job["result"],
            "recorded_at": job["recorded_at"].isoformat() if job["recorded_at"] else None,
            "applied_at": job["applied_at"].isoformat() if job["applied_at"] else None,
        }
        for job in jobs
    ]
    if as_json:
        _print_json({**instance.to_json(), "jobs": recorded})
        return
    out = _stdout()
    out.print(f"{instance.name} on {instance.backend}: [bold]{instance.status.value}[/]", highlight=False)
    details = Table(show_header=False, box=None)
    for key in ("os", "disk_template", "beparams", "nics", "disks", "tags"):
        details.add_row(key, str(getattr(instance, key)))
    out.print(details)
    table = Table("job", "action", "result", "recorded", "applied")
    for job in recorded:
        table.add_row(
            str(job["job_id"]),
            job["action"],
            job["result"] or "",
            job["recorded_at"] or "",
            job["applied_at"] or "",
        )
    out.print(table)
