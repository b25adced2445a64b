"""Networks and their IP pools through the facade: ``create_network``, ``delete_network``, ``list_networks``.

A mixin of :class:`~synnefo_ganeti.ControlPlane`. A network is Ganeti's (``gnt-network``):
an IPv4 subnet whose address pool Ganeti keeps, connected to node groups with a mode
and link. A NIC ``{"network": NAME, "ip": "pool"}`` in an ``InstanceSpec`` then takes the
pool's first free address on create, and the instance gives it back when it is removed:
Ganeti does both; the stored instance holds the address once its create ended.

Each call checks first and writes the database before Ganeti (as the instance calls do):

* ``create_network``: the values are checked (:class:`ValidationError` naming the field,
  nothing written or sent), each backend is asked whether it has a network of that name
  (:class:`ConflictError`, nothing written), the rows are written (``pending`` on each
  backend; a name the database holds is a ConflictError), then on every backend at once
  ``OP_NETWORK_ADD`` and one ``OP_NETWORK_CONNECT`` per node group, each job followed to
  its end and recorded on the backend's row (``reconcile/_network_jobs.py``).
* ``delete_network``: :class:`ConflictError` while a stored instance (not DESTROYED) or,
  in Ganeti, any instance has a NIC on it; else disconnect and remove on every backend;
  the rows go once it is gone everywhere.

A caller killed in the middle leaves backends ``pending``: ``synnefo-ganeti reconcile``
reports them and its fix finishes the work (docs/networks.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING

from synnefo_ganeti.control._network_checks import Groups, check_network, groups_for
from synnefo_ganeti.errors import ConflictError, GanetiError
from synnefo_ganeti.reconcile._network_jobs import find_network, make_on_backend, remove_from_backend
from synnefo_ganeti.store.networks._networks import NetworkState, NetworkStore, StoredNetwork

if TYPE_CHECKING:
    from synnefo_ganeti.config import Settings
    from synnefo_ganeti.control._validate import SpecChecker
    from synnefo_ganeti.rapi import RapiClient
    from synnefo_ganeti.store import Store

__all__ = ["NetworkMethods"]

log = logging.getLogger("synnefo_ganeti.control")


async def _all(calls: dict[str, Awaitable[object]]) -> None:
    """Run every backend's calls to their ends; then raise the first failure (by backend name)."""
    results = await asyncio.gather(*calls.values(), return_exceptions=True)
    failures = [(b, r) for b, r in zip(calls, results, strict=True) if isinstance(r, BaseException)]
    for _backend, result in sorted(failures, key=lambda item: item[0]):
        if not isinstance(result, Exception):
            raise result
    if failures:
        raise sorted(failures, key=lambda item: item[0])[0][1]


class NetworkMethods:
    """The network calls of :class:`~synnefo_ganeti.ControlPlane` (see the module docstring)."""

    if TYPE_CHECKING:  # what ControlPlane gives its mixins

        @property
        def settings(self) -> Settings: ...
        @property
        def store(self) -> Store: ...
        async def client(self, backend: str) -> RapiClient: ...

        _checker: SpecChecker

    @property
    def _networks(self) -> NetworkStore:
        return NetworkStore(self.store)

    async def create_network(
        self,
        name: str,
        *,
        subnet: str,
        gateway: str | None = None,
        mac_prefix: str | None = None,
        backends: Sequence[str] | None = None,
        groups: Groups = None,
        mode: str = "bridged",
        link: str | None = None,
        timeout: float | None = None,
    ) -> StoredNetwork:
        """Create network ``name`` (IPv4 ``subnet``, optional ``gateway`` and ``mac_prefix``) on
        ``backends`` (None: every configured backend) and connect it to ``groups`` there with
        ``mode`` (bridged, routed, openvswitch) and ``link`` (the bridge or routing table; None:
        each cluster's default NIC link). ``groups``: None (every node group of each backend),
        a list of group names, or a mapping backend -> group names. Returns the network as
        stored once every job ended (``timeout``: seconds per job).

        :class:`ValidationError` (its ``field`` names which) for bad values, and
        :class:`ConflictError` for a name the database or a backend's Ganeti holds, before
        anything is written or sent; a job that fails raises (:class:`JobFailedError`) after
        the other backends finished, the failed backend's state ``error`` with why.
        """
        checked = check_network(
            name, subnet=subnet, gateway=gateway, mac_prefix=mac_prefix, mode=mode, link=link
        )
        names = (
            list(dict.fromkeys(backends))
            if backends is not None
            else [b.name for b in self.settings.backends]
        )
        if not names:
            raise GanetiError(f"network {name}: no backends to create it on (configure one, or name them)")
        for backend in names:
            self.settings.backend(backend)  # an unknown name is a ConfigError, before anything is sent
        want = groups_for(groups, names)
        clients = {backend: await self.client(backend) for backend in names}
        found = await asyncio.gather(*(find_network(clients[b], checked.name) for b in names))
        taken = [backend for backend, network in zip(names, found, strict=True) if network is not None]
        if taken:
            raise ConflictError(
                f"network name {checked.name} is taken in Ganeti on backend {', '.join(taken)} "
                "(a network this control plane did not make, or one made outside it); choose another name"
            )
        network = await self._networks.add(
            checked.name,
            subnet=checked.subnet,
            gateway=checked.gateway,
            mac_prefix=checked.mac_prefix,
            mode=checked.mode,
            link=checked.link,
            groups=_stored_groups(groups),
            tags=self.settings.ownership.tags_for_new(),
            backends=names,
        )
        try:
            await _all(
                {
                    b: make_on_backend(clients[b], self._networks, network, b, want[b], timeout=timeout)
                    for b in names
                }
            )
        finally:
            self._checker.catalogs.outdated(names)  # the create checks find the network at once
        return await self._networks.require(checked.name)

    async def delete_network(self, name: str, *, timeout: float | None = None) -> None:
        """Disconnect network ``name`` from its groups and remove it from every backend it is on;
        then it is gone from the database and its name is free.

        :class:`NotFoundError` for a name the database lacks; :class:`ConflictError`, nothing
        sent, while a stored instance (not DESTROYED) or an instance in Ganeti has a NIC on it.
        A job that fails raises after the other backends finished; the network stays
        ``deleting`` (call again to go on)."""
        networks = self._networks
        network = await networks.require(name)
        users = await networks.users(name)
        if users:
            listed = ", ".join(f"{instance} ({backend})" for backend, instance in users[:5])
            more = f" and {len(users) - 5} more" if len(users) > 5 else ""
            raise ConflictError(
                f"network {name} is used by instances {listed}{more}; delete them (or detach their NICs) first"
            )
        backends = list(network.backends)
        clients = {backend: await self.client(backend) for backend in backends}
        found = await asyncio.gather(*(find_network(clients[b], name) for b in backends))
        busy = [
            (b, n.inst_list) for b, n in zip(backends, found, strict=True) if n is not None and n.inst_list
        ]
        if busy:
            listed = "; ".join(f"{b}: {', '.join(sorted(names))}" for b, names in busy)
            raise ConflictError(
                f"network {name} is used in Ganeti by instances ({listed}); delete them first"
            )
        await networks.set_status(name, NetworkState.DELETING)
        await _all({b: remove_from_backend(clients[b], networks, name, b, timeout=timeout) for b in backends})
        await networks.remove(name)
        log.info("network %s deleted from %s", name, ", ".join(backends) or "no backend")

    async def get_network(self, name: str) -> StoredNetwork | None:
        """The network ``name`` as stored (what was asked, and its state on each backend); None: none."""
        return await self._networks.get(name)

    async def list_networks(self) -> list[StoredNetwork]:
        """Every network this control plane made, by name, with its state on each backend."""
        return await self._networks.all()


def _stored_groups(groups: Groups) -> list[str] | dict[str, list[str]] | None:
    if groups is None:
        return None
    if isinstance(groups, dict):
        return {backend: list(names) for backend, names in groups.items()}
    return list(groups)
