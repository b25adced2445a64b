"""``[repair]``: what the dispatcher may repair by itself (docs/operations.md, "Repair by policy").

Off by default: the dispatcher opens and closes incidents (report only) and sends nothing.
``allow`` names the repairs it may send, from :data:`REPAIRS`; a backend's own
``repair_allow`` (in its ``[[backends]]`` table) replaces it for that backend. An instance is
repaired only when its harep tags allow it too (``ganeti:watcher:autorepair:...``).
"""

from __future__ import annotations

import shlex

from pydantic import Field, field_validator

from synnefo_ganeti.config._sections import BackendSettings, Repair, _Section

__all__ = ["REPAIRS", "RepairSettings"]

#: every repair, in harep's order of its levels (a failover allows a migrate)
REPAIRS: tuple[Repair, ...] = ("start", "migrate", "failover")


class RepairSettings(_Section):
    """``[repair]``: report only by default; ``allow`` the repairs the dispatcher may send."""

    #: seconds a node must be down (figures gone) before it opens an incident
    node_down_after: float = Field(default=120.0, gt=0, allow_inf_nan=False)
    #: the repairs allowed on every backend without its own ``repair_allow``; empty: report only
    allow: list[Repair] = Field(default_factory=list)
    #: run with a down node's name (``{node}`` substituted, split as a shell would, never through a
    #: shell): it must make the node safe (power it off); its exit 0 lets a failover mark the node
    #: offline. None: only an operator marks a node offline
    fence_command: str | None = None
    #: seconds ``fence_command`` may run
    fence_timeout: float = Field(default=60.0, gt=0, allow_inf_nan=False)
    #: seconds between looks for incidents
    interval: float = Field(default=10.0, gt=0, allow_inf_nan=False)

    @field_validator("allow")
    @classmethod
    def _unique(cls, value: list[Repair]) -> list[Repair]:
        return sorted(set(value), key=REPAIRS.index)

    @field_validator("fence_command")
    @classmethod
    def _check_fence(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        try:
            words = shlex.split(value)
        except ValueError:
            raise ValueError("fence_command is not a valid command line (an unclosed quote?)") from None
        if not any("{node}" in word for word in words):
            raise ValueError("fence_command must name the node: '{node}' in one of its words")
        return value

    def allowed(self, backend: BackendSettings) -> tuple[Repair, ...]:
        """The repairs allowed on ``backend``: its ``repair_allow``, else ``allow``."""
        chosen = backend.repair_allow if backend.repair_allow is not None else self.allow
        return tuple(repair for repair in REPAIRS if repair in chosen)

    def fence_argv(self, node: str) -> list[str]:
        """``fence_command`` for ``node``, as the argument list to run."""
        assert self.fence_command is not None
        return [word.replace("{node}", node) for word in shlex.split(self.fence_command)]
