"""The fake Ganeti takes a version (``FakeGaneti(version=...)``, ``fake-ganeti --version``): each
difference between Ganeti 2.16, 3.0 and 3.1 pinned on each of them, through plain HTTP.

3.0 and 3.1 are held to what the two labs answered to the same requests
(``tests/fixtures/ganeti-3.1-rapi/``, the 3.0 lab's side of those in its ``lab-3.0/``, and
``tests/fixtures/ganeti-3.0-rapi/``); 2.16 to Ganeti 2.16.2's own source
(``synnefo_ganeti/testing/_versions.py`` says where). A 3.1 fake's answers have the recorded 3.1
answers' structure key for key (``structure_diff``), as ``test_fake_surface.py`` holds 3.0's.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import click
import pytest
from click.testing import CliRunner

from synnefo_ganeti.cli import main
from synnefo_ganeti.errors import UnsupportedError
from synnefo_ganeti.testing import VERSIONS, FakeGaneti, structure_diff
from tests.helpers import FIXTURES, QUEUE_FIXTURES, RAPI_FIXTURES, eventually, fake_client, spec

LAB31 = FIXTURES / "ganeti-3.1-rapi"
LAB30 = LAB31 / "lab-3.0"  # the 3.0 lab's answers to the same requests
ALL = ("2.16", "3.0", "3.1")
NODE = "node1.fake.test"
FAST = {
    "OP_INSTANCE_CREATE": 0.01,
    "OP_INSTANCE_REMOVE": 0.01,
    "OP_INSTANCE_SET_PARAMS": 0.01,
    "dry_run": 0.01,
}
#: compare-30-31.py's create body (``CREATE``), on the fake's node
CREATE = {"__version__": 1, "mode": "create", "name": "x1.ganeti.test", "disk_template": "diskless",
          "os_type": "noop", "disks": [], "nics": [{}], "beparams": {"memory": 128}, "hypervisor": "fake",
          "name_check": False, "ip_check": False, "pnode": NODE}  # fmt: skip
UNSUPPORTED = "Hotplug is not supported: Hotplug is not supported by this hypervisor"
FALLBACK = [" - WARNING: " + UNSUPPORTED, " - INFO: Modification will take place without hotplugging."]


def lab(path: Any) -> Any:
    """A recorded answer; the recorder's ``{"status", "body"}`` form as it is."""
    return json.loads(path.read_text())


class Rapi:
    """Plain aiohttp requests to one fake."""

    def __init__(self, fake: FakeGaneti, session: aiohttp.ClientSession) -> None:
        self.fake = fake
        self.session = session

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": "application/json"}
        async with self.session.request(method, self.fake.url + path, data=data, headers=headers) as answer:
            return answer.status, await answer.json(content_type=None)

    async def get(self, path: str) -> Any:
        status, body = await self.call("GET", path)
        assert status == 200, (path, body)
        return body

    async def job(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        """Submit; the job once it ended and was written, as ``GET /2/jobs/ID`` shows it."""
        status, job_id = await self.call(method, path, body)
        assert status == 200 and isinstance(job_id, int), (path, job_id)
        return await self.ended(job_id)

    async def ended(self, job_id: int) -> dict[str, Any]:
        def done() -> bool:
            job = self.fake.cluster.job(job_id)
            return job is not None and job.status.is_final and job_id not in self.fake.cluster._running

        await eventually(done, what=f"job {job_id} to end")
        job: dict[str, Any] = await self.get(f"/2/jobs/{job_id}")
        return job

    async def create(self, **extra: Any) -> dict[str, Any]:
        job = await self.job("POST", "/2/instances", CREATE | extra)
        assert job["status"] == "success", job["opresult"]
        return job


@asynccontextmanager
async def started(version: str, tmp_path: Any = None, **kwargs: Any) -> AsyncIterator[Rapi]:
    queue = {"queue_dir": tmp_path / "queue"} if tmp_path is not None else {}
    fake = FakeGaneti(tls=False, nodes=1, op_times=FAST, version=version, **queue, **kwargs)
    token = base64.b64encode(f"{fake.username}:{fake.password}".encode()).decode()
    async with fake, aiohttp.ClientSession(headers={"Authorization": f"Basic {token}"}) as session:
        yield Rapi(fake, session)


def same_shape(recorded: Any, ours: Any, what: str) -> None:
    problems = structure_diff(recorded, ours)
    assert not problems, f"{what}: " + "; ".join(problems)


# ---------------------------------------------------------------------------------------------- the knob


def test_the_version_knob_takes_three_versions_and_names_them_when_refusing() -> None:
    assert FakeGaneti().version == "3.0"
    assert [FakeGaneti(version=v).version for v in ALL] == list(ALL) and sorted(VERSIONS) == sorted(ALL)
    for bad in ("3.2", "3", "2.16.2", "", 3.1):
        with pytest.raises(ValueError, match=r"version must be one of '2\.16', '3\.0', '3\.1'"):
            FakeGaneti(version=bad)  # type: ignore[arg-type]
    assert repr(VERSIONS["3.1"]) == "<VersionProfile Ganeti 3.1.0~rc2>"


async def test_repr_names_the_version() -> None:
    async with started("2.16") as rapi:
        assert "Ganeti 2.16.2, 1 nodes" in repr(rapi.fake)


# ---------------------------------------------------------------------------------------------- /2/info


@pytest.mark.parametrize(
    ("version", "software", "protocol", "vcs", "discard", "vhost", "xen_cmd"),
    [
        ("2.16", "2.16.2", 2160000, "(ganeti) version v2.16.2", "default", False, "xm"),
        ("3.0", "3.0.2", 3000000, "(ganeti) version 3.0.2-3", "default", False, "xm"),
        ("3.1", "3.1.0~rc2", 3010000, "(ganeti) version 3.1.0~rc2-3", "ignore", True, None),
    ],
)
async def test_info_is_the_versions(version, software, protocol, vcs, discard, vhost, xen_cmd) -> None:
    async with started(version) as rapi:
        info = await rapi.get("/2/info")
    assert (info["software_version"], info["protocol_version"], info["config_version"]) == (
        software, protocol, protocol,
    )  # fmt: skip
    assert info["vcs_version"] == vcs
    assert (info["hvparams"]["kvm"]["disk_discard"], info["hvparams"]["kvm"]["vhost_net"]) == (discard, vhost)
    for hv in ("xen-pvm", "xen-hvm"):
        assert info["hvparams"][hv].get("xen_cmd") == xen_cmd
    if version != "2.16":  # the lab's own values, and its keys
        recorded = lab((LAB31 if version == "3.1" else LAB30) / "GET_info.json")["body"]
        for key in ("software_version", "protocol_version", "config_version", "vcs_version"):
            assert info[key] == recorded[key], key
        assert info["hvparams"]["kvm"] == recorded["hvparams"]["kvm"]
        for hv in ("xen-pvm", "xen-hvm"):
            assert info["hvparams"][hv].keys() == recorded["hvparams"][hv].keys()
        same_shape(recorded, info, f"/2/info {version}")
    else:  # 2.16.2's QueryClusterInfo has 3.0.2's keys (src/Ganeti/Query/Server.hs)
        same_shape(json.loads((RAPI_FIXTURES / "info.json").read_text()), info, "/2/info 2.16")


# ---------------------------------------------------------------------------------------------- instances


@pytest.mark.parametrize("version", ALL)
async def test_instances_have_custom_osparams_on_3_1_only(version) -> None:
    async with started(version) as rapi:
        await rapi.create()
        await rapi.create(name="x2.ganeti.test", osparams={"dhcp": "yes"})
        one = await rapi.get("/2/instances/x1.ganeti.test")
        bulk = await rapi.get("/2/instances?bulk=1")
    if version == "3.1":
        assert one["custom_osparams"] == {} and [i["custom_osparams"] for i in bulk] == [{}, {"dhcp": "yes"}]
        keys = list(one)
        assert keys[keys.index("custom_nicparams") + 1] == "custom_osparams"  # rlib2.I_FIELDS' order
        same_shape(lab(LAB31 / "GET_instance_x1.json"), one, "3.1 /2/instances/x1")
        same_shape(lab(LAB31 / "GET_instances_bulk_with_x1.json"), bulk[:1], "3.1 ?bulk=1")
    else:
        assert "custom_osparams" not in one and all("custom_osparams" not in i for i in bulk)
        if version == "3.0":
            same_shape(lab(LAB30 / "GET_instance_x1.json"), one, "3.0 /2/instances/x1")


# ---------------------------------------------------------------------------------------------- create


@pytest.mark.parametrize("version", ALL)
async def test_create_checks_the_name_by_default_before_3_1(version) -> None:
    """compare-30-31.py's x3: a create naming neither ``name_check`` nor ``ip_check``."""
    body = {k: v for k, v in CREATE.items() if k not in ("name_check", "ip_check")} | {
        "name": "x3.ganeti.test"
    }
    async with started(version) as rapi:
        job = await rapi.job("POST", "/2/instances", body)
        created = "x3.ganeti.test" in rapi.fake.cluster.instances
    op = job["ops"][0]
    if version == "3.1":
        assert (
            job["status"] == lab(LAB31 / "POST_instances_no_name_ip_check.json")["job"]["status"] == "success"
        )
        assert (op["name_check"], op["ip_check"], created) == (False, False, True)
    else:
        recorded = lab(LAB30 / "POST_instances_no_name_ip_check.json")["job"]
        assert job["status"] == recorded["status"] == "error"
        assert job["opresult"] == recorded["opresult"] == [["OpPrereqError", [
            "The given name (x3.ganeti.test) does not resolve: Temporary failure in name resolution",
            "resolver_error"]]]  # fmt: skip
        assert (op["name_check"], op["ip_check"], created) == (True, True, False)


@pytest.mark.parametrize("version", ["2.16", "3.0"])
async def test_a_name_the_resolver_knows_passes_and_its_address_is_pinged(version) -> None:
    body = {k: v for k, v in CREATE.items() if k not in ("name_check", "ip_check")}
    hosts = {"x1.ganeti.test": "192.0.2.11", "taken.ganeti.test": "198.51.100.10"}  # the node's address
    async with started(version, hosts=hosts) as rapi:
        assert (await rapi.job("POST", "/2/instances", body))["status"] == "success"
        taken = await rapi.job("POST", "/2/instances", body | {"name": "taken.ganeti.test"})
        assert taken["opresult"] == [
            ["OpPrereqError", ["IP 198.51.100.10 of instance taken.ganeti.test already in use", "not_unique"]]
        ]
        unchecked = await rapi.job(
            "POST", "/2/instances", body | {"name": "x2.ganeti.test", "name_check": False}
        )
        assert unchecked["opresult"] == [
            ["OpPrereqError", ["Cannot do IP address check without a name check", "wrong_input"]]
        ]
        await rapi.call("PUT", "/2/instances/x1.ganeti.test/shutdown")
        rename = await rapi.job("PUT", "/2/instances/x1.ganeti.test/rename", {"new_name": "x9.ganeti.test"})
        assert rename["opresult"][0][1] == [
            "The given name (x9.ganeti.test) does not resolve: Temporary failure in name resolution",
            "resolver_error",
        ]
        assert rename["ops"][0]["name_check"] is True


async def test_rename_does_not_check_the_name_by_default_on_3_1() -> None:
    async with started("3.1") as rapi:
        await rapi.create(start=False)
        job = await rapi.job("PUT", "/2/instances/x1.ganeti.test/rename", {"new_name": "x9.ganeti.test"})
    assert job["status"] == "success" and job["opresult"] == ["x9.ganeti.test"]
    assert (job["ops"][0]["name_check"], job["ops"][0]["ip_check"]) == (False, False)


# ---------------------------------------------------------------------------------------------- modify


async def modified(version: str, body: dict[str, Any], *, start: bool = True) -> tuple[int, Any, Rapi, Any]:
    """``PUT /2/instances/x1/modify`` of a running (or stopped) x1: status, answer (the job when 200),
    the fake, and the job's file (``None`` without a job)."""
    async with started(version) as rapi:
        await rapi.create(start=start)
        status, answer = await rapi.call("PUT", "/2/instances/x1.ganeti.test/modify", body)
        written = None
        if status == 200:
            answer = await rapi.ended(answer)
            assert rapi.fake.queue_dir is not None
            written = json.loads((rapi.fake.queue_dir / f"job-{answer['id']}").read_text())
        return status, answer, rapi, written


def oplog(job: dict[str, Any]) -> list[str]:
    return [entry[3] for entry in job["oplog"][0]]


@pytest.mark.parametrize("version", ALL)
async def test_modify_with_hotplug_if_possible(version) -> None:
    body = {"hotplug_if_possible": True, "beparams": {"memory": 192}}
    status, answer, _, _ = await modified(version, body)
    if version == "3.1":
        recorded = lab(LAB31 / "PUT_instance_modify.json")["hotplug_if_possible"]
        assert (status, answer) == (recorded["status"], recorded["body"]) == (400, {
            "code": 400, "explain": "Bad request syntax or unsupported method",
            "message": "Invalid body parameters: Object OpInstanceSetParams doesn&#x27;t support the parameter "
                       "&#x27;hotplug_if_possible&#x27;"})  # fmt: skip
        return
    recorded = lab(LAB30 / "PUT_instance_modify.json")["hotplug_if_possible"]["job"]
    assert answer["status"] == recorded["status"] == "success"
    assert answer["opresult"] == recorded["opresult"] == [[["be/memory", 192]]]
    assert oplog(answer) == [line for _, line in recorded["oplog"]] == FALLBACK
    op = answer["ops"][0]
    assert (op["hotplug"], op["hotplug_if_possible"]) == (
        recorded["hotplug"],
        recorded["hotplug_if_possible"],
    )


@pytest.mark.parametrize("version", ALL)
async def test_modify_asking_hotplug_of_a_running_instance(version) -> None:
    status, job, rapi, _ = await modified(version, {"hotplug": True, "nics": [["add", {}]]})
    assert status == 200
    nics = len(rapi.fake.cluster.instances["x1.ganeti.test"].nics)
    if version == "3.1":
        recorded = lab(LAB31 / "PUT_instance_modify.json")["hotplug+nic-add"]["job"]
        assert job["status"] == recorded["status"] == "success" and nics == 2
        assert oplog(job) == [line for _, line in recorded["oplog"]] == FALLBACK
        assert job["opresult"][0][0][0] == recorded["opresult"][0][0][0] == "nic.1"
        assert job["opresult"][0][0][1].endswith(",ip=None,mode=bridged,link=gntbr0,network=None")
        assert job["ops"][0]["hotplug"] is recorded["hotplug"] is False
        assert "hotplug_if_possible" not in job["ops"][0]
    else:
        recorded = lab(LAB30 / "PUT_instance_modify.json")["hotplug+nic-add"]["job"]
        assert job["status"] == recorded["status"] == "error" and nics == 1
        assert job["opresult"] == recorded["opresult"] == [["OpPrereqError", [
            f"Hotplug is not possible: {UNSUPPORTED}: {UNSUPPORTED}", "wrong_state"]]]  # fmt: skip
        assert oplog(job) == [] and job["ops"][0]["hotplug"] is True


@pytest.mark.parametrize("version", ALL)
async def test_any_modify_of_a_running_instance(version) -> None:
    status, job, _, _ = await modified(version, {"beparams": {"memory": 256}})
    recorded = lab((LAB31 if version == "3.1" else LAB30) / "PUT_instance_modify.json")["beparams"]["job"]
    assert status == 200 and job["status"] == recorded["status"] == "success"
    assert job["opresult"] == recorded["opresult"] == [[["be/memory", 256]]]
    assert oplog(job) == [line for _, line in recorded["oplog"]] == (FALLBACK if version == "3.1" else [])
    assert job["ops"][0]["hotplug"] is False
    assert job["ops"][0].get("hotplug_if_possible", "(absent)") == recorded["hotplug_if_possible"]


async def test_a_stopped_instance_is_modified_without_hotplug_silently_on_3_1() -> None:
    status, job, _, written = await modified("3.1", {"beparams": {"memory": 256}}, start=False)
    assert status == 200 and job["status"] == "success" and oplog(job) == []
    assert job["ops"][0]["hotplug"] is False
    final = written["ops"][0][
        "input"
    ]  # the executor's resolved form: 3.1's opcode has no hotplug_if_possible
    assert final["hotplug"] is False and "hotplug_if_possible" not in final


async def test_the_submitted_3_1_modify_defaults_hotplug_to_true(tmp_path) -> None:
    async with started("3.1") as rapi:
        await rapi.create()
        rapi.fake.cluster.max_running_jobs = 1
        blocker = rapi.fake.cluster.submit(
            [("OP_TEST_DELAY", {"duration": 0.2})], client=("gnt-debug", "delay")
        )
        _, job_id = await rapi.call(
            "PUT", "/2/instances/x1.ganeti.test/modify", {"beparams": {"memory": 256}}
        )
        queued = (await rapi.get(f"/2/jobs/{job_id}"))["ops"][0]  # luxid's form: the opcode's default
        assert queued["hotplug"] is True and "hotplug_if_possible" not in queued
        await rapi.ended(blocker)
        assert (await rapi.ended(job_id))["ops"][0]["hotplug"] is False


# ---------------------------------------------------------------------------------------------- networks


@pytest.mark.parametrize("version", ALL)
async def test_network_rename_of_a_missing_network(version) -> None:
    async with started(version) as rapi:
        status, answer = await rapi.call("PUT", "/2/networks/nonet/rename", {"new_name": "nonet2"})
        if version == "3.1":
            recorded = lab(LAB31 / "PUT_network_rename.json")
            assert status == recorded["status"] == 200
            job = await rapi.ended(answer)
            assert (job["status"], job["opresult"]) == (
                recorded["job"]["status"],
                recorded["job"]["opresult"],
            )
            assert job["opresult"] == [["OpPrereqError", ["Network 'nonet' not found", "unknown_entity"]]]
            assert job["ops"][0]["OP_ID"] == "OP_NETWORK_RENAME" and job["summary"] == ["NETWORK_RENAME"]
        else:
            recorded = lab(LAB30 / "PUT_network_rename.json")
            assert (status, answer) == (recorded["status"], recorded["body"]) == (404, {
                "code": 404, "message": "Not Found", "explain": "Nothing matches the given URI"})  # fmt: skip


async def test_network_rename_on_3_1_renames_everything_that_names_it() -> None:
    """``LUNetworkRename`` (Ganeti 3.1.0): the groups' connections and the NICs follow; a name
    another network (or itself) has is refused in ``CheckPrereq``."""
    net = {"network_name": "net1", "network": "10.99.0.0/28", "gateway": "10.99.0.1"}
    async with started("3.1") as rapi:
        assert (await rapi.job("POST", "/2/networks", net))["status"] == "success"
        assert (await rapi.job("POST", "/2/networks", net | {"network_name": "net2"}))["status"] == "success"
        connect = {"group_name": "default", "network_mode": "bridged", "network_link": "br9"}
        assert (await rapi.job("PUT", "/2/networks/net1/connect", connect))["status"] == "success"
        await rapi.create(nics=[{"network": "net1", "ip": "pool"}])
        job = await rapi.job("PUT", "/2/networks/net1/rename", {"new_name": "net3"})
        assert job["status"] == "success" and job["opresult"] == ["net3"]
        assert job["ops"][0] | {"reason": None} == {
            "dry_run": False, "priority": 0, "depends": None, "comment": None, "reason": None,
            "OP_ID": "OP_NETWORK_RENAME", "debug_level": 0, "network_name": "net1", "new_name": "net3",
        }  # fmt: skip
        assert (await rapi.call("GET", "/2/networks/net1"))[0] == 404
        assert (await rapi.get("/2/networks/net3"))["group_list"] == [["default", "bridged", "br9", ""]]
        assert (await rapi.get("/2/instances/x1.ganeti.test"))["nic.networks.names"] == ["net3"]
        for clash in ("net2", "net3"):
            uuid = rapi.fake.cluster.model.networks[clash].uuid
            job = await rapi.job("PUT", "/2/networks/net3/rename", {"new_name": clash})
            assert job["opresult"] == [["OpPrereqError", [
                f"Desired new name '{clash}' clashes with existing network (UUID: {uuid})", "already_exists"]]]  # fmt: skip
        dry = await rapi.job("PUT", "/2/networks/net3/rename?dry-run=1", {"new_name": "net4"})
        assert dry["status"] == "success" and "net3" in rapi.fake.cluster.model.networks


# ---------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("version", ALL)
async def test_error_messages_are_escaped_as_each_version_escapes(version) -> None:
    """3.x: ``html.escape`` (quotes too, as both labs answered); 2.16's Python 2 ganeti-rapi:
    ``cgi.escape`` (``&``, ``<``, ``>`` only) and a set shown as ``set([...])``."""
    async with started(version) as rapi:
        # the labs were sent a NIC with an unknown key; the fake checks NICs' type only: the same 400
        status, nic = await rapi.call("POST", "/2/instances", CREATE | {"nics": ["not a dict"]})
        assert status == 400
        _, static = await rapi.call("PUT", "/2/groups/default/modify", {"group_name": "other"})
    if version == "2.16":
        assert nic["message"] == (
            "Invalid body parameters: (\"Parameter 'OP_INSTANCE_CREATE.nics' fails validation\", 'wrong_input')"
        )
        assert static["message"] == "Can't overwrite static parameters set(['group_name'])"
    else:
        recorded = lab((LAB31 if version == "3.1" else LAB30) / "POST_instances_unknown_param.json")["nic"]
        assert nic == recorded["body"]
        assert static["message"] == "Can&#x27;t overwrite static parameters {&#x27;group_name&#x27;}"


# ---------------------------------------------------------------------------------------------- job files


@pytest.mark.parametrize("version", ALL)
async def test_job_files_keep_one_format(version, tmp_path) -> None:
    """The same create's job file on the 3.0 and 3.1 labs differs in nothing but values (diff doc), and
    2.16.2's ``jqueue`` writes the same keys (``livelock``, ``process_id``): each fake's has the
    recorded file's structure."""
    async with started(version, tmp_path) as rapi:
        job = await rapi.create()
        written = json.loads((tmp_path / "queue" / f"job-{job['id']}").read_text())
    recorded31 = json.loads((LAB31 / "queue_job-create_x1.raw").read_text())
    same_shape(recorded31, written, f"{version} job file")
    same_shape(
        json.loads((QUEUE_FIXTURES / "job-11.op_instance_create.success.json").read_text()), written, "job-11"
    )
    assert list(written) == list(recorded31)  # the executor's key order
    assert (written["livelock"] or "").startswith("/var/run/ganeti/livelocks/job_")


# ---------------------------------------------------------------------------------------------- 3.1, key for key


async def test_the_3_1_fake_answers_as_the_3_1_lab_key_for_key(tmp_path) -> None:
    """Every answer recorded on the 3.1 lab, asked of a 3.1 fake (one node, x1 as
    compare-30-31.py made it): the same keys and value types at every level."""
    async with started("3.1", tmp_path) as rapi:
        for name, path in (("GET_version.json", "/version"), ("GET_os.json", "/2/os"),
                           ("GET_info.json", "/2/info"), ("GET_nodes_bulk.json", "/2/nodes?bulk=1"),
                           ("GET_job_unknown.json", "/2/jobs/999999")):  # fmt: skip
            recorded = lab(LAB31 / name)
            status, answer = await rapi.call("GET", path)
            assert status == recorded["status"], name
            same_shape(recorded["body"], answer, name)
        features = lab(LAB31 / "GET_features.json")["body"]  # a frozenset's order: compare as sets
        assert sorted(await rapi.get("/2/features")) == sorted(features)

        create = await rapi.create()
        same_shape(lab(LAB31 / "GET_job_create_x1.json"), create, "GET_job_create_x1")
        assert create["ops"][0]["name_check"] is False and create["opresult"] == [[NODE]]
        same_shape(lab(LAB31 / "GET_instance_x1.json"), await rapi.get("/2/instances/x1.ganeti.test"), "x1")
        same_shape(
            lab(LAB31 / "GET_instances_bulk_with_x1.json"), await rapi.get("/2/instances?bulk=1"), "bulk"
        )
        written = json.loads((tmp_path / "queue" / f"job-{create['id']}").read_text())
        same_shape(json.loads((LAB31 / "queue_job-create_x1.raw").read_text()), written, "job file")

        recorded = lab(LAB31 / "PUT_instance_modify.json")
        for label, body in (("beparams", {"beparams": {"memory": 256}}),
                            ("hotplug_if_possible", {"hotplug_if_possible": True, "beparams": {"memory": 192}}),
                            ("hotplug+nic-add", {"hotplug": True, "nics": [["add", {}]]}),
                            ("nic-add", {"nics": [["add", {}]]})):  # fmt: skip
            status, answer = await rapi.call("PUT", "/2/instances/x1.ganeti.test/modify", body)
            assert status == recorded[label]["status"], label
            if status != 200:
                assert answer == recorded[label]["body"], label
                continue
            job = await rapi.ended(answer)
            seen = {"status": job["status"], "opresult": job["opresult"],
                    "oplog": [[entry[2], entry[3]] for entry in job["oplog"][0]],
                    "hotplug": job["ops"][0].get("hotplug"),
                    "hotplug_if_possible": job["ops"][0].get("hotplug_if_possible", "(absent)")}  # fmt: skip
            same_shape(recorded[label]["job"], seen, label)
            assert {k: v for k, v in seen.items() if k != "opresult"} == {
                k: v for k, v in recorded[label]["job"].items() if k != "opresult"
            }, label
        assert [r[0] for r in (await rapi.get(f"/2/jobs/{answer}"))["opresult"][0]] == [
            "nic.2"
        ]  # as the lab's

        status, answer = await rapi.call("PUT", "/2/networks/nonet/rename", {"new_name": "nonet2"})
        job = await rapi.ended(answer)
        renamed = {"status": job["status"], "opresult": job["opresult"]}
        assert renamed == lab(LAB31 / "PUT_network_rename.json")["job"]

        remove = await rapi.job("DELETE", "/2/instances/x1.ganeti.test")
        same_shape(lab(LAB31 / "GET_job_remove_x1.json"), remove, "GET_job_remove_x1")
        status, answer = await rapi.call(
            "POST", "/2/instances", {k: v for k, v in CREATE.items() if k != "__version__"}
        )
        assert (status, answer) == (400, lab(LAB31 / "POST_instances_dryrun_no_version.json")["body"])


# ---------------------------------------------------------------------------------------------- the client


@pytest.mark.parametrize("version", ALL)
async def test_the_rapi_client_adapts_to_each_fake(version) -> None:
    """The client's version-dependent calls against each fake: what it sends, the fake takes."""
    async with started(version) as rapi, fake_client(rapi.fake) as client:
        assert (await client.ganeti_version()).text == VERSIONS[version].software_version
        job = await client.wait_for_job(await client.create_instance(spec("x1.ganeti.test", pnode=NODE)))
        assert job.status == "success"
        modify = await client.modify_instance("x1.ganeti.test", nics=[["add", {}]], hotplug_if_possible=True)
        assert (await client.wait_for_job(modify)).status == "success"
        assert len(rapi.fake.cluster.instances["x1.ganeti.test"].nics) == 2
        await client.wait_for_job(await client.create_network("net1", "10.99.0.0/28"))
        if version == "3.1":
            assert (
                await client.wait_for_job(await client.rename_network("net1", "net2"))
            ).status == "success"
            assert list(rapi.fake.cluster.model.networks) == ["net2"]
        else:
            with pytest.raises(UnsupportedError):
                await client.rename_network("net1", "net2")


# ---------------------------------------------------------------------------------------------- the command


def test_the_command_takes_version_and_its_alias_beside_the_groups_own_version() -> None:
    command = main.get_command(click.Context(main), "fake-ganeti")
    assert command is not None
    for args, expected in (
        ([], "3.0"),
        (["--version", "3.1"], "3.1"),
        (["--ganeti-version", "2.16"], "2.16"),
    ):
        assert command.make_context("fake-ganeti", list(args)).params["version"] == expected
    result = CliRunner().invoke(main, ["--version"])  # the group's own: the package's version
    assert result.exit_code == 0 and result.output.startswith("synnefo-ganeti, version ")
    result = CliRunner().invoke(main, ["fake-ganeti", "--ganeti-version", "3.2"])
    assert result.exit_code == 2 and "'3.2' is not one of '2.16', '3.0', '3.1'" in result.output
    bad = CliRunner().invoke(main, ["fake-ganeti", "--host-entry", "nothing"])
    assert bad.exit_code == 2 and "NAME=IP" in bad.output


@pytest.mark.slow
async def test_the_command_serves_the_version_asked(tmp_path) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "synnefo_ganeti", "fake-ganeti", "--port", "0", "--no-tls", "--json",
        "--version", "3.1", "--nodes", "1", "--host-entry", "x3.ganeti.test=192.0.2.3",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        text = b""
        while not text.rstrip().endswith(b"}"):
            text += await asyncio.wait_for(process.stdout.readline(), 30)
        details = json.loads(text)
        assert (details["version"], details["software_version"]) == ("3.1", "3.1.0~rc2")
        token = base64.b64encode(f"{details['username']}:{details['password']}".encode()).decode()
        async with aiohttp.ClientSession(headers={"Authorization": f"Basic {token}"}) as session:
            async with session.get(details["url"] + "/2/info") as answer:
                assert (await answer.json())["software_version"] == "3.1.0~rc2"
            async with session.put(details["url"] + "/2/networks/x/rename", json={"new_name": "y"}) as answer:
                assert answer.status == 200
    finally:
        process.terminate()
        assert await asyncio.wait_for(process.wait(), 10) == 0


@pytest.mark.parametrize("version", ["3.0", "3.1"])
async def test_a_perl_group_in_a_query_pattern_is_refused_by_3_1_only(version: str) -> None:
    """3.1's luxid parses ``=~`` patterns with Text.Regex.TDFA (POSIX): ``(?:`` fails the whole
    query with a 502 quoting the request; 3.0 takes it. A plain group works on both."""
    recorded = lab((LAB31 if version == "3.1" else LAB30) / "PUT_query_instance_regex.json")
    async with started(version) as rapi:
        status, body = await rapi.call("PUT", "/2/query/instance", recorded["request"])
        assert status == recorded["perl_group"]["status"]
        if version == "3.1":
            assert body == recorded["perl_group"]["body"]  # the same text, the pattern quoted
        plain = {"fields": ["name"], "qfilter": ["=~", "name", "^(x1\\.g31\\.test|y)$"]}
        status, _ = await rapi.call("PUT", "/2/query/instance", plain)
        assert status == 200


@pytest.mark.parametrize("version", ["3.0", "3.1"])
async def test_a_network_with_null_tags_is_refused_by_3_1_only(version: str) -> None:
    """3.1's OP_NETWORK_ADD refuses ``"tags": null`` (which Ganeti's own client sends) with a 400;
    the RapiClient leaves the key out when there are no tags."""
    recorded = lab(LAB31 / "POST_networks_null_tags.json")
    async with started(version) as rapi:
        status, body = await rapi.call("POST", "/2/networks?dry-run=1", recorded["request"])
        if version == "3.1":
            assert (status, body) == (recorded["answer"]["status"], recorded["answer"]["body"])
        else:
            assert status == 200 and isinstance(body, int)
        rest = {k: v for k, v in recorded["request"].items() if k != "tags"}
        status, _ = await rapi.call("POST", "/2/networks?dry-run=1", rest)
        assert status == 200
