"""Each backend's whole node stats, read from Ganeti by one dispatcher for all.

Design. Placement needs each backend's whole node stats (:class:`NodeStats`: the nodes with
their memory and disk figures, ``/2/info`` for the instance policy and the disk templates, the
OS list, the networks), read every ``stats_interval`` and whenever the allocator wants them
sooner (a placement accounted, a node back; ``Allocator.due_for_refresh``). On PostgreSQL the
holder of the backend's follow lease (:mod:`._leases`) reads them from Ganeti, as one
dispatcher alone always did, and stores them (``Store.set_backend_stats``, one row per backend:
``backend_stats``, migration 0016) with the time its read *began*. Every other dispatcher takes
the stored ones instead of asking Ganeti, as long as they are fresher than
:data:`STATS_FRESH` x ``stats_interval``; older ones (the holder died, or is stuck), or none,
and it reads Ganeti itself, as a fallback (said at debug level), and stores nothing.

The stored read time is turned into this process's monotonic clock (the clocks of the
dispatchers' machines are taken as in step, NTP), so that the stats' ``stats_at`` means what it
means for a read of its own: a placement accounted after the holder's read began stays
reserved until stats read after it come. SQLite runs one dispatcher, which holds every lease:
it reads Ganeti, and stores nothing, as before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from synnefo_ganeti.control._validate import networks_of
from synnefo_ganeti.dispatch._base import _replace
from synnefo_ganeti.dispatch._node_watch import NodeWatch
from synnefo_ganeti.errors import GanetiError
from synnefo_ganeti.rapi import ClusterInfo, Network, Node

__all__ = ["STATS_FRESH", "NodeStats", "StatsReads"]

log = logging.getLogger("synnefo_ganeti.dispatch")

#: stored stats are taken while younger than this many ``stats_interval`` (else read here)
STATS_FRESH = 2.0


@dataclass(frozen=True, slots=True)
class NodeStats:
    """One read of a backend's whole node stats: its nodes, ``/2/info``, its OS names (None: not
    known, or a RAPI without ``/2/os``: any OS passes) and networks (None: not read)."""

    nodes: list[Node]
    info: ClusterInfo
    oses: frozenset[str] | None
    networks: list[Network] | None

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable form (Ganeti's own keys, extras kept): :meth:`from_json` reads it."""
        return {
            "nodes": [node.model_dump(mode="json", by_alias=True) for node in self.nodes],
            "info": self.info.model_dump(mode="json", by_alias=True),
            "oses": None if self.oses is None else sorted(self.oses),
            "networks": None
            if self.networks is None
            else [net.model_dump(mode="json", by_alias=True) for net in self.networks],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeStats:
        """The stats :meth:`to_json` wrote; ``ValueError`` (pydantic's ``ValidationError``
        included) or ``KeyError``/``TypeError`` when ``data`` is not such a form."""
        oses, networks = data["oses"], data["networks"]
        return cls(
            nodes=[Node.model_validate(node) for node in data["nodes"]],
            info=ClusterInfo.model_validate(data["info"]),
            oses=None if oses is None else frozenset(oses),
            networks=None if networks is None else [Network.model_validate(net) for net in networks],
        )


class StatsReads(NodeWatch):
    """The whole node stats of each backend: read, stored, or taken as stored (see the module)."""

    async def _refresh_stats(self, names: list[str]) -> None:
        # drained by an operator (`backends drain`, the console) is in the database, read with the stats
        try:
            by_operator: set[str] | None = await self.store.drained_backends()
        except GanetiError as exc:
            log.info("drained backends not read (%s); keeping what was known", exc)
            by_operator = None
        await asyncio.gather(
            *(self._refresh_one(name, by_operator) for name in names if name in self._backends)
        )

    async def _refresh_one(self, name: str, by_operator: set[str] | None = None) -> None:
        leases = self.leases
        found = None if leases is None or leases.holds(name) else await self._stored_stats(name)
        here = found is None
        if found is None:
            found = await self._read_stats(name)
        if found is None or name not in self._backends:
            return
        stats, read_at = found
        in_place = self.allocator.view(name).stats_at
        if in_place is not None and in_place > read_at:
            return  # a read begun after this one (a reload's) is in place already: it says more
        # before the update: a node back makes the backend due for stats read after this one
        changes = self.allocator.nodes_seen(name, stats.nodes, read_at=read_at)
        view = self.allocator.view(name)
        settings = self._backends[name].settings
        self.allocator.update(
            _replace(
                view,
                nodes=stats.nodes,
                disk_templates=frozenset(stats.info.enabled_disk_templates or ()),
                drained=settings.drained or (view.drained if by_operator is None else name in by_operator),
                healthy=self.health.tracker.is_up(name) if self.health is not None else True,
                stats_at=read_at,
                catalog=self.catalogs.update(name, stats.info, stats.nodes, stats.oses, stats.networks),
            )
        )
        if here:
            await self._nodes_read(name, stats.nodes, read_at, changes)
        else:  # the holder writes the node states; what changed here is logged
            for change in changes:
                self._node_changed(change)

    async def _read_stats(self, name: str) -> tuple[NodeStats, float] | None:
        """The stats of ``name`` read from Ganeti, and when the read began (monotonic); stored
        for the others when this dispatcher holds the backend's lease on PostgreSQL."""
        client = await self.client(name)
        read_at, began = time.monotonic(), datetime.now(UTC)
        try:
            # the OS list is asked seldom (a job in Ganeti): Catalogs keeps it CATALOG_INTERVAL s
            # and the networks: placement goes where a spec's networks are and have addresses
            nodes, info, oses, networks = await asyncio.gather(
                client.list_nodes(), client.info(), self.catalogs.oses(name, client), networks_of(client)
            )
        except GanetiError as exc:
            log.info("backend %s: node stats not refreshed (%s)", name, exc)
            return None
        stats = NodeStats(nodes, info, oses, networks)
        leases = self.leases
        if leases is not None and leases.shared and leases.holds(name):
            try:
                await self.store.set_backend_stats(name, stats.to_json(), read_at=began)
            except GanetiError as exc:
                log.info("backend %s: node stats not stored for the others (%s)", name, exc)
        return stats, read_at

    async def _stored_stats(self, name: str) -> tuple[NodeStats, float] | None:
        """The stats of ``name`` its lease holder stored, when fresh, with the time their read
        began (on this process's monotonic clock); None (said at debug level) when they are
        not there, too old, or cannot be read: then this dispatcher reads Ganeti itself."""
        limit = STATS_FRESH * self.settings.dispatcher.stats_interval
        try:
            found = await self.store.backend_stats(name)
        except GanetiError as exc:
            log.debug("backend %s: stored node stats not read (%s); reading them from Ganeti", name, exc)
            return None
        if found is None:
            log.debug("backend %s: no stored node stats; reading them from Ganeti", name)
            return None
        data, began = found
        age = max(0.0, (datetime.now(UTC) - began).total_seconds())
        if age >= limit:
            log.debug(
                "backend %s: stored node stats are %.1f s old (over %g s); reading them from Ganeti",
                name,
                age,
                limit,
            )
            return None
        try:
            stats = NodeStats.from_json(data)
        except (ValueError, KeyError, TypeError) as exc:  # ValidationError is a ValueError
            log.debug("backend %s: stored node stats unreadable (%s); reading them from Ganeti", name, exc)
            return None
        return stats, time.monotonic() - age

    async def _stats_loop(self) -> None:
        interval = self.settings.dispatcher.stats_interval
        while True:
            await asyncio.sleep(min(1.0, interval))
            due = self.allocator.due_for_refresh(interval=interval)
            if due:
                await self._refresh_stats(due)
