from __future__ import annotations

import pytest
from pydantic import ValidationError

from synnefo_ganeti import ClusterInfo, Instance, InstanceSpec, Job, JobStatus, Node
from tests.helpers import rapi_fixture


def test_parses_recorded_bulk_instances() -> None:
    instances = [Instance.model_validate(item) for item in rapi_fixture("instances_bulk.json")]
    assert len(instances) == 43
    a = next(i for i in instances if i.name == "fx5682-a.ganeti.test")
    assert a.oper_state is True and a.admin_state == "up" and a.status == "running"
    assert a.beparams["maxmem"] == 128 and a.tags == ["owner:demo"]
    assert a.nic_macs == ["aa:00:00:67:94:e3"] and a.nic_links == ["gntbr0"]
    assert a.model_extra is not None and "custom_beparams" in a.model_extra  # unknown keys kept


def test_parses_stopped_instance_with_file_disk() -> None:
    b = Instance.model_validate(rapi_fixture("instance_stopped_file.json"))
    assert b.oper_state is False and b.admin_state == "down"
    assert b.disk_template == "file" and b.disk_sizes == [1024]


def test_parses_nodes_and_info() -> None:
    (node,) = [Node.model_validate(item) for item in rapi_fixture("nodes_bulk.json")]
    assert node.name == "node1.ganeti.test" and node.mfree == 18397 and node.ctotal == 2
    assert node.group_uuid == "4f814a11-12bc-40c5-ba90-3f69191c55e3"
    info = ClusterInfo.model_validate(rapi_fixture("info.json"))
    assert info.name == "cluster.ganeti.test" and info.enabled_hypervisors == ["fake"]


def test_offline_node_with_null_capacity() -> None:
    node = Node.model_validate({"name": "n2", "offline": True, "mfree": None, "dfree": None})
    assert node.offline and node.mfree is None


def test_successful_job() -> None:
    job = Job.model_validate(rapi_fixture("job_create_success.json"))
    assert job.id == 1011 and job.status is JobStatus.SUCCESS and job.is_final
    assert job.failure is None
    assert job.received_ts is not None and job.received_ts.seconds == 1795331136
    assert [e.serial for e in job.log] == [1, 2, 3, 4]
    assert job.log[0].message == "* creating instance disks..."


def test_failed_job_carries_parsed_failure() -> None:
    job = Job.model_validate(rapi_fixture("job_create_error_already_exists.json"))
    assert job.status is JobStatus.ERROR
    failure = job.failure
    assert failure is not None
    assert failure.type == "OpPrereqError" and failure.ecode == "already_exists"
    assert failure.message == "Instance 'fx5682-a.ganeti.test' is already in the cluster"


def test_failure_without_ecode_and_first_failed_op() -> None:
    job = Job.model_validate(
        {
            "id": 24,
            "status": "error",
            "ops": [{}, {}, {}],
            "opstatus": ["success", "error", "error"],
            "opresult": [
                None,
                ["OpPrereqError", ["Instance 'nosuch' not known", "unknown_entity"]],
                ["OpExecError", ["Preceding opcode failed"]],
            ],
        }
    )
    assert job.failure is not None
    assert (job.failure.op_index, job.failure.ecode) == (1, "unknown_entity")
    typed = Job.model_validate(
        {"id": 15, "status": "error", "opstatus": ["error"], "opresult": [["TypeEnforcementError", ["bad"]]]}
    )
    assert typed.failure is not None and typed.failure.ecode is None and typed.failure.message == "bad"


def test_bulk_jobs_without_oplog() -> None:
    jobs = [Job.model_validate(item) for item in rapi_fixture("jobs_bulk.json")]
    assert all(job.oplog is None for job in jobs)
    assert {job.status for job in jobs} <= set(JobStatus)


def test_canceled_job_has_no_failure() -> None:
    job = Job.model_validate({"id": 22, "status": "canceled", "opstatus": ["canceled"], "opresult": [None]})
    assert job.is_final and job.failure is None


def test_spec_body_is_ganetis_create_v1() -> None:
    spec = InstanceSpec(
        name="vm1.example.org",
        disk_template="file",
        os="noop",
        disks=[{"size": 1024}],
        beparams={"memory": 128},
        pnode="node1",
        extra={"file_driver": "loop"},
    )
    body = spec.to_rapi_body()
    assert body["__version__"] == 1 and body["mode"] == "create"
    assert body["name"] == "vm1.example.org" and body["os_type"] == "noop"
    assert body["nics"] == [{}] and body["disks"] == [{"size": 1024}]
    assert body["pnode"] == "node1" and "iallocator" not in body and "snode" not in body
    assert body["file_driver"] == "loop"
    assert body["name_check"] is False and body["ip_check"] is False and body["start"] is True


def test_spec_refuses_bad_input() -> None:
    with pytest.raises(ValidationError, match="extra must not set name"):
        InstanceSpec(name="a", disk_template="diskless", os="noop", extra={"name": "b"})
    with pytest.raises(ValidationError, match="either pnode or iallocator"):
        InstanceSpec(name="a", disk_template="diskless", os="noop", pnode="n", iallocator="hail")
    with pytest.raises(ValidationError):
        InstanceSpec(name="", disk_template="diskless", os="noop")
    with pytest.raises(ValidationError):
        InstanceSpec(name="a", disk_template="diskless", os="noop", colour="blue")  # type: ignore[call-arg]
