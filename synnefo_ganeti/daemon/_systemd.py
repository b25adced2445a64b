"""sd_notify: READY, STOPPING, WATCHDOG and STATUS to systemd when ``NOTIFY_SOCKET`` is set.

The protocol is one datagram per message on the unix socket ``NOTIFY_SOCKET`` names
(an ``@`` first means the abstract namespace). Without the variable every call does
nothing, so the daemon runs the same under systemd, in a terminal or in a test.
"""

from __future__ import annotations

import logging
import os
import socket

__all__ = ["SystemdNotifier"]

log = logging.getLogger("synnefo_ganeti.daemon")


class SystemdNotifier:
    def __init__(self, address: str | None = None) -> None:
        self.address = address if address is not None else os.environ.get("NOTIFY_SOCKET")
        if self.address and self.address.startswith("@"):
            self.address = "\0" + self.address[1:]

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def watchdog_interval(self) -> float | None:
        """Half of ``WATCHDOG_USEC`` in seconds (how often to send WATCHDOG=1), if systemd asks."""
        usec = os.environ.get("WATCHDOG_USEC")
        pid = os.environ.get("WATCHDOG_PID")
        if not usec or (pid and pid != str(os.getpid())):
            return None
        try:
            return int(usec) / 2_000_000
        except ValueError:
            return None

    def notify(self, message: str) -> bool:
        """Send one message (e.g. ``READY=1``); False when not under systemd or it failed."""
        if not self.address:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.connect(self.address)
                sock.sendall(message.encode())
        except OSError as exc:
            log.warning("cannot notify systemd (%s): %s", message.split("=", 1)[0], exc)
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        return self.notify("READY=1" + (f"\nSTATUS={status}" if status else ""))

    def stopping(self) -> bool:
        return self.notify("STOPPING=1")

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def status(self, text: str) -> bool:
        return self.notify(f"STATUS={text}")
