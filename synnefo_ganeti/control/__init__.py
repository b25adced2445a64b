"""The control-plane facade (:class:`ControlPlane`): what a cloud API calls to create and
manage instances. :mod:`._facade` holds the class; helper modules beside it hold what it
checks and follows."""

from __future__ import annotations

from synnefo_ganeti.control._facade import ControlPlane

__all__ = ["ControlPlane"]
