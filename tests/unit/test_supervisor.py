"""The daemon's supervisor: a root task that raises, returns or is cancelled by someone else stops
the daemon; stop() cancels the rest, the last started first."""

from __future__ import annotations

import asyncio
import logging

import pytest

from synnefo_ganeti._where import where
from synnefo_ganeti.daemon import RootTaskEnded, Supervisor


async def forever(
    started: asyncio.Event | None = None, order: list[str] | None = None, name: str = ""
) -> None:
    if started is not None:
        started.set()
    try:
        await asyncio.Event().wait()
    finally:
        if order is not None:
            order.append(name)


async def test_a_root_task_that_raises_is_logged_and_ends_the_wait(caplog: pytest.LogCaptureFixture) -> None:
    gate = asyncio.Event()

    async def broken() -> None:
        await gate.wait()
        raise RuntimeError("boom")

    supervisor = Supervisor("test")
    seen: list[tuple[str, BaseException]] = []
    supervisor.on_failure.append(lambda name, exc: seen.append((name, exc)))
    supervisor.start("quiet", forever())
    supervisor.start("broken", broken())
    assert supervisor.healthy and supervisor.problem() is None
    waiting = asyncio.create_task(supervisor.wait(asyncio.Event()))
    with caplog.at_level(logging.ERROR, logger="synnefo_ganeti.daemon"):
        gate.set()
        await asyncio.wait_for(waiting, 10)
    assert not supervisor.healthy
    assert supervisor.failed_task == "broken" and isinstance(supervisor.failed, RuntimeError)
    assert seen and seen[0][0] == "broken"
    assert supervisor.problem() == "broken ended: RuntimeError: boom"
    record = next(r for r in caplog.records if "broken" in r.getMessage())
    assert record.exc_info is not None and record.exc_info[1] is supervisor.failed
    assert supervisor.running == ["quiet"]
    await supervisor.stop(timeout=5)
    assert supervisor.running == [] and supervisor.failed_task == "broken"


@pytest.mark.parametrize("how", ["returns", "cancelled"])
async def test_a_root_task_that_returns_or_is_cancelled_is_a_failure(how: str) -> None:
    supervisor = Supervisor("test")
    started = asyncio.Event()

    async def short() -> int:
        return 3

    if how == "returns":
        supervisor.start("short", short())
    else:
        task = supervisor.start("victim", forever(started))
        await started.wait()
        task.cancel()
    await asyncio.wait_for(supervisor.wait(), 10)
    assert not supervisor.healthy and isinstance(supervisor.failed, RootTaskEnded)
    assert supervisor.failed_task == ("short" if how == "returns" else "victim")


async def test_a_loop_that_returns_once_told_to_stop_is_no_failure(caplog: pytest.LogCaptureFixture) -> None:
    """A daemon tells its loops to stop (a flag) before stop() cancels them: a loop that returns
    then is expected (the dispatcher's submitter did, and the stop was logged as a failure)."""
    supervisor = Supervisor("test")
    told = asyncio.Event()

    async def loop_until_told() -> None:
        await told.wait()

    task = supervisor.start("loop", loop_until_told())
    supervisor.begin_stopping()
    with caplog.at_level(logging.ERROR, logger="synnefo_ganeti.daemon"):
        told.set()
        await asyncio.wait_for(task, 10)
        await supervisor.stop(timeout=5)
    assert supervisor.healthy and supervisor.failed is None and supervisor.stopping
    assert not [r for r in caplog.records if "loop" in r.getMessage()]


async def test_a_loop_that_raises_while_stopping_is_still_a_failure() -> None:
    supervisor = Supervisor("test")
    told = asyncio.Event()

    async def crashes_when_told() -> None:
        await told.wait()
        raise RuntimeError("crashed while stopping")

    task = supervisor.start("late", crashes_when_told())
    supervisor.begin_stopping()
    told.set()
    await asyncio.wait({task}, timeout=10)
    assert not supervisor.healthy and supervisor.failed_task == "late"
    assert isinstance(supervisor.failed, RuntimeError)


async def test_wait_returns_when_stop_is_set_and_stop_goes_in_reverse_order() -> None:
    supervisor = Supervisor("test")
    order: list[str] = []
    started = [asyncio.Event() for _ in range(3)]
    for index, event in enumerate(started):
        supervisor.start(f"t{index}", forever(event, order, f"t{index}"))
    for event in started:
        await event.wait()
    stop = asyncio.Event()
    waiting = asyncio.create_task(supervisor.wait(stop))
    stop.set()
    await asyncio.wait_for(waiting, 10)
    await supervisor.stop(timeout=5)
    assert order == ["t2", "t1", "t0"]
    assert supervisor.healthy and supervisor.failed is None and supervisor.stopping
    with pytest.raises(RuntimeError, match="stopping"):
        supervisor.start("late", forever())


async def test_stop_gives_up_on_a_task_that_ignores_cancellation() -> None:
    supervisor = Supervisor("test")
    release = asyncio.Event()
    started = asyncio.Event()

    async def stubborn() -> None:
        started.set()
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue

    task = supervisor.start("stubborn", stubborn())
    await started.wait()
    await supervisor.stop(timeout=0.05)
    assert not task.done()
    release.set()
    await task
    assert supervisor.healthy  # it returned after stop() was called: expected


async def test_a_detached_task_may_end() -> None:
    supervisor = Supervisor("test")
    gate = asyncio.Event()

    async def ends() -> None:
        await gate.wait()

    task = supervisor.start("backend", ends())
    supervisor.detach(task)
    gate.set()
    await task
    assert supervisor.healthy


async def test_where_names_the_innermost_await_of_a_task() -> None:
    """A stop that overruns says where it hangs: the innermost frame, not the task's outer one."""
    blocker: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def inner_wait() -> None:
        await blocker

    async def outer() -> None:
        await inner_wait()

    task = asyncio.create_task(outer())
    await asyncio.sleep(0)  # the task runs up to its await
    here = where(task)
    assert "in inner_wait, awaiting Future" in here and "via outer" in here, here
    blocker.set_result(None)
    await task
    assert where(task) == "nowhere (the task has ended)"
