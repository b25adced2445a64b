"""``synnefo-ganeti submit``: write durable create requests from a specs file and wait for them.

``submit`` only writes requests (one row per spec, through
:meth:`~synnefo_ganeti.ControlPlane.request_instance`) and waits for them to end; the
``dispatcher`` daemon is what places, submits and follows them. Exit status 0 all
succeeded (or all written with ``--no-wait``), 1 any failed or was canceled, 2 bad
specs or settings (nothing written), 3 ``--timeout`` passed.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import orjson
import yaml
from pydantic import ValidationError
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from synnefo_ganeti.cli._main import main
from synnefo_ganeti.cli._options import config_option, json_option, load_settings
from synnefo_ganeti.cli._output import error, fail, print_json, run, stderr, stdout
from synnefo_ganeti.cli._requests import brief, request_table
from synnefo_ganeti.config import Settings
from synnefo_ganeti.control import ControlPlane
from synnefo_ganeti.rapi import InstanceSpec
from synnefo_ganeti.store import Request, RequestStatus

__all__ = ["submit"]

_OPEN = [RequestStatus.PENDING, RequestStatus.SUBMITTED]

#: seconds ``submit`` waits for a dispatcher to take one of its requests before it prints a hint
HINT_AFTER = 10.0
#: the longest pause between two looks at the requests while ``submit`` waits
POLL_INTERVAL = 0.5


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
            fail(f"specs file {source}: cannot read it ({exc.strerror})", 2)
    suffix = Path(source).suffix.lower() if source != "-" else ""
    if suffix == ".json" or (suffix not in (".yaml", ".yml") and text.lstrip().startswith(("[", "{"))):
        try:
            return where, orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            if suffix == ".json":
                fail(f"specs file {where}: not valid JSON ({exc})", 2)
    try:
        return where, yaml.safe_load(text)
    except yaml.YAMLError as exc:
        fail(f"specs file {where}: neither valid JSON nor valid YAML ({exc})", 2)


def _load_specs(source: str, settings: Settings) -> list[_Item]:
    """Every spec validated before anything is written: one error naming the index and field."""
    where, document = _read_specs(source)
    if isinstance(document, dict):
        document = [document]
    if not isinstance(document, list):
        kind = "nothing" if document is None else type(document).__name__
        fail(f"specs file {where}: must hold a list of instance specs (or one spec), not {kind}", 2)
    if not document:
        fail(f"specs file {where}: the list of specs is empty", 2)
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
        fail(f"specs file {where}: {problems[0]}{more}; nothing was submitted", 2)
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
    settings = load_settings(config_file)
    items = _load_specs(specs, settings)

    async def go() -> tuple[list[Request], bool]:
        async with ControlPlane(settings) as cp:
            ids = [await cp.request_instance(item.spec, backend=item.backend) for item in items]
            if no_wait:
                return [await cp.get_request(rid) for rid in ids], False
            return await _wait_all(cp, ids, wait_timeout, config_file, quiet=as_json)

    requests, timed_out = run(go())
    if as_json:
        print_json([brief(request) for request in requests])
    else:
        table = request_table("instance", "status", "backend", "job", "error")
        for request in requests:
            table.add_row(
                request.id, request.instance, request.status.value, request.backend or "",
                "" if request.job_id is None else str(request.job_id), request.error or "",
            )  # fmt: skip
        stdout().print(table)
    if timed_out:
        unfinished = [r for r in requests if not r.is_final]
        error(
            f"{len(unfinished)} of {len(requests)} requests have not ended within "
            f"{wait_timeout:g} s (they go on; 'synnefo-ganeti requests show ID' follows them): "
            + ", ".join(f"{r.id} ({r.instance}, {r.status.value})" for r in unfinished)
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
                    "(still waiting)"
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
