"""``LUInstanceSetParams._CheckHotplug`` as each Ganeti version runs it, on the fake hypervisor.

The fake's hypervisor cannot hotplug (Ganeti's ``fake`` hypervisor: ``call_hotplug_supported``
fails with ``Hotplug is not supported: Hotplug is not supported by this hypervisor``, as both labs
answered), so a modify only ever goes on without hotplugging, or fails:

* 2.16 and 3.0 (``lib/cmdlib/instance_set_params.py`` at v3.0.2): for any instance, when the op
  asks ``hotplug`` it fails (``OpPrereqError`` ``Hotplug is not possible: ...``, ``wrong_state``);
  when it asks ``hotplug_if_possible`` it logs the failure as a warning, then ``Modification will
  take place without hotplugging.``; asking neither, nothing;
* 3.1 (at v3.1.0): only for an instance whose admin state is up, and ``hotplug`` (now true by
  default) is never fatal: the same two lines, and ``hotplug`` turns false; for any other
  instance ``hotplug`` turns false silently.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from synnefo_ganeti.testing._cluster import OpFailure

if TYPE_CHECKING:
    from synnefo_ganeti.testing._cluster import FakeInstance
    from synnefo_ganeti.testing._engine import FakeCluster
    from synnefo_ganeti.testing._jobs import FakeOp

__all__ = ["UNSUPPORTED", "check_hotplug"]

#: ``call_hotplug_supported``'s ``fail_msg`` on the fake hypervisor
UNSUPPORTED = "Hotplug is not supported: Hotplug is not supported by this hypervisor"
_FALLBACK = [f" - WARNING: {UNSUPPORTED}", " - INFO: Modification will take place without hotplugging."]


def check_hotplug(cluster: FakeCluster, op: FakeOp, inst: FakeInstance) -> list[str]:
    """``_CheckHotplug`` (``CheckPrereq``): fails as this cluster's Ganeti version does, else
    resolves ``hotplug`` and returns the log lines to write once the op runs."""
    p = op.luxid
    if cluster.model.version.hotplug_falls_back:
        if not p.get("hotplug"):
            return []
        op.resolve(hotplug=False)
        return list(_FALLBACK) if inst.admin_state == "up" else []
    if p.get("hotplug"):  # result.Raise("Hotplug is not possible: %s" % fail_msg, prereq=True)
        raise OpFailure(
            "OpPrereqError", f"Hotplug is not possible: {UNSUPPORTED}: {UNSUPPORTED}", "wrong_state"
        )
    return list(_FALLBACK) if p.get("hotplug_if_possible") else []
