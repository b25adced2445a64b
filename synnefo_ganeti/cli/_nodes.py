"""``synnefo-ganeti nodes ...``: the nodes of every backend (list, show, drain, undrain; evacuate and
failover live in ``_node_moves``)."""

from __future__ import annotations

from synnefo_ganeti.cli._main import main

__all__ = ["nodes"]


@main.group()
def nodes() -> None:
    """The nodes of every backend: read them, drain them, move their instances away."""
