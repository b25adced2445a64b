"""``synnefo-ganeti maintenance plan|run|list|show|cancel``: rolling maintenance of a backend.

``plan`` reads Ganeti and prints the groups of nodes that can go down together (no database
needed). ``run`` needs the ``--config`` file's database (the run's progress is stored there, so
that a run killed resumes): it starts a run with ``--command`` or, without it, resumes the
backend's unfinished one; a progress bar on stderr while stderr is a terminal (never with
``--json``), every step logged (``--log-level``) and in the audit log (via "cli", by
``USER@HOST``). ``list``, ``show`` and ``cancel`` read and end the stored runs.

Exit status: 0 when the run is done, 1 when it failed or was canceled (the error says how to
resume), 1 for a refusal (another run holds the backend; a plan with an instance that would
stop), 2 for a config error.
"""

from __future__ import annotations

import getpass
import socket
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from synnefo_ganeti.allocate import MaintenancePlan
from synnefo_ganeti.cli._main import configure_cli_logging, main
from synnefo_ganeti.cli._options import config_option, existing, json_option, load_settings
from synnefo_ganeti.cli._output import empty, print_json, run, stderr, stdout, when
from synnefo_ganeti.control import ControlPlane
from synnefo_ganeti.control._maintenance import MaintenanceOptions, RollingMaintenance
from synnefo_ganeti.store import Store
from synnefo_ganeti.store.operations._maintenance import MaintenanceRecord

__all__ = ["maintenance"]

T = TypeVar("T")
_DEFAULTS = MaintenanceOptions()


@main.group()
def maintenance() -> None:
    """Rolling maintenance: nodes drained, evacuated, rebooted or upgraded, group after group."""


def _actor() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _with(
    config_file: Path, call: Callable[[RollingMaintenance], Awaitable[T]], *, stale_after: float = 60.0
) -> T:
    settings = load_settings(config_file)

    async def go() -> T:
        async with (
            Store(existing(settings.database.url), create=False) as store,
            ControlPlane(settings, store=store) as cp,
        ):
            return await call(RollingMaintenance(cp, actor=_actor(), via="cli", stale_after=stale_after))

    return run(go())


@maintenance.command("plan")
@click.argument("backend")
@config_option
@json_option
def maintenance_plan(backend: str, config_file: Path, as_json: bool) -> None:
    """The groups of BACKEND's nodes that can go down together, keeping every instance running.

    No two nodes of one instance (primary and secondary) in a group, room left on the other
    nodes for what moves (memory), the master last in a group of its own."""
    settings = load_settings(config_file)

    async def go() -> MaintenancePlan:
        async with Store("sqlite://") as store, ControlPlane(settings, store=store) as cp:
            return await RollingMaintenance(cp, actor=_actor()).plan(backend)

    plan = run(go())
    if as_json:
        print_json({"backend": backend, **plan.to_json()})
    else:
        out = stdout()
        table = Table("group", "nodes", "instances that move")
        for index, group in enumerate(plan.groups, 1):
            moves = ", ".join(f"{m.instance} {m.source}->{m.target}" for m in group.moves) or "none"
            nodes = ", ".join(group.nodes) + (" (master: handed over first)" if group.master else "")
            table.add_row(str(index), nodes, moves)
        out.print(table)
        if plan.skipped:
            out.print(f"left out (offline): {', '.join(plan.skipped)}")
        for problem in plan.problems:
            out.print(f"problem: {problem}")
    if plan.problems:
        raise SystemExit(1)


@maintenance.command("run")
@click.argument("backend")
@click.option("--command", "command", metavar="'CMD {node}'",
              help="The command run for each node, {node} its name (a reboot, an upgrade). Without it, "
              "the backend's unfinished run resumes.")  # fmt: skip
@click.option("--master-failover-command", metavar="'CMD {node}'",
              default=_DEFAULTS.master_failover_command, show_default=True,
              help="Hands the master role to {node} (RAPI has no master failover).")  # fmt: skip
@click.option("--no-master-back", is_flag=True, help="Leave the master role where it went.")
@click.option("--wait-timeout", type=float, default=_DEFAULTS.wait_timeout, show_default=True,
              help="Seconds for Ganeti to read a node again after the command.")  # fmt: skip
@click.option("--command-timeout", type=float, default=_DEFAULTS.command_timeout, show_default=True,
              help="Seconds the command may take.")  # fmt: skip
@click.option("--take-over", is_flag=True,
              help="Resume a run whose process is dead at once (else its heartbeat must be 60 s old).")  # fmt: skip
@config_option
@json_option
def maintenance_run(
    backend: str,
    command: str | None,
    master_failover_command: str,
    no_master_back: bool,
    wait_timeout: float,
    command_timeout: float,
    take_over: bool,
    config_file: Path,
    as_json: bool,
) -> None:
    """Run BACKEND's rolling maintenance, or resume its unfinished run (no --command).

    Per group of the plan: drain its nodes, evacuate them, run the command, wait until Ganeti
    reads each node again, undrain; the master's turn hands its role to a candidate first and
    back after. One run per backend at a time."""
    options = MaintenanceOptions(
        master_failover_command=master_failover_command,
        master_back=not no_master_back,
        wait_timeout=wait_timeout,
        command_timeout=command_timeout,
    )
    root = click.get_current_context().find_root()
    if root.get_parameter_source("log_level") is click.core.ParameterSource.DEFAULT:
        configure_cli_logging("info")  # every step logged, unless --log-level says otherwise

    async def go(maint: RollingMaintenance) -> MaintenanceRecord:
        with Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=stderr, transient=True, disable=as_json or not sys.stderr.isatty(),
        ) as progress:  # fmt: skip
            task = progress.add_task(f"maintenance of {backend}", total=None)

            def advance(done: int, total: int, what: str) -> None:
                progress.update(task, completed=done, total=total, description=f"{backend}: {what}")

            return await maint.run(backend, command, options=options, progress=advance)

    record = _with(config_file, go, stale_after=0.0 if take_over else 60.0)
    _print_run(record, as_json)
    if record.status != "done":
        raise SystemExit(1)


@maintenance.command("list")
@click.option("--backend", metavar="NAME", help="Only this backend's runs.")
@click.option("--limit", type=int, default=20, show_default=True)
@config_option
@json_option
def maintenance_list(backend: str | None, limit: int, config_file: Path, as_json: bool) -> None:
    """The rolling maintenance runs, newest first, with where each is."""
    records = _with(config_file, lambda m: m.runs(backend, limit=limit))
    if as_json:
        print_json([r.to_json() for r in records])
        return
    if not records:
        empty("no maintenance runs stored")
        return
    table = Table("id", "backend", "status", "progress", "at", "started", "by")
    for r in records:
        table.add_row(r.id, r.backend, r.status, f"{r.steps_done}/{r.steps_total}", _where(r),
                      when(r.started_at), r.started_by)  # fmt: skip
    stdout().print(table)


@maintenance.command("show")
@click.argument("run_id")
@config_option
@json_option
def maintenance_show(run_id: str, config_file: Path, as_json: bool) -> None:
    """One run: its plan, where it is, its error."""
    _print_run(_with(config_file, lambda m: m.get(run_id)), as_json)


@maintenance.command("cancel")
@click.argument("backend")
@config_option
@json_option
def maintenance_cancel(backend: str, config_file: Path, as_json: bool) -> None:
    """Cancel BACKEND's unfinished run (a running one stops before its next step).

    Nodes stay as they are: undrain a drained node yourself ('nodes undrain')."""
    _print_run(_with(config_file, lambda m: m.cancel(backend)), as_json)


def _where(record: MaintenanceRecord) -> str:
    pos: dict[str, Any] = record.position
    if record.status == "done":
        return ""
    if pos.get("phase") is None:
        return f"group {int(pos.get('group', 0)) + 1}"
    return f"group {int(pos.get('group', 0)) + 1}: {pos.get('phase')} {pos.get('node')}"


def _print_run(record: MaintenanceRecord, as_json: bool) -> None:
    if as_json:
        print_json(record.to_json())
        return
    out = stdout()
    out.print(f"maintenance run {record.id} of backend {record.backend}: {record.status}, "
              f"{record.steps_done}/{record.steps_total} steps {_where(record)}".rstrip())  # fmt: skip
    out.print(f"command: {record.command}; started {when(record.started_at)} by {record.started_by}")
    groups = MaintenancePlan.from_json(record.plan).groups
    current = int(record.position.get("group", 0))
    for index, group in enumerate(groups):
        state = "done" if index < current or record.status == "done" else "now" if index == current else ""
        out.print(f"  group {index + 1}: {', '.join(group.nodes)}{' (master)' if group.master else ''}"
                  f"{f'  [{state}]' if state else ''}")  # fmt: skip
    if record.error:
        out.print(f"error: {record.error}")
