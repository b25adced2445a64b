"""What each Ganeti version takes: :class:`GanetiVersion` and the rules that follow from it (pure).

A backend's version comes from ``GET /2/info`` (``software_version``: ``"3.0.2"``,
``"3.1.0~rc2"``, ``"2.16.2"``). The client (``_api_versions.py``) reads it once, keeps it in a
:class:`VersionCache` and builds each version-dependent body with the functions below, so that it
sends only what that Ganeti takes. What differs, read from Ganeti's sources (tags of
``ganeti/ganeti``) and seen on the labs (``docs/rapi-client.md``, "Versions"):

===========================================  ==============================  =============  ================
                                             < 2.10                          2.10 ... 3.0   3.1 and on
===========================================  ==============================  =============  ================
``OpInstanceSetParams.hotplug``              absent                          default false  default **true**
``OpInstanceSetParams.hotplug_if_possible``  absent                          default false  absent (400)
``name_check``, ``ip_check``                 true (rename's ip_check false)  true           **false**
``PUT /2/networks/NAME/rename``              absent (404)                    absent (404)   present
===========================================  ==============================  =============  ================

* 2.10 to 3.0 (``src/Ganeti/OpParams.hs``: ``pHotplug``, ``pHotplugIfPossible``, both
  ``defaultFalse``; ``LUInstanceSetParams._CheckHotplug`` in ``lib/cmdlib/instance_set_params.py``):
  ``hotplug`` fails the job (``OpPrereqError``, ``wrong_state``) when the hypervisor cannot
  hotplug; ``hotplug_if_possible`` tries, and on failure logs a warning and modifies without
  hotplugging. 2.16.2 and 3.0.2 are the same here.
* 3.1 (``pHotplug = defaultTrue "hotplug"``, ``pHotplugIfPossible`` gone, ``_CheckHotplug`` falls
  back with a warning): ``hotplug`` now means 3.0's ``hotplug_if_possible``; a body naming
  ``hotplug_if_possible`` is refused with a 400. ``pNameCheck``/``pIpCheck`` (of
  ``OpInstanceCreate`` and ``OpInstanceRename``) became ``defaultFalse``; ``OpNetworkRename`` and
  ``R_2_networks_name_rename`` are new.

The client's calls mean the same on every version: ``modify_instance(hotplug_if_possible=True)``
becomes ``hotplug: true`` on 3.1 and ``hotplug_if_possible: true, hotplug: false`` before; a modify
that asks for neither sends ``hotplug: false`` everywhere (Ganeti 3.0's default, never 3.1's).
"""

from __future__ import annotations

import asyncio
import functools
import re
from dataclasses import dataclass
from typing import Final

from synnefo_ganeti.errors import InvalidError, UnsupportedError

__all__ = ["GanetiVersion", "VersionCache", "hotplug_fields", "require_network_rename"]

_VERSION: Final = re.compile(r"\s*(\d+)\.(\d+)(?:\.(\d+))?(\S*)\s*")
_PRERELEASE: Final = re.compile(r"[~+.-]?(alpha|beta|rc|pre|dev)", re.IGNORECASE)
_NUMBER: Final = re.compile(r"(\d+)")

HOTPLUG_SINCE: Final = (2, 10)  #: OpInstanceSetParams takes hotplug and hotplug_if_possible
HOTPLUG_BY_DEFAULT_SINCE: Final = (3, 1)  #: hotplug defaults to true; hotplug_if_possible is gone
NO_CHECKS_BY_DEFAULT_SINCE: Final = (3, 1)  #: name_check and ip_check default to false
NETWORK_RENAME_SINCE: Final = (3, 1)  #: PUT /2/networks/NAME/rename exists


@functools.total_ordering
@dataclass(frozen=True, eq=False)
class GanetiVersion:
    """A Ganeti version, as ``/2/info``'s ``software_version`` gives it.

    ``GanetiVersion.parse("3.1.0~rc2")``: ``major`` 3, ``minor`` 1, ``patch`` 0, ``suffix``
    ``"~rc2"``, ``text`` the string read. Versions order as Ganeti's releases do: a pre-release
    (``~rc2``, ``beta1``) comes before its release (``3.1.0~rc2 < 3.1.0 < 3.1.1``); what a version
    takes depends on ``major.minor`` alone, so a release candidate of 3.1 takes what 3.1 takes.
    """

    major: int
    minor: int
    patch: int = 0
    suffix: str = ""
    text: str = ""

    @classmethod
    def parse(cls, text: str) -> GanetiVersion:
        """``"3.0.2"``, ``"3.1.0~rc2"``, ``"2.16.2"``, ``"3.1"``; :class:`InvalidError` otherwise."""
        found = _VERSION.fullmatch(text) if isinstance(text, str) else None
        if found is None:
            raise InvalidError(f"{text!r} is not a Ganeti version (like 3.0.2 or 3.1.0~rc2)")
        major, minor, patch, suffix = found.groups()
        return cls(int(major), int(minor), int(patch or 0), suffix, text.strip())

    def __post_init__(self) -> None:
        if not self.text:
            object.__setattr__(self, "text", f"{self.major}.{self.minor}.{self.patch}{self.suffix}")

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"GanetiVersion({self.text!r})"

    # -- order -----------------------------------------------------------------------------------

    @property
    def is_prerelease(self) -> bool:
        """A release candidate, beta or alpha (``3.1.0~rc2``): before the release it leads to."""
        return _PRERELEASE.match(self.suffix) is not None

    def _key(self) -> tuple[int, int, int, int, tuple[str | int, ...]]:
        # "~rc10" -> ("~rc", 10): text and numbers alternate from text (no suffix starts with a
        # digit), so two suffixes never compare a number with a text at the same place
        parts = tuple(int(p) if p.isdigit() else p.lower() for p in _NUMBER.split(self.suffix) if p)
        return (self.major, self.minor, self.patch, 0 if self.is_prerelease else 1, parts)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GanetiVersion):
            return NotImplemented
        return self._key() == other._key()

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, GanetiVersion):
            return NotImplemented
        return self._key() < other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def at_least(self, major: int, minor: int) -> bool:
        """This version is ``major.minor`` or later (its pre-releases included)."""
        return (self.major, self.minor) >= (major, minor)

    # -- what it takes ---------------------------------------------------------------------------

    @property
    def has_hotplug(self) -> bool:
        """``OpInstanceSetParams`` takes ``hotplug`` (Ganeti 2.10 and later)."""
        return self.at_least(*HOTPLUG_SINCE)

    @property
    def has_hotplug_if_possible(self) -> bool:
        """``OpInstanceSetParams`` takes ``hotplug_if_possible`` (2.10 to 3.0; 3.1 answers 400)."""
        return self.has_hotplug and not self.at_least(*HOTPLUG_BY_DEFAULT_SINCE)

    @property
    def hotplug_default(self) -> bool:
        """Ganeti's default of ``hotplug`` when a modify leaves it out: true from 3.1 (falling back
        to no hotplug, with a warning, where the hypervisor cannot), false before."""
        return self.at_least(*HOTPLUG_BY_DEFAULT_SINCE)

    @property
    def name_check_default(self) -> bool:
        """Ganeti's default of ``name_check`` (create, rename): false from 3.1, true before."""
        return not self.at_least(*NO_CHECKS_BY_DEFAULT_SINCE)

    @property
    def ip_check_default(self) -> bool:
        """Ganeti's default of ``ip_check`` (create, rename): false from 3.1, true before."""
        return not self.at_least(*NO_CHECKS_BY_DEFAULT_SINCE)

    @property
    def has_network_rename(self) -> bool:
        """``PUT /2/networks/NAME/rename`` exists (3.1 and later; 404 before)."""
        return self.at_least(*NETWORK_RENAME_SINCE)


# -- bodies ----------------------------------------------------------------------------------------


def hotplug_fields(
    version: GanetiVersion, *, hotplug: bool, hotplug_if_possible: bool, where: str, url: str | None = None
) -> dict[str, bool]:
    """The hotplug keys of a modify's body for ``version``, ``hotplug`` always explicit where taken.

    ``hotplug``: hotplug or fail (before 3.1; 3.1 no longer fails, it falls back with a warning);
    ``hotplug_if_possible``: hotplug where the hypervisor can, else modify without. Before 2.10
    Ganeti has neither: ``hotplug_if_possible`` is then left out (it never hotplugs), and
    ``hotplug=True`` is an :class:`UnsupportedError`.
    """
    if not version.has_hotplug:
        if hotplug:
            raise UnsupportedError(
                f"{where}: Ganeti {version} cannot hotplug (OpInstanceSetParams takes 'hotplug' from "
                "Ganeti 2.10); modify without hotplug=True",
                url=url,
                version=version.text,
                needed="2.10",
            )
        return {}
    if not version.has_hotplug_if_possible:  # 3.1 and on: "hotplug" falls back by itself
        return {"hotplug": bool(hotplug or hotplug_if_possible)}
    fields = {"hotplug": bool(hotplug)}
    if hotplug_if_possible:
        fields["hotplug_if_possible"] = True
    return fields


def require_network_rename(version: GanetiVersion, *, where: str, url: str | None = None) -> None:
    """:class:`UnsupportedError` unless ``version`` has ``PUT /2/networks/NAME/rename``."""
    if not version.has_network_rename:
        needed = ".".join(map(str, NETWORK_RENAME_SINCE))
        raise UnsupportedError(
            f"{where}: renaming a network needs Ganeti {needed} or later (PUT /2/networks/NAME/rename); "
            f"this backend runs Ganeti {version}: remove the network and create it again under the new "
            "name, or upgrade the cluster",
            url=url,
            version=version.text,
            needed=needed,
        )


# -- the cache -------------------------------------------------------------------------------------


class VersionCache:
    """The version and master a client last read from ``/2/info``, and when they stop holding.

    ``observe`` stores each read (any ``/2/info`` answer: ``info()``, the health checks' calls);
    a read also notices a new master (a failover) or a new version (an upgrade). ``current(losses)``
    gives the version unless the transport lost its connection since the read (``losses``: its
    count of connection-level failures; a restarted ganeti-rapi, a master that moved): then it is
    stale and read again. ``lock`` keeps concurrent callers to one ``/2/info`` at a time.
    """

    def __init__(self) -> None:
        self.version: GanetiVersion | None = None
        self.master: str | None = None
        self.reads = 0
        self.changes = 0
        self.lock = asyncio.Lock()
        self._losses_at_read = -1

    def __repr__(self) -> str:
        if self.version is None:
            return f"<VersionCache unknown, {self.reads} reads>"
        return (
            f"<VersionCache ganeti {self.version} master={self.master} "
            f"{self.reads} reads, {self.changes} changes>"
        )

    def current(self, losses: int) -> GanetiVersion | None:
        """The version read, or None: never read, or a connection failed since (``losses`` grew)."""
        if self.version is None or losses != self._losses_at_read:
            return None
        return self.version

    def observe(self, version: GanetiVersion | None, master: str | None, losses: int) -> list[str]:
        """Store one read of ``/2/info`` (``losses``: the transport's count when it was sent);
        returns what changed since the read before, in words (empty: nothing, or the first read)."""
        changed: list[str] = []
        if self.reads and version is not None and self.version is not None and version != self.version:
            changed.append(f"Ganeti version {self.version} -> {version}")
        if self.reads and master is not None and self.master is not None and master != self.master:
            changed.append(f"master {self.master} -> {master}")
        self.reads += 1
        self.changes += bool(changed)
        self.version = version
        if master is not None:
            self.master = master
        self._losses_at_read = losses
        return changed
