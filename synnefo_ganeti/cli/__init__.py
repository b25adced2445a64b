"""The ``synnefo-ganeti`` command line: one module per command group.

Importing a module registers its commands on :data:`main` (in ``_main``); shared
options are in ``_options``, output helpers in ``_output``.
"""

from __future__ import annotations

from synnefo_ganeti.cli import _backends as _backends  # backends list|events|drain|undrain
from synnefo_ganeti.cli import _capacity as _capacity  # backends capacity
from synnefo_ganeti.cli import _db as _db  # db upgrade|prune
from synnefo_ganeti.cli import _demo as _demo  # demo
from synnefo_ganeti.cli import _dispatch as _dispatch  # dispatcher
from synnefo_ganeti.cli import _fake as _fake  # fake-ganeti
from synnefo_ganeti.cli import _incidents as _incidents  # incidents list
from synnefo_ganeti.cli import _instances as _instances  # instances list|show
from synnefo_ganeti.cli import _jobs as _jobs  # jobs list|show
from synnefo_ganeti.cli import _maintenance as _maintenance  # maintenance plan|run|list|show|cancel
from synnefo_ganeti.cli import _node_moves as _node_moves  # nodes evacuate|failover
from synnefo_ganeti.cli import _nodes as _nodes  # nodes list|show|drain|undrain
from synnefo_ganeti.cli import _rapi as _rapi  # rapi info|nodes|instances|jobs|job|create|cancel
from synnefo_ganeti.cli import _reconcile as _reconcile  # reconcile
from synnefo_ganeti.cli import _requests as _requests  # requests list|show|cancel
from synnefo_ganeti.cli import _status as _status  # dispatchers, audit
from synnefo_ganeti.cli import _submit as _submit  # submit
from synnefo_ganeti.cli import _watch as _watch  # watch
from synnefo_ganeti.cli import _web as _web  # web (the operator console)
from synnefo_ganeti.cli._main import main

__all__ = ["main"]
