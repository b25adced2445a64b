"""``synnefo-ganeti nodes ...``: the nodes of every backend (list, show, drain, undrain; evacuate and
failover live in ``_node_moves``).

The figures are Ganeti's, read now (their ``read_at`` is printed: "as of"); up, down or offline
and since when are the dispatcher's last reads, from the database when there is one (no database:
those columns stay empty, the rest is printed all the same).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TypeVar

import click
from rich.table import Table

from synnefo_ganeti.allocate._node_info import BackendNodes, NodeInfo
from synnefo_ganeti.cli._main import main
from synnefo_ganeti.cli._options import config_option, existing, json_option, load_settings
from synnefo_ganeti.cli._output import empty, error, print_json, run, stdout, when
from synnefo_ganeti.cli._status import audit_cli
from synnefo_ganeti.config import Settings
from synnefo_ganeti.control import ControlPlane
from synnefo_ganeti.errors import GanetiError
from synnefo_ganeti.store import Store

__all__ = ["nodes"]

T = TypeVar("T")


@main.group()
def nodes() -> None:
    """The nodes of every backend: read them, drain them, move their instances away."""


@asynccontextmanager
async def _control_plane(settings: Settings) -> AsyncIterator[ControlPlane]:
    """A control plane on the settings' database, or on an empty one in memory when that
    database cannot be opened (the nodes are read from Ganeti all the same)."""
    try:
        store = Store(existing(settings.database.url), create=False)
        await store.open()
    except GanetiError:
        store = Store("sqlite://")
        await store.open()
    try:
        async with ControlPlane(settings, store=store) as cp:
            yield cp
    finally:
        await store.close()


def _with_cp(config_file: Path, call: Callable[[ControlPlane], Awaitable[T]]) -> T:
    settings = load_settings(config_file)

    async def go() -> T:
        async with _control_plane(settings) as cp:
            return await call(cp)

    return run(go())


def _mib(used: int | None, total: int | None, free: int | None) -> str:
    if total is None:
        return "?"
    return f"{'?' if used is None else used}/{total} ({'?' if free is None else free} free)"


def _state(node: NodeInfo) -> str:
    """``up since WHEN``, ``down since WHEN``, or ``not read`` (no dispatcher read it)."""
    if node.state is None:
        return "not read"
    return f"{node.state} since {when(node.state_since)}" if node.state_since else node.state


@nodes.command("list")
@click.option("--backend", metavar="NAME", help="Only this backend's nodes.")
@config_option
@json_option
def nodes_list(backend: str | None, config_file: Path, as_json: bool) -> None:
    """Every node of every backend (read at once): role, up or down since when (the dispatcher's
    reads), CPUs, memory and disk used/total (MiB), primary and secondary instances, group.

    Exit status 1 when a backend does not answer (the others are listed).
    """
    listing: list[BackendNodes] = _with_cp(config_file, lambda cp: cp.nodes(backend))
    if as_json:
        print_json({"backends": [b.to_json() for b in listing]})
    elif not any(b.nodes for b in listing) and not any(b.error for b in listing):
        empty("no nodes" + (f" on backend {backend}" if backend else ""))
    else:
        table = Table(
            "backend", "node", "role", "state (dispatcher)", "cpus", "mem used/total MiB", "disk used/total MiB",
            "primaries", "secondaries", "group", "as of",
        )  # fmt: skip
        for answer in listing:
            for node in answer.nodes:
                table.add_row(
                    node.backend, node.name, node.role, _state(node), "?" if node.cpus is None else str(node.cpus),
                    _mib(node.memory_used, node.memory_total, node.memory_free),
                    _mib(node.disk_used, node.disk_total, node.disk_free),
                    str(len(node.primary_instances)), str(len(node.secondary_instances)), node.group or "",
                    when(node.read_at),
                )  # fmt: skip
        if table.rows:
            stdout().print(table)
        for answer in listing:
            if answer.error is not None:
                error(f"backend {answer.backend} did not answer: {answer.error}")
    if any(b.error for b in listing):
        raise SystemExit(1)


def _print_node(node: NodeInfo) -> None:
    out = stdout()
    out.print(f"node {node.name} of backend {node.backend}, as of {when(node.read_at)}")
    detail = f" ({node.state_detail})" if node.state_detail and node.state != "up" else ""
    seen = f", last read {when(node.state_seen_at)}" if node.state_seen_at else ""
    rows = [
        ("role", node.role),
        ("state (dispatcher)", f"{_state(node)}{detail}{seen}"),
        ("group", node.group or ""),
        ("cpus", "?" if node.cpus is None else str(node.cpus)),
        ("memory MiB used/total", _mib(node.memory_used, node.memory_total, node.memory_free)),
        ("disk MiB used/total", _mib(node.disk_used, node.disk_total, node.disk_free)),
        ("primary instances", ", ".join(node.primary_instances) or "none"),
        ("secondary instances", ", ".join(node.secondary_instances) or "none"),
    ]
    for key, value in rows:
        out.print(f"{key}: {value}")


@nodes.command("show")
@click.argument("backend")
@click.argument("node")
@config_option
@json_option
def nodes_show(backend: str, node: str, config_file: Path, as_json: bool) -> None:
    """One node of BACKEND: role, state since when, figures, instances, group."""
    found: NodeInfo = _with_cp(config_file, lambda cp: cp.node(backend, node))
    if as_json:
        print_json(found.to_json())
    else:
        _print_node(found)


def _drain(backend: str, node: str, config_file: Path, as_json: bool, drained: bool) -> None:
    action = "node-drain" if drained else "node-undrain"

    async def call(cp: ControlPlane) -> NodeInfo:
        try:
            found = await (cp.drain_node(backend, node) if drained else cp.undrain_node(backend, node))
        except GanetiError as exc:  # refused: in the audit log too
            await audit_cli(
                cp.store, action, backend=backend, target=node, outcome="refused", detail=str(exc)
            )
            raise
        await audit_cli(cp.store, action, backend=backend, target=node)
        return found

    found = _with_cp(config_file, call)
    if as_json:
        print_json(found.to_json())
    elif drained:
        stdout().print(
            f"node {found.name} of backend {backend} drained: nothing new is placed there "
            "(its instances keep running; 'nodes evacuate' moves them)"
        )
    else:
        stdout().print(f"node {found.name} of backend {backend} undrained: it takes new instances again")


@nodes.command("drain")
@click.argument("backend")
@click.argument("node")
@config_option
@json_option
def nodes_drain(backend: str, node: str, config_file: Path, as_json: bool) -> None:
    """Drain NODE of BACKEND in Ganeti (its job followed to the end): no new instance goes there.

    Ganeti refuses the master (exit 1): hand its role to a candidate first."""
    _drain(backend, node, config_file, as_json, True)


@nodes.command("undrain")
@click.argument("backend")
@click.argument("node")
@config_option
@json_option
def nodes_undrain(backend: str, node: str, config_file: Path, as_json: bool) -> None:
    """Undrain NODE of BACKEND in Ganeti (its job followed to the end): it takes new instances again."""
    _drain(backend, node, config_file, as_json, False)
