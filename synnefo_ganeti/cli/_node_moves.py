"""``synnefo-ganeti nodes evacuate|failover``: moving a node's instances away.

Both run :meth:`~synnefo_ganeti.ControlPlane.evacuate_node` or ``failover_node`` on the
``--config`` file's database (it must exist: what is ours is read there) and print the report: a
table of each instance's move (action, target, job, outcome, error, ours), or ``--json``. A
progress bar on stderr follows the moves while stderr is a terminal (never with ``--json``).
Exit status 1 unless every instance moved (one skipped or failed, a refusal), 2 for a config error.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from synnefo_ganeti.cli._nodes import nodes
from synnefo_ganeti.cli._options import config_option, existing, json_option, load_settings
from synnefo_ganeti.cli._output import print_json, run, stderr, stdout
from synnefo_ganeti.cli._status import audit_cli
from synnefo_ganeti.control import ControlPlane
from synnefo_ganeti.control._node_plan import InstanceMove, NodeMoveReport
from synnefo_ganeti.control._node_plan import Progress as OnProgress
from synnefo_ganeti.errors import GanetiError
from synnefo_ganeti.store import Store

__all__ = ["nodes"]

Move = Callable[[ControlPlane, OnProgress], Awaitable[NodeMoveReport]]


def _run_moves(
    config_file: Path, what: str, move: Move, *, as_json: bool, backend: str, node: str, operation: str
) -> NodeMoveReport:
    settings = load_settings(config_file)
    action = f"node-{operation}"

    async def go() -> NodeMoveReport:
        async with (
            Store(existing(settings.database.url), create=False) as store,
            ControlPlane(settings, store=store) as cp,
        ):
            with Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                console=stderr, transient=True, disable=as_json or not sys.stderr.isatty(),
            ) as progress:  # fmt: skip
                task = progress.add_task(what, total=None)

                def advance(done: int, total: int, moved: InstanceMove | None) -> None:
                    progress.update(task, completed=done, total=total)
                    if moved is not None:
                        progress.update(task, description=f"{what}: {moved.name} {moved.outcome.value}")

                await audit_cli(store, f"{action}-start", backend=backend, target=node)
                try:
                    report = await move(cp, advance)
                except GanetiError as exc:  # refused: in the audit log too
                    await audit_cli(
                        store, action, backend=backend, target=node, outcome="refused", detail=str(exc)
                    )
                    raise
                counts = ", ".join(f"{n} {k}" for k, n in report.counts.items() if n) or "nothing to move"
                outcome = "ok" if report.ok else "failed"
                await audit_cli(store, action, backend=backend, target=node, outcome=outcome, detail=counts)
                return report

    return run(go())


def _print(report: NodeMoveReport, as_json: bool) -> None:
    if as_json:
        print_json(report.to_json())
    else:
        out = stdout()
        counts = ", ".join(f"{n} {outcome}" for outcome, n in report.counts.items())
        marked = "; marked offline" if report.marked_offline else ""
        out.print(f"{report.operation} of node {report.node} of backend {report.backend}: {counts}{marked}")
        if report.moves:
            table = Table("instance", "action", "target", "job", "outcome", "error", "ours")
            for m in report.moves:
                table.add_row(
                    m.name, m.action.value, m.target or "", "" if m.job_id is None else str(m.job_id),
                    m.outcome.value, m.error or "", "yes" if m.owned else "no (moved through RAPI)",
                )  # fmt: skip
            out.print(table)
        else:
            out.print("no primary instances on the node")
    if not report.ok:
        raise SystemExit(1)


@nodes.command("evacuate")
@click.argument("backend")
@click.argument("node")
@click.option(
    "--iallocator",
    metavar="NAME",
    help="Let Ganeti's allocator (e.g. hail) pick each target; else our placement.",
)
@config_option
@json_option
def nodes_evacuate(backend: str, node: str, iallocator: str | None, config_file: Path, as_json: bool) -> None:
    """Move every primary instance off a drained NODE: live-migrate what runs, fail over the rest.

    Drain the node first ('nodes drain BACKEND NODE'). Instances Ganeti cannot move (file, plain)
    are reported skipped; instances that are not ours are moved too and reported so."""
    report = _run_moves(
        config_file,
        f"evacuating {node}",
        lambda cp, advance: cp.evacuate_node(backend, node, iallocator=iallocator, progress=advance),
        as_json=as_json,
        backend=backend,
        node=node,
        operation="evacuate",
    )
    _print(report, as_json)


@nodes.command("failover")
@click.argument("backend")
@click.argument("node")
@click.option(
    "--yes", is_flag=True, help="The node is really dead or fenced: go on even if Ganeti still reaches it."
)
@config_option
@json_option
def nodes_failover(backend: str, node: str, yes: bool, config_file: Path, as_json: bool) -> None:
    """Recover a dead NODE's instances: mark it offline, then fail each over (ignoring consistency).

    Refused while Ganeti still reaches the node, unless --yes: starting its instances elsewhere
    while they still run there runs them twice."""
    report = _run_moves(
        config_file,
        f"failing over {node}",
        lambda cp, advance: cp.failover_node(backend, node, yes=yes, progress=advance),
        as_json=as_json,
        backend=backend,
        node=node,
        operation="failover",
    )
    _print(report, as_json)
