"""The ``synnefo-ganeti`` command line."""

from __future__ import annotations

from synnefo_ganeti.cli import _dispatch as _dispatch  # registers dispatcher, submit and requests
from synnefo_ganeti.cli import _fake as _fake  # registers fake-ganeti and demo
from synnefo_ganeti.cli import _instances as _instances  # registers instances
from synnefo_ganeti.cli import _reconcile as _reconcile  # registers reconcile and backends
from synnefo_ganeti.cli import _store as _store  # registers db, watch and jobs
from synnefo_ganeti.cli._main import main

__all__ = ["main"]
