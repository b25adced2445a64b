"""``synnefo-ganeti reconcile`` and ``synnefo-ganeti backends list|events|drain|undrain``: the backends."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from synnefo_ganeti.cli._main import _print_json, _run, _stdout, json_option, main, stderr
from synnefo_ganeti.cli._store import _existing
from synnefo_ganeti.config import BackendSettings, Settings
from synnefo_ganeti.errors import GanetiError
from synnefo_ganeti.reconcile import Fix, Reconciler, Report
from synnefo_ganeti.store import Store

config_option = click.option(
    "--config",
    "config_file",
    envvar="SYNNEFO_GANETI_CONFIG",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="The settings file (TOML; else $SYNNEFO_GANETI_CONFIG).",
)


def _settings(path: Path) -> Settings:
    async def load() -> Settings:
        return Settings.from_file(path)

    return _run(load())


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


def _fix_options(func: Any) -> Any:
    for fix in reversed(list(_FIX_FLAGS)):
        func = click.option(f"--fix-{fix.value}", f"fix_{fix.value}", is_flag=True, help=_FIX_FLAGS[fix])(
            func
        )
    return func


@main.command()
@config_option
@click.option("--backend", "backends", multiple=True, metavar="NAME", help="Only this backend (repeat).")
@click.option("--fix-all", is_flag=True, help="Every database-side fix below.")
@_fix_options
@click.option(
    "--delete-orphans",
    is_flag=True,
    help="Delete from Ganeti the instances that are ours but not in the database.",
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
    settings = _settings(config_file)
    fixes = set(Fix) if fix_all else {fix for fix in Fix if fix_flags.get(f"fix_{fix.value}")}

    async def run() -> Report:
        async with Reconciler(settings) as reconciler:
            return await reconciler.run_once(
                backends=backends or None, fixes=fixes, delete_orphans=delete_orphans
            )

    try:
        report = _run(run())
    except SystemExit as exc:
        raise SystemExit(2 if exc.code == 1 else exc.code) from None  # the store failed: an error
    if as_json:
        _print_json(report.to_json())
    else:
        _print_report(report)
    if not report.ok:
        raise SystemExit(2)
    if not report.clean:
        raise SystemExit(1)


def _print_report(report: Report) -> None:
    console = _stdout()
    for backend in report.backends:
        if not backend.ok:
            console.print(f"[bold red]{backend.name}: not checked[/] {backend.error}", highlight=False)
            continue
        if not backend.drifts:
            console.print(f"[green]{backend.name}: clean[/] ({backend.duration:.2f} s)", highlight=False)
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


# ---------------------------------------------------------------------- backends


@main.group()
def backends() -> None:
    """The configured Ganeti backends."""


async def _backend_row(settings: Settings, backend: BackendSettings) -> dict[str, Any]:
    timeout = settings.reconcile_timeout(backend)
    row: dict[str, Any] = {
        "name": backend.name,
        "url": backend.url,
        "drained": backend.drained,
        "ok": False,
        "error": None,
        "version": None,
        "software_version": None,
        "cluster": None,
        "free_memory": None,
        "free_disk": None,
        "nodes": None,
        "instances": None,
        "seconds": None,
        "health": "unknown",
        "health_at": None,
        "health_detail": None,
    }
    started = time.monotonic()
    try:
        async with asyncio.timeout(timeout), backend.rapi_client(timeout=timeout) as client:
            version, info, nodes, instances = await asyncio.gather(
                client.version(), client.info(), client.list_nodes(), client.list_instances()
            )
    except TimeoutError:
        row["error"] = f"backend {backend.name}: no answer within {timeout:g} s (timeout)"
    except (GanetiError, OSError) as exc:
        row["error"] = f"backend {backend.name}: {exc}"
    else:
        online = [node for node in nodes if not node.offline]
        row.update(
            ok=True,
            version=version,
            software_version=info.software_version,
            cluster=info.name,
            free_memory=sum(node.mfree or 0 for node in online),
            free_disk=sum(node.dfree or 0 for node in online),
            nodes=len(nodes),
            instances=len(instances),
        )
    row["seconds"] = round(time.monotonic() - started, 3)
    return row


@backends.command("list")
@config_option
@json_option
def backends_list(config_file: Path, as_json: bool) -> None:
    """Each backend's reachability, version, free memory and disk (MiB) and instance count.

    Exit status 1 when a backend cannot be reached.
    """
    settings = _settings(config_file)
    if not settings.backends:
        stderr.print(f"[bold red]error:[/] config file {config_file} defines no backends", highlight=False)
        raise SystemExit(2)

    async def run() -> list[dict[str, Any]]:
        rows = list(await asyncio.gather(*(_backend_row(settings, b) for b in settings.backends)))
        try:  # drained by an operator, health as the dispatcher saw it: when the database can tell
            async with Store(_existing(settings.database.url), create=False) as store:
                states = await store.backend_states()
        except GanetiError:
            states = {}
        for row in rows:
            state = states.get(row["name"], {})
            row["drained"] = row["drained"] or bool(state.get("drained"))
            health_at = state.get("health_at")
            row.update(
                health=state.get("health") or "unknown",
                health_at=health_at.isoformat() if health_at is not None else None,
                health_detail=state.get("health_detail"),
            )
        return rows

    rows = _run(run())
    if as_json:
        _print_json({"backends": rows})
    else:
        table = Table(
            "backend", "reachable", "version", "cluster", "mem free MiB", "disk free MiB", "instances",
            "health (dispatcher)",
        )  # fmt: skip
        for row in rows:
            health = _health_text(row)
            if row["ok"]:
                version = f"{row['software_version']} (RAPI {row['version']})"
                name = row["name"] + (" (drained)" if row["drained"] else "")
                table.add_row(
                    name, "yes", version, str(row["cluster"]), str(row["free_memory"]), str(row["free_disk"]),
                    str(row["instances"]), health,
                )  # fmt: skip
            else:
                table.add_row(row["name"], f"no: {row['error']}", "", "", "", "", "", health)
        _stdout().print(table)
    if not all(row["ok"] for row in rows):
        raise SystemExit(1)


def _health_text(row: dict[str, Any]) -> str:
    """``up (checked WHEN)``, ``down: WHY (checked WHEN)`` or ``unknown`` (no dispatcher stored it)."""
    health = str(row["health"])
    if health == "unknown" or row["health_at"] is None:
        return "unknown"
    at = datetime.fromisoformat(row["health_at"]).strftime("%Y-%m-%d %H:%M:%S")
    detail = f": {row['health_detail']}" if row["health_detail"] and health != "up" else ""
    return f"{health}{detail} (checked {at})"


@backends.command("events")
@config_option
@click.option("--backend", metavar="NAME", help="Only this backend's events.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="At most N events.")
@json_option
def backends_events(config_file: Path, backend: str | None, limit: int, as_json: bool) -> None:
    """What happened to the backends, newest first: health changes the dispatcher stored."""
    settings = _settings(config_file)

    async def read() -> list[dict[str, Any]]:
        async with Store(_existing(settings.database.url), create=False) as store:
            return await store.backend_events(backend=backend, limit=limit)

    events = [
        {**event, "at": event["at"].isoformat() if event["at"] is not None else None}
        for event in _run(read())
    ]
    if as_json:
        _print_json(events)
        return
    table = Table("when", "backend", "kind", "message")
    for event in events:
        at = datetime.fromisoformat(event["at"]).strftime("%Y-%m-%d %H:%M:%S") if event["at"] else ""
        table.add_row(at, event["backend"], event["kind"], event["message"])
    _stdout().print(table)
    if not events:
        stderr.print("no backend events stored" + (f" for backend {backend}" if backend else ""))


def _drain(config_file: Path, name: str, drained: bool, as_json: bool) -> None:
    settings = _settings(config_file)

    async def run() -> bool:
        settings.backend(name)  # ConfigError (exit 2) for a backend the config does not define
        async with Store(settings.database.url) as store:
            return await store.set_backend_drained(name, drained)

    changed = _run(run())
    state = "drained" if drained else "undrained"
    if as_json:
        _print_json({"backend": name, "drained": drained, "changed": changed})
    elif drained:
        _stdout().print(
            f"backend {name} {'drained' if changed else 'was already drained'}: no new instances go there "
            "(its instances and jobs are untouched)",
            highlight=False,
        )
    else:
        _stdout().print(
            f"backend {name} {state if changed else 'was not drained'}: it takes new instances again",
            highlight=False,
        )


@backends.command("drain")
@click.argument("name")
@config_option
@json_option
def backends_drain(name: str, config_file: Path, as_json: bool) -> None:
    """Take a backend out of placement: no new instances (the database remembers it)."""
    _drain(config_file, name, True, as_json)


@backends.command("undrain")
@click.argument("name")
@config_option
@json_option
def backends_undrain(name: str, config_file: Path, as_json: bool) -> None:
    """Let a drained backend take new instances again."""
    _drain(config_file, name, False, as_json)
