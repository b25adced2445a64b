"""Network RAPI calls: list, info, create, connect, disconnect, modify, rename, delete, tags.

Each method follows Ganeti 3.0's own client (``GanetiRapiClient``, ``lib/rapi/client.py``) for the
HTTP method, path, query and body; ``lib/rapi/rlib2.py`` (``R_2_networks*``) for their meaning.
Where Ganeti's client takes comma-joined strings (``add_reserved_ips``, ``tags``), these take lists.
``rename_network`` is Ganeti 3.1's (``RenameNetwork``, ``R_2_networks_name_rename``): on an earlier
backend it raises :class:`UnsupportedError` before sending anything.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from synnefo_ganeti.errors import ConfigError
from synnefo_ganeti.rapi._api_versions import VersionApi
from synnefo_ganeti.rapi._base import choice, query_args
from synnefo_ganeti.rapi._calls import NETWORK_MODES
from synnefo_ganeti.rapi._models import Network
from synnefo_ganeti.rapi._versions import require_network_rename

__all__ = ["NetworkApi"]


class NetworkApi(VersionApi):
    """``/2/networks`` and everything under ``/2/networks/NAME``."""

    async def list_networks(self) -> list[Network]:
        """Every network (``GET /2/networks?bulk=1``)."""
        answer = await self._get("/2/networks", {"bulk": "1"})
        return self._parse_list(Network, answer, "GET /2/networks?bulk=1")

    async def get_network(self, name: str, *, reason: str | None = None) -> Network:
        """One network (``GET /2/networks/NAME``); :class:`NotFoundError` if Ganeti has none."""
        path = self._path("networks", name)
        return self._parse(Network, await self._get(path, query_args(reason=reason)), f"GET {path}")

    async def create_network(
        self,
        name: str,
        network: str,
        *,
        gateway: str | None = None,
        network6: str | None = None,
        gateway6: str | None = None,
        mac_prefix: str | None = None,
        add_reserved_ips: Iterable[str] | None = None,
        tags: Iterable[str] | None = None,
        dry_run: bool = False,
        reason: str | None = None,
    ) -> int:
        """Create a network (``POST /2/networks``): ``network`` is its IPv4 subnet (``10.0.0.0/24``);
        returns the job id. Not sent again after an unknown outcome."""
        if not name:
            raise ConfigError("network name is empty")
        if not network:
            raise ConfigError(f"create_network({name!r}): the IPv4 subnet (network=) is empty")
        body = {
            "network_name": name,
            "gateway": gateway,
            "network": network,
            "gateway6": gateway6,
            "network6": network6,
            "mac_prefix": mac_prefix,
            "add_reserved_ips": _list_or_none(add_reserved_ips, "add_reserved_ips"),
        }
        # Ganeti's own client sends "tags": null, which 3.1 refuses (400: "Parameter
        # 'OP_NETWORK_ADD.tags' fails validation", seen on the 3.1 lab): no tags, no key
        named_tags = _list_or_none(tags, "tags")
        if named_tags is not None:
            body["tags"] = named_tags
        query = query_args(dry_run=dry_run, reason=reason)
        return await self._write_job("POST", "/2/networks", body, query)

    async def connect_network(
        self,
        name: str,
        group: str,
        mode: str,
        link: str,
        *,
        vlan: str = "",
        dry_run: bool = False,
        reason: str | None = None,
    ) -> int:
        """Connect a network to a node group (``PUT /2/networks/NAME/connect``); returns the job id.

        ``mode`` is bridged, routed, openvswitch or pool; ``link`` the bridge or routing table.
        """
        choice(mode, NETWORK_MODES, "network mode")
        body = {"group_name": group, "network_mode": mode, "network_link": link, "network_vlan": vlan}
        path = self._path("networks", name, "connect")
        return await self._write_job("PUT", path, body, query_args(dry_run=dry_run, reason=reason))

    async def disconnect_network(
        self, name: str, group: str, *, dry_run: bool = False, reason: str | None = None
    ) -> int:
        """Disconnect a network from a node group (``PUT /2/networks/NAME/disconnect``); job id."""
        path = self._path("networks", name, "disconnect")
        query = query_args(dry_run=dry_run, reason=reason)
        return await self._write_job("PUT", path, {"group_name": group}, query)

    async def modify_network(self, name: str, *, reason: str | None = None, **params: Any) -> int:
        """Change a network's parameters (``PUT /2/networks/NAME/modify``); returns the job id.

        ``params`` are Ganeti's (``gateway=...``, ``add_reserved_ips=[...]``, ...). Unlike
        Ganeti's client, which drops it here, ``reason`` is sent.
        """
        if not params:
            raise ConfigError(f"modify_network({name!r}) needs at least one parameter to change")
        path = self._path("networks", name, "modify")
        return await self._write_job("PUT", path, params, query_args(reason=reason))

    async def rename_network(self, name: str, new_name: str, *, reason: str | None = None) -> int:
        """Rename a network (``PUT /2/networks/NAME/rename``, Ganeti 3.1 and later); returns the job id.

        On an earlier Ganeti (404 there) it raises :class:`UnsupportedError`, naming the backend's
        version, before anything is sent.
        """
        if not new_name:
            raise ConfigError(f"rename_network({name!r}): the new name is empty")
        path = self._path("networks", name, "rename")
        require_network_rename(await self.ganeti_version(), where=self.where, url=self.url)
        return await self._write_job("PUT", path, {"new_name": new_name}, query_args(reason=reason))

    async def delete_network(self, name: str, *, dry_run: bool = False, reason: str | None = None) -> int:
        """Remove a network (``DELETE /2/networks/NAME``); returns the job id."""
        path = self._path("networks", name)
        return await self._write_job("DELETE", path, None, query_args(dry_run=dry_run, reason=reason))

    # ------------------------------------------------------------------ tags

    async def get_network_tags(self, name: str, *, reason: str | None = None) -> list[str]:
        """A network's tags (``GET /2/networks/NAME/tags``)."""
        return await self._get_tags(self._path("networks", name, "tags"), reason)

    async def add_network_tags(
        self, name: str, tags: Iterable[str], *, dry_run: bool = False, reason: str | None = None
    ) -> int:
        """Add tags to a network (``PUT /2/networks/NAME/tags?tag=...``); returns the job id."""
        path = self._path("networks", name, "tags")
        return await self._tag_job("PUT", path, tags, dry_run=dry_run, reason=reason)

    async def delete_network_tags(
        self, name: str, tags: Iterable[str], *, dry_run: bool = False, reason: str | None = None
    ) -> int:
        """Remove tags from a network (``DELETE /2/networks/NAME/tags?tag=...``); returns the job id."""
        path = self._path("networks", name, "tags")
        return await self._tag_job("DELETE", path, tags, dry_run=dry_run, reason=reason)


def _list_or_none(items: Iterable[str] | None, what: str) -> list[str] | None:
    """A list for the body; ``None`` and empty stay ``None``, as Ganeti's client leaves them."""
    if items is None:
        return None
    if isinstance(items, str):
        raise ConfigError(f"{what} must be a list of strings, not the string {items!r}")
    return [str(item) for item in items] or None
