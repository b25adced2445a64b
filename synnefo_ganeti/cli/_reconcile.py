"""``synnefo-ganeti reconcile``: compare the database with every backend; report and fix drift."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.table import Table

from synnefo_ganeti.cli._main import main
from synnefo_ganeti.cli._options import config_option, json_option, load_settings
from synnefo_ganeti.cli._output import print_json, run, stdout, styled
from synnefo_ganeti.reconcile import NETWORK_FIXES, Fix, NetworkDriftKind, Reconciler, Report

__all__ = ["reconcile"]


_FIX_FLAGS = {
    Fix.STALE: "Mark instances missing from Ganeti DESTROYED.",
    Fix.BUILDING: "Settle instances stuck in BUILD (STARTED/STOPPED as Ganeti runs them, or ERROR).",
    Fix.OPERSTATE: "Take Ganeti's state (STARTED/STOPPED).",
    Fix.FLAVOR: "Record Ganeti's beparams.",
    Fix.NICS: "Record Ganeti's NICs.",
    Fix.DISKS: "Record Ganeti's disks.",
    Fix.TAGS: "Record Ganeti's tags.",
    Fix.JOBS: "Store the final version of jobs the database holds as not final.",
}


_NETWORK_FLAGS = {
    NetworkDriftKind.STALE: "Make again in Ganeti the networks the database holds and Ganeti lost.",
    NetworkDriftKind.OUT_OF_SYNC: "Set Ganeti's network to what the database holds (gateway, MAC prefix, ranges).",
    NetworkDriftKind.NOT_CONNECTED: "Connect networks to the node groups they should be connected to.",
    NetworkDriftKind.PENDING: "Finish networks whose create (or delete) stopped half-way.",
    NetworkDriftKind.ADDRESS_UNRESERVED: "Reserve in Ganeti's pool the addresses stored instances use.",
}
assert set(_NETWORK_FLAGS) == NETWORK_FIXES


def _flag(kind: str) -> str:
    return "fix_" + kind.replace("-", "_")


def _fix_options(func: Any) -> Any:
    flags = [(fix.value, help) for fix, help in _FIX_FLAGS.items()]
    flags += [(kind.value.replace("_", "-"), help) for kind, help in _NETWORK_FLAGS.items()]
    for name, help in reversed(flags):
        func = click.option(f"--fix-{name}", _flag(name), is_flag=True, help=help)(func)
    return func


@main.command()
@config_option
@click.option("--backend", "backends", multiple=True, metavar="NAME", help="Only this backend (repeat).")
@click.option("--fix-all", is_flag=True, help="Every fix below (not --delete-orphans).")
@_fix_options
@click.option(
    "--delete-orphans",
    is_flag=True,
    help="Delete from Ganeti the instances (and networks) that are ours but not in the database.",
)
@json_option
def reconcile(
    config_file: Path,
    backends: tuple[str, ...],
    fix_all: bool,
    delete_orphans: bool,
    as_json: bool,
    **fix_flags: bool,
) -> None:
    """Compare the database with every backend; report what differs, fix what is asked.

    Report-only by default. Exit status: 0 clean, 1 drift found, 2 a backend could not
    be checked (or bad settings).
    """
    settings = load_settings(config_file)
    fixes = set(Fix) if fix_all else {fix for fix in Fix if fix_flags.get(_flag(fix.value))}
    network_fixes = (
        set(NETWORK_FIXES) if fix_all else {k for k in NETWORK_FIXES if fix_flags.get(_flag(k.value))}
    )

    async def go() -> Report:
        async with Reconciler(settings) as reconciler:
            return await reconciler.run_once(
                backends=backends or None,
                fixes=fixes,
                delete_orphans=delete_orphans,
                network_fixes=network_fixes,
            )

    try:
        report = run(go())
    except SystemExit as exc:
        raise SystemExit(2 if exc.code == 1 else exc.code) from None  # the store failed: an error
    if as_json:
        print_json(report.to_json())
    else:
        _print_report(report)
    if not report.ok:
        raise SystemExit(2)
    if not report.clean:
        raise SystemExit(1)


def _print_report(report: Report) -> None:
    console = stdout()
    for backend in report.backends:
        if not backend.ok:
            console.print(styled((f"{backend.name}: not checked", "bold red"), f" {backend.error}"))
            continue
        if not backend.drifts and not backend.networks:
            console.print(styled((f"{backend.name}: clean", "green"), f" ({backend.duration:.2f} s)"))
            continue
        if backend.networks:
            _print_networks(console, backend)
        if not backend.drifts:
            continue
        fixed = sum(drift.fixed for drift in backend.drifts)
        table = Table(
            "kind",
            "instance",
            "detail",
            "fixed",
            title=f"{backend.name}: {len(backend.drifts)} drifts, {fixed} fixed",
            title_justify="left",
        )
        for drift in backend.drifts:
            fixed_text = "yes" if drift.fixed else (f"no: {drift.error}" if drift.error else "no")
            table.add_row(drift.kind.value, drift.instance or "", drift.detail, fixed_text)
        console.print(table)


def _print_networks(console: Any, backend: Any) -> None:
    fixed = sum(drift.fixed for drift in backend.networks)
    table = Table(
        "kind",
        "network",
        "detail",
        "fixed",
        title=f"{backend.name}: {len(backend.networks)} network drifts, {fixed} fixed",
        title_justify="left",
    )
    for drift in backend.networks:
        fixed_text = "yes" if drift.fixed else (f"no: {drift.error}" if drift.error else "no")
        table.add_row(drift.kind.value, drift.network, drift.detail, fixed_text)
    console.print(table)
