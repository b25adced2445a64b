"""The small vocabulary of the client's calls: request ids, reboot types, create progress."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Literal

from synnefo_ganeti.errors import GanetiError

__all__ = ["REASON_PREFIX", "CreateProgress", "RebootType", "new_request_id"]

#: the reason-trail prefix a create's request id travels under (``synnefo-ganeti:<id>``)
REASON_PREFIX = "synnefo-ganeti:"
#: how ``reboot_instance`` reboots: the OS only, the VM, or the VM with its configuration re-read
RebootType = Literal["soft", "hard", "full"]


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
