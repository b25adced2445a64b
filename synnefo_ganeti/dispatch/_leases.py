"""Several dispatchers on one PostgreSQL database share the work: who follows which backend.

Design. Each backend's recorded jobs are followed by one dispatcher at a time, the holder of
the backend's **follow lease**: the session advisory lock ``follow:BACKEND``, taken with
``pg_try_advisory_lock`` on the dispatcher's liveness connection
(:class:`~synnefo_ganeti.dispatch._liveness.DispatcherLock`). The lock goes with the session, so
the leases of a dispatcher that dies (or loses its connection) are free at once, and another
takes them at its next round, every :data:`LEASE_RETRY` seconds.

Who should hold what is decided in pure code (:func:`owners`) from the live dispatchers: those
whose report (table ``dispatchers``, ``dispatch/_report.py``) is recent and whose liveness lock
is held (:meth:`~synnefo_ganeti.dispatch._liveness.DispatcherLock.is_alive`: a killed one is
out at once), each with the backends it serves. The backends, sorted, are dealt round the
dispatchers that serve them, sorted by id: two dispatchers and four backends hold two each.
Each round a dispatcher takes the leases it should hold, gives back the ones it should not
(after the owner is seen alive: the owner takes it at its next round), and takes any lease
seen free two rounds in a row, whoever should hold it (views of the live set that differ for
a moment never leave a backend unfollowed for long). A lease gained makes the caller read the
backend's unapplied jobs at once (``on_gained``).

What the holder does besides (see ``_wiring``, ``_node_watch`` and ``_stats``): it reads the
backend's nodes every ``health_interval`` and writes their states (``backend_nodes``), probes its
health and stores the verdict, and reads its whole node stats and stores them
(``backend_stats``); the others take all three from the database while fresh. Each dispatcher still follows the creates it submits itself
(its ``/wait`` on them is how it learns at once that one ended, for its placement accounting).

SQLite runs one dispatcher per database: it holds every lease, always.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping

from synnefo_ganeti.dispatch._liveness import DispatcherLock
from synnefo_ganeti.errors import GanetiError
from synnefo_ganeti.store import StatusStore

__all__ = ["LEASES_TASK", "LEASE_RETRY", "FollowLeases", "owners"]

log = logging.getLogger("synnefo_ganeti.dispatch")

#: the root task's name (PostgreSQL)
LEASES_TASK = "dispatch follow leases"
#: seconds between two rounds of lease taking (so a dead holder's backends are followed again
#: within this, plus one read of the recorded jobs)
LEASE_RETRY = 2.0


def owners(serving: Mapping[str, Iterable[str]]) -> dict[str, str]:
    """Backend -> the dispatcher that should hold its lease, given each live dispatcher's backends
    (``serving``: dispatcher id -> backend names). Pure: every dispatcher computes the same."""
    servers: dict[str, list[str]] = {}
    for dispatcher, backends in serving.items():
        for backend in backends:
            servers.setdefault(backend, []).append(dispatcher)
    owned: dict[str, str] = {}
    load: dict[str, int] = dict.fromkeys(serving, 0)
    for backend in sorted(servers):
        # the least loaded of its servers (ties: the lowest id): dealt round, evenly
        chosen = min(sorted(servers[backend]), key=lambda d: load[d])
        owned[backend] = chosen
        load[chosen] += 1
    return owned


class FollowLeases:
    """The follow leases one dispatcher holds (see the module)."""

    def __init__(
        self,
        lock: DispatcherLock,
        backends: Callable[[], Iterable[str]],
        *,
        on_gained: Callable[[set[str]], Awaitable[object]] | None = None,
        on_round: Callable[[], object] | None = None,
        retry: float = LEASE_RETRY,
    ) -> None:
        self.lock = lock
        self.backends = backends
        self.on_gained = on_gained
        #: called after every round, before ``on_gained`` (what this dispatcher holds may have changed)
        self.on_round = on_round
        self.retry = retry
        self.shared = lock.store.dialect == "postgresql"
        self.held: set[str] = set()
        #: the live dispatchers at the last round (id -> the backends it serves), this one included
        self.live: dict[str, set[str]] = {}
        self.rounds = 0
        self._claiming = 1
        self._free_before: set[str] = set()
        self._generation = lock.generation
        self._status = StatusStore(lock.store)

    def __repr__(self) -> str:
        held = ", ".join(sorted(self.held)) or "none"
        return f"<FollowLeases {self.lock.id}: holds {held}; {max(1, len(self.live))} live dispatchers>"

    def holds(self, backend: str) -> bool:
        """Whether this dispatcher follows ``backend``'s recorded jobs (and reads its nodes) now."""
        return not self.shared or backend in self.held

    def claimers(self) -> int:
        """How many live dispatchers take new claims now, this one included (1 on SQLite)."""
        return self._claiming if self.shared else 1

    def live_count(self) -> int:
        """How many dispatchers run now, this one included (1 on SQLite)."""
        return max(1, len(self.live)) if self.shared else 1

    async def run(self) -> None:
        """The root task: a round now, then every ``retry`` seconds (a round the database cannot
        answer is tried again at the next)."""
        while True:
            try:
                await self.round()
            except GanetiError as exc:
                log.warning("follow leases: %s; trying again in %g s", exc, self.retry)
            await asyncio.sleep(self.retry)

    async def round(self) -> set[str]:
        """Take and give back leases (see the module); the backends gained."""
        mine = set(self.backends())
        if not self.shared:
            gained = mine - self.held
            self.held = mine
            self.live = {self.lock.id: mine}
        else:
            gained = await self._shared_round(mine)
        self.rounds += 1
        if self.on_round is not None:
            self.on_round()
        if gained and self.on_gained is not None:
            await self.on_gained(gained)
        return gained

    async def _shared_round(self, mine: set[str]) -> set[str]:
        if self.lock.generation != self._generation:  # a new session: its locks are gone
            self._generation = self.lock.generation
            if self.held:
                log.warning(
                    "follow leases of %s lost with its database session", ", ".join(sorted(self.held))
                )
            self.held = set()
        self.live = await self._live(mine)
        owned = owners(self.live)
        for backend in sorted(self.held - mine):  # no longer configured here
            await self._give_back(backend)
        for backend in sorted(self.held):
            owner = owned.get(backend)
            if owner is not None and owner != self.lock.id:
                await self._give_back(backend)  # its owner takes it at its next round
        gained: set[str] = set()
        free: set[str] = set()
        for backend in sorted(mine - self.held):
            should = owned.get(backend) == self.lock.id
            if not should and backend not in self._free_before:
                if await self._is_free(backend):
                    free.add(backend)
                continue
            if await self.lock.try_lease(backend):
                self.held.add(backend)
                gained.add(backend)
        self._free_before = free
        if gained:
            log.info("dispatcher %s follows %s now", self.lock.id, ", ".join(sorted(gained)))
        return gained

    async def _live(self, mine: set[str]) -> dict[str, set[str]]:
        """The live dispatchers and their backends: a recent report and a held liveness lock."""
        live = {self.lock.id: mine}
        claiming = 1
        for report in await self._status.dispatchers():
            if report.id == self.lock.id or not report.alive():
                continue
            if await self.lock.is_alive(report.id):
                live[report.id] = set(report.state.get("backends") or ())
                claiming += report.state.get("claiming") is not False
        self._claiming = claiming
        return live

    async def _is_free(self, backend: str) -> bool:
        """Nobody holds ``backend``'s lease (taken and given back at once to tell)."""
        if await self.lock.try_lease(backend):
            await self.lock.release_lease(backend)
            return True
        return False

    async def _give_back(self, backend: str) -> None:
        self.held.discard(backend)
        try:
            await self.lock.release_lease(backend)
        except Exception as exc:  # a lost connection took it with it
            log.debug("giving back the follow lease of %s: %s", backend, exc)
        log.info("dispatcher %s no longer follows %s", self.lock.id, backend)

    async def release_all(self) -> None:
        """Give every lease back (the dispatcher stops; its connection's end would do it too)."""
        for backend in sorted(self.held):
            if self.shared:
                await self._give_back(backend)
        self.held = set()
