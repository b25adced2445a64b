"""The tests' own support: ``eventually()`` waits for an event and says what it waited for."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tests.helpers import clock_ticks, eventually, eventually_sync, spec


async def test_eventually_returns_the_first_true_value_of_a_sync_or_async_predicate() -> None:
    calls = 0

    def third_time() -> int:
        nonlocal calls
        calls += 1
        return calls if calls >= 3 else 0

    assert await eventually(third_time, interval=0) == 3
    event = asyncio.Event()
    asyncio.get_running_loop().call_soon(event.set)

    async def is_set() -> bool:
        return event.is_set()

    assert await eventually(is_set) is True


async def test_eventually_names_what_it_waited_for() -> None:
    with pytest.raises(AssertionError, match=r"gave up after 0\.05 s waiting for the moon \(last: None\)"):
        await eventually(lambda: None, timeout=0.05, what="the moon")


def test_eventually_sync_waits_for_another_thread() -> None:
    done = threading.Event()
    threading.Timer(0.01, done.set).start()
    assert eventually_sync(done.is_set, what="the timer") is True
    with pytest.raises(AssertionError, match="waiting for nothing"):
        eventually_sync(lambda: False, timeout=0.01, what="nothing")


async def test_clock_ticks_moves_past_now() -> None:
    before = time.time()
    await clock_ticks()
    assert time.time() > before


def test_spec_defaults_and_overrides() -> None:
    small = spec("a")
    assert (small.name, small.disk_template, small.os, small.beparams) == (
        "a",
        "diskless",
        "noop",
        {"memory": 256},
    )
    assert spec("b", memory=128, vcpus=2).beparams == {"memory": 128, "vcpus": 2}
    assert spec("c", memory=128, beparams={"memory": "abc"}).beparams == {"memory": "abc"}
