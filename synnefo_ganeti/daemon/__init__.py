"""Building blocks of the daemons: the embedded HTTP endpoints, systemd notification, the
supervisor of their root tasks and their event loop."""

from __future__ import annotations

from synnefo_ganeti.daemon._http import StatusServer
from synnefo_ganeti.daemon._loop import loop_factory, loop_name, run_daemon
from synnefo_ganeti.daemon._supervisor import Supervisor
from synnefo_ganeti.daemon._systemd import SystemdNotifier
from synnefo_ganeti.errors import RootTaskEnded

__all__ = [
    "RootTaskEnded",
    "StatusServer",
    "Supervisor",
    "SystemdNotifier",
    "loop_factory",
    "loop_name",
    "run_daemon",
]
