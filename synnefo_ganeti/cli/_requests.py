"""``synnefo-ganeti requests list|show|cancel``: the durable create requests.

``requests cancel`` exits 0 when the request is canceled (or the cancel is handed to
the dispatcher holding it), 1 when it cannot be (it ended already, or its job runs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import orjson
from rich.table import Table

from synnefo_ganeti.cli._main import main
from synnefo_ganeti.cli._options import (
    config_option,
    database_options,
    database_url,
    json_option,
    load_settings,
    with_store,
)
from synnefo_ganeti.cli._output import empty, error, fail, print_json, run, stdout, styled, when
from synnefo_ganeti.control import ControlPlane
from synnefo_ganeti.errors import GanetiError, NotFoundError, StoreError
from synnefo_ganeti.store import Request, RequestStatus, Store

__all__ = ["brief", "request_table", "requests"]

_STATUSES = [status.value for status in RequestStatus]


def request_table(*columns: str) -> Table:
    """A table whose first column, the request id, is never cut: it is what the other commands take."""
    table = Table()
    table.add_column("request", no_wrap=True, min_width=36)
    for column in columns:
        table.add_column(column)
    return table


def brief(request: Request) -> dict[str, Any]:
    """A request's JSON without its spec (lists, submit)."""
    data = request.to_json()
    data.pop("spec", None)
    return data


@main.group()
def requests() -> None:
    """Durable create requests ('submit' writes them, the dispatcher works them off)."""


@requests.command("list")
@database_options
@click.option(
    "--status", "statuses", multiple=True, type=click.Choice(_STATUSES), help="Only this status (repeat)."
)
@click.option("--backend", metavar="NAME", help="Only the requests placed on this backend.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="At most N.")
@json_option
def requests_list(
    config_file: Path | None,
    db_url: str | None,
    statuses: tuple[str, ...],
    backend: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """The newest requests first (without their specs: 'requests show' has them); why the
    pending ones no backend takes now wait, in a "waiting" column when any does."""
    url = database_url(config_file, db_url)
    found = with_store(
        url, lambda store: store.list_requests(status=statuses or None, backend=backend, limit=limit)
    )
    if as_json:
        print_json([brief(request) for request in found])
        return
    if not found:
        empty("no requests stored" + (" matching the filters" if statuses or backend else ""))
        return
    # why those not placed wait (Request.waiting_reason): a column of its own when any does
    waits = any(request.waiting_reason for request in found)
    columns = ["instance", "status", "backend", "job", "attempts", "created", "error"]
    table = request_table(*columns, *(["waiting"] if waits else []))
    for request in found:
        table.add_row(
            request.id, request.instance, request.status.value, request.backend or "",
            "" if request.job_id is None else str(request.job_id), str(request.attempts),
            when(request.created_at), request.error or "",
            *([request.waiting_reason or ""] if waits else []),
        )  # fmt: skip
    stdout().print(table)


@requests.command("show")
@click.argument("request_id", metavar="ID")
@database_options
@json_option
def requests_show(request_id: str, config_file: Path | None, db_url: str | None, as_json: bool) -> None:
    """One request with every field, its spec included."""
    url = database_url(config_file, db_url)

    async def read(store: Store) -> Request | None:
        try:
            return await store.get_request(request_id)
        except NotFoundError:
            return None

    request = with_store(url, read)
    if request is None:
        fail(f"request {request_id} is not in the database; 'synnefo-ganeti requests list' shows them", 1)
    if as_json:
        print_json(request.to_json())
        return
    out = stdout()
    out.print(styled(f"request {request.id} ({request.instance}): ", (request.status.value, "bold")))
    details = Table(show_header=False, box=None)
    for key, value in request.to_json().items():
        if key != "spec":
            details.add_row(key, "" if value is None else str(value))
    out.print(details)
    out.print("spec:")
    out.print(orjson.dumps(request.spec, option=orjson.OPT_INDENT_2).decode())


@requests.command("cancel")
@click.argument("request_id", metavar="ID")
@config_option
@json_option
def requests_cancel(request_id: str, config_file: Path, as_json: bool) -> None:
    """Cancel a request: before it is submitted, or while its job is still queued.

    Exit status 0 when it is canceled (or the dispatcher holding it is told to stop
    before submitting), 1 when it cannot be: it ended already, or its job runs.
    """
    settings = load_settings(config_file)

    async def cancel() -> tuple[Request, str | None]:
        async with ControlPlane(settings) as cp:
            try:
                return await cp.cancel_request(request_id), None
            except (StoreError, NotFoundError):
                raise
            except GanetiError as exc:
                return await cp.get_request(request_id), str(exc)

    request, reason = run(cancel())
    if reason is None and request.status is RequestStatus.CANCELED:
        outcome, text = "canceled", f"request {request.id} ({request.instance}) is canceled"
    elif reason is None and not request.is_final and request.cancel_requested:
        outcome, text = (
            "cancel_requested",
            f"request {request.id} ({request.instance}) is held by a dispatcher: it is told to stop "
            "before submitting ('requests show' tells when it is canceled)",
        )
    else:
        outcome = "not_canceled"
        reason = reason or f"it ended already ({request.status.value})"
        text = f"request {request.id} ({request.instance}) could not be canceled: {reason}"
    if as_json:
        print_json({**brief(request), "outcome": outcome, "reason": reason})
    elif outcome == "not_canceled":
        error(text)
    else:
        stdout().print(text)
    if outcome == "not_canceled":
        raise SystemExit(1)
