"""Where a task is suspended: its innermost awaiting frame, for logs about a stop that hangs."""

from __future__ import annotations

import asyncio
from types import CoroutineType, FrameType, GeneratorType
from typing import Any

__all__ = ["where"]


def where(task: asyncio.Task[Any]) -> str:
    """``file:line in function`` of the innermost coroutine ``task`` waits in, or what it awaits.

    ``Task.get_stack()`` gives only the outermost coroutine's frame; this follows the chain
    of ``await`` down to the frame that is really waiting (a future, a lock, a thread).
    """
    awaited: Any = task.get_coro()
    frame: FrameType | None = None
    chain: list[str] = []
    seen = 0
    while awaited is not None and seen < 100:
        seen += 1
        if isinstance(awaited, CoroutineType):
            frame, awaited = awaited.cr_frame, awaited.cr_await
            if frame is not None:
                chain.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
        elif isinstance(awaited, GeneratorType):
            frame, awaited = awaited.gi_frame, awaited.gi_yieldfrom
        else:
            if frame is None:
                return repr(awaited)
            break
    if frame is None:
        return "nowhere (the task has ended)" if task.done() else "an unknown place"
    code = frame.f_code
    here = f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"
    if awaited is not None:
        here += f", awaiting {type(awaited).__name__}"
    if len(chain) > 1:
        here += f" (via {' > '.join(chain[:-1])})"
    return here
