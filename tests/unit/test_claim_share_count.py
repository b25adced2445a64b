"""A dispatcher among several claims its fair share of the pending requests (issue 31). The count
of the pending requests it takes that share from stands for ``PENDING_COUNT_TTL`` seconds (its
claim loop runs each time a request's work ends, hundreds of times a second in a burst, and each
count reads every pending request); it counts again sooner, after ``PENDING_RECOUNT``, when that
count leaves it nothing to claim, and at once when woken for a request written in its process.
What it took since the count counts against its share even once that work has ended: a dispatcher
whose requests end fast does not take the others' share before they look."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from synnefo_ganeti.dispatch import _submitter
from synnefo_ganeti.dispatch._submitter import PENDING_COUNT_TTL, PENDING_RECOUNT, Submitter


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
        _pending_count=None,
    )
    for method in ("_claimed", "_share_left", "_count_pending_again"):
        setattr(stub, method, getattr(Submitter, method).__get__(stub))
    return stub


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [0.0]
    monkeypatch.setattr(_submitter.time, "monotonic", lambda: now[0])
    return now


async def limit(sub: Any, room: int = 500) -> int:
    return await Submitter._claim_limit(sub, room)


async def test_a_share_taken_is_not_taken_again_until_counted_again(clock: list[float]) -> None:
    store = _Store(pending=90)
    sub = _stub(store, claimers=3)
    assert await limit(sub) == 30 and store.counted == 1  # a third of 90
    sub._claimed(10)
    assert await limit(sub) == 20 and store.counted == 1  # the count stands: 30 less the 10 taken
    sub._claimed(20)
    # its work ended at once (nothing in flight): what it took still counts against its share
    assert not sub._inflight and await limit(sub) == 0 and store.counted == 1
    store.pending = 40  # (the others took 20 of theirs)
    clock[0] += PENDING_RECOUNT / 2
    assert await limit(sub) == 0 and store.counted == 1  # not counted again that soon
    clock[0] += PENDING_RECOUNT
    assert await limit(sub) == 14 and store.counted == 2  # share used up: counted again, a third of 40


async def test_what_it_holds_counts_against_its_share_when_more_than_it_took(clock: list[float]) -> None:
    store = _Store(pending=60)
    sub = _stub(store, claimers=2)
    sub._inflight = {object() for _ in range(25)}  # claimed before the count, still being worked on
    assert await limit(sub) == 5  # half of 60, less the 25 it holds
    assert await limit(sub, room=3) == 3  # and never more than it has room for
    sub._claimed(5)
    sub._inflight = set()
    assert await limit(sub) == 25 and store.counted == 1  # those ended: 30 less the 5 taken


async def test_a_count_that_stood_for_its_time_is_read_again(clock: list[float]) -> None:
    store = _Store(pending=90)
    sub = _stub(store, claimers=3)
    assert await limit(sub) == 30
    sub._claimed(5)
    store.pending = 30
    clock[0] += PENDING_COUNT_TTL
    assert await limit(sub) == 10 and store.counted == 2  # a third of 30, nothing taken since


async def test_none_pending_is_counted_again_soon_and_a_wake_forgets_the_count(clock: list[float]) -> None:
    store = _Store(pending=0)
    sub = _stub(store, claimers=2)
    assert await limit(sub) == 0 and store.counted == 1
    store.pending = 4  # requests came, written by another process
    assert await limit(sub) == 0 and store.counted == 1  # (not counted again at once)
    clock[0] += PENDING_RECOUNT
    assert await limit(sub) == 2 and store.counted == 2
    sub._claimed(2)
    store.pending = 6
    sub._count_pending_again()  # a request written in this process: its dispatcher woken
    assert await limit(sub) == 3 and store.counted == 3


async def test_alone_a_dispatcher_claims_what_it_has_room_for_without_counting(clock: list[float]) -> None:
    alone = _Store(pending=90)
    assert await limit(_stub(alone, claimers=1), 40) == 40 and alone.counted == 0
    assert await limit(_stub(alone, claimers=1), 0) == 0
    assert await limit(_stub(alone, claimers=3), 0) == 0 and alone.counted == 0  # no room: no count
