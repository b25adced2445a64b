"""NIC MAC addresses as Ganeti checks, reserves and generates them.

* A MAC given with a NIC (a create's ``nics``, a modify's ``[["add", {"mac": ...}]]``) is the NIC's:
  validated as ``utils.NormalizeAndValidateMac`` does (six colon-separated hex octets, lower-cased;
  else ``Invalid MAC address '...'``, ``ECODE_INVAL``) and reserved as ``ConfigWriter.ReserveMAC``
  does (one that a NIC of any instance has, or an earlier NIC of the same op, fails with
  ``ECODE_NOTUNIQUE``). A create words it as ``ComputeNics`` (``cmdlib/instance_utils.py``):
  ``MAC address aa:... already in use in cluster``; a modify as
  ``LUInstanceSetParams._PrepareNicModification`` (``cmdlib/instance_set_params.py``), the MAC quoted.
* ``auto`` and ``generate`` (and no ``mac``) make one that no NIC has (``ConfigWriter.GenerateMAC``);
  a modify's ``"mac": None`` is ``Cannot unset the NIC MAC address``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from synnefo_ganeti.testing._cluster import OpFailure, new_mac

if TYPE_CHECKING:
    from synnefo_ganeti.testing._engine import FakeCluster

__all__ = ["MacReservation"]

_MAC = re.compile(r"^[0-9a-f]{2}(?::[0-9a-f]{2}){5}$", re.IGNORECASE)
_GENERATE = ("auto", "generate")


class MacReservation:
    """The MACs of one op: those every NIC of the cluster has, and those the op takes."""

    def __init__(self, cluster: FakeCluster, *, create: bool) -> None:
        self.taken = {str(nic["mac"]).lower() for inst in cluster.instances.values() for nic in inst.nics}
        self.create = create

    def __repr__(self) -> str:
        return f"<MacReservation {len(self.taken)} taken>"

    def given(self, params: dict[str, Any]) -> str | None:
        """The NIC's own MAC, checked and reserved; ``None`` when one is to be generated."""
        if "mac" not in params or params["mac"] in _GENERATE:
            return None
        mac = params["mac"]
        if mac is None:
            if self.create:
                return None
            raise OpFailure("OpPrereqError", "Cannot unset the NIC MAC address", "wrong_input")
        if not isinstance(mac, str) or not _MAC.match(mac):
            raise OpFailure("OpPrereqError", f"Invalid MAC address '{mac}'", "wrong_input")
        mac = mac.lower()
        if mac in self.taken:
            shown = mac if self.create else f"'{mac}'"
            raise OpFailure(
                "OpPrereqError", f"MAC address {shown} already in use in cluster", "resource_not_unique"
            )
        self.taken.add(mac)
        return mac

    def take(self, params: dict[str, Any]) -> str:
        """The NIC's MAC: its own (checked), else a new one no NIC has."""
        mac = self.given(params)
        if mac is None:
            mac = new_mac()
            while mac in self.taken:
                mac = new_mac()
            self.taken.add(mac)
        return mac
