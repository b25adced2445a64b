"""Why a request waits: ``Request.waiting_reason`` written for the requests no backend takes now.

When the submitter cannot place a request (the allocator's :class:`NoCapacityError`, one reason
per backend), the request waits in line for room (:mod:`._room`); the reason goes to the
database (``requests.waiting_reason``: the API, the CLI, the console and the change feed read
it there) and into the gauge ``synnefo_ganeti_requests_waiting{reason}`` by its *kind*, a small
fixed set so that the label stays cheap:

* ``no_room``: some backend takes the spec but has no room now (memory, disk, vCPUs, no node
  fits, a node full); room comes back as creates end or instances go;
* ``backend_down``: the backends that could take it fail their health checks, answer 503, or
  are not in this dispatcher's configuration;
* ``drained``: the backends that could take it are drained;
* ``not_offered``: the backends up do not offer what it asks (OS, template, network, policy);
* ``failed_there``: its create failed, for a reason of theirs, on every backend left.

The reason is written again only when its kind changes, or its words after
:data:`REWRITE_AFTER` seconds (the words carry free memory and such, which change with every
create that ends: a write each time would make a change-feed row each time). Placing a request
clears it in the same transaction (store/requests/_requests.py ``place``, store/requests/_requests_batch.py), and
so does its end (``finish``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from synnefo_ganeti import metrics
from synnefo_ganeti.store import Store

__all__ = ["REWRITE_AFTER", "WAITING_KINDS", "WaitingKind", "WaitingReasons", "waiting_kind"]

WaitingKind = Literal["no_room", "backend_down", "drained", "not_offered", "failed_there"]
#: every kind, most hopeful first: the one of a request is the first any backend gives
WAITING_KINDS: Final[tuple[WaitingKind, ...]] = (
    "no_room",
    "backend_down",
    "drained",
    "not_offered",
    "failed_there",
)
#: seconds before a reason of the same kind is written again with its new words
REWRITE_AFTER: Final = 30.0

#: the words of the allocator's reasons (allocate/_placement.py ``_assess``, allocate/_nodes.py,
#: allocate/_catalog.py ``refusals``, allocate/_addresses.py), checked in this order; a reason
#: none of them names is taken for room (``no_room``: free memory, disk, addresses, nodes)
_SIGNS: Final[tuple[tuple[WaitingKind, tuple[str, ...]], ...]] = (
    (
        "backend_down",
        (
            "failing health checks",
            "refusing submissions",
            "not a backend of this dispatcher",
            "not a known backend",
            "no usable node (all offline",
            "was removed",
        ),
    ),
    ("failed_there", ("the create failed there already",)),
    (
        "not_offered",
        (
            "not offered",
            "not enabled",
            "is not in range",
            "can ever free",
            "CPUs (at most",
            "MiB disk (largest",
            "not on this backend",
            "not connected to a node group",
            "not in network",
        ),
    ),
)


def _kind_of(reason: str) -> WaitingKind:
    if reason == "drained":  # (as _assess says it; "drained" in other words is a node's)
        return "drained"
    for kind, signs in _SIGNS:
        if any(sign in reason for sign in signs):
            return kind
    return "no_room"


def waiting_kind(reasons: Mapping[str, str]) -> WaitingKind:
    """The kind of a request's wait, from each backend's reason (the most hopeful any gives)."""
    kinds = {_kind_of(reason) for reason in reasons.values()}
    return next((kind for kind in WAITING_KINDS if kind in kinds), "backend_down")


@dataclass(slots=True)
class _Noted:
    kind: WaitingKind
    text: str
    at: float


class WaitingReasons:
    """The requests this dispatcher holds that wait, their reasons as written, and the gauge."""

    def __init__(self, *, rewrite_after: float = REWRITE_AFTER) -> None:
        self.rewrite_after = rewrite_after
        self._noted: dict[str, _Noted] = {}

    def __repr__(self) -> str:
        counts = self.counts()
        waiting = ", ".join(f"{counts[kind]} {kind}" for kind in WAITING_KINDS if counts[kind])
        return f"<WaitingReasons {waiting or 'none waiting'}>"

    def __len__(self) -> int:
        return len(self._noted)

    def counts(self) -> dict[WaitingKind, int]:
        counts = dict.fromkeys(WAITING_KINDS, 0)
        for noted in self._noted.values():
            counts[noted.kind] += 1
        return counts

    async def note(
        self, store: Store, request_id: str, dispatcher: str, kind: WaitingKind, text: str
    ) -> bool:
        """The request waits for ``kind``, ``text`` saying why: written unless as written (or the
        same kind, written under ``rewrite_after`` s ago). True: written."""
        now = time.monotonic()
        noted = self._noted.get(request_id)
        if (
            noted is not None
            and noted.kind == kind
            and (noted.text == text or now - noted.at < self.rewrite_after)
        ):
            return False
        await store.set_waiting_reason(request_id, dispatcher, text)
        self._set(request_id, _Noted(kind, text, now))
        return True

    def forget(self, request_id: str) -> None:
        """The request no longer waits here (placed, ended, given back): out of the gauge. Its
        reason in the database was cleared with its placement or end (or stays, for the next
        dispatcher to write again, when given back)."""
        self._set(request_id, None)

    def _set(self, request_id: str, noted: _Noted | None) -> None:
        before = self._noted.pop(request_id, None)
        if before is not None:
            metrics.REQUESTS_WAITING.labels(before.kind).dec()
        if noted is not None:
            self._noted[request_id] = noted
            metrics.REQUESTS_WAITING.labels(noted.kind).inc()
