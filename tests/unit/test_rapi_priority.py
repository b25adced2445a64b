"""Jobs at a priority: ``migrate_instance``, ``failover_instance`` and ``modify_node`` send
``priority`` in their body (every opcode takes it, ``opcodes.OpCode``; RAPI's ``FillOpcode``
passes the body through), checked against ``constants.OP_PRIO_SUBMIT_VALID``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import orjson
import pytest

from synnefo_ganeti import RapiClient
from synnefo_ganeti.errors import ConfigError
from synnefo_ganeti.rapi._base import JOB_PRIORITIES, PRIORITY_LOW, job_priority
from tests.helpers import StubRapi, stub_client

INST = "/2/instances/vm1.ganeti.test"
CALLS: list[tuple[str, str, Callable[[RapiClient, int | None], Awaitable[int]]]] = [
    ("PUT", f"{INST}/migrate", lambda c, p: c.migrate_instance("vm1.ganeti.test", target_node="n2", priority=p)),
    ("PUT", f"{INST}/failover", lambda c, p: c.failover_instance("vm1.ganeti.test", target_node="n2", priority=p)),
    ("POST", "/2/nodes/n1/modify", lambda c, p: c.modify_node("n1", drained=True, priority=p)),
]  # fmt: skip


@pytest.mark.parametrize(("method", "path", "call"), CALLS, ids=["migrate", "failover", "modify_node"])
async def test_the_priority_is_in_the_body(
    method: str, path: str, call: Callable[[RapiClient, int | None], Awaitable[int]]
) -> None:
    async with StubRapi() as stub:
        stub.route(method, path, 77)
        async with stub_client(stub.url) as rapi:
            assert await call(rapi, PRIORITY_LOW) == 77
    body = orjson.loads(stub.seen[0].body)
    assert body["priority"] == 10


@pytest.mark.parametrize(("method", "path", "call"), CALLS[:2], ids=["migrate", "failover"])
async def test_no_priority_sends_none(
    method: str, path: str, call: Callable[[RapiClient, int | None], Awaitable[int]]
) -> None:
    async with StubRapi() as stub:
        stub.route(method, path, 78)
        async with stub_client(stub.url) as rapi:
            await call(rapi, None)
    assert "priority" not in orjson.loads(stub.seen[0].body)


async def test_a_priority_ganeti_refuses_is_refused_before_sending() -> None:
    assert JOB_PRIORITIES == (-10, 0, 10)
    assert job_priority(None) is None and job_priority(-10) == -10
    for wrong in (5, 19, True):
        with pytest.raises(ConfigError, match="job priority"):
            job_priority(wrong)
    async with StubRapi() as stub, stub_client(stub.url) as rapi:
        with pytest.raises(ConfigError):
            await rapi.migrate_instance("vm1.ganeti.test", priority=3)
    assert stub.seen == []
