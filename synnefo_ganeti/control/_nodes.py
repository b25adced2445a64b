"""The facade's nodes, node, drain_node, undrain_node (reading and draining nodes): :class:`NodeMethods`, a base of :class:`~synnefo_ganeti.ControlPlane`.

Reads ask Ganeti (``GET /2/nodes?bulk=1`` and ``/2/groups?bulk=1``, every backend at once) and
join what the dispatcher last stored of each node (``backend_nodes``: up, down or offline, since
when); :func:`~synnefo_ganeti.allocate._node_info.node_info` builds each answer (pure). A backend
that does not answer within its timeout is one :class:`BackendNodes` with ``error`` set, not a
failure of the listing.

Draining is Ganeti's node modify (``POST /2/nodes/NAME/modify``, ``OP_NODE_SET_PARAMS`` with
``drained``), the job followed to its end. Errors: an unknown backend or node is a
:class:`NotFoundError`; Ganeti's refusal to drain the master (only a master failover changes its
role) a :class:`ConflictError` that says what to do; any other failed job a
:class:`JobFailedError`.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from synnefo_ganeti.allocate._node_info import BackendNodes, NodeInfo, master_refusal, node_info
from synnefo_ganeti.errors import (
    ConfigError,
    ConflictError,
    GanetiError,
    JobFailedError,
    NotFoundError,
)
from synnefo_ganeti.rapi import JobStatus, RapiClient
from synnefo_ganeti.rapi._base import job_priority
from synnefo_ganeti.rapi._models import JobFailure

if TYPE_CHECKING:
    from synnefo_ganeti.config import Settings
    from synnefo_ganeti.store import Store

__all__ = ["DRAIN_TIMEOUT", "NODES_TIMEOUT", "NodeMethods"]

#: seconds a backend has to list its nodes when its settings set no ``timeout``
NODES_TIMEOUT = 30.0
#: seconds a drain or undrain job may take (it waits for the node's lock: a create running there)
DRAIN_TIMEOUT = 300.0


class NodeMethods:
    """nodes, node, drain_node, undrain_node on the facade (see the module)."""

    if TYPE_CHECKING:

        @property
        def store(self) -> Store: ...

        @property
        def settings(self) -> Settings: ...

        async def client(self, backend: str) -> RapiClient: ...

    async def nodes(self, backend: str | None = None) -> list[BackendNodes]:
        """Every node of every backend (or of ``backend`` only), read concurrently, sorted by
        backend; a backend that does not answer is listed with its ``error``.
        :class:`NotFoundError` for an unknown ``backend``."""
        names = [self._known_backend(backend)] if backend is not None else self._backend_names()
        stored = await self._stored_nodes(backend)
        return list(
            await asyncio.gather(*(self._backend_nodes(name, stored.get(name, {})) for name in names))
        )

    async def node(self, backend: str, name: str) -> NodeInfo:
        """One node of ``backend``; :class:`NotFoundError` for an unknown backend or node."""
        self._known_backend(backend)
        client = await self.client(backend)
        read_at = datetime.now(UTC)
        try:
            node, groups = await asyncio.gather(client.get_node(name), _group_names(client))
        except NotFoundError:
            raise NotFoundError(f"backend {backend} has no node {name!r}", url=client.url) from None
        stored = (await self._stored_nodes(backend)).get(backend, {})
        return node_info(backend, node, read_at=read_at, groups=groups, stored=stored.get(node.name))

    async def drain_node(
        self, backend: str, name: str, *, timeout: float = DRAIN_TIMEOUT, priority: int | None = None
    ) -> NodeInfo:
        """Drain ``name`` on ``backend`` (Ganeti places nothing new there; what runs stays); the
        node as it is after; the job at ``priority`` (Ganeti's default when None). :class:`ConflictError`
        for the master."""
        return await self._set_drained(backend, name, True, timeout, priority)

    async def undrain_node(
        self, backend: str, name: str, *, timeout: float = DRAIN_TIMEOUT, priority: int | None = None
    ) -> NodeInfo:
        """Undrain ``name`` on ``backend`` (it takes new instances again); the node as it is after."""
        return await self._set_drained(backend, name, False, timeout, priority)

    # -- helpers -----------------------------------------------------------------------------------

    def _backend_names(self) -> list[str]:
        return sorted(b.name for b in self.settings.backends)

    def _known_backend(self, backend: str) -> str:
        try:
            return self.settings.backend(backend).name
        except ConfigError as exc:
            raise NotFoundError(str(exc)) from None

    async def _stored_nodes(self, backend: str | None) -> dict[str, dict[str, dict[str, Any]]]:
        """backend -> node -> its ``backend_nodes`` row (empty when the database cannot say)."""
        try:
            rows = await self.store.backend_nodes(backend)
        except GanetiError:  # the figures are Ganeti's; the dispatcher's reads are a bonus
            return {}
        return {name: {row["name"]: row for row in nodes} for name, nodes in rows.items()}

    async def _backend_nodes(self, backend: str, stored: dict[str, dict[str, Any]]) -> BackendNodes:
        read_at = datetime.now(UTC)
        timeout = self.settings.backend(backend).timeout or NODES_TIMEOUT
        try:
            client = await self.client(backend)
            async with asyncio.timeout(timeout):
                nodes, groups = await asyncio.gather(client.list_nodes(), _group_names(client))
        except TimeoutError:
            return BackendNodes(backend, (), f"no answer within {timeout:g} s", read_at)
        except (GanetiError, OSError) as exc:
            return BackendNodes(backend, (), str(exc) or type(exc).__name__, read_at)
        infos = sorted(
            (node_info(backend, n, read_at=read_at, groups=groups, stored=stored.get(n.name)) for n in nodes),
            key=lambda info: info.name,
        )
        return BackendNodes(backend, tuple(infos), None, read_at)

    async def _set_drained(
        self, backend: str, name: str, drained: bool, timeout: float, priority: int | None = None
    ) -> NodeInfo:
        before = await self.node(backend, name)  # NotFoundError for an unknown backend or node
        client = await self.client(backend)
        what = "drain" if drained else "undrain"
        extra = {"priority": job_priority(priority)} if priority is not None else {}
        job_id = await client.modify_node(
            before.name, drained=drained, reason=f"synnefo-ganeti nodes {what}", **extra
        )
        job = await client.wait_for_job(job_id, timeout=timeout)
        if job.status is not JobStatus.SUCCESS:
            failure = job.failure or JobFailure(
                type="JobCanceled", message=f"job {job_id} {job.status.value}"
            )
            if master_refusal(failure.message):
                raise ConflictError(
                    f"node {before.name} is the master of backend {backend}: Ganeti changes the master's "
                    f"role only by a master failover (job {job_id}: {failure.message}); run "
                    "'gnt-cluster master-failover' on a master candidate first, then drain this node",
                    url=client.url,
                )
            raise JobFailedError(
                f"{what} of node {before.name} on backend {backend}: job {job_id} {job.status.value}: "
                f"{failure.type}: {failure.message}",
                url=client.url,
                job_id=job_id,
                failure=failure,
            )
        return await self.node(backend, before.name)


async def _group_names(client: RapiClient) -> dict[str, str]:
    """Node group uuid -> name (empty when Ganeti does not list them)."""
    try:
        groups = await client.list_groups()
    except NotFoundError:
        return {}
    return {g.uuid: g.name for g in groups if g.uuid is not None}
