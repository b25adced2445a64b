"""Many callers' writes in one transaction: each in a savepoint of its own, or, for writes of
one kind queued together, one set-based step for all of them (a batch).

A batch kind is a function ``kind(conn, [arg, ...])`` that does, in a few statements, what the
calls' own functions would do one by one in many: per item it returns the outcome
``(True, result)``, or None for an item it leaves to that call's own function (a case off its
fast path: a name held, a row to reuse, an error to word). Those run after it, each in a
savepoint, and see what the batch wrote, as if they had been queued after it. A batch that
fails as a whole (a race its checks did not see: an integrity error) is rolled back and every
one of its calls runs on its own.

The batch steps run without a savepoint first (a savepoint and its release are two round trips
a step, and a batch step fails only on a race its checks did not see); if a step fails, the
whole transaction is rolled back and :class:`_BatchFailed` tells the writer to run the calls
again with a savepoint around each step (``savepoints=True``), where a failed step is rolled back
alone and its calls run one by one, as described above. The calls that run on their own (no
batch) always run in a savepoint: their refusals (a name taken) are expected answers.
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
    """A batch step run without a savepoint failed: the transaction is rolled back; run the
    calls again with savepoints (see the module)."""


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
    *,
    savepoints: bool = False,
) -> Callable[[Connection], list[Outcome]]:
    """One function running ``calls`` (each its own function, and its batch if any) in one
    transaction: the batches first, then the rest in order. Without ``savepoints`` every batch
    kind runs as a step, raising :class:`_BatchFailed` if one fails; with them, a kind with two
    calls or more runs as a step in a savepoint (see the module)."""

    def run(conn: Connection) -> list[Outcome]:
        outcomes: list[Outcome | None] = [None] * len(calls)
        kinds: dict[BatchKind, list[int]] = {}
        for index, (_fn, batch) in enumerate(calls):
            if batch is not None:
                kinds.setdefault(batch.kind, []).append(index)
        for kind, members in kinds.items():
            if savepoints and len(members) < 2:
                continue
            args = [batch.arg for _fn, batch in (calls[i] for i in members) if batch is not None]
            if not savepoints:  # no savepoint: a failure is the whole transaction's (see the module)
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
