"""``synnefo-ganeti backends capacity``: how many more instances of each flavor fit, now and keeping N+1."""

from __future__ import annotations

from synnefo_ganeti.cli._backends import backends

__all__ = ["backends"]
