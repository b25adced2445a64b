"""``synnefo-ganeti instances list|show``: instances as the database holds them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.table import Table

from synnefo_ganeti._serial import iso
from synnefo_ganeti.cli._main import main
from synnefo_ganeti.cli._options import database_options, database_url, json_option, with_store
from synnefo_ganeti.cli._output import empty, fail, print_json, stdout, styled
from synnefo_ganeti.store import InstanceStatus, Store, StoredInstance

__all__ = ["instances"]

_STATUSES = [status.value for status in InstanceStatus]


@main.group()
def instances() -> None:
    """Instances as the database holds them (their state follows job events)."""


@instances.command("list")
@database_options
@click.option("--backend", help="Only this backend's instances.")
@click.option(
    "--status", "statuses", multiple=True, type=click.Choice(_STATUSES), help="Only this status (repeat)."
)
@json_option
def instances_list(
    config_file: Path | None,
    db_url: str | None,
    backend: str | None,
    statuses: tuple[str, ...],
    as_json: bool,
) -> None:
    """Every instance, ordered by backend and name."""
    url = database_url(config_file, db_url)
    found = with_store(url, lambda store: store.list_instances(backend=backend, status=statuses or None))
    if as_json:
        print_json([instance.to_json() for instance in found])
        return
    if not found:
        empty("no instances stored" + (" matching the filters" if backend or statuses else ""))
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
    stdout().print(table)


@instances.command("show")
@click.argument("backend")
@click.argument("name")
@database_options
@json_option
def instances_show(
    backend: str, name: str, config_file: Path | None, db_url: str | None, as_json: bool
) -> None:
    """One instance with the jobs recorded for it."""
    url = database_url(config_file, db_url)

    async def read(store: Store) -> tuple[StoredInstance | None, list[dict[str, Any]]]:
        instance = await store.get_instance(backend, name)
        return instance, (await store.instance_jobs(backend, name) if instance else [])

    instance, jobs = with_store(url, read)
    if instance is None:
        fail(f"instance {name} of backend {backend!r} is not in the database", 1)
    recorded = [
        {
            "job_id": job["job_id"],
            "action": job["action"],
            "result": job["result"],
            "recorded_at": iso(job["recorded_at"]),
            "applied_at": iso(job["applied_at"]),
        }
        for job in jobs
    ]
    if as_json:
        print_json({**instance.to_json(), "jobs": recorded})
        return
    out = stdout()
    out.print(styled(f"{instance.name} on {instance.backend}: ", (instance.status.value, "bold")))
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
