"""Requests waiting for room wait in line (dispatch/_room.py): one is woken per freed place,
the longest waiting first; a stop wakes them all; the backoff stays the longest wait."""

from __future__ import annotations

import asyncio

from synnefo_ganeti.dispatch._room import RoomQueue
from tests.helpers import eventually


async def test_one_waiter_is_woken_per_freed_place_first_come_first_served() -> None:
    room = RoomQueue()
    stop = asyncio.Event()
    woken: list[int] = []

    async def waiter(n: int) -> None:
        await room.wait(60.0, stop)
        woken.append(n)

    tasks = []
    for n in range(5):
        tasks.append(asyncio.create_task(waiter(n)))
        await eventually(lambda n=n: len(room) == n + 1)
    room.free(2)
    await eventually(lambda: len(woken) == 2)
    assert woken == [0, 1] and len(room) == 3
    room.free(1)
    await eventually(lambda: len(woken) == 3)
    assert woken == [0, 1, 2]
    stop.set()  # stopping: everyone leaves the line at once
    await asyncio.gather(*tasks)
    assert sorted(woken) == [0, 1, 2, 3, 4] and len(room) == 0


async def test_a_waiter_whose_wait_ran_out_gives_its_turn_to_the_next() -> None:
    room = RoomQueue()
    stop = asyncio.Event()
    await room.wait(0.01, stop)  # nobody freed anything: back after its backoff
    assert len(room) == 0
    later = asyncio.create_task(room.wait(60.0, stop))
    await eventually(lambda: len(room) == 1)
    room.free(1)  # the one that left is skipped, the one in line is woken
    await asyncio.wait_for(later, 10)
    room.free(3)  # nobody waits: nothing happens
    assert len(room) == 0
