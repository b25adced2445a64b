"""Node group RAPI calls: list, info, create, modify, rename, assign nodes, delete, tags.

Each method follows Ganeti 3.0's own client (``GanetiRapiClient``, ``lib/rapi/client.py``) for the
HTTP method, path, query and body; ``lib/rapi/rlib2.py`` (``R_2_groups*``) for their meaning.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from synnefo_ganeti.errors import ConfigError
from synnefo_ganeti.rapi._base import RapiBase, choice, query_args
from synnefo_ganeti.rapi._calls import ALLOC_POLICIES
from synnefo_ganeti.rapi._models import Group

__all__ = ["GroupApi"]


class GroupApi(RapiBase):
    """``/2/groups`` and everything under ``/2/groups/NAME``."""

    async def list_groups(self) -> list[Group]:
        """Every node group (``GET /2/groups?bulk=1``)."""
        return self._parse_list(Group, await self._get("/2/groups", {"bulk": "1"}), "GET /2/groups?bulk=1")

    async def get_group(self, name: str, *, reason: str | None = None) -> Group:
        """One node group (``GET /2/groups/NAME``); :class:`NotFoundError` if Ganeti has none."""
        path = self._path("groups", name)
        return self._parse(Group, await self._get(path, query_args(reason=reason)), f"GET {path}")

    async def create_group(
        self,
        name: str,
        *,
        alloc_policy: str | None = None,
        dry_run: bool = False,
        reason: str | None = None,
    ) -> int:
        """Create a node group (``POST /2/groups``); returns the job id.

        ``alloc_policy`` is preferred, last_resort or unallocable (Ganeti's default when not given).
        Not sent again after an unknown outcome: a second create of the name would fail anyway.
        """
        if not name:
            raise ConfigError("group name is empty")
        if alloc_policy is not None:
            choice(alloc_policy, ALLOC_POLICIES, "alloc_policy")
        body = {"name": name, "alloc_policy": alloc_policy}
        return await self._write_job("POST", "/2/groups", body, query_args(dry_run=dry_run, reason=reason))

    async def modify_group(self, name: str, *, reason: str | None = None, **params: Any) -> int:
        """Change a node group's parameters (``PUT /2/groups/NAME/modify``); returns the job id.

        ``params`` are Ganeti's (``alloc_policy=...``, ``ndparams={...}``, ``ipolicy={...}``).
        """
        if not params:
            raise ConfigError(f"modify_group({name!r}) needs at least one parameter to change")
        path = self._path("groups", name, "modify")
        return await self._write_job("PUT", path, params, query_args(reason=reason))

    async def rename_group(self, name: str, new_name: str, *, reason: str | None = None) -> int:
        """Rename a node group (``PUT /2/groups/NAME/rename``); returns the job id."""
        if not new_name:
            raise ConfigError(f"rename_group({name!r}): the new name is empty")
        path = self._path("groups", name, "rename")
        return await self._write_job("PUT", path, {"new_name": new_name}, query_args(reason=reason))

    async def assign_group_nodes(
        self,
        name: str,
        nodes: Iterable[str],
        *,
        force: bool = False,
        dry_run: bool = False,
        reason: str | None = None,
    ) -> int:
        """Move nodes into a node group (``PUT /2/groups/NAME/assign-nodes``); returns the job id."""
        if isinstance(nodes, str):
            raise ConfigError(f"nodes must be a list of node names, not the string {nodes!r}")
        members = [str(node) for node in nodes]
        if not members:
            raise ConfigError(f"assign_group_nodes({name!r}) needs at least one node")
        path = self._path("groups", name, "assign-nodes")
        query = query_args(force=force, dry_run=dry_run, reason=reason)
        return await self._write_job("PUT", path, {"nodes": members}, query)

    async def delete_group(self, name: str, *, dry_run: bool = False, reason: str | None = None) -> int:
        """Remove an empty node group (``DELETE /2/groups/NAME``); returns the job id."""
        path = self._path("groups", name)
        return await self._write_job("DELETE", path, None, query_args(dry_run=dry_run, reason=reason))

    # ------------------------------------------------------------------ tags

    async def get_group_tags(self, name: str, *, reason: str | None = None) -> list[str]:
        """A node group's tags (``GET /2/groups/NAME/tags``)."""
        return await self._get_tags(self._path("groups", name, "tags"), reason)

    async def add_group_tags(
        self, name: str, tags: Iterable[str], *, dry_run: bool = False, reason: str | None = None
    ) -> int:
        """Add tags to a node group (``PUT /2/groups/NAME/tags?tag=...``); returns the job id."""
        path = self._path("groups", name, "tags")
        return await self._tag_job("PUT", path, tags, dry_run=dry_run, reason=reason)

    async def delete_group_tags(
        self, name: str, tags: Iterable[str], *, dry_run: bool = False, reason: str | None = None
    ) -> int:
        """Remove tags from a node group (``DELETE /2/groups/NAME/tags?tag=...``); returns the job id."""
        path = self._path("groups", name, "tags")
        return await self._tag_job("DELETE", path, tags, dry_run=dry_run, reason=reason)
