"""The RAPI calls no other real-Ganeti test makes, on whichever testbed runs (3.0 or 3.1): a network's
tags, its modify and its rename (3.1 only: before, ``UnsupportedError`` before anything is sent), a
node group's rename, an instance export, and a node powercycle. Each is sent for real and Ganeti's
answer is asserted; the two that would harm the testbed are sent in the form Ganeti refuses (the
master without ``force``; a live export of a ``file`` disk, which Ganeti cannot snapshot). The
network and the group are this test's own, removed even when a step fails.
"""

from __future__ import annotations

import uuid

import pytest

from synnefo_ganeti import JobStatus, RapiClient, UnsupportedError
from tests.integration._testbed import DEADLINE, client, name, spec

pytestmark = [pytest.mark.ganeti, pytest.mark.timeout(300)]


async def ended(rapi: RapiClient, job_id: int, status: JobStatus = JobStatus.SUCCESS) -> list[object]:
    job = await rapi.wait_for_job(job_id, timeout=DEADLINE)
    assert job.status is status, job.opresult
    return list(job.opresult or [])


async def test_a_networks_tags_modify_and_rename(testbed) -> None:
    tag = f"sg-{uuid.uuid4().hex[:6]}"
    net = f"sgnet-{uuid.uuid4().hex[:6]}"
    renamed = f"{net}-b"
    subnet = f"10.{uuid.uuid4().int % 200 + 20}.{uuid.uuid4().int % 250}.0/28"
    async with client(testbed) as rapi:
        await ended(rapi, await rapi.create_network(net, subnet))
        current = net
        try:
            assert await rapi.get_network_tags(net) == []
            await ended(rapi, await rapi.add_network_tags(net, [tag]))
            assert await rapi.get_network_tags(net) == [tag]
            await ended(rapi, await rapi.delete_network_tags(net, [tag]))
            assert await rapi.get_network_tags(net) == []
            reserved = subnet.replace(".0/28", ".5")
            before = (await rapi.get_network(net)).reserved_count or 0  # (network and broadcast)
            await ended(rapi, await rapi.modify_network(net, add_reserved_ips=[reserved]))
            assert (await rapi.get_network(net)).reserved_count == before + 1
            if testbed.series == "3.1":
                await ended(rapi, await rapi.rename_network(net, renamed))
                current = renamed
                assert renamed in {n.name for n in await rapi.list_networks()}
            else:
                with pytest.raises(UnsupportedError) as refused:
                    await rapi.rename_network(net, renamed)
                assert refused.value.needed == "3.1" and "3.1" in str(refused.value)
        finally:
            await ended(rapi, await rapi.delete_network(current))


async def test_a_groups_rename(testbed) -> None:
    group = f"sggrp-{uuid.uuid4().hex[:6]}"
    renamed = f"{group}-b"
    async with client(testbed) as rapi:
        await ended(rapi, await rapi.create_group(group))
        current = group
        try:
            await ended(rapi, await rapi.rename_group(group, renamed))
            current = renamed
            assert renamed in {g.name for g in await rapi.list_groups()}
        finally:
            await ended(rapi, await rapi.delete_group(current))


async def test_an_export_and_a_powercycle_are_refused_as_ganeti_refuses_them(testbed) -> None:
    instance = name("exp")
    async with client(testbed) as rapi:
        await ended(
            rapi,
            await rapi.create_instance(spec(testbed, instance, disk_template="file", disks=[{"size": 1024}])),
        )
        try:
            for shutdown, why in ((False, "requested a live export"), (True, "--long-sleep")):
                job_id = await rapi.export_instance(instance, "local", testbed.node, shutdown=shutdown)
                [[kind, [message]]] = await ended(rapi, job_id, JobStatus.ERROR)  # type: ignore[misc]
                assert kind == "OpExecError" and "Not all disks could be snapshotted" in message, message
                assert why in message
        finally:
            await ended(rapi, await rapi.delete_instance(instance))
        master = (await rapi.info()).master
        assert master is not None
        [[kind, [message, code]]] = await ended(rapi, await rapi.powercycle_node(master), JobStatus.ERROR)  # type: ignore[misc]
        assert (kind, code) == ("OpPrereqError", "wrong_input")
        assert message == "The node is the master and the force parameter was not set"
