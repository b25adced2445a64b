"""The facade's nodes, node, drain_node, undrain_node (reading and draining nodes): :class:`NodeMethods`, a base of :class:`~synnefo_ganeti.ControlPlane`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from synnefo_ganeti.rapi import RapiClient

if TYPE_CHECKING:
    from synnefo_ganeti.config import Settings
    from synnefo_ganeti.store import Store

__all__ = ["NodeMethods"]


class NodeMethods:
    """nodes, node, drain_node, undrain_node on the facade (see the module)."""

    if TYPE_CHECKING:

        @property
        def store(self) -> Store: ...

        @property
        def settings(self) -> Settings: ...

        async def client(self, backend: str) -> RapiClient: ...
