"""``synnefo-ganeti backends list|show|events|drain|undrain``: the configured Ganeti backends."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from synnefo_ganeti._serial import iso
from synnefo_ganeti.allocate import BackendCatalog
from synnefo_ganeti.cli._main import main
from synnefo_ganeti.cli._options import (
    config_option,
    database_options,
    database_url,
    existing,
    json_option,
    load_settings,
    with_store,
)
from synnefo_ganeti.cli._output import empty, fail, print_json, run, stdout
from synnefo_ganeti.config import BackendSettings, Settings
from synnefo_ganeti.control import ControlPlane
from synnefo_ganeti.errors import GanetiError
from synnefo_ganeti.store import Store

__all__ = ["backends"]


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
    settings = load_settings(config_file)
    if not settings.backends:
        fail(f"config file {config_file} defines no backends", 2)

    async def read() -> list[dict[str, Any]]:
        rows = list(await asyncio.gather(*(_backend_row(settings, b) for b in settings.backends)))
        try:  # drained by an operator, health as the dispatcher saw it: when the database can tell
            async with Store(existing(settings.database.url), create=False) as store:
                states = await store.backend_states()
        except GanetiError:
            states = {}
        for row in rows:
            state = states.get(row["name"], {})
            row["drained"] = row["drained"] or bool(state.get("drained"))
            health_at = state.get("health_at")
            row.update(
                health=state.get("health") or "unknown",
                health_at=iso(health_at),
                health_detail=state.get("health_detail"),
            )
        return rows

    rows = run(read())
    if as_json:
        print_json({"backends": rows})
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
        stdout().print(table)
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


async def _show(settings: Settings, name: str) -> dict[str, Any]:
    """The backend's row for ``show``: health, drained and its nodes as the dispatcher saw them
    (up, down or offline, since when, the first sign) from the database (when it can tell), the
    catalog read now (its error, if it could not be read)."""
    backend = settings.backend(name)  # ConfigError (exit 2) for a name the config does not define
    timeout = settings.reconcile_timeout(backend)
    row: dict[str, Any] = {
        "name": name, "url": backend.url, "drained": backend.drained, "reachable": False, "error": None,
        "health": "unknown", "health_at": None, "health_detail": None, "nodes": [], "catalog": None,
    }  # fmt: skip
    try:
        store = Store(existing(settings.database.url), create=False)
        await store.open()
    except GanetiError:
        store = Store("sqlite://")  # no database to tell health and drain: the catalog alone
        await store.open()
    try:
        state = (await store.backend_states()).get(name, {})
        row["drained"] = row["drained"] or bool(state.get("drained"))
        row.update(
            health=state.get("health") or "unknown",
            health_at=iso(state.get("health_at")),
            health_detail=state.get("health_detail"),
        )
        nodes = (await store.backend_nodes(name)).get(name, [])
        row["nodes"] = [
            {**node, "since": iso(node["since"]), "seen_at": iso(node["seen_at"])} for node in nodes
        ]
        async with (
            backend.rapi_client(timeout=timeout) as client,
            ControlPlane(settings, store=store, clients={name: client}) as cp,
        ):
            async with asyncio.timeout(timeout):
                row["catalog"] = await cp.catalog(name)
        row["reachable"] = True
    except TimeoutError:
        row["error"] = f"backend {name}: no answer within {timeout:g} s (timeout)"
    except (GanetiError, OSError) as exc:
        row["error"] = f"backend {name}: {exc}"
    finally:
        await store.close()
    return row


@backends.command("show")
@click.argument("name")
@config_option
@json_option
def backends_show(name: str, config_file: Path, as_json: bool) -> None:
    """One backend: its health and drain, its nodes, and what it offers (OSes with variants,
    disk templates, instance policy, node groups, networks), read now.

    Exit status 1 when the backend cannot be reached.
    """
    settings = load_settings(config_file)
    row = run(_show(settings, name))
    catalog: BackendCatalog | None = row["catalog"]
    if as_json:
        version = None if catalog is None else catalog.ganeti_version
        print_json(
            {**row, "ganeti_version": version, "catalog": None if catalog is None else catalog.to_json()}
        )
    else:
        _print_show(row, catalog)
    if catalog is None:
        raise SystemExit(1)


def _print_show(row: dict[str, Any], catalog: BackendCatalog | None) -> None:
    out = stdout()
    drained = "yes" if row["drained"] else "no"
    out.print(f"backend {row['name']} ({row['url']}): drained {drained}, health {_health_text(row)}")
    for node in row["nodes"]:  # as the dispatcher last read them: those out of placement
        if node["state"] != "up":
            since = datetime.fromisoformat(node["since"]).strftime("%Y-%m-%d %H:%M:%S")
            why = f": {node['detail']}" if node["detail"] else ""
            out.print(f"node {node['name']} is {node['state']} since {since} (out of placement){why}")
    if catalog is None:
        out.print(f"not reachable: {row['error']}")
        return
    ganeti = f"Ganeti {catalog.ganeti_version}" if catalog.ganeti_version else "Ganeti version not told"
    out.print(
        f"cluster {catalog.cluster} ({ganeti}), read {catalog.read_at:%Y-%m-%d %H:%M:%S}: "
        f"{catalog.memory_free} MiB memory and {catalog.disk_free} MiB disk free on usable nodes"
    )
    nodes = Table("node", "group", "state", "mem free/total MiB", "disk free/total MiB", "cpus", "instances")
    for node in catalog.nodes:
        state = (
            "offline"
            if node.offline
            else "drained"
            if node.drained
            else "ok"
            if node.vm_capable
            else "no VMs"
        )
        nodes.add_row(
            node.name, node.group or "", state, f"{_num(node.memory_free)}/{_num(node.memory_total)}",
            f"{_num(node.disk_free)}/{_num(node.disk_total)}", _num(node.cpus), _num(node.instances),
        )  # fmt: skip
    out.print(nodes)
    oses = "any (the backend does not list them)" if catalog.oses is None else ", ".join(
        f"{os.name} ({', '.join(os.variants)})" if os.variants else os.name for os in catalog.oses
    )  # fmt: skip
    out.print(f"OSes: {oses or 'none'}")
    out.print(f"disk templates: {', '.join(catalog.disk_templates) or 'none'}")
    policy = Table("instance policy", "min", "max", "std")
    std = catalog.policy.std or {}
    for index, pair in enumerate(catalog.policy.minmax):
        for key in sorted(set(pair["min"]) | set(pair["max"])):
            label = key if len(catalog.policy.minmax) == 1 else f"{key} (pair {index})"
            policy.add_row(label, _num(pair["min"].get(key)), _num(pair["max"].get(key)), _num(std.get(key)))
    out.print(policy)
    groups = Table("node group", "alloc policy", "nodes", "networks")
    for group in catalog.groups:
        groups.add_row(
            group.name, group.alloc_policy or "", ", ".join(group.nodes), ", ".join(group.networks)
        )
    out.print(groups)
    if not catalog.networks:
        empty("no networks")
        return
    networks = Table("network", "subnet", "gateway", "free addresses", "groups (mode, link)")
    for net in catalog.networks:
        links = ", ".join(f"{link.group} ({link.mode}, {link.link})" for link in net.groups)
        networks.add_row(net.name, net.subnet or "", net.gateway or "", _num(net.free_count), links)
    out.print(networks)


def _num(value: int | float | None) -> str:
    return "" if value is None else str(value)


@backends.command("events")
@database_options
@click.option("--backend", metavar="NAME", help="Only this backend's events.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="At most N events.")
@json_option
def backends_events(
    config_file: Path | None, db_url: str | None, backend: str | None, limit: int, as_json: bool
) -> None:
    """What happened to the backends, newest first: health changes the dispatcher stored."""
    url = database_url(config_file, db_url)
    found = with_store(url, lambda store: store.backend_events(backend=backend, limit=limit))
    events = [{**event, "at": iso(event["at"])} for event in found]
    if as_json:
        print_json(events)
        return
    if not events:
        empty("no backend events stored" + (f" for backend {backend}" if backend else ""))
        return
    table = Table("when", "backend", "kind", "message")
    for event in events:
        at = datetime.fromisoformat(event["at"]).strftime("%Y-%m-%d %H:%M:%S") if event["at"] else ""
        table.add_row(at, event["backend"], event["kind"], event["message"])
    stdout().print(table)


def _drain(config_file: Path, name: str, drained: bool, as_json: bool) -> None:
    settings = load_settings(config_file)

    async def go() -> bool:
        settings.backend(name)  # ConfigError (exit 2) for a backend the config does not define
        async with Store(settings.database.url) as store:
            return await store.set_backend_drained(name, drained)

    changed = run(go())
    state = "drained" if drained else "undrained"
    if as_json:
        print_json({"backend": name, "drained": drained, "changed": changed})
    elif drained:
        stdout().print(
            f"backend {name} {'drained' if changed else 'was already drained'}: no new instances go there "
            "(its instances and jobs are untouched)"
        )
    else:
        stdout().print(
            f"backend {name} {state if changed else 'was not drained'}: it takes new instances again"
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
