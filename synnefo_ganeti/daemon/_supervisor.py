"""The root tasks of a daemon, supervised: one that ends unexpectedly stops the daemon.

A daemon (the dispatcher, ``synnefo-ganeti watch``) runs a few loops that must run
until it stops: the submitter, the health monitor, the watchdog pings, ... A loop that
raises (any exception, not only a :class:`~synnefo_ganeti.GanetiError`), returns or is
cancelled by someone else while the daemon is not stopping leaves the daemon running
but no longer doing its job. Under a :class:`Supervisor` that end is logged with its
traceback and marks the supervisor unhealthy; :meth:`Supervisor.wait` returns, and the
caller stops the rest (:meth:`Supervisor.stop`) and exits 1::

    supervisor = Supervisor("dispatcher")
    supervisor.start("dispatch submitter", submit_loop())
    supervisor.start("dispatch watchdog", watchdog_loop())
    await supervisor.wait(stop_event)  # SIGTERM, or a root task failed
    await supervisor.stop(timeout=10.0)  # reverse start order: the watchdog first
    raise SystemExit(0 if supervisor.healthy else 1)

Not an :class:`asyncio.TaskGroup`: a task group cancels its tasks all at once and in no
order, while a daemon stops its loops one by one, last started first, so that (say) the
watchdog stops before the loops it vouches for, and it must be told which ends are
expected (a backend removed on reload, :meth:`Supervisor.detach`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from synnefo_ganeti.errors import RootTaskEnded

__all__ = ["Supervisor"]

_log = logging.getLogger("synnefo_ganeti.daemon")

#: what :attr:`Supervisor.on_failure` callbacks are given: the task's name and why it ended
FailureCallback = Callable[[str, BaseException], None]


class Supervisor:
    """Root tasks of one daemon: :meth:`start` them, :meth:`wait`, then :meth:`stop` them.

    ``healthy`` turns False (for good) when a root task ends while the supervisor is not
    stopping it; ``failed`` and ``failed_task`` then say which and why (the first such
    end only). Callbacks in ``on_failure`` are called (synchronously) at that moment, so
    a daemon can stop its watchdog pings or readiness at once, before it begins to stop.
    """

    def __init__(self, name: str, *, logger: logging.Logger | None = None) -> None:
        self.name = name
        self.log = logger or _log
        self.on_failure: list[FailureCallback] = []
        # running root tasks -> their names, in start order
        self._tasks: dict[asyncio.Task[Any], str] = {}
        # tasks stop() cancelled: their end is expected
        self._cancelling: set[asyncio.Task[Any]] = set()
        self._failed: BaseException | None = None
        self._failed_task: str | None = None
        self._stopping = False
        self._ended = asyncio.Event()

    def __repr__(self) -> str:
        state = "healthy" if self.healthy else f"failed in {self._failed_task!r}"
        return f"<Supervisor {self.name} {state}: {', '.join(self.running) or 'no tasks'}>"

    # -- state -----------------------------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        """False once a root task ended unexpectedly (stays False)."""
        return self._failed_task is None

    @property
    def failed(self) -> BaseException | None:
        """The first unexpected end: the exception raised, or a :class:`RootTaskEnded`."""
        return self._failed

    @property
    def failed_task(self) -> str | None:
        """The name of the root task whose end is :attr:`failed`."""
        return self._failed_task

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` was called."""
        return self._stopping

    @property
    def running(self) -> list[str]:
        """The names of the root tasks still running, in start order."""
        return [name for task, name in self._tasks.items() if not task.done()]

    def problem(self) -> str | None:
        """None while healthy, else what ended (a readiness check can return it as it is)."""
        if self._failed_task is None:
            return None
        return f"{self._failed_task} ended: {_describe(self._failed)}"

    # -- tasks -----------------------------------------------------------------------------------

    def start(self, name: str, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` as a root task named ``name``: it must run until :meth:`stop`."""
        if self._stopping:
            coro.close()
            raise RuntimeError(f"{self.name}: cannot start {name!r}, the supervisor is stopping")
        task = asyncio.create_task(coro, name=name)
        self._tasks[task] = name
        task.add_done_callback(self._task_done)
        return task

    def detach(self, task: asyncio.Task[Any]) -> None:
        """No longer supervise ``task``: its end is the caller's business (e.g. a backend removed)."""
        self._tasks.pop(task, None)
        self._cancelling.discard(task)

    async def wait(self, stop: asyncio.Event | None = None) -> None:
        """Return when ``stop`` is set or a root task ended unexpectedly (see :attr:`healthy`)."""
        if not self.healthy or (stop is not None and stop.is_set()):
            return
        waiters = {asyncio.create_task(self._ended.wait(), name=f"{self.name} supervisor wait")}
        if stop is not None:
            waiters.add(asyncio.create_task(stop.wait(), name=f"{self.name} stop wait"))
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)

    def begin_stopping(self) -> None:
        """From now on a root task that ends is expected: the daemon is stopping (its loops may
        return on their own once it told them, before :meth:`stop` cancels what is left)."""
        self._stopping = True

    async def stop(self, timeout: float) -> None:
        """Cancel the root tasks left, the last started first, awaiting each; all within ``timeout``.

        A task still running when the time is up is left cancelled but not awaited (logged).
        """
        self._stopping = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout)
        for task in reversed(list(self._tasks)):
            name = self._tasks.get(task)
            if name is None or task.done():
                continue
            self._cancelling.add(task)
            task.cancel()
            await asyncio.wait({task}, timeout=max(0.0, deadline - loop.time()))
            if not task.done():
                self.log.warning("%s: %s did not stop within %g s; left cancelled", self.name, name, timeout)

    # -- ends ------------------------------------------------------------------------------------

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        name = self._tasks.pop(task, None)
        expected = task in self._cancelling
        self._cancelling.discard(task)
        if name is None:
            return  # detached
        if task.cancelled():
            if expected or self._stopping:
                return
            error: BaseException = RootTaskEnded(f"{name} was cancelled while it should run until stopped")
            self.log.error("%s: root task %s was cancelled; stopping", self.name, name)
        else:
            exc = task.exception()
            if exc is None:
                if expected or self._stopping:
                    return
                error = RootTaskEnded(f"{name} returned while it should run until stopped")
                self.log.error("%s: root task %s returned; stopping", self.name, name)
            else:
                error = exc
                self.log.error(
                    "%s: root task %s failed (%s); stopping",
                    self.name,
                    name,
                    _describe(exc),
                    exc_info=(type(exc), exc, exc.__traceback__),
                )
        if self._failed_task is not None:
            return
        self._failed = error
        self._failed_task = name
        self._ended.set()
        for callback in list(self.on_failure):
            try:
                callback(name, error)
            except Exception:
                self.log.exception("%s: a failure callback failed", self.name)


def _describe(error: BaseException | None) -> str:
    if error is None:
        return "no error"
    if isinstance(error, RootTaskEnded):
        return str(error)
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
