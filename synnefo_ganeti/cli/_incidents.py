"""``synnefo-ganeti incidents list``: what the dispatcher found wrong and repaired by policy.

Reads the store's ``incidents`` (written by the dispatcher's ``dispatch repair`` task; see
docs/operations.md, "Repair by policy"), newest first.
"""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from synnefo_ganeti.cli._main import main
from synnefo_ganeti.cli._options import database_options, database_url, json_option, with_store
from synnefo_ganeti.cli._output import empty, print_json, stdout, when
from synnefo_ganeti.store import IncidentStore

__all__ = ["incidents"]


@main.group()
def incidents() -> None:
    """Incidents the dispatcher found (nodes down, instances that should run) and their repairs."""


@incidents.command("list")
@database_options
@click.option("--open", "open_only", is_flag=True, help="Only the incidents still open.")
@click.option("--backend", metavar="NAME", help="Only this backend's incidents.")
@click.option("--limit", type=click.IntRange(min=1), default=200, show_default=True, help="At most N.")
@json_option
def incidents_list(
    config_file: Path | None,
    db_url: str | None,
    open_only: bool,
    backend: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """The incidents, newest first: kind, backend, node, instance, opened, action, job, closed, outcome."""
    url = database_url(config_file, db_url)
    found = with_store(
        url, lambda store: IncidentStore(store).incidents(open_only=open_only, backend=backend, limit=limit)
    )
    if as_json:
        print_json([incident.to_json() for incident in found])
        return
    if not found:
        which = "open incidents" if open_only else "incidents"
        empty(f"no {which} stored" + (f" for backend {backend}" if backend else ""))
        return
    table = Table("id", "kind", "backend", "node", "instance", "opened", "action", "job", "closed", "outcome")
    for i in found:
        table.add_row(
            str(i.id), i.kind, i.backend, i.node or "", i.instance or "", when(i.opened_at),
            i.action or "", "" if i.job_id is None else str(i.job_id), when(i.closed_at),
            i.outcome or ("open" if i.open else ""),
        )  # fmt: skip
    stdout().print(table)
    details = [(i.id, i.detail) for i in found if i.detail]
    for incident_id, detail in details:
        stdout().print(f"{incident_id}: {detail}", highlight=False, markup=False)
