"""Create specs checked before anything is written: the facade's :class:`SpecChecker`.

``request_instance`` and ``create_instance`` call :meth:`SpecChecker.check` first; a spec no
backend would take raises :class:`~synnefo_ganeti.ValidationError` at once (see
:mod:`synnefo_ganeti.allocate._catalog` for the checks). The backends' catalogs (OSes,
enabled disk templates, instance policy, largest node) are fetched on first use, all
backends at once, and again once older than ``interval`` seconds (:class:`Catalogs`, which
the dispatcher's placement uses too). A backend that cannot be reached within ``timeout``
is skipped (its catalog is tried again after ``retry_after`` seconds): an unreachable
backend is never a reason to refuse a request. A backend drained (in the configuration, or by
an operator: read every ``DRAINED_INTERVAL`` s) is left out unless the request names it: a
spec only a drained backend's nodes could hold is refused, naming the largest the others take.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from synnefo_ganeti.allocate import Catalog, check_name, check_numbers, check_spec
from synnefo_ganeti.config import Settings
from synnefo_ganeti.errors import GanetiError, RapiNotFoundError, ValidationError
from synnefo_ganeti.rapi import ClusterInfo, InstanceSpec, Network, Node, RapiClient

__all__ = ["CATALOG_INTERVAL", "Catalogs", "SpecChecker"]

log = logging.getLogger("synnefo_ganeti.control")

#: seconds a backend's catalog is used before it is fetched again (``GET /2/os`` is a job in Ganeti)
CATALOG_INTERVAL = 300.0
#: seconds to wait for a backend's catalog before checking without it
CATALOG_TIMEOUT = 5.0
#: seconds the backends an operator drained are taken as read (a drain counts within this)
DRAINED_INTERVAL = 5.0
#: seconds before a backend whose catalog could not be fetched is asked again
CATALOG_RETRY = 30.0
#: seconds a catalog is trusted before a spec naming a network it lacks reads it again
NETWORK_RECHECK = 2.0


class Catalogs:
    """Per backend, its :class:`Catalog`: fetched on first use, again after ``interval`` s."""

    def __init__(
        self,
        client: Callable[[str], Awaitable[RapiClient]],
        *,
        interval: float = CATALOG_INTERVAL,
        timeout: float = CATALOG_TIMEOUT,
        retry_after: float = CATALOG_RETRY,
    ) -> None:
        self._client = client
        self.interval = interval
        self.timeout = timeout
        self.retry_after = retry_after
        self._known: dict[str, tuple[float, Catalog]] = {}
        self._oses: dict[str, tuple[float, frozenset[str] | None]] = {}
        self._failed: dict[str, float] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def forget(self, name: str) -> None:
        """Fetch ``name``'s catalog again on next use (a create there failed for its reasons)."""
        self._known.pop(name, None)
        self._oses.pop(name, None)
        self._failed.pop(name, None)

    def _fresh(self, name: str, now: float) -> bool:
        known = self._known.get(name)
        if known is not None and now - known[0] < self.interval:
            return True
        failed = self._failed.get(name)
        return known is None and failed is not None and now - failed < self.retry_after

    async def get(self, names: Iterable[str]) -> list[Catalog]:
        """The catalogs of ``names`` that are known (fetching the stale ones at once)."""
        names = list(dict.fromkeys(names))
        now = time.monotonic()
        stale = [name for name in names if not self._fresh(name, now)]
        if stale:
            await asyncio.gather(*(self._refresh(name) for name in stale))
        return [self._known[name][1] for name in names if name in self._known]

    async def _refresh(self, name: str) -> None:
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            if self._fresh(name, time.monotonic()):
                return  # another caller fetched it meanwhile
            try:
                async with asyncio.timeout(self.timeout):
                    client = await self._client(name)
                    info, nodes, oses, networks = await asyncio.gather(
                        client.info(), client.list_nodes(), self.oses(name, client), networks_of(client)
                    )
            except (GanetiError, TimeoutError) as exc:
                self._failed[name] = time.monotonic()
                log.info(
                    "backend %s: catalog not fetched (%s); its checks are skipped", name, exc or "timeout"
                )
                return
            self._store(name, info, nodes, oses, networks)

    def _store(
        self,
        name: str,
        info: ClusterInfo,
        nodes: list[Node],
        oses: frozenset[str] | None,
        networks: list[Network] | None = None,
    ) -> None:
        self._known[name] = (time.monotonic(), Catalog.of(name, info, nodes, oses, networks))
        self._failed.pop(name, None)

    def update(
        self,
        name: str,
        info: ClusterInfo,
        nodes: list[Node],
        oses: frozenset[str] | None,
        networks: list[Network] | None = None,
    ) -> Catalog:
        """A catalog from answers read elsewhere (the dispatcher's node stats), kept and returned."""
        self._store(name, info, nodes, oses, networks)
        return self._known[name][1]

    def outdated(self, names: Iterable[str], *, older_than: float = 0.0) -> None:
        """Read ``names``' catalogs again on next use (their OS lists kept): a network made since.
        ``older_than``: only those read more than that many seconds ago."""
        now = time.monotonic()
        for name in names:
            known = self._known.get(name)
            if known is None or now - known[0] >= older_than:
                self._known.pop(name, None)
                self._failed.pop(name, None)

    async def oses(self, name: str, client: RapiClient | None = None) -> frozenset[str] | None:
        """``GET /2/os`` of ``name``, asked at most every ``interval`` s; ``None``: not known."""
        known = self._oses.get(name)
        if known is not None and time.monotonic() - known[0] < self.interval:
            return known[1]
        client = client or await self._client(name)
        try:
            oses: frozenset[str] | None = frozenset(await client.list_os())
        except RapiNotFoundError:
            oses = None  # a RAPI without /2/os: any OS passes
        except GanetiError as exc:
            log.info("backend %s: OS list not fetched (%s)", name, exc)
            return None if known is None else known[1]
        self._oses[name] = (time.monotonic(), oses)
        return oses


class SpecChecker:
    """The facade's checks of a create spec against the configured backends' catalogs.

    ``drained``: the backends an operator drained (the store's), left out with those drained
    in the configuration (read at most every ``drained_interval`` s; unread: none left out)."""

    def __init__(
        self,
        settings: Callable[[], Settings],
        client: Callable[[str], Awaitable[RapiClient]],
        *,
        drained: Callable[[], Awaitable[set[str]]] | None = None,
    ) -> None:
        self._settings = settings
        self.catalogs = Catalogs(client)
        self._drained = drained
        self.drained_interval = DRAINED_INTERVAL
        self._drained_read: tuple[float, set[str]] | None = None

    async def drained(self) -> set[str]:
        """The backends an operator drained, as last read (again once ``drained_interval`` old)."""
        if self._drained is None:
            return set()
        read = self._drained_read
        if read is not None and time.monotonic() - read[0] < self.drained_interval:
            return read[1]
        try:
            found = await self._drained()
        except GanetiError as exc:  # the database could not: nothing left out for it
            log.info("drained backends not read (%s); the checks count every backend", exc)
            return set() if read is None else read[1]
        self._drained_read = (time.monotonic(), found)
        return found

    async def check(self, spec: InstanceSpec, *, backend: str | None) -> None:
        """Raise :class:`ValidationError` unless ``spec`` is one ``backend`` (or, without it, some
        backend not drained, in the configuration or by an operator) would take; nothing is
        written either way."""
        check_name(spec.name)
        check_numbers(spec)
        off = await self.drained() if backend is None else set()
        eligible = [b.name for b in self._settings().backends if not b.drained and b.name not in off]
        names = [backend] if backend is not None else eligible
        try:
            check_spec(spec, await self.catalogs.get(names))
        except ValidationError as exc:
            if not (exc.field or "").startswith("nics["):
                raise
            # a network made after the catalogs were read (by another process: create_network
            # outdates this one's): read them again before refusing, unless just read
            self.catalogs.outdated(names, older_than=NETWORK_RECHECK)
            check_spec(spec, await self.catalogs.get(names))


async def networks_of(client: RapiClient) -> list[Network] | None:
    """``GET /2/networks?bulk=1``; None when it cannot be read (the network checks are skipped)."""
    try:
        return await client.list_networks()
    except GanetiError as exc:
        log.info("networks not read (%s); their checks are skipped", exc)
        return None
