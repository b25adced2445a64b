"""A dispatcher among several claims its fair share of the pending requests (issue 31); the count
of the pending requests it takes that share from is read at most every ``PENDING_COUNT_TTL``
seconds, less what it claims meanwhile: its claim loop runs each time a request's work ends,
hundreds of times a second in a burst, and each count read every pending request."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from synnefo_ganeti.dispatch import _submitter
from synnefo_ganeti.dispatch._submitter import PENDING_COUNT_TTL, Submitter


class _Store:
    def __init__(self, pending: int) -> None:
        self.pending = pending
        self.counted = 0

    async def request_counts(self, *, status: Any = None) -> dict[tuple[str | None, str], int]:
        self.counted += 1
        return {(None, "pending"): self.pending}


def _stub(store: _Store, claimers: int) -> Any:
    stub = SimpleNamespace(
        settings=SimpleNamespace(dispatcher=SimpleNamespace(claim_batch=100)),
        leases=SimpleNamespace(claimers=lambda: claimers),
        store=store,
        _inflight=set(),
        _pending_counted=None,
    )
    stub._claimed = lambda count: Submitter._claimed(stub, count)  # type: ignore[arg-type]
    return stub


async def test_the_pending_count_stands_for_a_while_less_what_was_claimed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [100.0]
    monkeypatch.setattr(_submitter.time, "monotonic", lambda: clock[0])
    store = _Store(pending=90)
    sub = _stub(store, claimers=3)
    assert await Submitter._claim_limit(sub, 500) == 30  # a third of 90
    sub._claimed(30)
    clock[0] += PENDING_COUNT_TTL / 2
    store.pending = 0  # (the others claimed the rest: not read yet)
    assert await Submitter._claim_limit(sub, 500) == 20 and store.counted == 1  # a third of 60
    sub._claimed(20)
    clock[0] += PENDING_COUNT_TTL / 2
    assert await Submitter._claim_limit(sub, 500) == 0 and store.counted == 2  # counted again: none
    # alone, a dispatcher claims what it has room for, without counting
    alone = _Store(pending=90)
    assert await Submitter._claim_limit(_stub(alone, claimers=1), 40) == 40 and alone.counted == 0
