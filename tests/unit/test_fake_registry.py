"""The fake's opcode registry: which handler runs an op, which ops lock their node."""

from __future__ import annotations

import asyncio

import pytest

from synnefo_ganeti import JobStatus
from synnefo_ganeti.testing import FakeCluster
from synnefo_ganeti.testing import _opcodes as opcodes
from synnefo_ganeti.testing._registry import LOCKS, OPCODES, opcode

INSTANCE_OPS = {"OP_INSTANCE_CREATE", "OP_INSTANCE_REMOVE", "OP_INSTANCE_STARTUP", "OP_INSTANCE_SHUTDOWN",
                "OP_INSTANCE_REBOOT", "OP_INSTANCE_SET_PARAMS", "OP_INSTANCE_MULTI_ALLOC"}  # fmt: skip


def test_every_opcode_the_fake_can_write_has_a_handler() -> None:
    assert set(OPCODES) == set(opcodes.LUXID) == set(opcodes.RESOLVED)
    # every instance op declares its LU's locks (the other ops': test_fake_surface)
    assert set(LOCKS) >= INSTANCE_OPS


def test_an_opcode_has_one_handler() -> None:
    with pytest.raises(ValueError, match="OP_TEST_DELAY already has a handler: delay"):

        @opcode("OP_TEST_DELAY")
        async def again(*args: object) -> None: ...


async def test_an_op_without_a_handler_fails_as_ganeti_fails_an_unknown_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(OPCODES, "OP_TEST_DELAY")
    cluster = FakeCluster(nodes=1)
    try:
        job_id = cluster.submit(
            [("OP_TEST_DELAY", {"duration": 0.0}), ("OP_TEST_DELAY", {"duration": 0.0})],
            client=("gnt-debug", "submit-job"),
        )
        job = cluster.jobs[job_id]
        while not job.status.is_final:
            await asyncio.wait_for(job.changed.wait(), 5)
        assert job.status is JobStatus.ERROR
        assert [op.result for op in job.ops] == [
            ["OpPrereqError", ["Opcode OP_TEST_DELAY is not supported by the fake Ganeti", "wrong_input"]],
            ["OpExecError", ["Preceding opcode failed"]],
        ]
        assert job.ops[0].exec_timestamp is None  # a prerequisite failure: never ran
    finally:
        await cluster.aclose()
