"""``synnefo-ganeti backends capacity``: how many more instances of each flavor fit, now and keeping N+1.

Every backend is read at once (:meth:`~synnefo_ganeti.ControlPlane.capacity`); the counts follow
Ganeti's ``hspace`` (docs/operations.md, "How much room is left"). Nothing is written: the
control plane runs on an empty database in memory.
"""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from synnefo_ganeti.allocate import Flavor
from synnefo_ganeti.cli._backends import backends
from synnefo_ganeti.cli._options import config_option, json_option, load_settings
from synnefo_ganeti.cli._output import empty, error, fail, print_json, run, stdout, when
from synnefo_ganeti.control import ControlPlane
from synnefo_ganeti.control._capacity import BackendCapacity
from synnefo_ganeti.errors import InvalidError
from synnefo_ganeti.store import Store

__all__ = ["backends"]


def _flavors(values: tuple[str, ...]) -> list[Flavor]:
    try:
        return [Flavor.parse(value) for value in values]
    except InvalidError as exc:
        raise click.BadParameter(str(exc), param_hint="'--flavor'") from None


@backends.command("capacity")
@click.option(
    "--flavor",
    "flavor_texts",
    multiple=True,
    metavar="memory=MiB,vcpus=N,disk=MiB",
    help="A size to count (repeat for more; 4G is 4096 MiB). Default: each backend's standard size "
    "(its instance policy's std).",
)
@click.option("--backend", "names", multiple=True, metavar="NAME", help="Only this backend (repeatable).")
@click.option(
    "--disk-template",
    metavar="TEMPLATE",
    help="The disk template to count for. Default: each backend's first enabled one its policy allows.",
)
@config_option
@json_option
def backends_capacity(
    flavor_texts: tuple[str, ...],
    names: tuple[str, ...],
    disk_template: str | None,
    config_file: Path,
    as_json: bool,
) -> None:
    """How many more instances of each flavor fit on each backend: now, and keeping N+1 (every
    node's primaries able to be re-created on the others of its group), as Ganeti's hspace counts.

    Exit status 1 when a backend does not answer (the others are counted).
    """
    flavors = _flavors(flavor_texts)
    settings = load_settings(config_file)
    if not settings.backends:
        fail(f"config file {config_file} defines no backends", 2)

    async def read() -> list[BackendCapacity]:
        async with Store("sqlite://") as store, ControlPlane(settings, store=store) as cp:
            return await cp.capacity(flavors, backends=names or None, template=disk_template)

    answers = run(read())  # an unknown --backend: "error: unknown backend ...", exit 1
    if as_json:
        print_json({"backends": [answer.to_json() for answer in answers]})
    elif not any(answer.flavors for answer in answers) and not any(answer.error for answer in answers):
        empty("no backends to count")
    else:
        _print_table(answers)
    if any(answer.error for answer in answers):
        raise SystemExit(1)


def _print_table(answers: list[BackendCapacity]) -> None:
    table = Table(
        "backend", "flavor", "template", "fit now", "limited by", "keeping N+1", "limited by", "nodes", "as of",
    )  # fmt: skip
    for answer in answers:
        for count in answer.flavors:
            table.add_row(
                answer.backend, str(count.flavor), count.template, _count(count.now), count.limit_now or "",
                _count(count.n_plus_1), count.limit_n_plus_1 or "", f"{answer.nodes}/{answer.nodes_total}",
                when(answer.read_at),
            )  # fmt: skip
    if table.rows:
        stdout().print(table)
    for answer in answers:
        if answer.error is not None:
            error(f"backend {answer.backend}: {answer.error}")
        for count in answer.flavors:
            if count.note:
                stdout().print(f"{answer.backend}, {count.flavor}: {count.note}")


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)
