"""The facade's capacity (how many more instances of a flavor fit, now and keeping N+1): :class:`CapacityMethods`, a base of :class:`~synnefo_ganeti.ControlPlane`.

``await cp.capacity(flavors)`` reads every backend at once (``GET /2/info`` for the instance
policy and templates, ``/2/nodes?bulk=1``, ``/2/instances?bulk=1`` for what the nodes hold,
``/2/groups?bulk=1`` for group names: four reads a backend, together) and counts with the pure
:func:`~synnefo_ganeti.allocate.count_capacity`, which follows hspace. A backend that does not
answer (in its ``timeout``, else :data:`CAPACITY_TIMEOUT` seconds) gets its error in its
entry; the others are counted all the same.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from synnefo_ganeti.allocate import (
    Flavor,
    FlavorCapacity,
    InstancePolicy,
    capacity_nodes,
    count_capacity,
    hosted_instances,
)
from synnefo_ganeti.errors import ConfigError, GanetiError, NotFoundError
from synnefo_ganeti.rapi import RapiClient

if TYPE_CHECKING:
    from synnefo_ganeti.config import Settings
    from synnefo_ganeti.store import Store

__all__ = ["CAPACITY_TIMEOUT", "BackendCapacity", "CapacityMethods", "default_template"]

#: seconds a backend's four reads may take together when its settings give no ``timeout``
CAPACITY_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True)
class BackendCapacity:
    """One backend's counts, read at ``read_at``: one :class:`~synnefo_ganeti.allocate.FlavorCapacity`
    per flavor asked (the policy's standard size when none was), on ``nodes`` usable nodes of
    ``nodes_total``; or ``error`` when it did not answer."""

    backend: str
    read_at: datetime
    cluster: str | None = None
    template: str | None = None
    nodes: int = 0
    nodes_total: int = 0
    flavors: tuple[FlavorCapacity, ...] = ()
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "read_at": self.read_at.isoformat(),
            "cluster": self.cluster,
            "template": self.template,
            "nodes": self.nodes,
            "nodes_total": self.nodes_total,
            "flavors": [flavor.to_json() for flavor in self.flavors],
            "error": self.error,
        }


class CapacityMethods:
    """capacity on the facade (see the module)."""

    if TYPE_CHECKING:

        @property
        def store(self) -> Store: ...

        @property
        def settings(self) -> Settings: ...

        async def client(self, backend: str) -> RapiClient: ...

    async def capacity(
        self,
        flavors: Sequence[Flavor] = (),
        *,
        backends: Sequence[str] | None = None,
        template: str | None = None,
    ) -> list[BackendCapacity]:
        """How many more instances of each flavor fit on each backend (every one, or those
        named in ``backends``), now and keeping N+1, read concurrently, sorted by backend.

        No ``flavors``: each backend's standard size (its policy's ``std``). ``template``: the
        disk template to count for (default: each backend's first enabled one its policy
        allows). :class:`NotFoundError` for an unknown backend."""
        names = sorted(self._capacity_backend(name) for name in backends) if backends else None
        if names is None:
            names = sorted(b.name for b in self.settings.backends)
        return list(
            await asyncio.gather(*(self._backend_capacity(n, tuple(flavors), template) for n in names))
        )

    def _capacity_backend(self, name: str) -> str:
        try:
            return self.settings.backend(name).name
        except ConfigError as exc:
            raise NotFoundError(str(exc)) from None

    async def _backend_capacity(
        self, backend: str, flavors: tuple[Flavor, ...], template: str | None
    ) -> BackendCapacity:
        read_at = datetime.now(UTC)
        timeout = self.settings.backend(backend).timeout or CAPACITY_TIMEOUT
        try:
            client = await self.client(backend)
            async with asyncio.timeout(timeout):
                info, nodes, instances, groups = await asyncio.gather(
                    client.info(), client.list_nodes(), client.list_instances(), client.list_groups()
                )
        except TimeoutError:
            return BackendCapacity(backend, read_at, error=f"no answer within {timeout:g} s")
        except (GanetiError, OSError) as exc:
            return BackendCapacity(backend, read_at, error=str(exc) or type(exc).__name__)
        policy = InstancePolicy.of(info.ipolicy)
        chosen = template or default_template(info.enabled_disk_templates, policy)
        group_names = {group.uuid: group.name for group in groups if group.uuid}
        counted = capacity_nodes(nodes, hosted_instances(instances), groups=group_names)
        base = BackendCapacity(
            backend,
            read_at,
            cluster=info.name,
            template=chosen,
            nodes=sum(1 for node in counted if node.usable),
            nodes_total=len(counted),
        )
        if chosen is None:
            return replace(base, error="no disk template is both enabled and allowed by the policy")
        wanted = flavors or tuple(f for f in (Flavor.standard(policy),) if f is not None)
        if not wanted:
            return replace(base, error="no flavor given and the instance policy has no standard size")
        counts = tuple(count_capacity(counted, policy, flavor, chosen) for flavor in wanted)
        return replace(base, flavors=counts)


def default_template(enabled: Sequence[str], policy: InstancePolicy) -> str | None:
    """The first enabled disk template the policy allows (Ganeti's default is the first enabled)."""
    allowed = set(policy.disk_templates) if policy.disk_templates else None
    return next((t for t in enabled if allowed is None or t in allowed), None)
