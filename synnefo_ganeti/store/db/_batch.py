"""Many callers' writes in one transaction: each in a savepoint of its own, or, for writes of
one kind queued together, one set-based step for all of them (a batch).

A batch kind is a function ``kind(conn, [arg, ...])`` that does, in a few statements, what the
calls' own functions would do one by one in many: per item it returns the outcome
``(True, result)``, or None for an item it leaves to that call's own function (a case off its
fast path: a name held, a row to reuse, an error to word). Those run after it, each in a
savepoint, and see what the batch wrote, as if they had been queued after it. A batch that
fails as a whole (a race its checks did not see: an integrity error) is rolled back and every
one of its calls runs on its own.

A transaction that holds one batch and nothing else (the common case: a burst of one kind)
runs its step without a savepoint (two round trips fewer); if the step fails, the whole
transaction is rolled back and :class:`_BatchFailed` tells the writer to run every call on its
own, as a failed savepoint would have.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, IntegrityError

__all__ = ["BatchKind", "Batched", "Outcome", "grouped", "in_savepoint"]

#: a call's outcome: (True, its result) or (False, the exception it raised)
Outcome = tuple[bool, Any]
BatchKind = Callable[[Connection, list[Any]], list[Outcome | None]]


class _BatchFailed(Exception):  # (a signal to the writer, never seen outside the store)
    """A batch run without a savepoint failed: the transaction is rolled back; run each call alone."""


@dataclass(frozen=True, slots=True)
class Batched:
    """A write that may also run as one item (``arg``) of a set-based step (``kind``)."""

    kind: BatchKind
    arg: Any


def in_savepoint(conn: Connection, fn: Callable[[Connection], Any]) -> Outcome:
    """``fn`` in a savepoint: rolled back alone when it raises. Database trouble other than an
    integrity error is raised (the whole transaction is the database's problem, not the call's)."""
    savepoint = conn.begin_nested()
    try:
        result = fn(conn)
    except IntegrityError as exc:
        savepoint.rollback()
        return False, exc
    except DBAPIError:
        raise
    except Exception as exc:  # the call's own refusal (a ConflictError, an InvalidError ...)
        savepoint.rollback()
        return False, exc
    savepoint.commit()
    return True, result


def grouped(
    calls: Sequence[tuple[Callable[[Connection], Any], Batched | None]],
) -> Callable[[Connection], list[Outcome]]:
    """One function running ``calls`` (each its own function, and its batch if any) in one
    transaction: the batches first (a kind with two calls or more), then the rest in order."""

    def run(conn: Connection) -> list[Outcome]:
        outcomes: list[Outcome | None] = [None] * len(calls)
        kinds: dict[BatchKind, list[int]] = {}
        for index, (_fn, batch) in enumerate(calls):
            if batch is not None:
                kinds.setdefault(batch.kind, []).append(index)
        alone = len(kinds) == 1 and len(next(iter(kinds.values()))) == len(calls)
        for kind, members in kinds.items():
            if len(members) < 2:
                continue
            args = [batch.arg for _fn, batch in (calls[i] for i in members) if batch is not None]
            if alone:  # nothing else in the transaction: no savepoint (see the module)
                try:
                    ok, step = True, kind(conn, args)
                except Exception as exc:
                    raise _BatchFailed(f"{getattr(kind, '__name__', kind)}: {exc}") from exc
            else:
                ok, step = in_savepoint(conn, _step(kind, args))
            if ok:
                for index, outcome in zip(members, step, strict=True):
                    outcomes[index] = outcome
        done: list[Outcome] = []
        for index, (fn, _batch) in enumerate(calls):
            outcome = outcomes[index]
            done.append(outcome if outcome is not None else in_savepoint(conn, fn))
        return done

    return run


def _step(kind: BatchKind, args: list[Any]) -> Callable[[Connection], list[Outcome | None]]:
    return lambda conn: kind(conn, args)
