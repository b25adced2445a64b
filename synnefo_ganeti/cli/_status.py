"""``synnefo-ganeti dispatchers`` and ``synnefo-ganeti audit``: what the database says of the
dispatchers (their own reports, ``dispatch/_report.py``) and of the operators' actions.

:func:`audit_cli` writes a CLI action to the audit log (who: ``USER@HOST`` of the shell, via
"cli"); the commands that act on Ganeti (``nodes drain``, ``nodes evacuate``, ...) call it.
"""

from __future__ import annotations

import getpass
import logging
import socket
from datetime import UTC, datetime
from pathlib import Path

import click
from rich.table import Table

from synnefo_ganeti.cli._main import main
from synnefo_ganeti.cli._options import database_options, database_url, json_option, with_store
from synnefo_ganeti.cli._output import empty, print_json, stdout, when
from synnefo_ganeti.errors import GanetiError
from synnefo_ganeti.store import AuditRecord, DispatcherReport, StatusStore, Store

__all__ = ["audit", "audit_cli", "cli_actor", "dispatchers"]

log = logging.getLogger("synnefo_ganeti.cli")


def cli_actor() -> str:
    """Who runs this command: ``USER@HOST``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


async def audit_cli(
    store: Store,
    action: str,
    *,
    backend: str | None = None,
    target: str | None = None,
    job_id: int | None = None,
    outcome: str = "ok",
    detail: str | None = None,
) -> None:
    """Write a CLI action to the audit log; a database that cannot take it is logged, not fatal
    (the action is done: failing the command now would lie about it)."""
    try:
        await StatusStore(store).audit(
            cli_actor(),
            action,
            via="cli",
            backend=backend,
            target=target,
            job_id=job_id,
            outcome=outcome,
            detail=detail,
        )
    except GanetiError as exc:
        log.warning("could not write %s to the audit log (%s)", action, exc)


@main.command("dispatchers")
@database_options
@json_option
def dispatchers(config_file: Path | None, db_url: str | None, as_json: bool) -> None:
    """The dispatchers as they last reported themselves: alive or not, root tasks, claims, and per
    backend creates in flight and requests open. Exit status 1 when none is alive."""
    url = database_url(config_file, db_url)
    found: list[DispatcherReport] = with_store(url, lambda store: StatusStore(store).dispatchers())
    now = datetime.now(UTC)
    alive = [d for d in found if d.alive(now)]
    if as_json:
        print_json([d.to_json(now) for d in found])
    elif not found:
        empty("no dispatcher has reported to this database (is 'synnefo-ganeti dispatcher' running?)")
    else:
        table = Table("dispatcher", "host", "pid", "state", "reported", "tasks", "claims", "backends")
        for d in found:
            if d.alive(now):
                state = "alive" if d.healthy else f"failing: {d.state.get('problem') or ''}"
            elif d.stopped_at is not None:
                state = f"stopped {when(d.stopped_at)}"
            else:
                state = "silent (not alive)"
            backends = d.state.get("backends") or {}
            per = ", ".join(
                f"{name}: {b.get('in_flight', 0)} in flight, {b.get('pending', 0)} pending"
                for name, b in sorted(backends.items())
            )
            table.add_row(
                d.id,
                d.host,
                str(d.pid),
                state,
                when(d.heartbeat_at),
                str(len(d.state.get("tasks") or [])),
                str(d.state.get("claims", "")),
                per,
            )
        stdout().print(table)
    if not alive:
        raise SystemExit(1)


@main.command("audit")
@database_options
@click.option("--backend", metavar="NAME", help="Only actions on this backend.")
@click.option("--actor", metavar="WHO", help="Only this operator's actions (a console user, USER@HOST).")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="At most N actions.")
@json_option
def audit(
    config_file: Path | None,
    db_url: str | None,
    backend: str | None,
    actor: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """The operators' actions, newest first: who, how, what, on what, which job, how it ended."""
    url = database_url(config_file, db_url)
    found: list[AuditRecord] = with_store(
        url, lambda store: StatusStore(store).audit_log(limit=limit, backend=backend, actor=actor)
    )
    if as_json:
        print_json([entry.to_json() for entry in found])
        return
    if not found:
        empty("no operator action stored" + (" matching the filters" if backend or actor else ""))
        return
    table = Table("when", "who", "via", "action", "backend", "target", "job", "outcome", "detail")
    for entry in found:
        table.add_row(
            when(entry.at),
            entry.actor,
            entry.via,
            entry.action,
            entry.backend or "",
            entry.target or "",
            "" if entry.job_id is None else str(entry.job_id),
            entry.outcome,
            entry.detail or "",
        )
    stdout().print(table)
