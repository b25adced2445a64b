"""How the commands print: consoles, tables, JSON, errors and exit statuses.

Nothing printed is read as Rich markup or emoji codes: a fingerprint ``...EA:CD:20...``
stays as it is (Rich's emoji codes would make ``:cd:`` a disc), and a ``[`` in an
error message or an instance name is printed, not taken for a style. Styles are given
as :class:`~rich.text.Text` spans instead (:func:`styled`).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable
from datetime import datetime
from typing import Any, NoReturn, TypeVar

import click
import orjson
from rich.console import Console
from rich.text import Text

from synnefo_ganeti.errors import ConfigError, GanetiError

__all__ = [
    "console",
    "dump",
    "empty",
    "error",
    "fail",
    "print_json",
    "run",
    "stderr",
    "stdout",
    "styled",
    "when",
]

T = TypeVar("T")


def console(*, stderr: bool = False) -> Console:
    """A console that prints text as it is: no markup, no emoji codes, no highlighting.

    On stdout it is wide when stdout is no terminal, so piped tables do not wrap.
    """
    width = None if stderr or sys.stdout.isatty() else 200
    return Console(stderr=stderr, soft_wrap=True, width=width, emoji=False, markup=False, highlight=False)


stderr = console(stderr=True)
"""Messages and progress: to stderr (Rich finds the current ``sys.stderr`` each time)."""


def stdout() -> Console:
    """A console on the current stdout (made anew: tests and ``CliRunner`` swap ``sys.stdout``)."""
    return console()


def styled(*parts: str | tuple[str, str]) -> Text:
    """Text from plain strings and ``(text, style)`` pairs; nothing in them is read as markup."""
    return Text.assemble(*parts)


def empty(what: str) -> None:
    """Say that a listing found nothing, on a line of its own (``no jobs stored``)."""
    stdout().print(what)


def when(moment: datetime | None, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    """A time for a table cell (empty when there is none)."""
    return moment.strftime(fmt) if moment is not None else ""


def print_json(value: Any) -> None:
    """``value`` as indented JSON on stdout."""
    click.echo(orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode())


def dump(model: Any) -> Any:
    """A pydantic model as JSON-ready data, by alias."""
    return model.model_dump(mode="json", by_alias=True)


def error(message: str) -> None:
    """``error: MESSAGE`` on stderr."""
    stderr.print(styled(("error:", "bold red"), " ", message))


def fail(message: str, code: int) -> NoReturn:
    """``error: MESSAGE`` on stderr, then exit with ``code``."""
    error(message)
    raise SystemExit(code)


def run(coro: Awaitable[T]) -> T:
    """Run one coroutine; turn library errors into a clear message and an exit status.

    :class:`~synnefo_ganeti.errors.ConfigError`: 2; any other ``GanetiError``: 1;
    Ctrl-C: 130.
    """
    try:
        return asyncio.run(coro)  # type: ignore[arg-type]
    except ConfigError as exc:
        fail(str(exc), 2)
    except GanetiError as exc:
        fail(str(exc), 1)
    except KeyboardInterrupt:
        stderr.print("interrupted")
        raise SystemExit(130) from None
