"""The daemon's event loop: uvloop's where it is installed, asyncio's otherwise (``[dispatcher] event_loop``).

uvloop (libuv, in C; asyncpg's authors') runs the same coroutines with the same API; it is an
optional extra of the package (``pip install 'synnefo-ganeti[uvloop]'``), as uvicorn has it.
``auto`` (the default) takes uvloop when it can be imported and asyncio's loop otherwise;
``uvloop`` insists on it (an error that says how to install it when it cannot be imported);
``asyncio`` is the standard library's loop, always.

What it does, measured with ``benchmarks/burst.py --dispatcher-loop`` (docs/benchmarks.md,
2026-12-01, seventeenth session): the CPU a request is the same within the runs' noise (the
time asyncio's loop spends is mostly the system calls any loop makes); with two dispatchers the
p99 of a job's end to the change feed was lower in 10 of 13 pairs of runs (389 -> 323 ms, mean),
not in a second comparison against the code before. The whole fast test suite passes on both
loops (tox's py312-fast env runs it on uvloop).

Only the daemons' own entry points choose a loop: a cloud API that embeds the library runs it on
whatever loop it runs itself.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from synnefo_ganeti.config import EventLoop
from synnefo_ganeti.errors import ConfigError

__all__ = ["loop_factory", "loop_name", "run_daemon"]

T = TypeVar("T")

LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def _uvloop() -> Any | None:
    try:
        return importlib.import_module("uvloop")
    except ImportError:
        return None


def loop_factory(choice: EventLoop) -> LoopFactory:
    """What makes the event loop ``choice`` names (see the module's docstring)."""
    if choice == "asyncio":
        return asyncio.new_event_loop
    uvloop = _uvloop()
    if uvloop is not None:
        factory: LoopFactory = uvloop.new_event_loop
        return factory
    if choice == "auto":
        return asyncio.new_event_loop
    if choice == "uvloop":
        raise ConfigError(
            "[dispatcher] event_loop = 'uvloop', but uvloop cannot be imported: install it "
            "(pip install 'synnefo-ganeti[uvloop]', or pip install uvloop) or set event_loop to "
            "'auto' or 'asyncio'"
        )
    raise ConfigError(f"[dispatcher] event_loop = {choice!r}: use 'auto', 'uvloop' or 'asyncio'")


def run_daemon(main: Coroutine[Any, Any, T], choice: EventLoop) -> T:
    """``asyncio.run(main)`` on the event loop ``choice`` names."""
    try:
        factory = loop_factory(choice)
    except ConfigError:
        main.close()  # (never awaited: no warning about it)
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def loop_name(loop: asyncio.AbstractEventLoop | None = None) -> str:
    """The running (or given) loop, as a log line tells it: ``uvloop 0.21.0`` or ``asyncio``."""
    loop = loop or asyncio.get_running_loop()
    module = type(loop).__module__.split(".")[0]
    if module == "uvloop":
        uvloop = _uvloop()
        return f"uvloop {getattr(uvloop, '__version__', '')}".strip()
    return "asyncio" if module == "asyncio" else module
