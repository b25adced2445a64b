"""Backend health: probes on an interval, down after K failures, up again after M successes.

Each probe asks a backend's RAPI for ``/version`` and ``/2/info`` within a short
timeout. :class:`HealthTracker` is the pure state machine; :class:`HealthMonitor`
probes every backend at once on an interval, logs each change, calls the
``on_change`` listeners (the dispatcher takes a down backend out of placement and
stores an event) and POSTs the change to an optional webhook. A webhook that fails is
logged, never raised: health checks must not depend on the receiver.

Several dispatchers probe each backend once: the one that probes stores its verdicts, and
the others take them (:meth:`HealthMonitor.adopt`; a change so taken is ``shared``, announced
to the listeners but not posted again) and probe only the backends they must
(:meth:`HealthMonitor.run_once` with ``names``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from synnefo_ganeti._serial import to_jsonable
from synnefo_ganeti.errors import GanetiError
from synnefo_ganeti.rapi import RapiClient

__all__ = ["HealthChange", "HealthMonitor", "HealthState", "HealthTracker"]

log = logging.getLogger("synnefo_ganeti.health")


@dataclass(slots=True)
class HealthState:
    """What is known of one backend's health."""

    name: str
    up: bool = True
    failures: int = 0  # in a row
    successes: int = 0  # in a row
    last_error: str | None = None
    last_checked: float | None = None  # time.time()
    changed_at: float | None = None
    version: int | None = None
    cluster: str | None = None

    def to_json(self) -> dict[str, Any]:
        result: dict[str, Any] = to_jsonable(self)
        return result


@dataclass(frozen=True, slots=True)
class HealthChange:
    """A backend went down or came back up (``shared``: another process's probes found it)."""

    backend: str
    up: bool
    error: str | None
    at: float = field(default_factory=time.time)
    shared: bool = False

    def to_json(self) -> dict[str, Any]:
        result: dict[str, Any] = to_jsonable(
            {
                "backend": self.backend,
                "state": "up" if self.up else "down",
                "error": self.error,
                "at": self.at,
            }
        )
        return result


class HealthTracker:
    """Down after ``fail_after`` failed probes in a row; up after ``recover_after`` good ones."""

    def __init__(self, *, fail_after: int = 3, recover_after: int = 2) -> None:
        if fail_after < 1 or recover_after < 1:
            raise ValueError("fail_after and recover_after must be at least 1")
        self.fail_after = fail_after
        self.recover_after = recover_after
        self.states: dict[str, HealthState] = {}

    def state(self, name: str) -> HealthState:
        state = self.states.get(name)
        if state is None:
            state = self.states[name] = HealthState(name)
        return state

    def is_up(self, name: str) -> bool:
        return self.state(name).up

    def record(
        self, name: str, ok: bool, error: str | None = None, *, now: float | None = None
    ) -> HealthChange | None:
        """One probe's outcome; the change it causes, if any."""
        state = self.state(name)
        now = time.time() if now is None else now
        state.last_checked = now
        if ok:
            state.successes += 1
            state.failures = 0
            state.last_error = None
            if not state.up and state.successes >= self.recover_after:
                state.up = True
                state.changed_at = now
                return HealthChange(name, True, None, now)
            return None
        state.failures += 1
        state.successes = 0
        state.last_error = error
        if state.up and state.failures >= self.fail_after:
            state.up = False
            state.changed_at = now
            return HealthChange(name, False, error, now)
        return None


class HealthMonitor:
    """Probes every backend (name -> open :class:`RapiClient`) every ``interval`` seconds."""

    def __init__(
        self,
        clients: Mapping[str, RapiClient],
        *,
        interval: float = 10.0,
        timeout: float = 5.0,
        fail_after: int = 3,
        recover_after: int = 2,
        webhook: str | None = None,
    ) -> None:
        self.clients = dict(clients)
        self.interval = interval
        self.timeout = timeout
        self.webhook = webhook
        self.tracker = HealthTracker(fail_after=fail_after, recover_after=recover_after)
        #: called with each change (sync or async callables)
        self.on_change: list[Callable[[HealthChange], Awaitable[None] | None]] = []
        for name in self.clients:
            self.tracker.state(name)

    def __repr__(self) -> str:
        down = [name for name, state in self.tracker.states.items() if not state.up]
        return f"<HealthMonitor {len(self.clients)} backends, down: {down or 'none'}>"

    async def probe(self, name: str) -> HealthChange | None:
        """One probe of one backend: ``/version`` and ``/2/info`` within ``timeout``."""
        client = self.clients[name]
        state = self.tracker.state(name)
        try:
            async with asyncio.timeout(self.timeout):
                version, info = await asyncio.gather(client.version(), client.info())
        except TimeoutError:
            change = self.tracker.record(name, False, f"no answer within {self.timeout:g} s")
        except GanetiError as exc:
            change = self.tracker.record(name, False, str(exc))
        else:
            state.version, state.cluster = version, info.name
            change = self.tracker.record(name, True)
        if change is not None:
            await self._announce(change)
        return change

    async def run_once(self, names: Iterable[str] | None = None) -> list[HealthChange]:
        """Probe every backend (or those of ``names``) at once; the changes."""
        chosen = self.clients if names is None else [name for name in names if name in self.clients]
        changes = await asyncio.gather(*(self.probe(name) for name in chosen))
        return [change for change in changes if change is not None]

    async def adopt(
        self, name: str, up: bool, error: str | None = None, *, checked_at: float | None = None
    ) -> HealthChange | None:
        """The verdict another process's probes reached on ``name`` (read from the database),
        taken as is; the change it makes here, announced (``shared``: not posted again)."""
        state = self.tracker.state(name)
        state.last_checked = time.time() if checked_at is None else checked_at
        state.last_error = error
        state.failures = state.successes = 0
        if state.up == up:
            return None
        state.up = up
        state.changed_at = time.time()
        change = HealthChange(name, up, error, state.changed_at, shared=True)
        await self._announce(change)
        return change

    async def run_forever(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        while not stop.is_set():
            started = time.monotonic()
            await self.run_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, self.interval - (time.monotonic() - started)))

    async def _announce(self, change: HealthChange) -> None:
        whose = " (another dispatcher's probes)" if change.shared else ""
        if change.up:
            log.warning("backend %s is up again%s", change.backend, whose)
        else:
            log.error("backend %s is down%s: %s", change.backend, whose, change.error)
        for listener in self.on_change:
            try:
                result = listener(change)
                if result is not None:
                    await result
            except Exception:
                log.exception("a health listener failed on %s", change)
        if self.webhook and not change.shared:  # a shared change was posted by its prober
            await self._post(change)

    async def _post(self, change: HealthChange) -> None:
        assert self.webhook is not None
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout)) as session,
                session.post(
                    self.webhook,
                    data=orjson.dumps(change.to_json()),
                    headers={"Content-Type": "application/json"},
                ) as response,
            ):
                if response.status >= 400:
                    log.warning("health webhook answered HTTP %s for %s", response.status, change.backend)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.warning("health webhook failed for %s: %s", change.backend, exc or type(exc).__name__)
