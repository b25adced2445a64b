"""Cluster-wide RAPI calls: version, info, features, OSes, modify, redistribute-config, tags, filters.

Each method follows Ganeti 3.0's own client (``GanetiRapiClient``, ``lib/rapi/client.py``) for the
HTTP method, path, query and body; ``lib/rapi/rlib2.py`` for what the server makes of them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from synnefo_ganeti.errors import RapiError, RapiNotFoundError
from synnefo_ganeti.rapi._api_versions import VersionApi
from synnefo_ganeti.rapi._base import query_args
from synnefo_ganeti.rapi._models import ClusterInfo, FilterRule

__all__ = ["ClusterApi"]


class ClusterApi(VersionApi):
    """The cluster's own resources: ``/version``, ``/2/info``, ``/2/features``, ``/2/os``,
    ``/2/modify``, ``/2/redistribute-config``, ``/2/tags``, ``/2/filters``."""

    async def version(self) -> int:
        """The RAPI version (``GET /version``; 2 for every Ganeti since 2.0)."""
        return int(await self._get("/version"))

    async def info(self) -> ClusterInfo:
        """Cluster information (``GET /2/info``); each read also refreshes the Ganeti version and
        master the client knows (``known_version``), noticing an upgrade or a failover."""
        return await self._read_info()

    async def features(self) -> list[str]:
        """The RAPI features (``GET /2/features``), asked once per client; a server too old to
        have the resource (404) has none, as Ganeti's own client says."""
        if self._features is None:
            try:
                answer = await self._get("/2/features")
            except RapiNotFoundError:
                answer = []
            self._features = [str(item) for item in answer]
        return list(self._features)

    async def list_os(self) -> list[str]:
        """The OSes every node offers, a variant as ``os+variant`` (``GET /2/os``; Ganeti runs an
        ``OP_OS_DIAGNOSE`` job for it, so ask seldom)."""
        answer = await self._get("/2/os")
        if not isinstance(answer, list):
            raise RapiError(
                f"{self.where}: GET /2/os answered {answer!r}, not a list of OS names", url=self.url
            )
        return [str(item) for item in answer]

    async def modify_cluster(self, *, reason: str | None = None, **params: Any) -> int:
        """Change cluster parameters (``PUT /2/modify``, ``OP_CLUSTER_SET_PARAMS``); returns the job id.

        ``params`` are Ganeti's (``candidate_pool_size=10``, ``beparams={...}``, ...).
        """
        return await self._write_job("PUT", "/2/modify", params, query_args(reason=reason))

    async def redistribute_config(self, *, reason: str | None = None) -> int:
        """Copy the configuration files to every node again (``PUT /2/redistribute-config``); job id."""
        return await self._write_job("PUT", "/2/redistribute-config", None, query_args(reason=reason))

    # ------------------------------------------------------------------ tags

    async def get_cluster_tags(self, *, reason: str | None = None) -> list[str]:
        """The cluster's tags (``GET /2/tags``)."""
        return await self._get_tags("/2/tags", reason)

    async def add_cluster_tags(
        self, tags: Iterable[str], *, dry_run: bool = False, reason: str | None = None
    ) -> int:
        """Add tags to the cluster (``PUT /2/tags?tag=...``); returns the job id."""
        return await self._tag_job("PUT", "/2/tags", tags, dry_run=dry_run, reason=reason)

    async def delete_cluster_tags(
        self, tags: Iterable[str], *, dry_run: bool = False, reason: str | None = None
    ) -> int:
        """Remove tags from the cluster (``DELETE /2/tags?tag=...``); returns the job id."""
        return await self._tag_job("DELETE", "/2/tags", tags, dry_run=dry_run, reason=reason)

    # ------------------------------------------------------------------ filters

    async def list_filters(self) -> list[FilterRule]:
        """Every job filter rule (``GET /2/filters?bulk=1``)."""
        answer = await self._get("/2/filters", {"bulk": "1"})
        return self._parse_list(FilterRule, answer, "GET /2/filters?bulk=1")

    async def get_filter(self, uuid: str) -> FilterRule:
        """One filter rule (``GET /2/filters/UUID``); :class:`NotFoundError` if Ganeti has none."""
        path = self._path("filters", uuid)
        return self._parse(FilterRule, await self._get(path), f"GET {path}")

    async def add_filter(
        self,
        *,
        priority: int = 0,
        predicates: Sequence[Any] = (),
        action: Any = "CONTINUE",
        reason_trail: Sequence[Sequence[Any]] | None = None,
    ) -> str:
        """Add a job filter rule (``POST /2/filters``); returns its UUID (no job: luxid adds it).

        As Ganeti's client does, ``("gnt:client", "", <ns since epoch>)`` ends the reason trail.
        """
        body = _filter_body(priority, predicates, action, reason_trail)
        return str(await self._write("POST", "/2/filters", body))

    async def replace_filter(
        self,
        uuid: str,
        *,
        priority: int = 0,
        predicates: Sequence[Any] = (),
        action: Any = "CONTINUE",
        reason_trail: Sequence[Sequence[Any]] | None = None,
    ) -> str:
        """Replace the filter rule ``uuid``, or add it if none has that UUID (``PUT /2/filters/UUID``);
        returns its UUID."""
        body = _filter_body(priority, predicates, action, reason_trail)
        return str(await self._write("PUT", self._path("filters", uuid), body))

    async def delete_filter(self, uuid: str) -> None:
        """Delete a filter rule (``DELETE /2/filters/UUID``)."""
        await self._write("DELETE", self._path("filters", uuid), {})


def _filter_body(
    priority: int, predicates: Sequence[Any], action: Any, reason_trail: Sequence[Sequence[Any]] | None
) -> dict[str, Any]:
    trail = [list(item) for item in reason_trail or ()]
    trail.append(["gnt:client", "", time.time_ns()])  # Ganeti's client adds this one too
    return {"priority": priority, "predicates": list(predicates), "action": action, "reason": trail}
