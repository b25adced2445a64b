"""Network drifts, as Synnefo's ``NetworkReconciler`` and ``PoolReconciler`` check them; and their fixes.

:func:`plan_networks` is pure: one backend's stored networks and instances and Ganeti's
networks in (a :class:`NetworkSnapshot`), a list of :class:`NetworkDrift` out.
:func:`apply_network_fixes` does the fixes asked for; :func:`check_networks` runs all
three for one backend (what the reconciler calls). The kinds:

* ``network_stale``: stored as active on the backend, Ganeti has no such network
  (Synnefo's "missing Ganeti network"). Fix: make it again (add, connect its groups).
* ``network_orphan``: a network in Ganeti that the ownership settings say is ours (its
  tag, and the name prefix if one is set) but the database does not hold on that backend.
  Fix, only with ``delete_orphans``: disconnect it and remove it from Ganeti (refused
  while Ganeti lists instances on it).
* ``network_out_of_sync``: the subnet, gateway or MAC prefix Ganeti reports differs from
  the stored one, or (a network on several backends) its pool leaves addresses of the other
  backends' ranges free (made before ranges, or an operator's ``remove_reserved_ips``).
  Fix: the gateway and MAC prefix set back in Ganeti (``OP_NETWORK_SET_PARAMS``), else the
  other ranges reserved (``add_reserved_ips``; Ganeti takes not both in one job); a subnet
  cannot change (delete and create the network).
* ``network_not_connected``: Ganeti has it, but not connected to a group it should be
  (Synnefo's "hanging groups"). Fix: connect it.
* ``network_pending``: the backend's row is pending, error or deleting and has not moved
  for ``grace`` seconds: a create or delete that did not finish (a caller killed
  midway, a job that failed). Fix: finish it: make the network (add, connect) or
  remove it, as the row says. A network whose delete began (``deleting``, the network's
  own status or its backend's) is only ever a delete to finish, whatever its backend's
  row says and whether Ganeti still has it: never ``network_stale`` nor
  ``network_not_connected``, so that no fix makes again what is being deleted (Synnefo's
  ``NetworkReconciliationTest.test_stale_network``); its delete finished, its name is free.
* ``address_unused``: an address Ganeti's pool holds for an instance (reserved, not
  externally) that no stored instance's NIC on that network has. No fix through RAPI
  (Ganeti releases an instance's address only with the instance): delete the instance
  holding it (``inst_list`` of the network names the candidates) or let it be.
* ``address_unreserved``: a stored instance's NIC has an address that Ganeti's pool
  holds free, so Ganeti could give it to another NIC. Fix: reserve it externally
  (``add_reserved_ips``), so it is never handed out; release it by hand once the
  instance is gone.
* ``address_conflict``: one address of a stored network held by two instances: two stored
  instances (not DESTROYED, on any backends) whose NICs on that network have it, or two
  backends' pools holding it for an instance. Report-only: one of the instances must change
  address or go. Found across backends (:func:`plan_conflicts`, after every backend's
  check of one pass); each backend involved reports it.

Networks with a job in flight are left alone: a row pending for less than ``grace``
seconds yields no drift, and address drift is not checked on a network while a stored
instance on it still waits for its pool address (its NIC's ip is ``"pool"``).
"""

from __future__ import annotations

import enum
import ipaddress
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from synnefo_ganeti._serial import to_jsonable
from synnefo_ganeti.errors import GanetiError
from synnefo_ganeti.rapi import Network, RapiClient
from synnefo_ganeti.reconcile._network_jobs import (
    connected_groups,
    make_on_backend,
    remove_from_backend,
    run_job,
    unreserved_elsewhere,
)
from synnefo_ganeti.store import InstanceStatus, Store, StoredInstance
from synnefo_ganeti.store.networks._networks import NetworkState, NetworkStore, StoredNetwork

__all__ = [
    "NETWORK_GRACE",
    "NetworkDrift",
    "NetworkDriftKind",
    "NetworkSnapshot",
    "apply_network_fixes",
    "check_networks",
    "conflicts_by_backend",
    "plan_conflicts",
    "plan_networks",
    "snapshot_networks",
]

log = logging.getLogger("synnefo_ganeti.reconcile")

#: seconds a network's row may stay pending (a create or delete running) before it is a drift
NETWORK_GRACE = 60.0


class NetworkDriftKind(enum.StrEnum):
    STALE = "network_stale"
    ORPHAN = "network_orphan"
    OUT_OF_SYNC = "network_out_of_sync"
    NOT_CONNECTED = "network_not_connected"
    PENDING = "network_pending"
    ADDRESS_UNUSED = "address_unused"
    ADDRESS_UNRESERVED = "address_unreserved"
    ADDRESS_CONFLICT = "address_conflict"


#: the kinds whose fix acts in the database or Ganeti when asked (orphans need ``delete_orphans``)
FIXABLE = frozenset(NetworkDriftKind) - {
    NetworkDriftKind.ADDRESS_UNUSED,
    NetworkDriftKind.ORPHAN,
    NetworkDriftKind.ADDRESS_CONFLICT,
}


@dataclass(frozen=True, slots=True)
class NetworkSnapshot:
    """One backend: the stored networks (every one, by name), the stored instances not
    DESTROYED, Ganeti's networks (by name) and which of those the ownership settings own."""

    backend: str
    stored: dict[str, StoredNetwork]
    instances: list[StoredInstance]
    ganeti: dict[str, Network]
    owned: frozenset[str] = frozenset()
    taken_at: float = field(default_factory=time.time)


@dataclass(slots=True)
class NetworkDrift:
    """One network difference; ``fixed`` and ``error`` are set by :func:`apply_network_fixes`."""

    kind: NetworkDriftKind
    backend: str
    network: str
    detail: str
    #: the groups to connect (not_connected), the address (address_*), the values to set (out_of_sync)
    groups: list[str] = field(default_factory=list)
    address: str | None = None
    values: dict[str, Any] = field(default_factory=dict)
    job_id: int | None = None
    fixed: bool = False
    error: str | None = None

    __json_fields__ = ("kind", "network", "detail", "address", "fixed", "error")

    def to_json(self) -> dict[str, Any]:
        result: dict[str, Any] = to_jsonable(self)
        return result


def _differences(stored: StoredNetwork, net: Network) -> tuple[list[str], dict[str, Any]]:
    """What differs (sentences), and the parameters that set Ganeti back (subnet aside)."""
    said: list[str] = []
    values: dict[str, Any] = {}
    if (net.network or None) != stored.subnet:
        said.append(f"subnet: stored {stored.subnet}, Ganeti has {net.network}")
    if (net.gateway or None) != stored.gateway:
        said.append(f"gateway: stored {stored.gateway}, Ganeti has {net.gateway}")
        values["gateway"] = stored.gateway or "none"
    if ((net.mac_prefix or None) and str(net.mac_prefix).lower()) != stored.mac_prefix:
        said.append(f"MAC prefix: stored {stored.mac_prefix}, Ganeti has {net.mac_prefix}")
        values["mac_prefix"] = stored.mac_prefix or "none"
    return said, values


def _reserved(net: Network) -> tuple[set[str], set[str]]:
    """Ganeti's pool: (every reserved address, the external ones) from ``map`` and
    ``external_reservations`` (``network.AddressPool.GetMap``: ``X`` reserved, ``.`` free)."""
    if not net.network or not net.map:
        return set(), set()
    subnet = ipaddress.IPv4Network(net.network)
    base = int(subnet.network_address)
    reserved = {str(ipaddress.IPv4Address(base + i)) for i, mark in enumerate(net.map) if mark == "X"}
    external = {a.strip() for a in (net.external_reservations or "").split(",") if a.strip()}
    return reserved, external


def _is_ip(value: Any) -> bool:
    try:
        ipaddress.IPv4Address(str(value))
    except ValueError:
        return False
    return True


def _address_drifts(
    backend: str, name: str, net: Network, instances: list[StoredInstance]
) -> list[NetworkDrift]:
    users: dict[str, list[str]] = {}
    for instance in instances:
        for nic in instance.nics or []:
            if not isinstance(nic, Mapping) or nic.get("network") != name:
                continue
            ip = nic.get("ip")
            if ip == "pool":
                return []  # an address not known yet (a create in flight): next pass
            if ip is not None and _is_ip(ip):
                users.setdefault(str(ip), []).append(instance.name)
    reserved, external = _reserved(net)
    holders = ", ".join(sorted(net.inst_list)) or "none"
    drifts = [
        NetworkDrift(
            NetworkDriftKind.ADDRESS_UNUSED,
            backend,
            name,
            f"address {ip} is reserved for an instance in Ganeti's pool, but no stored instance has it "
            f"(instances on the network in Ganeti: {holders})",
            address=ip,
        )
        for ip in sorted(reserved - external - set(users), key=ipaddress.IPv4Address)
    ]
    drifts.extend(
        NetworkDrift(
            NetworkDriftKind.ADDRESS_UNRESERVED,
            backend,
            name,
            f"address {ip} of instance {', '.join(users[ip])} is free in Ganeti's pool "
            "(Ganeti could give it to another NIC)",
            address=ip,
        )
        for ip in sorted(set(users) - reserved, key=ipaddress.IPv4Address)
    )
    return drifts


def plan_networks(snapshot: NetworkSnapshot, *, grace: float = NETWORK_GRACE) -> list[NetworkDrift]:
    """Every network drift of one backend (see the module docstring); no I/O."""
    backend, drifts = snapshot.backend, []
    for name in sorted(snapshot.owned - {n for n, s in snapshot.stored.items() if s.on(backend) is not None}):
        orphan = snapshot.ganeti[name]
        users = f"; instances on it: {', '.join(sorted(orphan.inst_list))}" if orphan.inst_list else ""
        drifts.append(
            NetworkDrift(
                NetworkDriftKind.ORPHAN,
                backend,
                name,
                f"network {name} ({orphan.network}) is ours by its tags but not in the database{users}",
            )
        )
    for name, stored in sorted(snapshot.stored.items()):
        on = stored.on(backend)
        if on is None:
            continue
        net = snapshot.ganeti.get(name)
        deleting = on.state is NetworkState.DELETING or stored.status is NetworkState.DELETING
        if on.state is not NetworkState.ACTIVE or deleting:
            # (a delete begins with the network's status: the backend's row may still say active,
            # since before the delete began)
            since = (
                on.updated_at
                if on.state is not NetworkState.ACTIVE
                else max(on.updated_at, stored.updated_at)
            )
            if snapshot.taken_at - since.timestamp() >= grace:
                doing = "delete" if deleting else "create"
                why = f": {on.error}" if on.error else ""
                drifts.append(
                    NetworkDrift(
                        NetworkDriftKind.PENDING,
                        backend,
                        name,
                        f"network {name}: its {doing} is {on.state} since {since:%Y-%m-%d %H:%M:%S} UTC "
                        f"(last job {on.job_id}){why}",
                        values={"do": doing},
                    )
                )
            continue
        if net is None:
            drifts.append(
                NetworkDrift(
                    NetworkDriftKind.STALE,
                    backend,
                    name,
                    f"network {name} is active in the database, Ganeti has none",
                )
            )
            continue
        said, values = _differences(stored, net)
        missing = (
            [] if said or net.external_reservations is None else unreserved_elsewhere(stored, backend, net)
        )
        if missing:
            said.append(
                f"{len(missing)} addresses of the other backends' ranges are free in its pool ({missing[0]}, ...)"
            )
            values["add_reserved_ips"] = missing
        if said:
            drifts.append(
                NetworkDrift(
                    NetworkDriftKind.OUT_OF_SYNC,
                    backend,
                    name,
                    f"network {name}: " + "; ".join(said),
                    values=values if not said[0].startswith("subnet") else {},
                )
            )
        connected = set(connected_groups(net))
        missing = [group for group in on.want_groups or on.groups if group not in connected]
        if missing:
            drifts.append(
                NetworkDrift(
                    NetworkDriftKind.NOT_CONNECTED,
                    backend,
                    name,
                    f"network {name} is not connected to group {', '.join(missing)}",
                    groups=missing,
                )
            )
        if (net.network or None) == stored.subnet:  # another subnet: its pool is not comparable
            drifts.extend(_address_drifts(backend, name, net, snapshot.instances))
    return drifts


def plan_conflicts(snapshots: Iterable[NetworkSnapshot]) -> list[NetworkDrift]:
    """``address_conflict`` drifts across backends (one per backend involved); no I/O.

    Only the stored networks count (one address space across their backends; same-named
    networks of Ganeti that the control plane did not make are separate), and a backend's
    pool only when it has the stored subnet."""
    holders: dict[tuple[str, str], list[tuple[str, str]]] = {}
    pools: dict[tuple[str, str], set[str]] = {}
    for snapshot in snapshots:
        backend = snapshot.backend
        for instance in snapshot.instances:
            for nic in instance.nics or []:
                if not isinstance(nic, Mapping) or nic.get("network") not in snapshot.stored:
                    continue
                if _is_ip(nic.get("ip")):
                    found = holders.setdefault((str(nic["network"]), str(nic["ip"])), [])
                    if (backend, instance.name) not in found:
                        found.append((backend, instance.name))
        for name, stored in snapshot.stored.items():
            net = snapshot.ganeti.get(name)
            if stored.on(backend) is None or net is None or (net.network or None) != stored.subnet:
                continue
            if net.external_reservations is None:
                continue  # which reservations are external is not known: no pool side
            reserved, external = _reserved(net)
            for ip in reserved - external:
                pools.setdefault((name, ip), set()).add(backend)
    drifts: list[NetworkDrift] = []
    for key in sorted(set(holders) | set(pools), key=lambda k: (k[0], ipaddress.IPv4Address(k[1]))):
        name, ip = key
        held, in_pools = holders.get(key, []), sorted(pools.get(key, ()))
        if len(held) < 2 and len(in_pools) < 2:
            continue
        said = ", ".join(f"{instance} ({backend})" for backend, instance in sorted(held)) or "none stored"
        detail = (
            f"address {ip} of network {name} is held by {max(len(held), len(in_pools))} instances: {said}"
            + (f"; the pools of {', '.join(in_pools)} hold it for an instance" if len(in_pools) > 1 else "")
        )
        drifts.extend(
            NetworkDrift(NetworkDriftKind.ADDRESS_CONFLICT, backend, name, detail, address=ip)
            for backend in sorted({b for b, _ in held} | set(in_pools))
        )
    return drifts


def conflicts_by_backend(snapshots: Iterable[NetworkSnapshot]) -> dict[str, list[NetworkDrift]]:
    """:func:`plan_conflicts` by backend (what each backend's report adds)."""
    out: dict[str, list[NetworkDrift]] = {}
    for drift in plan_conflicts(snapshots):
        out.setdefault(drift.backend, []).append(drift)
    return out


async def snapshot_networks(
    store: Store,
    client: RapiClient,
    backend: str,
    *,
    owns: Callable[[str, list[str]], bool] | None = None,
    stored: Iterable[StoredNetwork] | None = None,
) -> NetworkSnapshot:
    """The stored networks, then Ganeti's (``GET /2/networks?bulk=1``); the stored instances
    only when the backend has a stored network (their NICs are what address drift compares).
    ``stored``: the networks read already (the reconciler's pass reads them once, in its
    snapshot); None: read now."""
    taken_at = time.time()
    if stored is None:
        stored = await NetworkStore(store).all()
    networks = {network.name: network for network in stored}
    ganeti = {net.name: net for net in await client.list_networks()}
    instances: list[StoredInstance] = []
    if any(network.on(backend) is not None for network in networks.values()):
        live = [s for s in InstanceStatus if s is not InstanceStatus.DESTROYED]
        instances = await store.list_instances(backend=backend, status=live)
    owned = frozenset(name for name, net in ganeti.items() if owns is not None and owns(name, list(net.tags)))
    return NetworkSnapshot(backend, networks, instances, ganeti, owned, taken_at)


async def _remove_orphan(client: RapiClient, net: Network, *, timeout: float | None) -> None:
    if net.inst_list:
        raise GanetiError(f"network {net.name} has instances {', '.join(sorted(net.inst_list))} in Ganeti")
    for group in connected_groups(net):
        job = await client.wait_for_job(await client.disconnect_network(net.name, group), timeout=timeout)
        if job.status.value != "success":
            raise GanetiError(f"network {net.name}: disconnecting group {group}: job {job.id} {job.status}")
    job = await client.wait_for_job(await client.delete_network(net.name), timeout=timeout)
    if job.status.value != "success":
        raise GanetiError(f"network {net.name}: removing it: job {job.id} {job.status}")


async def _fix(
    drift: NetworkDrift,
    snapshot: NetworkSnapshot,
    store: NetworkStore,
    client: RapiClient,
    timeout: float | None,
) -> None:
    name, backend, stored = drift.network, drift.backend, snapshot.stored.get(drift.network)
    kind = drift.kind
    if kind is NetworkDriftKind.ORPHAN:
        await _remove_orphan(client, snapshot.ganeti[name], timeout=timeout)
    elif kind is NetworkDriftKind.PENDING and drift.values.get("do") == "delete":
        await remove_from_backend(client, store, name, backend, timeout=timeout)
        if not (await store.require(name)).backends:
            await store.remove(name)
    elif kind in (NetworkDriftKind.PENDING, NetworkDriftKind.STALE, NetworkDriftKind.NOT_CONNECTED):
        assert stored is not None
        if stored.status is NetworkState.DELETING:  # (plan_networks never asks it: a delete wins)
            raise GanetiError(f"network {name} is being deleted: it is not made again")
        on = stored.on(backend)
        groups = on.want_groups if on is not None else None
        await make_on_backend(client, store, stored, backend, groups, timeout=timeout)
    elif kind is NetworkDriftKind.OUT_OF_SYNC:
        if not drift.values:
            raise GanetiError(f"network {name}: its subnet differs: delete the network and create it again")
        drift.job_id = await run_job(
            client, store, name, backend, lambda: client.modify_network(name, **drift.values), timeout=timeout
        )
    elif kind is NetworkDriftKind.ADDRESS_UNRESERVED:
        assert drift.address is not None
        address = drift.address
        drift.job_id = await run_job(
            client,
            store,
            name,
            backend,
            lambda: client.modify_network(name, add_reserved_ips=[address]),
            timeout=timeout,
        )
    else:
        return
    drift.fixed = True


async def apply_network_fixes(
    drifts: list[NetworkDrift],
    snapshot: NetworkSnapshot,
    fixes: Collection[NetworkDriftKind | str],
    *,
    store: Store,
    client: RapiClient,
    delete_orphans: bool = False,
    timeout: float | None = None,
) -> list[NetworkDrift]:
    """Fix the drifts whose kind ``fixes`` names (orphans only with ``delete_orphans``), one
    after another; a fix that fails says why in ``error`` and the others go on."""
    kinds = {NetworkDriftKind(kind) for kind in fixes} & FIXABLE
    networks = NetworkStore(store)
    for drift in drifts:
        wanted = drift.kind in kinds or (drift.kind is NetworkDriftKind.ORPHAN and delete_orphans)
        if not wanted:
            continue
        try:
            await _fix(drift, snapshot, networks, client, timeout)
        except GanetiError as exc:
            drift.error = str(exc)
            log.warning("%s: cannot fix %s of network %s: %s", drift.backend, drift.kind, drift.network, exc)
    return drifts


async def check_networks(
    store: Store,
    client: RapiClient,
    backend: str,
    *,
    owns: Callable[[str, list[str]], bool] | None = None,
    fixes: Iterable[NetworkDriftKind | str] = (),
    delete_orphans: bool = False,
    grace: float = NETWORK_GRACE,
    timeout: float | None = None,
    stored: Iterable[StoredNetwork] | None = None,
    seen: list[NetworkSnapshot] | None = None,
) -> list[NetworkDrift]:
    """One backend: the snapshot, the plan, the fixes asked for; the drifts found.
    ``seen``: the snapshot is appended to it (a pass's conflicts across backends)."""
    snapshot = await snapshot_networks(store, client, backend, owns=owns, stored=stored)
    if seen is not None:
        seen.append(snapshot)
    drifts = plan_networks(snapshot, grace=grace)
    fixes = list(fixes)
    if drifts and (fixes or delete_orphans):
        await apply_network_fixes(
            drifts,
            snapshot,
            fixes,
            store=store,
            client=client,
            delete_orphans=delete_orphans,
            timeout=timeout,
        )
    return drifts
