"""Ganeti's locks as wconfd grants them: instance, node and node-resource locks, shared or exclusive.

What the fake models, and the Ganeti code it follows:

* Levels ``instance``, ``node`` and ``node-res`` (``locking.LEVEL_NAMES``); the cluster
  (BGL) and node-group locks are left out: every op the fake runs takes them shared
  (``REQ_BGL = False``; ``share_locks[LEVEL_NODEGROUP] = 1``), so they never conflict.
* A lock is held shared by many owners or exclusively by one (``locking.SharedLock``).
  Each level also has its whole-set lock, :data:`ALL` (``locking.LOCKSET_NAME``, which
  ``mcpu.Processor._AcquireLocks`` requests for ``needed_locks[level] = ALL_SET``):
  held exclusively it conflicts with every lock of the level, held shared with every
  exclusive one (wconfd's lock hierarchy: a set lock covers its members).
* A request (:class:`Request`) is granted whole or not at all, as wconfd grants one
  ``UpdateLocksWaiting`` request; ``mcpu.Processor._LockAndExecLU`` collates the
  levels it does not acquire opportunistically into one such request.
* Requests that cannot be granted wait; whenever locks are released the waiting ones
  are granted, in arrival order, each as soon as it fits (wconfd's pending requests:
  a later request that fits is not held back by an earlier one that does not).
* :meth:`LockManager.try_union` is wconfd's ``GuardedOpportunisticLockUnion``: the
  named locks that are free now, if at least ``count`` of them are, else none.
* Releasing some members of a held set lock keeps the other members, each held on its
  own (``cmdlib.instance_utils.ReleaseLocks`` after ``LUInstanceCreate._RunAllocator``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

__all__ = ["ALL", "LEVELS", "LockManager", "Request"]

#: the lock on a whole level (Ganeti's ``locking.LOCKSET_NAME``)
ALL = "[lockset]"
LEVELS = ("instance", "node", "node-res")

Key = tuple[str, str]  # (level, name)


@dataclass
class Request:
    """Locks wanted at once: ``{(level, name): shared}``."""

    locks: dict[Key, bool] = field(default_factory=dict)

    def add(self, level: str, names: Iterable[str] | str, *, shared: bool = False) -> Request:
        """Add ``names`` (or :data:`ALL`) of ``level``, shared or exclusive."""
        for name in [names] if isinstance(names, str) else names:
            self.locks[(level, name)] = shared
        return self


class LockManager:
    """The locks of one fake cluster, and who holds or waits for them."""

    def __init__(self, members: Callable[[str], Iterable[str]] = lambda level: ()) -> None:
        self._held: dict[Key, dict[object, bool]] = {}  # lock -> {owner: shared}
        self._waiting: list[tuple[object, Request, asyncio.Future[None]]] = []
        self._members = members  # level -> the names ALL stands for

    # ------------------------------------------------------------------ queries

    def owned(self, owner: object, level: str) -> set[str]:
        """Names of ``level`` that ``owner`` holds; :data:`ALL` expanded, as ``LogicalUnit.owned_locks``."""
        names = {name for (lvl, name), owners in self._held.items() if lvl == level and owner in owners}
        if ALL in names:
            return set(self._members(level)) | (names - {ALL})
        return names

    def holders(self, level: str, name: str) -> dict[object, bool]:
        """Who holds ``level/name`` (not through :data:`ALL`), each with its shared flag."""
        return dict(self._held.get((level, name), {}))

    def is_waiting(self, owner: object) -> bool:
        return any(waiter is owner for waiter, _, _ in self._waiting)

    def _conflicts(self, owner: object, key: Key, shared: bool) -> bool:
        level, name = key
        for (lvl, other), owners in self._held.items():
            if lvl != level or (other != name and ALL not in (name, other)):
                continue
            for holder, held_shared in owners.items():
                if holder is not owner and not (shared and held_shared):
                    return True
        return False

    def _grantable(self, owner: object, request: Request) -> bool:
        return not any(self._conflicts(owner, key, shared) for key, shared in request.locks.items())

    def _grant(self, owner: object, request: Request) -> None:
        for key, shared in request.locks.items():
            self._held.setdefault(key, {})[owner] = shared

    # ------------------------------------------------------------------ acquire and release

    async def acquire(self, owner: object, request: Request) -> None:
        """Wait until the whole ``request`` can be granted, then hold it."""
        if not request.locks:
            return
        if self._grantable(owner, request):
            self._grant(owner, request)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (owner, request, future)
        self._waiting.append(entry)
        try:
            await future
        except BaseException:
            if entry in self._waiting:
                self._waiting.remove(entry)
            elif future.done() and not future.cancelled():
                self.release(owner, request.locks)  # granted as we were cancelled: give it back
            raise

    def try_union(self, owner: object, level: str, names: Iterable[str], count: int) -> list[str]:
        """wconfd's ``GuardedOpportunisticLockUnion``: take the free ones exclusively if at least ``count``."""
        free = sorted({name for name in names if not self._conflicts(owner, (level, name), False)})
        if len(free) < count:
            return []
        self._grant(owner, Request().add(level, free))
        return free

    def release(self, owner: object, keys: Iterable[Key]) -> None:
        """Release ``keys`` held by ``owner``."""
        for key in list(keys):
            owners = self._held.get(key)
            if owners is not None and owners.pop(owner, None) is not None and not owners:
                del self._held[key]
        self._wake()

    def release_level(self, owner: object, level: str, keep: Iterable[str] = ()) -> None:
        """``ReleaseLocks(lu, level, keep=...)``: all of ``level`` but ``keep``; a set lock becomes its kept members."""
        kept = set(keep)
        mine = [(lvl, name) for (lvl, name), owners in self._held.items() if lvl == level and owner in owners]
        for key in mine:
            if key[1] == ALL and kept:
                shared = self._held[key][owner]
                self._grant(
                    owner, Request().add(level, sorted(kept & set(self._members(level))), shared=shared)
                )
        self.release(owner, [key for key in mine if key[1] not in kept])

    def release_all(self, owner: object) -> None:
        self.release(owner, [key for key, owners in self._held.items() if owner in owners])

    def _wake(self) -> None:
        for entry in list(self._waiting):
            owner, request, future = entry
            if future.done():
                self._waiting.remove(entry)
            elif self._grantable(owner, request):
                self._waiting.remove(entry)
                self._grant(owner, request)
                future.set_result(None)
