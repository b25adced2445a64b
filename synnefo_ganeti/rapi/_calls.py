"""The small vocabulary of the client's calls: request ids, reboot types, modes, create progress.

The modes are Ganeti 3.0's (``lib/_constants.py``: ``REPLACE_MODES``, ``NODE_EVAC_MODES``,
``HT_MIGRATION_MODES``, ``EXPORT_MODES``, ``VALID_ALLOC_POLICIES``, ``NIC_VALID_MODES``,
``QR_VIA_RAPI``, the ``ST_*`` storage types; node roles from ``lib/rapi/rlib2.py``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Literal

from synnefo_ganeti.errors import GanetiError

__all__ = [
    "ALLOC_POLICIES",
    "EXPORT_MODES",
    "MIGRATION_MODES",
    "NETWORK_MODES",
    "NODE_EVACUATE_MODES",
    "NODE_ROLES",
    "QUERY_RESOURCES",
    "REASON_PREFIX",
    "REPLACE_DISKS_MODES",
    "SETTABLE_NODE_ROLES",
    "STORAGE_TYPES",
    "CreateProgress",
    "NodeRole",
    "RebootType",
    "job_reason",
    "new_request_id",
    "with_job_reason",
]

#: the reason-trail prefix a create's request id travels under (``synnefo-ganeti:<id>``)
REASON_PREFIX = "synnefo-ganeti:"
_JOB_REASON: ContextVar[str | None] = ContextVar("synnefo_ganeti_job_reason", default=None)


@contextmanager
def job_reason(reason: str) -> Iterator[None]:
    """Every write sent from this task inside the block carries ``?reason=<reason>`` (unless the
    call names its own), so that the job it makes can be found by it in Ganeti's job list
    (``Job.request_ids``) when its answer is lost. Reads are left as they are."""
    token = _JOB_REASON.set(reason)
    try:
        yield
    finally:
        _JOB_REASON.reset(token)


def with_job_reason(
    method: str, path: str, query: Mapping[str, str] | Sequence[tuple[str, str]] | None, *, body: bool
) -> Mapping[str, str] | Sequence[tuple[str, str]] | None:
    """``query`` with the reason of :func:`job_reason`, for a write that names none. Not for a
    reinstall with a body: Ganeti's ``R_2_instances_name_reinstall.POST`` refuses any query
    argument beside one ("Can't combine query and body parameters")."""
    reason = _JOB_REASON.get()
    if reason is None or method == "GET" or (body and path.endswith("/reinstall")):
        return query
    pairs = list(query.items()) if isinstance(query, Mapping) else list(query or ())
    if any(name == "reason" for name, _ in pairs):
        return query
    return [*pairs, ("reason", reason)]


#: how ``reboot_instance`` reboots: the OS only, the VM, or the VM with its configuration re-read
RebootType = Literal["soft", "hard", "full"]
#: a node's role as ``GET /2/nodes/NAME/role`` answers it
NodeRole = Literal["master", "master-candidate", "regular", "drained", "offline"]
NODE_ROLES: frozenset[str] = frozenset({"master", "master-candidate", "regular", "drained", "offline"})
#: the roles ``PUT /2/nodes/NAME/role`` sets (``master`` only by a master failover)
SETTABLE_NODE_ROLES: frozenset[str] = NODE_ROLES - {"master"}
REPLACE_DISKS_MODES: frozenset[str] = frozenset(
    {"replace_auto", "replace_new_secondary", "replace_on_primary", "replace_on_secondary"}
)
NODE_EVACUATE_MODES: frozenset[str] = frozenset({"all", "primary-only", "secondary-only"})
MIGRATION_MODES: frozenset[str] = frozenset({"live", "non-live"})
EXPORT_MODES: frozenset[str] = frozenset({"local", "remote"})
ALLOC_POLICIES: frozenset[str] = frozenset({"preferred", "last_resort", "unallocable"})
NETWORK_MODES: frozenset[str] = frozenset({"bridged", "openvswitch", "pool", "routed"})
#: what ``/2/query/WHAT`` serves
QUERY_RESOURCES: frozenset[str] = frozenset(
    {"export", "filter", "group", "instance", "job", "lock", "network", "node"}
)
STORAGE_TYPES: frozenset[str] = frozenset(
    {"blockdev", "diskless", "ext", "file", "sharedfile", "gluster", "lvm-pv", "lvm-vg", "rados"}
)


def new_request_id() -> str:
    """A fresh id for one create request (32 hex digits)."""
    return uuid.uuid4().hex


@dataclass(frozen=True, slots=True)
class CreateProgress:
    """Passed to ``create_instances``' ``on_progress`` after each create finishes."""

    done: int
    total: int
    index: int
    result: int | GanetiError
