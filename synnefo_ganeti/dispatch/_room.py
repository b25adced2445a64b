"""Requests waiting for room: woken first come, first served, one per place a job's end frees.

A request that finds no room on any backend used to sleep its backoff (up to 10 s) while
others' creates ended; now it waits in line and the submitter wakes one waiter for each
create that ended (the allocator gave its place back), so a place is taken again at once, by
the request that waited longest. The backoff stays the longest wait (room may also come from
fresh node stats, which wake nobody).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Any

__all__ = ["RoomQueue"]


class RoomQueue:
    def __init__(self) -> None:
        self._waiters: deque[asyncio.Future[None]] = deque()

    def __len__(self) -> int:
        return sum(1 for waiter in self._waiters if not waiter.done())

    async def wait(self, timeout: float, stop: asyncio.Event) -> None:
        """Until a place is freed for this waiter, ``timeout`` passes, or ``stop`` is set."""
        if stop.is_set():
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        stopping: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
        either: set[asyncio.Future[Any]] = {waiter, stopping}
        try:
            await asyncio.wait(either, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stopping
            if not waiter.done():
                waiter.cancel()  # (left in line: skipped when its turn comes)

    def free(self, places: int) -> None:
        """Wake the ``places`` longest waiting."""
        while places > 0 and self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                places -= 1
