"""Node RAPI calls: list, info, role, evacuate, migrate, modify, powercycle, storage units, tags.

Each method follows Ganeti 3.0's own client (``GanetiRapiClient``, ``lib/rapi/client.py``) for the
HTTP method, path, query and body, in its current form: ``evacuate_node`` and ``migrate_node``
send the body Ganeti has taken since 2.5 (features ``node-evac-res1``, ``node-migrate-reqv1``)
without asking ``/2/features`` first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, cast

from synnefo_ganeti.errors import ConfigError, RapiError
from synnefo_ganeti.rapi._base import RapiBase, choice, query_args, some_body
from synnefo_ganeti.rapi._calls import (
    MIGRATION_MODES,
    NODE_EVACUATE_MODES,
    NODE_ROLES,
    SETTABLE_NODE_ROLES,
    STORAGE_TYPES,
    NodeRole,
)
from synnefo_ganeti.rapi._models import Node

__all__ = ["NodeApi"]


class NodeApi(RapiBase):
    """``/2/nodes`` and everything under ``/2/nodes/NAME``."""

    async def list_nodes(self) -> list[Node]:
        """Every node with its capacity (``GET /2/nodes?bulk=1``)."""
        answer = await self._get("/2/nodes", {"bulk": "1"})
        return [self._parse(Node, item, "GET /2/nodes?bulk=1") for item in answer]

    async def get_node(self, name: str, *, reason: str | None = None) -> Node:
        """One node (``GET /2/nodes/NAME``); :class:`NotFoundError` if Ganeti has none."""
        path = self._path("nodes", name)
        return self._parse(Node, await self._get(path, query_args(reason=reason)), f"GET {path}")

    async def get_node_role(self, name: str, *, reason: str | None = None) -> NodeRole:
        """The node's role (``GET /2/nodes/NAME/role``): master, master-candidate, regular, drained
        or offline."""
        path = self._path("nodes", name, "role")
        answer = await self._get(path, query_args(reason=reason))
        if answer not in NODE_ROLES:
            raise RapiError(f"{self.where}: GET {path} answered {answer!r}, not a node role", url=self.url)
        return cast(NodeRole, answer)

    async def set_node_role(
        self,
        name: str,
        role: NodeRole,
        *,
        force: bool = False,
        auto_promote: bool | None = None,
        reason: str | None = None,
    ) -> int:
        """Set the node's role (``PUT /2/nodes/NAME/role``, the role as the JSON body); job id.

        ``role`` is regular, master-candidate, drained or offline (a node becomes master only
        by ``gnt-cluster master-failover``).
        """
        if role == "master":
            raise ConfigError(
                "a node's role cannot be set to master through RAPI; run 'gnt-cluster master-failover' "
                "on the new master instead"
            )
        choice(role, SETTABLE_NODE_ROLES, "role")
        query = query_args(("auto-promote", auto_promote), force=force, reason=reason)
        return await self._write_job("PUT", self._path("nodes", name, "role"), role, query)

    async def evacuate_node(
        self,
        name: str,
        *,
        iallocator: str | None = None,
        remote_node: str | None = None,
        mode: str | None = None,
        early_release: bool | None = None,
        dry_run: bool = False,
        reason: str | None = None,
    ) -> int:
        """Move the instances off a node (``POST /2/nodes/NAME/evacuate``); returns the job id.

        ``mode`` is all, primary-only or secondary-only; give ``iallocator`` or ``remote_node``,
        not both. The job's result lists the jobs that move each instance.
        """
        if iallocator and remote_node:
            raise ConfigError("evacuate_node takes iallocator or remote_node, not both")
        if mode is not None:
            choice(mode, NODE_EVACUATE_MODES, "evacuation mode")
        body = some_body(
            iallocator=iallocator, remote_node=remote_node, early_release=early_release, mode=mode
        )
        query = query_args(dry_run=dry_run, reason=reason)
        return await self._write_job("POST", self._path("nodes", name, "evacuate"), body, query)

    async def migrate_node(
        self,
        name: str,
        *,
        mode: str | None = None,
        iallocator: str | None = None,
        target_node: str | None = None,
        dry_run: bool = False,
        reason: str | None = None,
    ) -> int:
        """Migrate every primary instance off a node (``POST /2/nodes/NAME/migrate``); job id.

        ``mode`` is live or non-live (the hypervisor's default when not given).
        """
        if mode is not None:
            choice(mode, MIGRATION_MODES, "migration mode")
        body = some_body(mode=mode, iallocator=iallocator, target_node=target_node)
        query = query_args(dry_run=dry_run, reason=reason)
        return await self._write_job("POST", self._path("nodes", name, "migrate"), body, query)

    async def modify_node(self, name: str, *, reason: str | None = None, **params: Any) -> int:
        """Change a node's parameters (``POST /2/nodes/NAME/modify``, ``OP_NODE_SET_PARAMS``); job id.

        ``params`` are Ganeti's (``drained=True``, ``ndparams={...}``, ``secondary_ip=...``).
        """
        if not params:
            raise ConfigError(f"modify_node({name!r}) needs at least one parameter to change")
        return await self._write_job(
            "POST", self._path("nodes", name, "modify"), params, query_args(reason=reason)
        )

    async def powercycle_node(self, name: str, *, force: bool = False, reason: str | None = None) -> int:
        """Power-cycle a node (``POST /2/nodes/NAME/powercycle``); returns the job id."""
        query = query_args(force=force, reason=reason)
        return await self._write_job("POST", self._path("nodes", name, "powercycle"), None, query)

    # ------------------------------------------------------------------ storage units

    async def get_node_storage_units(
        self, name: str, storage_type: str, output_fields: Sequence[str] | str, *, reason: str | None = None
    ) -> int:
        """Ask for a node's storage units (``GET /2/nodes/NAME/storage``); returns the job id.

        Ganeti answers with a job (``OP_NODE_QUERY_STORAGE``, write access needed) whose result
        holds one row of ``output_fields`` per unit (``["name", "size", "used", "free"]``).
        """
        fields = output_fields if isinstance(output_fields, str) else ",".join(output_fields)
        if not fields:
            raise ConfigError("get_node_storage_units needs at least one output field (name, size, ...)")
        query = query_args(
            ("storage_type", choice(storage_type, STORAGE_TYPES, "storage_type")),
            ("output_fields", fields),
            reason=reason,
        )
        return await self._get_job(self._path("nodes", name, "storage"), query)

    async def modify_node_storage_units(
        self,
        name: str,
        storage_type: str,
        unit: str,
        *,
        allocatable: bool | None = None,
        reason: str | None = None,
    ) -> int:
        """Change a storage unit of a node (``PUT /2/nodes/NAME/storage/modify``); job id.

        ``unit`` is the unit's name (Ganeti's ``name`` query parameter), e.g. a PV's device.
        """
        query = self._storage_query(storage_type, unit, reason, ("allocatable", allocatable))
        return await self._write_job("PUT", self._path("nodes", name, "storage/modify"), None, query)

    async def repair_node_storage_units(
        self, name: str, storage_type: str, unit: str, *, reason: str | None = None
    ) -> int:
        """Repair a storage unit of a node (``PUT /2/nodes/NAME/storage/repair``); job id."""
        query = self._storage_query(storage_type, unit, reason)
        return await self._write_job("PUT", self._path("nodes", name, "storage/repair"), None, query)

    @staticmethod
    def _storage_query(
        storage_type: str, unit: str, reason: str | None, *more: tuple[str, bool | None]
    ) -> list[tuple[str, str]]:
        if not unit:
            raise ConfigError("the storage unit's name is empty")
        return query_args(
            ("storage_type", choice(storage_type, STORAGE_TYPES, "storage_type")),
            ("name", unit),
            *more,
            reason=reason,
        )

    # ------------------------------------------------------------------ tags

    async def get_node_tags(self, name: str, *, reason: str | None = None) -> list[str]:
        """A node's tags (``GET /2/nodes/NAME/tags``)."""
        return await self._get_tags(self._path("nodes", name, "tags"), reason)

    async def add_node_tags(
        self, name: str, tags: Iterable[str], *, dry_run: bool = False, reason: str | None = None
    ) -> int:
        """Add tags to a node (``PUT /2/nodes/NAME/tags?tag=...``); returns the job id.

        As Ganeti's client does, the tags also travel as the JSON body.
        """
        names = _tag_list(tags)
        path = self._path("nodes", name, "tags")
        return await self._tag_job("PUT", path, names, dry_run=dry_run, reason=reason, body=names)

    async def delete_node_tags(
        self, name: str, tags: Iterable[str], *, dry_run: bool = False, reason: str | None = None
    ) -> int:
        """Remove tags from a node (``DELETE /2/nodes/NAME/tags?tag=...``); returns the job id."""
        path = self._path("nodes", name, "tags")
        return await self._tag_job("DELETE", path, tags, dry_run=dry_run, reason=reason)


def _tag_list(tags: Iterable[str]) -> list[str]:
    if isinstance(tags, str):
        raise ConfigError(f"tags must be a list of strings, not the string {tags!r}")
    return [str(tag) for tag in tags]
