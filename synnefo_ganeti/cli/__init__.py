"""The ``synnefo-ganeti`` command line."""

from __future__ import annotations

from synnefo_ganeti.cli._main import main

__all__ = ["main"]
