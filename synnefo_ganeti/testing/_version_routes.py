"""The routes only some Ganeti versions serve (:mod:`._versions`): 3.1's ``PUT /2/networks/NAME/rename``.

On a version without one, the fake answers it as any URI it does not map: 404 ``Nothing matches
the given URI``, as ganeti-rapi 3.0 answered ``PUT /2/networks/NAME/rename`` on the lab.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiohttp import web

    from synnefo_ganeti.testing._routes import Route, Surface

__all__ = ["VersionRoutes"]


class VersionRoutes:
    """The version-dependent routes of a :class:`~._routes.Surface`'s cluster."""

    def __init__(self, surface: Surface) -> None:
        self.surface = surface
        self.version = surface.cluster.model.version

    def routes(self) -> list[Route]:
        r: list[Route] = []
        if self.version.network_rename:
            r.append(("PUT", "/2/networks/{name}/rename", self._network_rename))
        return r

    async def _network_rename(self, request: web.Request) -> Any:
        """``R_2_networks_name_rename.GetPutOpInput`` (``lib/rapi/rlib2.py`` at v3.1.0): the body,
        with ``network_name`` and ``dry_run`` from the URL."""
        s = self.surface
        static = {"network_name": request.match_info["name"], "dry_run": s._dry(request)}
        return s._submit(
            request, [("OP_NETWORK_RENAME", await s._fill(request, static))], "networks_name_rename"
        )
