"""The cluster and node opcodes: ``OP_TEST_DELAY`` (``gnt-debug delay``) so far.

It takes no node lock here: the fake runs it for its ``duration`` on the master.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from synnefo_ganeti.testing._registry import opcode

if TYPE_CHECKING:
    from synnefo_ganeti.testing._engine import FakeCluster
    from synnefo_ganeti.testing._jobs import FakeJob, FakeOp

__all__: list[str] = []


@opcode("OP_TEST_DELAY")
async def delay(cluster: FakeCluster, job: FakeJob, op: FakeOp) -> None:
    nodes = [cluster.nodes[name].uuid for name in op.luxid.get("on_nodes") or [] if name in cluster.nodes]
    cluster.start_running(job, op, duration=float(op.luxid.get("duration") or 0.0), on_node_uuids=nodes)
    await asyncio.sleep(float(op.luxid.get("duration") or 0.0))
