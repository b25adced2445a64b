"""Which Ganeti the fake is: each version's answers, defaults and refusals, as one table.

``FakeGaneti(version="3.1")`` (``--version`` on the command line) picks a :class:`VersionProfile`
from :data:`VERSIONS`; the routes, opcodes and views read it (``cluster.model.version``) where
the versions differ, and behave as Ganeti 3.0 everywhere else. What differs, and where it
was read (tags of ``ganeti/ganeti``) or seen (``../shared/ganeti/v31/diff-3.0-3.1.md``: both
labs asked the same questions):

=========================================  ======================  ==============  =====================
                                           2.16 (v2.16.2)          3.0 (3.0.2)     3.1 (3.1.0~rc2)
=========================================  ======================  ==============  =====================
``/2/info`` ``software_version``           ``2.16.2``              ``3.0.2``       ``3.1.0~rc2``
``protocol_version``, ``config_version``   2160000                 3000000         3010000
``hvparams.kvm`` ``disk_discard``,         as 3.0                  ``default``,    ``ignore``, ``true``
``vhost_net``                                                      ``false``
``hvparams.xen-*.xen_cmd``                 as 3.0                  ``xm``          absent
instances' ``custom_osparams``             absent                  absent          the instance's own
``name_check``, ``ip_check`` (create,      default true            default true    default false
rename)
set-params ``hotplug``                     default false, fails    as 2.16         default true, falls
                                           the job if the                          back with a warning
                                           hypervisor cannot                       (running instances)
set-params ``hotplug_if_possible``         warns, goes on          as 2.16         400 (no such param)
``PUT /2/networks/NAME/rename``            404                     404             ``OP_NETWORK_RENAME``
error messages (``{"message"}``)           ``cgi.escape``: quotes  ``html.escape``  as 3.0
                                           kept, Python 2 reprs
=========================================  ======================  ==============  =====================

2.16.2 and 3.0.2 serve the same URL map (``lib/rapi/connector.py`` differs only in its
``urlparse`` import, so ``/2/filters`` is there), take the same opcode parameters with the same
defaults (``src/Ganeti/OpParams.hs``, ``OpCodes.hs``: only ``MonadFail`` changed) and write the
same job files (``lib/jqueue``: ``livelock`` and ``process_id`` both; ``serializer.DumpJson``
the same separators). 3.0 is their Python 3 port: what a client sees change is the version
numbers and the error texts (``lib/http/server.py``: ``cgi.escape(message)``, which leaves
``'`` and ``"`` alone; ``baserlib.FillOpcode``'s ``%r`` of a set is ``set(['x'])``). Not
modelled: the key order of the job files 2.16's Python 2 executor writes (a ``dict``'s).
3.0 to 3.1 (``git diff v3.0.2 v3.1.0``): ``pNameCheck``/``pIpCheck`` ``defaultFalse``,
``pHotplug`` ``defaultTrue`` and ``pHotplugIfPossible`` gone, ``LUInstanceSetParams._CheckHotplug``
only for a running instance and never failing, ``R_2_networks_name_rename`` and
``OpNetworkRename``, ``custom_osparams`` in ``rlib2.I_FIELDS``; job files unchanged.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DEFAULT_VERSION", "VERSIONS", "VersionProfile", "profile"]

#: a key of ``info_hvparams`` whose value is this is left out of ``/2/info``
ABSENT: Any = object()


@dataclass(frozen=True, kw_only=True)
class VersionProfile:
    """What one Ganeti version answers differently from the fake's 3.0 (defaults: 3.0's)."""

    name: str
    #: ``/2/info``: ``software_version``, ``protocol_version``/``config_version``, ``vcs_version``
    software_version: str
    protocol_version: int
    vcs_version: str
    #: ``/2/info`` ``hvparams``: hypervisor -> parameter -> value (or :data:`ABSENT`) over 3.0's
    info_hvparams: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: ``rlib2.I_FIELDS`` has ``custom_osparams`` (``/2/instances/NAME``, ``?bulk=1``)
    custom_osparams: bool = False
    #: opcode parameter defaults over 3.0's: ``OP_ID`` -> parameter -> default
    op_defaults: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: parameters the opcode does not have (a body naming one: 400, as ``FillOpcode``)
    op_removed: dict[str, frozenset[str]] = field(default_factory=dict)
    #: parameters that may not be null (a body with one null: 400 "fails validation")
    op_not_null: dict[str, frozenset[str]] = field(default_factory=dict)
    #: ``LUInstanceSetParams._CheckHotplug`` as 3.1: only for a running instance, never fatal
    hotplug_falls_back: bool = False
    #: ``PUT /2/networks/NAME/rename`` (``OP_NETWORK_RENAME``) exists
    network_rename: bool = False
    #: error messages as Python 2's ganeti-rapi writes them (``cgi.escape``, 2's reprs)
    python2: bool = False
    #: query filters' ``=~`` patterns are POSIX (``Text.Regex.TDFA``, seen on the 3.1 lab): Perl's
    #: ``(?...)`` groups are refused with a 502 (3.0's luxid takes them)
    posix_regex: bool = False

    def __repr__(self) -> str:
        return f"<VersionProfile Ganeti {self.software_version}>"

    def info(self, info: dict[str, Any]) -> dict[str, Any]:
        """``/2/info`` (3.0's, with this cluster's values) as this version answers it."""
        info = dict(info, software_version=self.software_version, protocol_version=self.protocol_version,
                    config_version=self.protocol_version, vcs_version=self.vcs_version)  # fmt: skip
        hvparams = {hv: dict(params) for hv, params in info["hvparams"].items()}
        for hv, changes in self.info_hvparams.items():
            for key, value in changes.items():
                if value is ABSENT:
                    hvparams[hv].pop(key, None)
                else:
                    hvparams[hv][key] = value
        info["hvparams"] = hvparams
        return info

    def instance_view(self, view: dict[str, Any], osparams: dict[str, Any]) -> dict[str, Any]:
        """An instance's view (``I_FIELDS``): ``custom_osparams`` after ``custom_nicparams`` where
        this version has it (``objects.Instance.osparams``, the instance's own)."""
        if not self.custom_osparams:
            return view
        out: dict[str, Any] = {}
        for key, value in view.items():
            out[key] = value
            if key == "custom_nicparams":
                out["custom_osparams"] = dict(osparams)
        return out

    def defaults(self, op_id: str) -> dict[str, Any]:
        return self.op_defaults.get(op_id, {})

    def removed(self, op_id: str) -> frozenset[str]:
        return self.op_removed.get(op_id, frozenset())

    def refusal(self, op_id: str, params: dict[str, Any]) -> str | None:
        """``baserlib.FillOpcode``'s 400 for a parameter the opcode lacks (``OpCode.__init__``'s
        ``TypeError``, written 3.0's way: see :meth:`message`); None when it takes them all."""
        for key in params:
            if key in self.removed(op_id):
                cls = "Op" + "".join(word.capitalize() for word in op_id.removeprefix("OP_").split("_"))
                support = f"doesn&#x27;t support the parameter &#x27;{key}&#x27;"
                return f"Invalid body parameters: Object {cls} {support}"
            if params[key] is None and key in self.op_not_null.get(op_id, frozenset()):
                text = f"Invalid body parameters: (\"Parameter '{op_id}.{key}' fails validation\", 'wrong_input')"
                return html.escape(text, quote=True)
        return None

    def message(self, text: str) -> str:
        """An error answer's message (written 3.0's way, ``html.escape``) as this version writes it:
        2.16's ``cgi.escape`` escapes ``&``, ``<`` and ``>`` only, and Python 2 shows a set as
        ``set(['a'])``."""
        if not self.python2:
            return text
        text = text.replace("&#x27;", "'").replace("&quot;", '"')
        return _SET_REPR.sub(lambda m: f"set([{m.group(1)}])", text)


_SET_REPR = re.compile(r"(?<=static parameters )\{('[^{}]*')\}")  # baserlib.FillOpcode's

_V216 = VersionProfile(
    name="2.16", software_version="2.16.2", protocol_version=2160000, vcs_version="(ganeti) version v2.16.2",
    python2=True,
)  # fmt: skip
_V30 = VersionProfile(name="3.0", software_version="3.0.2", protocol_version=3000000,
                      vcs_version="(ganeti) version 3.0.2-3")  # fmt: skip
_V31 = VersionProfile(
    name="3.1", software_version="3.1.0~rc2", protocol_version=3010000, vcs_version="(ganeti) version 3.1.0~rc2-3",
    info_hvparams={"kvm": {"disk_discard": "ignore", "vhost_net": True},
                   "xen-pvm": {"xen_cmd": ABSENT}, "xen-hvm": {"xen_cmd": ABSENT}},
    custom_osparams=True,
    op_defaults={"OP_INSTANCE_CREATE": {"name_check": False, "ip_check": False},
                 "OP_INSTANCE_RENAME": {"name_check": False, "ip_check": False},
                 "OP_INSTANCE_SET_PARAMS": {"hotplug": True}},
    op_removed={"OP_INSTANCE_SET_PARAMS": frozenset({"hotplug_if_possible"})},
    op_not_null={"OP_NETWORK_ADD": frozenset({"tags"})},  # seen on the 3.1 lab (3.0 takes null)
    hotplug_falls_back=True, network_rename=True, posix_regex=True,
)  # fmt: skip

#: every version the fake can be, by the name the knob takes
VERSIONS: dict[str, VersionProfile] = {"2.16": _V216, "3.0": _V30, "3.1": _V31}
DEFAULT_VERSION = "3.0"


def profile(version: str) -> VersionProfile:
    """The profile of ``version`` (``"3.0"``, ``"3.1"``, ``"2.16"``); ``ValueError`` naming the
    versions there are for anything else."""
    found = VERSIONS.get(version) if isinstance(version, str) else None
    if found is None:
        choices = ", ".join(repr(name) for name in VERSIONS)
        raise ValueError(f"version must be one of {choices}, not {version!r}")
    return found
