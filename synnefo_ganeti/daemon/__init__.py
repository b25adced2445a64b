"""Building blocks of the daemons: the embedded HTTP endpoints, systemd notification and the
supervisor of their root tasks."""

from __future__ import annotations

from synnefo_ganeti.daemon._http import StatusServer
from synnefo_ganeti.daemon._supervisor import Supervisor
from synnefo_ganeti.daemon._systemd import SystemdNotifier
from synnefo_ganeti.errors import RootTaskEnded

__all__ = ["RootTaskEnded", "StatusServer", "Supervisor", "SystemdNotifier"]
