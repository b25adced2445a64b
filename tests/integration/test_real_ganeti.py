"""The RAPI client against a real Ganeti cluster, 3.0 or 3.1 (scripts/ganeti-testbed up [--version 3.1]).

Skipped with a reason where no cluster runs (a laptop without root); in CI these
tests must run, and the ``testbed`` fixture fails instead of skipping.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes

from synnefo_ganeti import (
    AuthenticationError,
    InstanceSpec,
    JobNotFoundError,
    JobStatus,
    NotFoundError,
    RapiClient,
    RetryPolicy,
    TLSError,
)
from tests.integration._testbed import client, name, ns, spec

pytestmark = [pytest.mark.ganeti, pytest.mark.timeout(300)]


async def test_cluster_calls(testbed) -> None:
    async with client(testbed) as rapi:
        assert await rapi.version() == 2
        info = await rapi.info()
        assert info.name == testbed.cluster and "fake" in info.enabled_hypervisors
        assert "instance-create-reqv1" in await rapi.features()
        nodes = await rapi.list_nodes()
        assert testbed.node in [n.name for n in nodes]
        node = next(n for n in nodes if n.name == testbed.node)
        assert node.mtotal and node.mfree is not None and node.ctotal


async def test_instance_lifecycle(testbed) -> None:
    instance = name("life")
    async with client(testbed) as rapi:
        job_id = await rapi.create_instance(spec(testbed, instance))
        assert isinstance(job_id, int)
        try:
            job = await rapi.wait_for_job(job_id, timeout=120)
            assert job.status is JobStatus.SUCCESS, job.failure
            assert job.failure is None and job.log  # Ganeti logs the create's steps
            assert any(job_id == j.id for j in await rapi.list_jobs())

            listed = {i.name: i for i in await rapi.list_instances()}
            assert listed[instance].oper_state is True
            got = await rapi.get_instance(instance)
            assert got.admin_state == "up" and got.beparams["maxmem"] == 128 and len(got.nic_macs) == 1

            duplicate = await rapi.wait_for_job(
                await rapi.create_instance(spec(testbed, instance)), timeout=120
            )
            assert duplicate.status is JobStatus.ERROR
            assert duplicate.failure is not None
            assert (duplicate.failure.type, duplicate.failure.ecode) == ("OpPrereqError", "already_exists")

            stop = await rapi.wait_for_job(await rapi.shutdown_instance(instance), timeout=120)
            assert stop.status is JobStatus.SUCCESS
            assert (await rapi.get_instance(instance)).oper_state is False

            start = await rapi.wait_for_job(await rapi.startup_instance(instance), timeout=120)
            assert start.status is JobStatus.SUCCESS
            assert (await rapi.get_instance(instance)).oper_state is True

            reboot = await rapi.wait_for_job(await rapi.reboot_instance(instance), timeout=120)
            assert reboot.status is JobStatus.SUCCESS

            modify = await rapi.wait_for_job(
                await rapi.modify_instance(instance, beparams={"vcpus": 2}), timeout=120
            )
            assert modify.status is JobStatus.SUCCESS, modify.failure
            assert (await rapi.get_instance(instance)).beparams["vcpus"] == 2
        finally:
            remove = await rapi.wait_for_job(await rapi.delete_instance(instance), timeout=120)
        assert remove.status is JobStatus.SUCCESS
        with pytest.raises(NotFoundError):
            await rapi.get_instance(instance)


@pytest.mark.parametrize(
    ("overrides", "error_type", "ecode"),
    [
        ({"os": "doesnotexist"}, "OpExecError", None),
        ({"beparams": {"memory": "abc"}}, "TypeEnforcementError", None),
        ({"disk_template": "file", "disks": [{"size": 64}]}, "OpPrereqError", "wrong_input"),
    ],
    ids=["unknown-os", "bad-beparams", "ipolicy"],
)
async def test_failed_creates_are_typed_job_failures(testbed, overrides, error_type, ecode) -> None:
    values = spec(testbed, name("fail")).model_dump() | overrides
    async with client(testbed) as rapi:
        job = await rapi.wait_for_job(await rapi.create_instance(InstanceSpec(**values)), timeout=120)
    assert job.status is JobStatus.ERROR
    assert job.failure is not None and job.failure.message
    assert (job.failure.type, job.failure.ecode, job.failure.op_index) == (error_type, ecode, 0)


async def test_many_dry_run_creates_and_their_request_ids(testbed) -> None:
    specs = [spec(testbed, name(f"dry{i}")) for i in range(8)]
    async with client(testbed) as rapi:
        results = await rapi.create_instances(specs, dry_run=True)
        assert all(isinstance(r, int) for r in results), results
        jobs = [await rapi.wait_for_job(j, timeout=120) for j in results]  # type: ignore[arg-type]
    assert [j.status for j in jobs] == [JobStatus.SUCCESS] * 8
    assert all(j.ops[0]["dry_run"] is True for j in jobs)
    for s, job in zip(specs, jobs, strict=True):
        assert job.ops[0]["instance_name"] == s.name
        (request_id,) = job.request_ids
        assert request_id.startswith("synnefo-ganeti:")
    assert len({j.request_ids[0] for j in jobs}) == 8


async def test_cancel_a_queued_job(testbed) -> None:
    async with client(testbed) as rapi:
        await rapi.wait_for_job(
            await rapi._write_job("PUT", "/2/modify", {"max_running_jobs": 1}), timeout=60
        )
        try:
            ids = await rapi.create_instances([spec(testbed, name(f"q{i}")) for i in range(4)], dry_run=True)
            last = max(ids)  # type: ignore[type-var]  # the last to arrive: surely still queued
            result = await rapi.cancel_job(last)  # type: ignore[arg-type]
            assert result.success, result.message
            canceled = await rapi.wait_for_job(last, timeout=120)  # type: ignore[arg-type]
            assert canceled.status is JobStatus.CANCELED and canceled.failure is None
            for job_id in sorted(ids)[:-1]:  # type: ignore[type-var]
                assert (await rapi.wait_for_job(job_id, timeout=120)).status is JobStatus.SUCCESS  # type: ignore[arg-type]
            late = await rapi.cancel_job(min(ids))  # type: ignore[arg-type, type-var]
            assert late.success is False  # a finished job cannot be canceled
        finally:
            await rapi.wait_for_job(
                await rapi._write_job("PUT", "/2/modify", {"max_running_jobs": 20}), timeout=60
            )


async def test_unknown_and_archived_jobs(testbed) -> None:
    async with client(testbed) as rapi:
        with pytest.raises(JobNotFoundError):
            await rapi.get_job(987654321)  # Ganeti 3.0: 200 with every field null
        with pytest.raises(JobNotFoundError):
            await rapi.wait_for_job(987654321)  # Ganeti 3.0: 500 "Can't load job file"
        job_id = await rapi.create_instance(spec(testbed, name("arch")), dry_run=True)
        await rapi.wait_for_job(job_id, timeout=120)
        archive = await asyncio.create_subprocess_exec(*ns(testbed, "gnt-job", "archive", str(job_id)))
        assert await archive.wait() == 0
        assert job_id not in [j.id for j in await rapi.list_jobs()]
        archived = await rapi.get_job(job_id)  # still answered, from the archive
        assert archived.status is JobStatus.SUCCESS and archived.id == job_id


async def test_wrong_credentials(testbed) -> None:
    rapi = RapiClient(
        testbed.url, username=testbed.username, password="not-the-password", ca_file=testbed.ca_file
    )
    async with rapi:
        with pytest.raises(AuthenticationError, match="HTTP 401") as caught:
            await rapi.info()
    assert "not-the-password" not in str(caught.value)


def _fingerprint(ca_file: str) -> str:
    pem = Path(ca_file).read_text()
    cert = x509.load_pem_x509_certificate(pem[pem.index("-----BEGIN CERTIFICATE-----") :].encode())
    return cert.fingerprint(hashes.SHA256()).hex(":")


async def test_tls_trust(testbed) -> None:
    async with client(testbed, ca_file=None, fingerprint=_fingerprint(testbed.ca_file)) as rapi:
        assert await rapi.version() == 2
    wrong = "AA:" * 31 + "AA"
    async with client(testbed, ca_file=None, fingerprint=wrong, retry=RetryPolicy(attempts=1)) as rapi:
        with pytest.raises(TLSError, match="fingerprint mismatch"):
            await rapi.version()
    async with client(testbed, ca_file=None, retry=RetryPolicy(attempts=1)) as rapi:
        with pytest.raises(TLSError, match="verif"):
            await rapi.version()
    assert ssl.OPENSSL_VERSION  # the ssl module is the one aiohttp used
