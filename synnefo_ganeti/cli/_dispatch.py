"""``synnefo-ganeti dispatcher``, ``submit`` and ``requests list|show|cancel``: durable create requests.

``submit`` only writes requests (one row per spec, through
:meth:`~synnefo_ganeti.ControlPlane.request_instance`) and waits for them to end; the
``dispatcher`` daemon is what places, submits and follows them. Exit statuses:

* ``dispatcher``: 0 after SIGTERM/SIGINT (drained and flushed), 2 when it cannot
  start (settings, database), 1 when it fails later;
* ``submit``: 0 all succeeded (or all written with ``--no-wait``), 1 any failed or
  was canceled, 2 bad specs or settings (nothing written), 3 ``--timeout`` passed;
* ``requests cancel``: 0 canceled (or the cancel is handed to the dispatcher holding
  it), 1 it could not be canceled (it ended already, or its job runs).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import click
import orjson
import yaml
from click.core import ParameterSource
from pydantic import ValidationError
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from synnefo_ganeti.cli._main import _configure_logging, _print_json, _run, _stdout, json_option, main, stderr
from synnefo_ganeti.cli._reconcile import _settings, config_option
from synnefo_ganeti.cli._store import _existing
from synnefo_ganeti.config import Settings
from synnefo_ganeti.control import ControlPlane
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.errors import ConfigError, GanetiError, StoreError
from synnefo_ganeti.rapi import InstanceSpec
from synnefo_ganeti.store import Request, RequestStatus, Store

log = logging.getLogger("synnefo_ganeti.cli")

_STATUSES = [status.value for status in RequestStatus]
_OPEN = [RequestStatus.PENDING, RequestStatus.SUBMITTED]

#: seconds ``submit`` waits for a dispatcher to take one of its requests before it prints a hint
HINT_AFTER = 10.0
#: the longest pause between two looks at the requests while ``submit`` waits
POLL_INTERVAL = 0.5


def _fail(message: str, code: int) -> NoReturn:
    stderr.print(f"[bold red]error:[/] {message}", highlight=False, markup=True)
    raise SystemExit(code)


def _when(moment: Any) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S") if moment is not None else ""


def _request_table(*columns: str) -> Table:
    """A table whose first column, the request id, is never cut: it is what the other commands take."""
    table = Table()
    table.add_column("request", no_wrap=True, min_width=36)
    for column in columns:
        table.add_column(column)
    return table


def _brief(request: Request) -> dict[str, Any]:
    """A request's JSON without its spec (lists, submit)."""
    data = request.to_json()
    data.pop("spec", None)
    return data


# ---------------------------------------------------------------------- dispatcher


@main.command()
@config_option
@click.option(
    "--status-port",
    type=click.IntRange(0, 65535),
    metavar="PORT",
    help="Serve /metrics, /healthz and /readyz here (0: a free port); overrides [dispatcher] status_port.",
)
@click.option("--no-status", is_flag=True, help="No status server at all.")
def dispatcher(config_file: Path, status_port: int | None, no_status: bool) -> None:
    """Run the dispatcher daemon: place, submit and follow durable requests, until SIGTERM/SIGINT.

    SIGHUP re-reads FILE: backends added, changed, drained or removed take effect at
    once; a bad file is logged as an error and the configuration in force stays. Logs
    go to stderr (JSON lines unless on a terminal; --log-level info unless given);
    nothing is printed on stdout. Exit status 0 after a clean stop, 2 when it cannot
    start (bad settings, database unusable), 1 when it fails later.
    """
    root = click.get_current_context().find_root()
    if root.get_parameter_source("log_level") in (ParameterSource.DEFAULT, None):
        _configure_logging("info")  # a daemon tells what it does unless asked otherwise
    settings = _settings(config_file)
    if status_port is not None:
        settings = settings.model_copy(
            update={"dispatcher": settings.dispatcher.model_copy(update={"status_port": status_port})}
        )
    daemon = _Daemon(settings, config_file, status=not no_status)
    try:
        asyncio.run(daemon.serve())
    except (ConfigError, StoreError) as exc:
        _fail(str(exc), 1 if daemon.started else 2)
    except GanetiError as exc:
        _fail(str(exc), 1)
    except KeyboardInterrupt:  # before the signal handlers were installed
        stderr.print("interrupted")
        raise SystemExit(130) from None


@dataclass
class _Daemon:
    settings: Settings
    config_file: Path
    status: bool
    started: bool = False

    async def serve(self) -> None:
        daemon = Dispatcher(
            self.settings, config_path=self.config_file, status_server=self.status, freeze_gc=True
        )
        loop = asyncio.get_running_loop()
        reloads: set[asyncio.Task[None]] = set()

        def stop(name: str) -> None:
            log.info("%s: stopping (drain, flush, exit)", name)
            for task in reloads:  # a reload must not add backends behind the shutdown
                task.cancel()
            daemon.stop()

        def reload() -> None:
            task = loop.create_task(self._reload(daemon), name="dispatch reload")
            reloads.add(task)
            task.add_done_callback(reloads.discard)

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop, sig.name)
        loop.add_signal_handler(signal.SIGHUP, reload)
        ready = asyncio.create_task(self._mark_started(daemon), name="dispatch started")
        try:
            await daemon.run()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)
            ready.cancel()
            for task in list(reloads):
                task.cancel()
            await asyncio.gather(ready, *reloads, return_exceptions=True)

    async def _mark_started(self, daemon: Dispatcher) -> None:
        await daemon.ready.wait()
        self.started = True

    async def _reload(self, daemon: Dispatcher) -> None:
        """SIGHUP: apply the file again; whatever goes wrong is logged, the daemon goes on."""
        await daemon.ready.wait()
        log.info("SIGHUP: reloading %s", self.config_file)
        try:
            await daemon.reload()  # logs what changed ("configuration reloaded: added c")
        except ConfigError as exc:
            log.error("reload failed, the configuration in force stays: %s", exc)
        except GanetiError as exc:
            log.error("reload failed: %s", exc)
        except Exception:  # a daemon does not die of a reload
            log.exception("reload failed")


# ---------------------------------------------------------------------- submit


@dataclass(frozen=True, slots=True)
class _Item:
    spec: InstanceSpec
    backend: str | None


def _read_specs(source: str) -> tuple[str, Any]:
    """(a name for messages, the parsed document) of a JSON or YAML file, or of stdin for ``-``."""
    if source == "-":
        where = "<stdin>"
        text = sys.stdin.read()
    else:
        where = source
        try:
            text = Path(source).read_text()
        except OSError as exc:
            _fail(f"specs file {source}: cannot read it ({exc.strerror})", 2)
    suffix = Path(source).suffix.lower() if source != "-" else ""
    if suffix == ".json" or (suffix not in (".yaml", ".yml") and text.lstrip().startswith(("[", "{"))):
        try:
            return where, orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            if suffix == ".json":
                _fail(f"specs file {where}: not valid JSON ({exc})", 2)
    try:
        return where, yaml.safe_load(text)
    except yaml.YAMLError as exc:
        _fail(f"specs file {where}: neither valid JSON nor valid YAML ({exc})", 2)


def _load_specs(source: str, settings: Settings) -> list[_Item]:
    """Every spec validated before anything is written: one error naming the index and field."""
    where, document = _read_specs(source)
    if isinstance(document, dict):
        document = [document]
    if not isinstance(document, list):
        kind = "nothing" if document is None else type(document).__name__
        _fail(f"specs file {where}: must hold a list of instance specs (or one spec), not {kind}", 2)
    if not document:
        _fail(f"specs file {where}: the list of specs is empty", 2)
    items: list[_Item] = []
    problems: list[str] = []
    seen: dict[str, int] = {}
    for index, entry in enumerate(document):
        problem = None
        if not isinstance(entry, dict):
            problem = f"spec {index}: must be a mapping of instance fields, not {type(entry).__name__}"
        else:
            fields = dict(entry)
            backend = fields.pop("backend", None)
            label = f"spec {index}" + (f" ({fields['name']})" if isinstance(fields.get("name"), str) else "")
            try:
                spec = InstanceSpec.model_validate(fields)
            except ValidationError as exc:
                first = exc.errors()[0]
                field = ".".join(str(part) for part in first["loc"]) or "(the spec)"
                problem = f"{label}: {field}: {first['msg']}"
            else:
                if backend is not None and not isinstance(backend, str):
                    problem = f"{label}: backend: must be a backend name, not {type(backend).__name__}"
                elif backend is not None and backend not in {b.name for b in settings.backends}:
                    known = ", ".join(b.name for b in settings.backends) or "none"
                    problem = f"{label}: backend: unknown backend {backend!r} (the config defines {known})"
                elif spec.name in seen:
                    problem = f"{label}: name: {spec.name} is also the name of spec {seen[spec.name]}"
                else:
                    seen[spec.name] = index
                    items.append(_Item(spec, backend or None))
        if problem is not None:
            problems.append(problem)
    if problems:
        more = f" (and {len(problems) - 1} more bad specs)" if len(problems) > 1 else ""
        _fail(f"specs file {where}: {problems[0]}{more}; nothing was submitted", 2)
    return items


@main.command()
@config_option
@click.argument("specs", metavar="SPECS")
@click.option("--no-wait", is_flag=True, help="Write the requests and return (print their ids).")
@click.option(
    "--timeout",
    "wait_timeout",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="Stop waiting after this long (exit 3; the requests go on).",
)
@json_option
def submit(config_file: Path, specs: str, no_wait: bool, wait_timeout: float | None, as_json: bool) -> None:
    """Write one durable create request per spec in SPECS and wait until they all end.

    SPECS is a JSON or YAML file (- reads stdin) holding a list of instance specs
    (InstanceSpec fields: name, disk_template, os, beparams, disks, nics, tags, start,
    ...) or one spec; a "backend" key pins a spec to that backend. Every spec is
    checked before any is written. The dispatcher daemon ('synnefo-ganeti dispatcher')
    places and submits them.

    Exit status: 0 all succeeded (or, with --no-wait, all written), 1 any failed or was
    canceled, 2 bad specs or settings (nothing written), 3 --timeout passed.
    """
    settings = _settings(config_file)
    items = _load_specs(specs, settings)

    async def run() -> tuple[list[Request], bool]:
        async with ControlPlane(settings) as cp:
            ids = [await cp.request_instance(item.spec, backend=item.backend) for item in items]
            if no_wait:
                return [await cp.get_request(rid) for rid in ids], False
            return await _wait_all(cp, ids, wait_timeout, config_file, quiet=as_json)

    requests, timed_out = _run(run())
    if as_json:
        _print_json([_brief(request) for request in requests])
    else:
        table = _request_table("instance", "status", "backend", "job", "error")
        for request in requests:
            table.add_row(
                request.id, request.instance, request.status.value, request.backend or "",
                "" if request.job_id is None else str(request.job_id), request.error or "",
            )  # fmt: skip
        _stdout().print(table)
    if timed_out:
        unfinished = [r for r in requests if not r.is_final]
        stderr.print(
            f"[bold red]error:[/] {len(unfinished)} of {len(requests)} requests have not ended within "
            f"{wait_timeout:g} s (they go on; 'synnefo-ganeti requests show ID' follows them): "
            + ", ".join(f"{r.id} ({r.instance}, {r.status.value})" for r in unfinished),
            highlight=False,
        )
        raise SystemExit(3)
    if not no_wait and any(r.status is not RequestStatus.SUCCEEDED for r in requests):
        raise SystemExit(1)


async def _wait_all(
    cp: ControlPlane, ids: list[str], timeout: float | None, config_file: Path, *, quiet: bool
) -> tuple[list[Request], bool]:
    """Poll until every request ended (or ``timeout``); (the requests, timed out).

    One query a look finds which requests are still open; those of ours that are not
    are read once more. A hint goes to stderr when no dispatcher takes any of them.
    """
    store = cp.store
    latest = {rid: await cp.get_request(rid) for rid in ids}
    started = time.monotonic()
    deadline = None if timeout is None else started + timeout
    hinted = taken = False
    delay = 0.05
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=stderr, transient=True, disable=quiet,
    ) as progress:  # fmt: skip
        task = progress.add_task("requests ended", total=len(ids))
        while True:
            ended = sum(request.is_final for request in latest.values())
            progress.update(task, completed=ended)
            if ended == len(ids):
                return list(latest.values()), False
            taken = taken or any(
                r.status is not RequestStatus.PENDING or r.claimed_by for r in latest.values()
            )
            now = time.monotonic()
            if not taken and not hinted and now - started >= HINT_AFTER:
                hinted = True
                progress.console.print(
                    f"no dispatcher seems to run: start 'synnefo-ganeti dispatcher --config {config_file}' "
                    "(still waiting)",
                    highlight=False,
                )
            if deadline is not None and now >= deadline:
                return list(latest.values()), True
            pause = delay if deadline is None else min(delay, deadline - now)
            await asyncio.sleep(max(pause, 0.0))
            delay = min(delay * 2, POLL_INTERVAL)
            still_open = {r.id: r for r in await store.list_requests(status=_OPEN)}
            for rid, request in latest.items():
                if request.is_final:
                    continue
                latest[rid] = still_open[rid] if rid in still_open else await cp.get_request(rid)


# ---------------------------------------------------------------------- requests


@main.group()
def requests() -> None:
    """Durable create requests ('submit' writes them, the dispatcher works them off)."""


def _read_store(settings: Settings) -> Store:
    return Store(_existing(settings.database.url), create=False)


@requests.command("list")
@config_option
@click.option(
    "--status", "statuses", multiple=True, type=click.Choice(_STATUSES), help="Only this status (repeat)."
)
@click.option("--backend", metavar="NAME", help="Only the requests placed on this backend.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="At most N.")
@json_option
def requests_list(
    config_file: Path, statuses: tuple[str, ...], backend: str | None, limit: int, as_json: bool
) -> None:
    """The newest requests first (without their specs: 'requests show' has them)."""
    settings = _settings(config_file)

    async def read() -> list[Request]:
        async with _read_store(settings) as store:
            return await store.list_requests(status=statuses or None, backend=backend, limit=limit)

    found = _run(read())
    if as_json:
        _print_json([_brief(request) for request in found])
        return
    table = _request_table("instance", "status", "backend", "job", "attempts", "created", "error")
    for request in found:
        table.add_row(
            request.id, request.instance, request.status.value, request.backend or "",
            "" if request.job_id is None else str(request.job_id), str(request.attempts),
            _when(request.created_at), request.error or "",
        )  # fmt: skip
    _stdout().print(table)
    if not found:
        stderr.print("no requests stored" + (" matching the filters" if statuses or backend else ""))


@requests.command("show")
@click.argument("request_id", metavar="ID")
@config_option
@json_option
def requests_show(request_id: str, config_file: Path, as_json: bool) -> None:
    """One request with every field, its spec included."""
    settings = _settings(config_file)

    async def read() -> Request | None:
        async with _read_store(settings) as store:
            return await store.get_request(request_id)

    request = _run(read())
    if request is None:
        _fail(f"request {request_id} is not in the database; 'synnefo-ganeti requests list' shows them", 1)
    if as_json:
        _print_json(request.to_json())
        return
    out = _stdout()
    out.print(f"request {request.id} ({request.instance}): [bold]{request.status.value}[/]", highlight=False)
    details = Table(show_header=False, box=None)
    for key, value in request.to_json().items():
        if key != "spec":
            details.add_row(key, "" if value is None else str(value))
    out.print(details)
    out.print("spec:", highlight=False)
    out.print(orjson.dumps(request.spec, option=orjson.OPT_INDENT_2).decode(), highlight=False)


@requests.command("cancel")
@click.argument("request_id", metavar="ID")
@config_option
@json_option
def requests_cancel(request_id: str, config_file: Path, as_json: bool) -> None:
    """Cancel a request: before it is submitted, or while its job is still queued.

    Exit status 0 when it is canceled (or the dispatcher holding it is told to stop
    before submitting), 1 when it cannot be: it ended already, or its job runs.
    """
    settings = _settings(config_file)

    async def cancel() -> tuple[Request, str | None]:
        async with ControlPlane(settings) as cp:
            try:
                return await cp.cancel_request(request_id), None
            except StoreError:
                raise
            except GanetiError as exc:
                return await cp.get_request(request_id), str(exc)

    request, reason = _run(cancel())
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
        _print_json({**_brief(request), "outcome": outcome, "reason": reason})
    elif outcome == "not_canceled":
        stderr.print(f"[bold red]error:[/] {text}", highlight=False)
    else:
        _stdout().print(text, highlight=False)
    if outcome == "not_canceled":
        raise SystemExit(1)


__all__ = ["dispatcher", "requests", "submit"]
