"""The registry of opcodes the fake executes: ``OP_ID`` -> handler.

A handler is ``async def handler(cluster, job, op) -> None``, registered with
``@opcode("OP_...")``. It runs once the op holds its locks (its stage is ``resolved``,
its status still ``waiting``); it raises :class:`~._cluster.OpFailure` for a check
Ganeti makes, calls ``cluster.start_running(job, op, **resolved)`` when Ganeti's
executor would start executing, and ``cluster.work(...)`` to spend the op's time and
write its log lines. Returning marks the op ``success`` (``op.result`` is its result).

``locks=``: a function ``(cluster, op) -> Needs`` naming the locks the op's LU asks for
in ``ExpandNames``/``DeclareLocks`` (instance, node and node-resource locks, see
:mod:`._locks`); the engine acquires them before the handler runs (the op is ``waiting``
meanwhile) and releases what the handler has not released when the op ends.

The handler modules (``_ops_*``) register themselves when imported; :mod:`._engine`
imports them all. An op whose ``OP_ID`` has no handler fails as the fake always
answered: ``OpPrereqError`` "Opcode ... is not supported by the fake Ganeti".
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from synnefo_ganeti.testing._engine import FakeCluster
    from synnefo_ganeti.testing._jobs import FakeJob, FakeOp

__all__ = ["LOCKS", "OPCODES", "Handler", "LockFn", "Needs", "opcode"]


@dataclass
class Needs:
    """The locks an LU asks for: ``needed_locks`` of its ``ExpandNames``/``DeclareLocks``.

    ``node``/``node_res``: node names, :data:`._locks.ALL` (``locking.ALL_SET``) or ``None``;
    ``shared``: node and node-res locks shared (``ShareAll()``), else exclusive;
    ``opportunistic``: ``opportunistic_locks_count`` when the node levels are acquired
    opportunistically (``opportunistic_locks[level] = True``), else 0.
    """

    instance: str | None = None
    node: list[str] | str | None = None
    node_res: list[str] | str | None = None
    shared: bool = False
    opportunistic: int = 0


Handler: TypeAlias = "Callable[[FakeCluster, FakeJob, FakeOp], Awaitable[None]]"
LockFn: TypeAlias = "Callable[[FakeCluster, FakeOp], Needs]"

#: every opcode the fake executes, by ``OP_ID``
OPCODES: dict[str, Handler] = {}
#: the locks each opcode takes before it runs, by ``OP_ID``
LOCKS: dict[str, LockFn] = {}


def opcode(op_id: str, *, locks: LockFn | None = None) -> Callable[[Handler], Handler]:
    """Register the decorated coroutine function as the handler of ``op_id``."""

    def register(handler: Handler) -> Handler:
        if op_id in OPCODES:
            raise ValueError(f"{op_id} already has a handler: {OPCODES[op_id].__qualname__}")
        OPCODES[op_id] = handler
        if locks is not None:
            LOCKS[op_id] = locks
        return handler

    return register
