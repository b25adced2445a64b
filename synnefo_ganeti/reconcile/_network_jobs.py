"""Making a network on one backend, and removing it: Ganeti's jobs, each followed to its end.

Shared by the facade (``ControlPlane.create_network``, ``delete_network``) and by the
reconciler's network fixes (a pending network finished, a stale one made again, a group
connected), so that both do exactly the same thing. Each step is written to the store
before (the job id) and after (its outcome) it runs, which is what lets a step cut short
by a crash be found (``pending``) and finished by a later pass:

* :func:`make_on_backend`: ``OP_NETWORK_ADD`` unless Ganeti has the network already
  (a pass resuming an earlier try); on a network of several backends, one
  ``OP_NETWORK_SET_PARAMS`` reserving externally the addresses of the other backends'
  ranges that its pool does not hold reserved yet (``allocate/_addresses.py``: one
  address space, each backend handing out its own range), before any group is connected;
  then one ``OP_NETWORK_CONNECT`` per group it should be connected to and is not; the
  backend's row ends ``active`` (or ``error``).
* :func:`remove_from_backend`: refused (:class:`ConflictError`) while Ganeti lists
  instances on the network; else ``OP_NETWORK_DISCONNECT`` per connected group, then
  ``OP_NETWORK_REMOVE``; the backend's row goes. A network Ganeti does not have is gone
  already.

Jobs are awaited with :meth:`RapiClient.wait_for_job` (long-polls); one that does not
succeed is a :class:`JobFailedError` (or a :class:`GanetiError` when it was canceled).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from synnefo_ganeti.allocate import reserved_elsewhere
from synnefo_ganeti.errors import ConflictError, GanetiError, JobFailedError, RapiNotFoundError
from synnefo_ganeti.jobs import JobStatus
from synnefo_ganeti.rapi import Network, RapiClient
from synnefo_ganeti.store.networks._networks import NetworkState, NetworkStore, StoredNetwork

__all__ = [
    "default_link",
    "external_of",
    "find_network",
    "make_on_backend",
    "remove_from_backend",
    "run_job",
    "unreserved_elsewhere",
]

log = logging.getLogger("synnefo_ganeti.networks")


async def run_job(
    client: RapiClient,
    networks: NetworkStore,
    name: str,
    backend: str,
    submit: Callable[[], Awaitable[int]],
    *,
    timeout: float | None,
) -> int:
    """Submit, record the job id on the backend's row, wait for its end; raise unless it succeeded."""
    job_id = await submit()
    await networks.set_backend(name, backend, job_id=job_id)
    job = await client.wait_for_job(job_id, timeout=timeout)
    if job.status is JobStatus.SUCCESS:
        return job_id
    failure = job.failure
    op = (
        str(job.ops[failure.op_index].get("OP_ID", "")) if failure and failure.op_index < len(job.ops) else ""
    )
    what = f"network {name} on backend {backend}: job {job_id} ({op or 'network job'}) ended {job.status}"
    if failure is None:
        raise GanetiError(
            f"{what}; submit it again, or check the job with 'synnefo-ganeti rapi job {job_id}'"
        )
    raise JobFailedError(f"{what}: {failure.type}: {failure.message}", job_id=job_id, failure=failure)


async def find_network(client: RapiClient, name: str) -> Network | None:
    """Ganeti's network ``name``; None when it has none."""
    try:
        return await client.get_network(name)
    except RapiNotFoundError:
        return None


async def default_link(client: RapiClient) -> str | None:
    """The cluster's default NIC link (``nicparams.default.link`` of ``GET /2/info``)."""
    info = await client.info()
    nicparams = (info.model_extra or {}).get("nicparams") or {}
    link = (nicparams.get("default") or {}).get("link")
    return str(link) if link else None


def connected_groups(network: Network) -> list[str]:
    """The groups Ganeti lists the network connected to (``group_list``: ``[group, mode, link, vlan]``)."""
    return [str(entry[0]) for entry in network.group_list if isinstance(entry, list | tuple) and entry]


def external_of(network: Network) -> set[str]:
    """The addresses Ganeti's pool holds reserved externally (``external_reservations``)."""
    return {a.strip() for a in (network.external_reservations or "").split(",") if a.strip()}


def unreserved_elsewhere(stored: StoredNetwork, backend: str, network: Network) -> list[str]:
    """The addresses of the other backends' ranges that ``backend``'s pool (``network``, as
    Ganeti has it) does not hold reserved externally: those it could hand out twice."""
    elsewhere = reserved_elsewhere(stored.subnet, stored.gateway, stored.backends, backend)
    if not elsewhere:
        return []
    external = external_of(network)
    return [address for address in elsewhere if address not in external]


async def make_on_backend(
    client: RapiClient,
    networks: NetworkStore,
    network: StoredNetwork,
    backend: str,
    groups: Sequence[str] | None,
    *,
    timeout: float | None = None,
) -> list[str]:
    """Add the network on ``backend`` (unless there) and connect it to ``groups`` (None: every
    group there); the groups it is connected to. The backend's row ends active or error."""
    name = network.name
    try:
        want = list(groups) if groups is not None else [group.name for group in await client.list_groups()]
        link = network.link or await default_link(client)
        if link is None:
            raise GanetiError(
                f"network {name} on backend {backend}: the cluster has no default NIC link; give link="
            )
        await networks.set_backend(
            name, backend, state=NetworkState.PENDING, want_groups=want, link=link, error=None
        )
        found = await find_network(client, name)
        connected = [] if found is None else connected_groups(found)
        if found is None:
            await run_job(
                client,
                networks,
                name,
                backend,
                lambda: client.create_network(
                    name,
                    network.subnet,
                    gateway=network.gateway,
                    mac_prefix=network.mac_prefix,
                    tags=network.tags or None,
                    reason=f"synnefo-ganeti: network {network.id}",
                ),
                timeout=timeout,
            )
            found = await find_network(client, name)
        missing = [] if found is None else unreserved_elsewhere(network, backend, found)
        if missing:  # before any group is connected: no NIC takes an address of another backend
            await run_job(
                client,
                networks,
                name,
                backend,
                lambda: client.modify_network(
                    name, add_reserved_ips=missing, reason=f"synnefo-ganeti: network {network.id} range"
                ),
                timeout=timeout,
            )
        for group in want:
            if group in connected:
                continue
            await run_job(
                client,
                networks,
                name,
                backend,
                lambda group=group: client.connect_network(name, group, network.mode, link),  # type: ignore[misc]
                timeout=timeout,
            )
            connected.append(group)
            await networks.set_backend(name, backend, groups=connected)
    except GanetiError as exc:
        await networks.set_backend(name, backend, state=NetworkState.ERROR, error=str(exc))
        raise
    await networks.set_backend(name, backend, state=NetworkState.ACTIVE, groups=connected, error=None)
    log.info("network %s on backend %s: active, connected to %s", name, backend, ", ".join(connected))
    return connected


async def remove_from_backend(
    client: RapiClient, networks: NetworkStore, name: str, backend: str, *, timeout: float | None = None
) -> None:
    """Disconnect the network from its groups and remove it from ``backend``; its row goes.

    :class:`ConflictError` (nothing sent) while Ganeti lists instances on it."""
    found = await find_network(client, name)
    if found is None:
        await networks.remove_backend(name, backend)
        return
    if found.inst_list:
        raise ConflictError(
            f"network {name} on backend {backend} is used by instances {', '.join(sorted(found.inst_list))} "
            "in Ganeti; delete them (or detach their NICs) first"
        )
    try:
        await networks.set_backend(name, backend, state=NetworkState.DELETING, error=None)
        connected = connected_groups(found)
        for group in list(connected):
            await run_job(
                client,
                networks,
                name,
                backend,
                lambda group=group: client.disconnect_network(name, group),  # type: ignore[misc]
                timeout=timeout,
            )
            connected.remove(group)
            await networks.set_backend(name, backend, groups=connected)
        await run_job(client, networks, name, backend, lambda: client.delete_network(name), timeout=timeout)
    except GanetiError as exc:
        await networks.set_backend(name, backend, state=NetworkState.ERROR, error=str(exc))
        raise
    await networks.remove_backend(name, backend)
    log.info("network %s: removed from backend %s", name, backend)
