"""Reading what a backend offers (:class:`~synnefo_ganeti.allocate.BackendCatalog`) for the facade.

``await cp.catalog(backend)`` reads the backend's cluster info, nodes, networks and node
groups at once, every call (they are the node stats: what is free now), and its OS list
through the facade's :class:`~synnefo_ganeti.control._validate.Catalogs`, which asks
``GET /2/os`` at most every ``CATALOG_INTERVAL`` seconds (Ganeti runs a job for it). The
answers also refresh the catalog the create checks use, as the dispatcher's node-stats
refresh does, so a spec is checked against what the caller was just shown.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from synnefo_ganeti.allocate import BackendCatalog
from synnefo_ganeti.control._validate import Catalogs
from synnefo_ganeti.rapi import RapiClient

__all__ = ["read_catalog"]


async def read_catalog(name: str, client: RapiClient, catalogs: Catalogs) -> BackendCatalog:
    """The catalog of backend ``name`` (RAPI errors propagate: the caller maps them)."""
    info, nodes, networks, groups, oses = await asyncio.gather(
        client.info(),
        client.list_nodes(),
        client.list_networks(),
        client.list_groups(),
        catalogs.oses(name, client),
    )
    catalogs.update(name, info, nodes, oses, networks)  # the create checks see the same answers
    return BackendCatalog.of(
        name,
        info=info,
        nodes=nodes,
        oses=oses,
        networks=networks,
        groups=groups,
        read_at=datetime.now(UTC),
    )
