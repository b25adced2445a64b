"""Networks in the database: what ``ControlPlane.create_network`` was asked, and each backend's state.

One ``networks`` row per network (its name unique while the row exists), one
``network_backends`` row per backend it is on. The facade writes before it sends each
job and after each job ends, so a caller killed in the middle leaves a backend
``pending`` with its last job id: the reconciler reports it (``network_pending``) and
its fix finishes the work. Rows are written through the store's one writer
(:meth:`Store.call`) and read on reader connections (:meth:`Store.call_read`); nothing
here sends anything to Ganeti.

Errors: a name taken is a :class:`ConflictError`, a network the database lacks a
:class:`NotFoundError`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast
from uuid import uuid4

from sqlalchemy import Table, delete, insert, select, update
from sqlalchemy.engine import Connection, Row

from synnefo_ganeti.errors import ConflictError, NotFoundError
from synnefo_ganeti.store._store import Store
from synnefo_ganeti.store.backends._backends import backends_t
from synnefo_ganeti.store.instances._instances import InstanceStatus, instances_t
from synnefo_ganeti.store.networks._rows import NetworkBackendRow, NetworkRow

__all__ = [
    "NetworkOnBackend",
    "NetworkState",
    "NetworkStore",
    "StoredNetwork",
    "network_backends_t",
    "networks_t",
    "read_networks",
]

networks_t = cast(Table, NetworkRow.__table__)
network_backends_t = cast(Table, NetworkBackendRow.__table__)


class NetworkState(enum.StrEnum):
    """A network's state on one backend (and, summed up, :attr:`StoredNetwork.status`)."""

    PENDING = "pending"  # its add or a connect has not ended (or the caller stopped in between)
    ACTIVE = "active"  # added and connected to every group it should be
    ERROR = "error"  # a job failed or Ganeti refused one: ``error`` says why
    DELETING = "deleting"  # a delete began and has not ended


@dataclass(frozen=True, slots=True)
class NetworkOnBackend:
    """A network on one backend: its state, the groups it is connected to and should be."""

    backend: str
    state: NetworkState
    groups: list[str]
    want_groups: list[str] | None
    link: str | None
    job_id: int | None
    error: str | None
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class StoredNetwork:
    """A network as stored: what was asked, and its state on each backend (``backends``).

    ``status`` sums the backends up: ``deleting`` once a delete began, else ``error`` if
    any backend is in error, ``pending`` if any is pending, else ``active``. ``link`` None
    and ``groups`` None mean each backend's default NIC link and every group it has.
    """

    id: str
    name: str
    subnet: str
    gateway: str | None
    mac_prefix: str | None
    mode: str
    link: str | None
    groups: list[str] | dict[str, list[str]] | None
    tags: list[str]
    status: NetworkState
    created_at: datetime
    updated_at: datetime
    backends: dict[str, NetworkOnBackend] = field(default_factory=dict)

    def on(self, backend: str) -> NetworkOnBackend | None:
        """Its state on ``backend``; None: not on that backend."""
        return self.backends.get(backend)


#: a backend's row before its first job: pending, connected to nothing yet
_NEW_ROW: dict[str, Any] = {
    "state": NetworkState.PENDING.value,
    "groups": [],
    "want_groups": None,
    "link": None,
    "job_id": None,
    "error": None,
}


def _now() -> datetime:
    return datetime.now(UTC)


def _status(row: Row[Any], backends: Iterable[NetworkOnBackend]) -> NetworkState:
    states = {on.state for on in backends}
    if row.status == NetworkState.DELETING.value:
        return NetworkState.DELETING
    for state in (NetworkState.ERROR, NetworkState.PENDING, NetworkState.DELETING):
        if state in states:
            return state
    return NetworkState.ACTIVE


def _network_id(conn: Connection, name: str) -> int:
    found = conn.execute(select(networks_t.c.id).where(networks_t.c.name == name)).scalar()
    if found is None:
        raise NotFoundError(f"network {name} is not in the database; list them with list_networks()")
    return int(found)


def read_networks(conn: Connection) -> list[StoredNetwork]:
    """Every network, by name, on a synchronous connection (:meth:`NetworkStore.all`; the
    reconciler's pass reads them once, in its snapshot)."""
    return _read(conn, None)


def _read(conn: Connection, name: str | None) -> list[StoredNetwork]:
    query = select(networks_t).order_by(networks_t.c.name)
    if name is not None:
        query = query.where(networks_t.c.name == name)
    rows = list(conn.execute(query))
    if not rows:
        return []
    per = (
        select(network_backends_t, backends_t.c.name.label("backend"))
        .join(backends_t, backends_t.c.id == network_backends_t.c.backend_id)
        .where(network_backends_t.c.network_id.in_([row.id for row in rows]))
        .order_by(backends_t.c.name)
    )
    on: dict[int, dict[str, NetworkOnBackend]] = {}
    for b in conn.execute(per):
        on.setdefault(b.network_id, {})[b.backend] = NetworkOnBackend(
            backend=b.backend,
            state=NetworkState(b.state),
            groups=list(b.groups or []),
            want_groups=None if b.want_groups is None else list(b.want_groups),
            link=b.link,
            job_id=b.job_id,
            error=b.error,
            updated_at=b.updated_at,
        )
    return [
        StoredNetwork(
            id=row.uuid,
            name=row.name,
            subnet=row.subnet,
            gateway=row.gateway,
            mac_prefix=row.mac_prefix,
            mode=row.mode,
            link=row.link,
            groups=row.groups,
            tags=list(row.tags or []),
            status=_status(row, on.get(row.id, {}).values()),
            created_at=row.created_at,
            updated_at=row.updated_at,
            backends=on.get(row.id, {}),
        )
        for row in rows
    ]


class NetworkStore:
    """The networks of one :class:`Store` (``NetworkStore(store)``; it holds no state of its own)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def __repr__(self) -> str:
        return f"<NetworkStore {self.store.display_url}>"

    async def add(
        self,
        name: str,
        *,
        subnet: str,
        gateway: str | None,
        mac_prefix: str | None,
        mode: str,
        link: str | None,
        groups: Sequence[str] | dict[str, list[str]] | None,
        tags: Sequence[str],
        backends: Sequence[str],
    ) -> StoredNetwork:
        """Write the network and a ``pending`` row per backend; a name taken: :class:`ConflictError`."""
        ids = {backend: await self.store.ensure_backend(backend) for backend in backends}

        def run(conn: Connection) -> None:
            taken = conn.execute(select(networks_t.c.status).where(networks_t.c.name == name)).scalar()
            if taken is not None:
                raise ConflictError(
                    f"network name {name} is taken (a network {taken} in the database); "
                    "choose another name, or delete that network first"
                )
            now = _now()
            network_id = conn.execute(
                insert(networks_t)
                .values(
                    uuid=str(uuid4()),
                    name=name,
                    subnet=subnet,
                    gateway=gateway,
                    mac_prefix=mac_prefix,
                    mode=mode,
                    link=link,
                    groups=None
                    if groups is None
                    else (dict(groups) if isinstance(groups, dict) else list(groups)),
                    tags=list(tags),
                    status=NetworkState.ACTIVE.value,
                    created_at=now,
                    updated_at=now,
                )
                .returning(networks_t.c.id)
            ).scalar_one()
            if ids:
                conn.execute(
                    insert(network_backends_t),
                    [
                        {"network_id": network_id, "backend_id": backend_id, "updated_at": now} | _NEW_ROW
                        for backend_id in ids.values()
                    ],
                )

        await self.store.call(run)
        return await self.require(name)

    async def get(self, name: str) -> StoredNetwork | None:
        """The network named ``name``; None: the database has none."""
        found = await self.store.call_read(lambda conn: _read(conn, name))
        return found[0] if found else None

    async def require(self, name: str) -> StoredNetwork:
        """The network named ``name``; :class:`NotFoundError` when the database has none."""
        found = await self.get(name)
        if found is None:
            raise NotFoundError(f"network {name} is not in the database; list them with list_networks()")
        return found

    async def all(self) -> list[StoredNetwork]:
        """Every network, by name."""
        return await self.store.call_read(lambda conn: _read(conn, None))

    async def set_backend(self, name: str, backend: str, **values: Any) -> None:
        """Change a backend's row (``state``, ``groups``, ``want_groups``, ``link``, ``job_id``,
        ``error``); one the network lacks is added (the reconciler re-creating a network)."""
        allowed = {"state", "groups", "want_groups", "link", "job_id", "error"}
        unknown = set(values) - allowed
        if unknown:
            raise ValueError(
                f"network backend columns {sorted(unknown)} cannot be set; only {sorted(allowed)}"
            )
        if isinstance(values.get("state"), NetworkState):
            values["state"] = values["state"].value
        backend_id = await self.store.ensure_backend(backend)

        def run(conn: Connection) -> None:
            network_id = _network_id(conn, name)
            now = _now()
            where = (network_backends_t.c.network_id == network_id) & (
                network_backends_t.c.backend_id == backend_id
            )
            if conn.execute(
                update(network_backends_t).where(where).values(updated_at=now, **values)
            ).rowcount:
                return
            row = _NEW_ROW | values
            conn.execute(
                insert(network_backends_t).values(
                    network_id=network_id, backend_id=backend_id, updated_at=now, **row
                )
            )

        await self.store.call(run)

    async def set_status(self, name: str, status: NetworkState) -> None:
        """The network's own status (``active``, or ``deleting`` once a delete began)."""

        def run(conn: Connection) -> None:
            network_id = _network_id(conn, name)
            conn.execute(
                update(networks_t)
                .where(networks_t.c.id == network_id)
                .values(status=status.value, updated_at=_now())
            )

        await self.store.call(run)

    async def remove_backend(self, name: str, backend: str) -> None:
        """The network is gone from ``backend``: its row goes."""
        backend_id = await self.store.ensure_backend(backend)

        def run(conn: Connection) -> None:
            network_id = _network_id(conn, name)
            conn.execute(
                delete(network_backends_t).where(
                    (network_backends_t.c.network_id == network_id)
                    & (network_backends_t.c.backend_id == backend_id)
                )
            )

        await self.store.call(run)

    async def remove(self, name: str) -> None:
        """The network is gone from every backend: its rows go, its name is free again."""

        def run(conn: Connection) -> None:
            network_id = _network_id(conn, name)
            conn.execute(delete(network_backends_t).where(network_backends_t.c.network_id == network_id))
            conn.execute(delete(networks_t).where(networks_t.c.id == network_id))

        await self.store.call(run)

    async def users(self, name: str) -> list[tuple[str, str]]:
        """(backend, instance name) of each stored instance not DESTROYED with a NIC on ``name``."""

        def run(conn: Connection) -> list[tuple[str, str]]:
            query = (
                select(instances_t.c.name, instances_t.c.nics, backends_t.c.name.label("backend"))
                .join(backends_t, backends_t.c.id == instances_t.c.backend_id)
                .where(instances_t.c.status != InstanceStatus.DESTROYED.value)
                .order_by(backends_t.c.name, instances_t.c.name)
            )
            return [
                (row.backend, row.name)
                for row in conn.execute(query)
                if any(isinstance(nic, dict) and nic.get("network") == name for nic in row.nics or [])
            ]

        return await self.store.call_read(run)
