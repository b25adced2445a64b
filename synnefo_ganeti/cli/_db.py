"""``synnefo-ganeti db upgrade|prune``: create, upgrade and prune the database."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import click

from synnefo_ganeti.cli._main import main
from synnefo_ganeti.cli._options import database_options, database_url, json_option, with_store
from synnefo_ganeti.cli._output import print_json, run, stdout
from synnefo_ganeti.store import head_revision, upgrade_database

__all__ = ["db", "parse_duration"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_PART = r"(\d+(?:\.\d+)?)\s*([smhdw])"


def parse_duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w`` (or combined: ``1d12h``)."""
    parts = re.findall(_PART, text.strip().lower())
    if not parts or re.sub(_PART, "", text.strip().lower()).strip():
        raise click.BadParameter(f"{text!r} is not a duration; write it like 30d, 12h, 90m or 1w")
    return timedelta(seconds=sum(float(number) * _UNITS[unit] for number, unit in parts))


class _Duration(click.ParamType):  # type: ignore[type-arg]
    name = "DURATION"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> timedelta:
        if isinstance(value, timedelta):
            return value
        try:
            return parse_duration(str(value))
        except click.BadParameter as exc:
            self.fail(exc.message, param, ctx)


def _human(span: timedelta) -> str:
    seconds = span.total_seconds()
    for unit, size in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)} {unit}"
    return f"{seconds:g} seconds"


@main.group()
def db() -> None:
    """Create, upgrade and prune the database."""


@db.command("upgrade")
@database_options
@json_option
def db_upgrade(config_file: Path | None, db_url: str | None, as_json: bool) -> None:
    """Create the tables, or bring them to this version's schema (safe to run again)."""
    url = database_url(config_file, db_url)

    async def go() -> dict[str, Any]:
        database, before, after = await upgrade_database(url)
        return {"database": database, "from": before, "to": after, "head": head_revision()}

    result = run(go())
    if as_json:
        print_json(result)
    elif result["from"] == result["to"]:
        stdout().print(f"{result['database']} is at the latest revision ({result['to']})")
    else:
        stdout().print(f"{result['database']} upgraded from {result['from'] or 'empty'} to {result['to']}")


@db.command("prune")
@database_options
@click.option(
    "--older-than",
    type=_Duration(),
    required=True,
    help="Age, like 30d, 12h or 2w: jobs that ended before then go, with their events.",
)
@json_option
def db_prune(config_file: Path | None, db_url: str | None, older_than: timedelta, as_json: bool) -> None:
    """Delete the events and the jobs that ended longer ago than --older-than.

    Unfinished jobs, their events and anything younger stay.
    """
    url = database_url(config_file, db_url)
    result = with_store(url, lambda store: store.prune(older_than))
    if as_json:
        print_json({"events": result.events, "jobs": result.jobs, "older_than_s": older_than.total_seconds()})
    else:
        stdout().print(
            f"deleted {result.events} events and {result.jobs} jobs that ended more than {_human(older_than)} ago"
        )
