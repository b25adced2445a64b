"""``synnefo-ganeti nodes evacuate|failover``: moving a node's instances away."""

from __future__ import annotations

from synnefo_ganeti.cli._nodes import nodes

__all__ = ["nodes"]
