"""Building blocks of the dispatcher daemon: the embedded HTTP endpoints and systemd notification."""

from __future__ import annotations

from synnefo_ganeti.daemon._http import StatusServer
from synnefo_ganeti.daemon._systemd import SystemdNotifier

__all__ = ["StatusServer", "SystemdNotifier"]
