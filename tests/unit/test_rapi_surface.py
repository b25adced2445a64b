"""RapiClient covers every public method of Ganeti 3.0's own RAPI client (``GanetiRapiClient``).

For each method: the HTTP method, path, query and JSON body sent, checked against what Ganeti's
client (``lib/rapi/client.py``) sends for the same call, and the typed value returned. Argument
checks, retries and the table of ``docs/rapi-client.md``: ``test_rapi_surface_rules.py``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiohttp import web

from synnefo_ganeti import RapiClient
from synnefo_ganeti.rapi import (
    CancelResult,
    ClusterInfo,
    FilterRule,
    Group,
    Instance,
    InstanceConsole,
    Job,
    Network,
    Node,
    QueryField,
    QueryResult,
)
from tests.helpers import FIXTURES, StubRapi, json_response, rapi_fixture, spec, stub_client

JOB = 4242
NOBODY = object()  # the request carried no body at all
EMPTY: dict[str, Any] = {}  # Ganeti's client sends no content here; ours sends "{}", which Ganeti reads alike

GROUP = {
    "name": "default", "uuid": "9a7f", "alloc_policy": "preferred", "node_cnt": 1,
    "node_list": ["node1.ganeti.test"], "ipolicy": {"std": {}}, "custom_ipolicy": {}, "diskparams": {},
    "custom_diskparams": {}, "ndparams": {"oob_program": None}, "custom_ndparams": {}, "tags": [],
    "ctime": 1700000000.5, "mtime": 1700000001.5, "serial_no": 3,
}  # fmt: skip
NETWORK = {
    "name": "net1", "network": "10.0.0.0/24", "gateway": "10.0.0.1", "network6": None, "gateway6": None,
    "mac_prefix": None, "free_count": 252, "reserved_count": 4, "map": "XX" + "." * 252 + "XX",
    "group_list": [["default", "bridged", "br0", ""]], "inst_list": [], "external_reservations": "10.0.0.0",
    "tags": ["t1"], "ctime": 1.0, "mtime": 2.0, "uuid": "5b1c", "serial_no": 1,
}  # fmt: skip
FILTER = {
    "uuid": "f-1", "watermark": 1530, "priority": 5, "predicates": [["jobid", [">", "id", "watermark"]]],
    "action": "REJECT", "reason_trail": [["gnt:client", "", 1700000000000000000]],
}  # fmt: skip
CONSOLE = {
    "instance": "vm1.ganeti.test", "kind": "vnc", "host": "node1.ganeti.test", "port": 11000, "display": 5100
}  # fmt: skip
QUERY = {
    "fields": [
        {"name": "name", "title": "Instance", "kind": "text", "doc": "Instance name"},
        {"name": "oper_ram", "title": "Memory", "kind": "unit", "doc": "Actual memory usage"},
    ],
    "data": [[[0, "vm1.ganeti.test"], [0, 128]], [[0, "vm2.ganeti.test"], [4, None]]],
}
FIELDS = {"fields": [{"name": "name", "title": "Node", "kind": "text", "doc": "Node name"}]}


@dataclass
class Case:
    """One call, what Ganeti's client sends for it, and what ours returns."""

    ganeti: str
    call: Callable[[RapiClient], Awaitable[Any]]
    method: str
    path: str
    query: list[tuple[str, str]] = field(default_factory=list)
    body: Any = field(default_factory=dict)  # EMPTY
    answer: Any = JOB
    returns: Any = JOB  # the value, or a predicate on it
    info: Any = None  # what GET /2/info answers, if the call asks the backend's version (None: 3.0.2's)

    def check(self, result: Any) -> bool:
        return bool(self.returns(result)) if callable(self.returns) else result == self.returns


R = [("reason", "why")]
DRY_R = [("dry-run", "1"), *R]
TAGS = [("tag", "a"), ("tag", "b c"), *DRY_R]
ALLOC = spec("vm9.ganeti.test").to_rapi_body()
ALLOC.pop("__version__")


def tag_cases(kind: str, path: str, get: str, add: str, delete: str, *name: str) -> list[Case]:
    # Ganeti's AddNodeTags sends the tags as the body too; the other Add*Tags send none
    add_body: Any = ["a", "b c"] if kind == "Node" else EMPTY
    return [
        Case(f"Get{kind}Tags", lambda c: getattr(c, get)(*name, reason="why"), "GET", path, R, NOBODY,
             ["a", "b"], ["a", "b"]),
        Case(f"Add{kind}Tags", lambda c: getattr(c, add)(*name, ["a", "b c"], dry_run=True, reason="why"),
             "PUT", path, TAGS, add_body),
        Case(f"Delete{kind}Tags", lambda c: getattr(c, delete)(*name, ["a", "b c"], dry_run=True, reason="why"),
             "DELETE", path, TAGS),
    ]  # fmt: skip


INST = "/2/instances/vm1.ganeti.test"
INFO_31 = orjson.loads((FIXTURES / "ganeti-3.1-rapi" / "GET_info.json").read_bytes())["body"]  # 3.1.0~rc2's
NODE = "/2/nodes/node1.ganeti.test"
CASES: list[Case] = [
    # -- cluster
    Case("GetVersion", lambda c: c.version(), "GET", "/version", [], NOBODY, 2, 2),
    Case("GetFeatures", lambda c: c.features(), "GET", "/2/features", [], NOBODY, ["node-evac-res1"],
         ["node-evac-res1"]),
    Case("GetOperatingSystems", lambda c: c.list_os(), "GET", "/2/os", [], NOBODY, ["noop", "debootstrap+default"],
         ["noop", "debootstrap+default"]),
    Case("GetInfo", lambda c: c.info(), "GET", "/2/info", [], NOBODY, rapi_fixture("info.json"),
         lambda r: isinstance(r, ClusterInfo) and r.name),
    Case("RedistributeConfig", lambda c: c.redistribute_config(reason="why"), "PUT", "/2/redistribute-config", R),
    Case("ModifyCluster", lambda c: c.modify_cluster(reason="why", candidate_pool_size=5), "PUT", "/2/modify", R,
         {"candidate_pool_size": 5}),
    *tag_cases("Cluster", "/2/tags", "get_cluster_tags", "add_cluster_tags", "delete_cluster_tags"),
    Case("GetFilters", lambda c: c.list_filters(), "GET", "/2/filters", [("bulk", "1")], NOBODY, [FILTER],
         lambda r: r == [FilterRule.model_validate(FILTER)] and r[0].priority == 5),
    Case("GetFilter", lambda c: c.get_filter("f-1"), "GET", "/2/filters/f-1", [], NOBODY, FILTER,
         lambda r: isinstance(r, FilterRule) and r.action == "REJECT" and r.watermark == 1530),
    Case("DeleteFilter", lambda c: c.delete_filter("f-1"), "DELETE", "/2/filters/f-1", [], EMPTY, None, None),
    # -- instances
    Case("GetInstances", lambda c: c.list_instances(), "GET", "/2/instances", [("bulk", "1")], NOBODY,
         rapi_fixture("instances_bulk.json"), lambda r: len(r) == 43 and isinstance(r[0], Instance)),
    Case("GetInstance", lambda c: c.get_instance("vm1.ganeti.test", reason="why"), "GET", INST, R, NOBODY,
         {"name": "vm1.ganeti.test"}, lambda r: isinstance(r, Instance) and r.name == "vm1.ganeti.test"),
    Case("GetInstanceInfo", lambda c: c.get_instance_info("vm1.ganeti.test", static=True, reason="why"),
         "GET", f"{INST}/info", [("static", "1"), *R], NOBODY),
    Case("InstancesMultiAlloc",
         lambda c: c.instances_multi_alloc([spec("vm9.ganeti.test")], iallocator="hail", dry_run=True, reason="why"),
         "POST", "/2/instances-multi-alloc", DRY_R, {"instances": [ALLOC], "iallocator": "hail"}),
    Case("CreateInstance", lambda c: c.create_instance(spec("vm9.ganeti.test"), dry_run=True, request_id="r1"),
         "POST", "/2/instances", [("dry-run", "1"), ("reason", "synnefo-ganeti:r1")], NOBODY, JOB, JOB),
    Case("DeleteInstance", lambda c: c.delete_instance("vm1.ganeti.test", dry_run=True, reason="why"),
         "DELETE", INST, DRY_R, NOBODY),
    # ours sends "hotplug" always (false unless asked): its default is true from Ganeti 3.1 on
    Case("ModifyInstance", lambda c: c.modify_instance("vm1.ganeti.test", reason="why", beparams={"memory": 512}),
         "PUT", f"{INST}/modify", R, {"beparams": {"memory": 512}, "hotplug": False}),
    Case("ActivateInstanceDisks", lambda c: c.activate_instance_disks("vm1.ganeti.test", ignore_size=True,
         reason="why"), "PUT", f"{INST}/activate-disks", [("ignore_size", "1"), *R]),
    Case("DeactivateInstanceDisks", lambda c: c.deactivate_instance_disks("vm1.ganeti.test", force=True,
         reason="why"), "PUT", f"{INST}/deactivate-disks", [("force", "1"), *R]),
    Case("RecreateInstanceDisks", lambda c: c.recreate_instance_disks("vm1.ganeti.test", disks=[0],
         nodes=["node2"], reason="why"), "POST", f"{INST}/recreate-disks", R, {"disks": [0], "nodes": ["node2"]}),
    Case("GrowInstanceDisk", lambda c: c.grow_instance_disk("vm1.ganeti.test", 1, 1024, wait_for_sync=False,
         reason="why"), "POST", f"{INST}/disk/1/grow", R, {"amount": 1024, "wait_for_sync": False}),
    *tag_cases("Instance", f"{INST}/tags", "get_instance_tags", "add_instance_tags", "delete_instance_tags",
               "vm1.ganeti.test"),
    Case("RebootInstance", lambda c: c.reboot_instance("vm1.ganeti.test", reboot_type="hard",
         ignore_secondaries=True, dry_run=True, reason="why"), "POST", f"{INST}/reboot",
         [("dry-run", "1"), ("type", "hard"), ("ignore_secondaries", "1"), *R]),
    Case("ShutdownInstance", lambda c: c.shutdown_instance("vm1.ganeti.test", dry_run=True, no_remember=True,
         reason="why", timeout=60), "PUT", f"{INST}/shutdown", [("dry-run", "1"), ("no_remember", "1"), *R],
         {"timeout": 60}),
    Case("StartupInstance", lambda c: c.startup_instance("vm1.ganeti.test", dry_run=True, no_remember=True,
         reason="why"), "PUT", f"{INST}/startup", [("dry-run", "1"), ("no_remember", "1"), *R]),
    Case("ReinstallInstance", lambda c: c.reinstall_instance("vm1.ganeti.test", os="noop", no_startup=True,
         osparams={"a": "b"}, reason="why"), "POST", f"{INST}/reinstall", R,
         {"start": False, "os": "noop", "osparams": {"a": "b"}}),
    # Ganeti's client sends these in the query, where the server drops early_release: the body form
    Case("ReplaceInstanceDisks", lambda c: c.replace_instance_disks("vm1.ganeti.test", disks=[0, 1],
         mode="replace_new_secondary", remote_node="node2", early_release=True, reason="why"), "POST",
         f"{INST}/replace-disks", R,
         {"mode": "replace_new_secondary", "disks": [0, 1], "remote_node": "node2", "early_release": True}),
    Case("PrepareExport", lambda c: c.prepare_export("vm1.ganeti.test", "remote", reason="why"), "PUT",
         f"{INST}/prepare-export", [("mode", "remote"), *R]),
    Case("ExportInstance", lambda c: c.export_instance("vm1.ganeti.test", "local", "node2", shutdown=True,
         remove_instance=False, compress="gzip", reason="why"), "PUT", f"{INST}/export", R,
         {"destination": "node2", "mode": "local", "shutdown": True, "remove_instance": False, "compress": "gzip"}),
    Case("MigrateInstance", lambda c: c.migrate_instance("vm1.ganeti.test", mode="live", cleanup=False,
         reason="why"), "PUT", f"{INST}/migrate", R, {"mode": "live", "cleanup": False}),
    Case("FailoverInstance", lambda c: c.failover_instance("vm1.ganeti.test", iallocator="hail",
         ignore_consistency=True, reason="why"), "PUT", f"{INST}/failover", R,
         {"iallocator": "hail", "ignore_consistency": True}),
    Case("RenameInstance", lambda c: c.rename_instance("vm1.ganeti.test", "vm2.ganeti.test", ip_check=False,
         name_check=False, reason="why"), "PUT", f"{INST}/rename", R,
         {"new_name": "vm2.ganeti.test", "ip_check": False, "name_check": False}),
    Case("GetInstanceConsole", lambda c: c.get_instance_console("vm1.ganeti.test"), "GET", f"{INST}/console", [],
         NOBODY, CONSOLE, lambda r: isinstance(r, InstanceConsole) and r.kind == "vnc" and r.port == 11000),
    # -- jobs
    Case("GetJobs", lambda c: c.list_jobs(), "GET", "/2/jobs", [("bulk", "1")], NOBODY,
         rapi_fixture("jobs_bulk.json"), lambda r: [j.id for j in r] == [1011, 1012, 1013, 1014]),
    Case("GetJobStatus", lambda c: c.get_job(1014), "GET", "/2/jobs/1014", [], NOBODY,
         rapi_fixture("job_create_error_already_exists.json"), lambda r: isinstance(r, Job) and r.id == 1014),
    Case("WaitForJobChange", lambda c: c.wait_for_job_change(1011, ["status", "opstatus"], ["running"], 3),
         "GET", "/2/jobs/1011/wait", [],
         {"fields": ["status", "opstatus"], "previous_job_info": ["running"], "previous_log_serial": 3},
         {"job_info": ["success", ["success"]], "log_entries": []},
         {"job_info": ["success", ["success"]], "log_entries": []}),
    Case("CancelJob", lambda c: c.cancel_job(22, dry_run=True), "DELETE", "/2/jobs/22", [("dry-run", "1")],
         NOBODY, [True, "Dequeued job 22"], CancelResult(True, "Dequeued job 22")),
    # -- nodes
    Case("GetNodes", lambda c: c.list_nodes(), "GET", "/2/nodes", [("bulk", "1")], NOBODY,
         rapi_fixture("nodes_bulk.json"), lambda r: isinstance(r[0], Node) and r[0].name == "node1.ganeti.test"),
    Case("GetNode", lambda c: c.get_node("node1.ganeti.test", reason="why"), "GET", NODE, R, NOBODY,
         rapi_fixture("nodes_bulk.json")[0], lambda r: isinstance(r, Node) and r.mfree == 18397),
    Case("EvacuateNode", lambda c: c.evacuate_node("node1.ganeti.test", iallocator="hail", early_release=True,
         mode="all", dry_run=True, reason="why"), "POST", f"{NODE}/evacuate", DRY_R,
         {"iallocator": "hail", "early_release": True, "mode": "all"}),
    Case("MigrateNode", lambda c: c.migrate_node("node1.ganeti.test", mode="non-live", iallocator="hail",
         dry_run=True, reason="why"), "POST", f"{NODE}/migrate", DRY_R, {"mode": "non-live", "iallocator": "hail"}),
    Case("GetNodeRole", lambda c: c.get_node_role("node1.ganeti.test"), "GET", f"{NODE}/role", [], NOBODY,
         "master-candidate", "master-candidate"),
    Case("SetNodeRole", lambda c: c.set_node_role("node1.ganeti.test", "drained", force=True, auto_promote=True,
         reason="why"), "PUT", f"{NODE}/role", [("force", "1"), ("auto-promote", "1"), *R], "drained"),
    Case("PowercycleNode", lambda c: c.powercycle_node("node1.ganeti.test", force=True, reason="why"), "POST",
         f"{NODE}/powercycle", [("force", "1"), *R]),
    Case("ModifyNode", lambda c: c.modify_node("node1.ganeti.test", reason="why", drained=True), "POST",
         f"{NODE}/modify", R, {"drained": True}),
    Case("GetNodeStorageUnits", lambda c: c.get_node_storage_units("node1.ganeti.test", "lvm-vg",
         ["name", "size"], reason="why"), "GET", f"{NODE}/storage",
         [("storage_type", "lvm-vg"), ("output_fields", "name,size"), *R], NOBODY),
    Case("ModifyNodeStorageUnits", lambda c: c.modify_node_storage_units("node1.ganeti.test", "lvm-pv",
         "/dev/sda1", allocatable=False, reason="why"), "PUT", f"{NODE}/storage/modify",
         [("storage_type", "lvm-pv"), ("name", "/dev/sda1"), ("allocatable", "0"), *R]),
    Case("RepairNodeStorageUnits", lambda c: c.repair_node_storage_units("node1.ganeti.test", "lvm-vg", "xenvg",
         reason="why"), "PUT", f"{NODE}/storage/repair", [("storage_type", "lvm-vg"), ("name", "xenvg"), *R]),
    *tag_cases("Node", f"{NODE}/tags", "get_node_tags", "add_node_tags", "delete_node_tags", "node1.ganeti.test"),
    # -- networks
    Case("GetNetworks", lambda c: c.list_networks(), "GET", "/2/networks", [("bulk", "1")], NOBODY, [NETWORK],
         lambda r: isinstance(r[0], Network) and r[0].free_count == 252),
    Case("GetNetwork", lambda c: c.get_network("net1", reason="why"), "GET", "/2/networks/net1", R, NOBODY,
         NETWORK, lambda r: isinstance(r, Network) and r.group_list == [["default", "bridged", "br0", ""]]),
    Case("CreateNetwork", lambda c: c.create_network("net1", "10.0.0.0/24", gateway="10.0.0.1",
         add_reserved_ips=["10.0.0.2", "10.0.0.3"], tags=["a", "b"], dry_run=True, reason="why"), "POST",
         "/2/networks", DRY_R,
         {"network_name": "net1", "gateway": "10.0.0.1", "network": "10.0.0.0/24", "gateway6": None,
          "network6": None, "mac_prefix": None, "add_reserved_ips": ["10.0.0.2", "10.0.0.3"], "tags": ["a", "b"]}),
    Case("ConnectNetwork", lambda c: c.connect_network("net1", "default", "bridged", "br0", dry_run=True,
         reason="why"), "PUT", "/2/networks/net1/connect", DRY_R,
         {"group_name": "default", "network_mode": "bridged", "network_link": "br0", "network_vlan": ""}),
    Case("DisconnectNetwork", lambda c: c.disconnect_network("net1", "default", dry_run=True, reason="why"),
         "PUT", "/2/networks/net1/disconnect", DRY_R, {"group_name": "default"}),
    Case("ModifyNetwork", lambda c: c.modify_network("net1", gateway="10.0.0.254"), "PUT",
         "/2/networks/net1/modify", [], {"gateway": "10.0.0.254"}),
    Case("RenameNetwork", lambda c: c.rename_network("net1", "net2", reason="why"), "PUT",
         "/2/networks/net1/rename", R, {"new_name": "net2"}, info=INFO_31),  # Ganeti 3.1's
    Case("DeleteNetwork", lambda c: c.delete_network("net1", dry_run=True, reason="why"), "DELETE",
         "/2/networks/net1", DRY_R),
    *tag_cases("Network", "/2/networks/net1/tags", "get_network_tags", "add_network_tags", "delete_network_tags",
               "net1"),
    # -- groups
    Case("GetGroups", lambda c: c.list_groups(), "GET", "/2/groups", [("bulk", "1")], NOBODY, [GROUP],
         lambda r: isinstance(r[0], Group) and r[0].node_list == ["node1.ganeti.test"]),
    Case("GetGroup", lambda c: c.get_group("default", reason="why"), "GET", "/2/groups/default", R, NOBODY,
         GROUP, lambda r: isinstance(r, Group) and r.alloc_policy == "preferred"),
    Case("CreateGroup", lambda c: c.create_group("g2", alloc_policy="last_resort", dry_run=True, reason="why"),
         "POST", "/2/groups", DRY_R, {"name": "g2", "alloc_policy": "last_resort"}),
    Case("ModifyGroup", lambda c: c.modify_group("g2", reason="why", alloc_policy="unallocable"), "PUT",
         "/2/groups/g2/modify", R, {"alloc_policy": "unallocable"}),
    Case("DeleteGroup", lambda c: c.delete_group("g2", dry_run=True, reason="why"), "DELETE", "/2/groups/g2",
         DRY_R),
    Case("RenameGroup", lambda c: c.rename_group("g2", "g3", reason="why"), "PUT", "/2/groups/g2/rename", R,
         {"new_name": "g3"}),
    Case("AssignGroupNodes", lambda c: c.assign_group_nodes("g2", ["node1.ganeti.test"], force=True,
         dry_run=True, reason="why"), "PUT", "/2/groups/g2/assign-nodes", [("force", "1"), *DRY_R],
         {"nodes": ["node1.ganeti.test"]}),
    *tag_cases("Group", "/2/groups/g2/tags", "get_group_tags", "add_group_tags", "delete_group_tags", "g2"),
    # -- query
    Case("Query", lambda c: c.query("instance", ["name", "oper_ram"], qfilter=["=", "name", "vm1"],
         reason="why"), "PUT", "/2/query/instance", R,
         {"fields": ["name", "oper_ram"], "qfilter": ["=", "name", "vm1"], "filter": ["=", "name", "vm1"]},
         QUERY, lambda r: isinstance(r, QueryResult) and r.names == ["name", "oper_ram"]),
    Case("QueryFields", lambda c: c.query_fields("node", ["name", "role"]), "GET", "/2/query/node/fields",
         [("fields", "name,role")], NOBODY, FIELDS,
         [QueryField(name="name", title="Node", kind="text", doc="Node name")]),
]  # fmt: skip


async def _send(case: Case) -> tuple[list[tuple[str, str]], bytes, Any]:
    """Make the call against a stub that answers ``case.answer``; what was sent, and the result."""
    sent: list[tuple[list[tuple[str, str]], bytes]] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        sent.append((list(request.query.items()), await request.read()))
        return json_response(case.answer)

    async with StubRapi() as stub:
        stub.route("GET", "/2/info", rapi_fixture("info.json") if case.info is None else case.info)
        stub.route(case.method, case.path, handler)
        async with stub_client(stub.url) as rapi:
            result = await case.call(rapi)
    assert len(sent) == 1, f"{case.ganeti}: {len(stub.seen)} requests, to {[s.path for s in stub.seen]}"
    return sent[0][0], sent[0][1], result


@pytest.mark.parametrize("case", CASES, ids=[case.ganeti for case in CASES])
async def test_each_call_sends_what_ganetis_client_sends_and_returns_a_typed_value(case: Case) -> None:
    query, body, result = await _send(case)
    assert sorted(query) == sorted(case.query)
    if case.body is NOBODY:
        if case.ganeti != "CreateInstance":
            assert body == b""
    else:
        assert orjson.loads(body) == case.body
    assert case.check(result), result


async def test_create_instance_body_is_the_spec_with_version_1() -> None:
    case = next(c for c in CASES if c.ganeti == "CreateInstance")
    _, body, _ = await _send(case)
    assert orjson.loads(body) == {**ALLOC, "__version__": 1}


@pytest.mark.parametrize("kind", ["Add", "Replace"])
async def test_filter_rules_end_their_reason_trail_with_the_clients_entry(kind: str) -> None:
    """Ganeti's AddFilter/ReplaceFilter append ("gnt:client", "", <ns since epoch>) to the trail."""
    predicates = [["jobid", [">", "id", "watermark"]]]
    if kind == "Add":
        case = Case("AddFilter", lambda c: c.add_filter(priority=5, predicates=predicates, action="REJECT",
                    reason_trail=[["me", "because", 1]]), "POST", "/2/filters", answer="f-1", returns="f-1")  # fmt: skip
    else:
        case = Case("ReplaceFilter", lambda c: c.replace_filter("f-1", priority=5, predicates=predicates,
                    action="REJECT", reason_trail=[["me", "because", 1]]), "PUT", "/2/filters/f-1", answer="f-1",
                    returns="f-1")  # fmt: skip
    query, raw, result = await _send(case)
    body = orjson.loads(raw)
    assert query == [] and result == "f-1"
    *given, (source, text, stamp) = body.pop("reason")
    assert body == {"priority": 5, "predicates": predicates, "action": "REJECT"}
    assert given == [["me", "because", 1]] and (source, text) == ("gnt:client", "")
    assert isinstance(stamp, int) and stamp > 1_600_000_000 * 10**9


def test_instance_allocation_is_the_create_body_without_its_version() -> None:
    alloc = RapiClient.instance_allocation(
        spec("vm9.ganeti.test", disk_template="file", disks=[{"size": 1024}])
    )
    assert "__version__" not in alloc
    assert {k: alloc[k] for k in ("mode", "name", "disk_template", "disks", "nics")} == {
        "mode": "create", "name": "vm9.ganeti.test", "disk_template": "file", "disks": [{"size": 1024}],
        "nics": [{}],
    }  # fmt: skip


async def test_wait_for_job_completion_counterpart_returns_the_final_job() -> None:
    async with StubRapi() as stub:
        stub.route("GET", "/2/jobs/1014/wait", {"job_info": ["error"], "log_entries": []})
        stub.route("GET", "/2/jobs/1014", rapi_fixture("job_create_error_already_exists.json"))
        async with stub_client(stub.url) as rapi:
            job = await rapi.wait_for_job(1014, timeout=5)
    assert job.is_final and job.failure is not None and job.failure.ecode == "already_exists"


def test_query_result_rows_leave_out_what_ganeti_could_not_give() -> None:
    result = QueryResult.model_validate(QUERY)
    assert result.rows == [
        {"name": "vm1.ganeti.test", "oper_ram": 128},
        {"name": "vm2.ganeti.test", "oper_ram": None},
    ]
