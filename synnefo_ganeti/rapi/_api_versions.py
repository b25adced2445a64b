"""The backend's Ganeti version, as the client knows it: ``ganeti_version()``, ``known_version``.

Design, and why:

* The version comes from ``GET /2/info`` (``software_version``), read the first time a call needs
  it (a modify, a network rename) and kept in a :class:`~._versions.VersionCache`: a burst of
  modifies costs one ``/2/info``, not one each (the cache's lock holds the others while it is read).
* It is read again after a reconnect: each connection-level failure the transport sees (refused,
  reset, no connection in time, a TLS failure; not an answer that was only slow) raises its
  ``connection_losses``, and a version read before that is stale. An upgrade restarts ganeti-rapi,
  and a master failover moves it: both break connections first.
* Every ``/2/info`` read, whoever asks (``info()``, the health checks), refreshes it, so a new master
  or a new version is noticed within one health interval even with no failure in between; either
  change also forgets the cached ``/2/features``.

The rules of what each version takes are pure code in ``_versions.py``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from synnefo_ganeti.errors import InvalidError, RapiError
from synnefo_ganeti.rapi._base import RapiBase
from synnefo_ganeti.rapi._models import ClusterInfo
from synnefo_ganeti.rapi._versions import GanetiVersion

if TYPE_CHECKING:
    from synnefo_ganeti.rapi._versions import VersionCache

__all__ = ["VersionApi"]

logger = logging.getLogger("synnefo_ganeti.rapi")


class VersionApi(RapiBase):
    """Reading ``/2/info`` and keeping the Ganeti version and master it tells."""

    _versions: VersionCache
    _features: list[str] | None

    @property
    def known_version(self) -> GanetiVersion | None:
        """The Ganeti version last read from ``/2/info``; None before the first read, and after a
        connection failure until the next (``await ganeti_version()`` reads it when needed)."""
        return self._versions.current(self._transport.connection_losses)

    async def ganeti_version(self) -> GanetiVersion:
        """The backend's Ganeti version, read from ``/2/info`` once and again after a reconnect or
        a master failover; :class:`RapiError` if ``/2/info`` gives none that can be read."""
        cache = self._versions
        known = cache.current(self._transport.connection_losses)
        if known is not None:
            return known
        async with cache.lock:
            known = cache.current(self._transport.connection_losses)
            if known is not None:
                return known
            info = await self._read_info()
            version = cache.version
            if version is None:
                raise RapiError(
                    f"{self.where}: GET /2/info answered software_version {info.software_version!r}, "
                    "not a Ganeti version; is this a ganeti-rapi?",
                    url=self.url,
                )
            return version

    async def _read_info(self) -> ClusterInfo:
        """``GET /2/info``, parsed, its version and master stored."""
        losses = self._transport.connection_losses
        info = self._parse(ClusterInfo, await self._get("/2/info"), "GET /2/info")
        version: GanetiVersion | None = None
        if info.software_version is not None:
            try:
                version = GanetiVersion.parse(info.software_version)
            except InvalidError:
                logger.warning(
                    "%s: /2/info's software_version %r is not a version", self.where, info.software_version
                )
        changed = self._versions.observe(version, info.master, losses)
        if changed:
            logger.warning("%s: %s (read from /2/info)", self.where, ", ".join(changed))
            self._features = None  # what the RAPI offers may have changed with it
        return info
