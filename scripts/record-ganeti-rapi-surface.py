#!/usr/bin/env python3
"""Record the real Ganeti 3.0 RAPI answers of every resource the testbed serves.

Usage (the testbed up: ``scripts/ganeti-testbed up``)::

    eval "$(scripts/ganeti-testbed env)"
    python3 scripts/record-ganeti-rapi-surface.py tests/fixtures/ganeti-3.0-rapi \
        tests/fixtures/ganeti-3.0-queue

Makes two instances (``fx-a``: diskless, running, tagged; ``fx-b``: a 1 GiB ``file`` disk,
shut down), a network ``fxnet`` and a group ``fxgroup``, then records each GET answer
as ``<name>.json`` and, for each write, the job's final ``GET /2/jobs/ID`` as
``job_<name>.json`` (and the job file as ``job-<id>.<name>.json`` in the queue folder).
Answers that are errors are recorded as ``<name>.txt`` (body, then the HTTP status).
The password comes from the environment and is never written.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

URL = os.environ.get("SYNNEFO_GANETI_TEST_RAPI_URL", "https://127.0.0.1:5080")
USER = os.environ.get("SYNNEFO_GANETI_TEST_RAPI_USER", "ci")
PASSWORD = os.environ.get("SYNNEFO_GANETI_TEST_RAPI_PASSWORD", "ci")
QUEUE = Path(os.environ.get("SYNNEFO_GANETI_TEST_QUEUE", "/var/lib/ganeti/queue"))
NODE = os.environ.get("SYNNEFO_GANETI_TEST_NODE", "node1.ganeti.test")
CTX = ssl.create_default_context()
CTX.check_hostname = False
CTX.verify_mode = ssl.CERT_NONE
AUTH = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()


def call(method: str, path: str, body: Any = None) -> tuple[int, bytes]:
    data = b"" if body is None else json.dumps(body).encode()
    request = urllib.request.Request(URL + path, data=data, method=method)
    request.add_header("Authorization", AUTH)
    request.add_header("Content-Type", "application/json")
    request.add_header("Content-Length", str(len(data)))
    try:
        with urllib.request.urlopen(request, context=CTX, timeout=60) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class Recorder:
    def __init__(self, rapi_dir: Path, queue_dir: Path) -> None:
        self.rapi_dir = rapi_dir
        self.queue_dir = queue_dir

    def save(self, name: str, status: int, raw: bytes) -> Any:
        if status == 200:
            (self.rapi_dir / f"{name}.json").write_bytes(raw)
            print(f"{name}.json: 200")
            return json.loads(raw)
        (self.rapi_dir / f"{name}.txt").write_bytes(raw + f"\n{status}\n".encode())
        print(f"{name}.txt: {status} {raw[:160]!r}")
        return None

    def get(self, name: str, path: str) -> Any:
        return self.save(name, *call("GET", path))

    def job(self, name: str, method: str, path: str, body: Any = None) -> Any:
        """Submit a write, wait for its job to end, record the job (and its file)."""
        status, raw = call(method, path, body)
        if status != 200:
            return self.save(f"submit_{name}", status, raw)
        job_id = json.loads(raw)
        if not isinstance(job_id, int | str):
            return self.save(name, status, raw)
        job_id = int(job_id)
        while True:
            _, job_raw = call("GET", f"/2/jobs/{job_id}")
            job = json.loads(job_raw)
            if job["status"] in ("success", "error", "canceled"):
                break
            time.sleep(0.2)
        print(f"  job {job_id} {job['status']} {json.dumps(job['opresult'])[:200]}")
        self.save(f"job_{name}", 200, job_raw)
        for candidate in (
            QUEUE / f"job-{job_id}",
            QUEUE / "archive" / str(job_id // 10000) / f"job-{job_id}",
        ):
            if candidate.exists():
                shutil.copy(candidate, self.queue_dir / f"job-{job_id}.{name}.json")
                break
        return job


def main() -> None:
    rec = Recorder(Path(sys.argv[1]), Path(sys.argv[2]))
    inst_a, inst_b = "fx-a.ganeti.test", "fx-b.ganeti.test"
    base = {"__version__": 1, "mode": "create", "os": "noop", "name_check": False, "ip_check": False,
            "nics": [{}], "beparams": {"memory": 128}, "pnode": NODE}  # fmt: skip
    for name in (inst_a, inst_b, "fx-c.ganeti.test", "fx-renamed.ganeti.test"):
        call("DELETE", f"/2/instances/{name}")
    time.sleep(3)
    rec.job("instance_create_a", "POST", "/2/instances",
            base | {"name": inst_a, "disk_template": "diskless", "disks": [], "tags": ["owner:demo"]})  # fmt: skip
    rec.job("instance_create_b", "POST", "/2/instances",
            base | {"name": inst_b, "disk_template": "file", "disks": [{"size": 1024}], "start": False})  # fmt: skip
    rec.job("instance_create_c", "POST", "/2/instances",
            base | {"name": "fx-c.ganeti.test", "disk_template": "diskless", "disks": []})  # fmt: skip

    # ---- cluster
    rec.get("root", "/")
    rec.get("cluster_tags", "/2/tags")
    rec.get("os", "/2/os")
    rec.job("tags_add_cluster", "PUT", "/2/tags?tag=fx:cluster&tag=fx:two")
    rec.get("cluster_tags_after_add", "/2/tags")
    rec.job("tags_del_cluster", "DELETE", "/2/tags?tag=fx:two")
    rec.job("redistribute_config", "PUT", "/2/redistribute-config")
    rec.job("cluster_modify", "PUT", "/2/modify", {"candidate_pool_size": 10})
    status, raw = call("POST", "/2/filters",
                       {"priority": 5, "predicates": [["jobid", [">", "id", 999999999]]], "action": "CONTINUE",
                        "reason": [["fx:test", "recording", 0]]})  # fmt: skip
    rec.save("filter_add", status, raw)
    uuid = json.loads(raw) if status == 200 else None
    rec.get("filters", "/2/filters")
    rec.get("filters_bulk", "/2/filters?bulk=1")
    if uuid:
        rec.get("filter", f"/2/filters/{uuid}")
        rec.save("filter_replace", *call("PUT", f"/2/filters/{uuid}", {"priority": 6, "action": "CONTINUE"}))
        rec.save("filter_delete", *call("DELETE", f"/2/filters/{uuid}"))
    rec.get("error_404_filter", "/2/filters/00000000-0000-0000-0000-000000000000")

    # ---- groups
    rec.get("groups", "/2/groups")
    rec.get("groups_bulk", "/2/groups?bulk=1")
    rec.get("group", "/2/groups/default")
    rec.get("error_404_group", "/2/groups/nosuch")
    rec.job("group_add", "POST", "/2/groups", {"group_name": "fxgroup"})
    rec.job("group_modify", "PUT", "/2/groups/fxgroup/modify", {"alloc_policy": "last_resort"})
    rec.job("group_rename", "PUT", "/2/groups/fxgroup/rename", {"new_name": "fxgroup2"})
    rec.job("tags_add_group", "PUT", "/2/groups/fxgroup2/tags?tag=fx:group")
    rec.get("group_tags", "/2/groups/fxgroup2/tags")
    rec.get("group_fxgroup2", "/2/groups/fxgroup2")
    rec.job("tags_del_group", "DELETE", "/2/groups/fxgroup2/tags?tag=fx:group")
    rec.job("group_assign_nodes", "PUT", "/2/groups/default/assign-nodes", {"nodes": [NODE]})
    rec.job(
        "group_assign_nodes_error",
        "PUT",
        "/2/groups/fxgroup2/assign-nodes",
        {"nodes": ["nosuch.ganeti.test"]},
    )

    # ---- networks
    rec.job("network_add", "POST", "/2/networks",
            {"network_name": "fxnet", "network": "10.99.0.0/28", "gateway": "10.99.0.1",
             "add_reserved_ips": ["10.99.0.5"], "tags": ["fx:net"]})  # fmt: skip
    rec.job(
        "network_add_error_exists",
        "POST",
        "/2/networks",
        {"network_name": "fxnet", "network": "10.98.0.0/28"},
    )
    rec.get("networks", "/2/networks")
    rec.get("networks_bulk", "/2/networks?bulk=1")
    rec.get("network", "/2/networks/fxnet")
    rec.get("error_404_network", "/2/networks/nosuch")
    rec.job("network_connect", "PUT", "/2/networks/fxnet/connect",
            {"group_name": "default", "network_mode": "bridged", "network_link": "gntbr0"})  # fmt: skip
    rec.job("network_modify", "PUT", "/2/networks/fxnet/modify",
            {"add_reserved_ips": ["10.99.0.6"], "remove_reserved_ips": ["10.99.0.5"]})  # fmt: skip
    rec.get("network_connected", "/2/networks/fxnet")
    rec.job("tags_add_network", "PUT", "/2/networks/fxnet/tags?tag=fx:more")
    rec.get("network_tags", "/2/networks/fxnet/tags")
    rec.job("tags_del_network", "DELETE", "/2/networks/fxnet/tags?tag=fx:more")
    rec.job("instance_modify_nic_network", "PUT", f"/2/instances/{inst_a}/modify",
            {"nics": [["add", {"network": "fxnet", "ip": "pool"}]]})  # fmt: skip
    rec.get("network_with_instance", "/2/networks/fxnet")
    rec.get("instance_with_network", f"/2/instances/{inst_a}")

    # ---- nodes
    rec.get("node", f"/2/nodes/{NODE}")
    rec.get("node_role", f"/2/nodes/{NODE}/role")
    rec.get("node_tags", f"/2/nodes/{NODE}/tags")
    rec.get("error_404_node", "/2/nodes/nosuch.ganeti.test")
    rec.job("tags_add_node", "PUT", f"/2/nodes/{NODE}/tags?tag=fx:node")
    rec.job("tags_del_node", "DELETE", f"/2/nodes/{NODE}/tags?tag=fx:node")
    rec.job(
        "node_storage", "GET", f"/2/nodes/{NODE}/storage?storage_type=file&output_fields=name,size,used,free"
    )
    rec.get("submit_node_storage_no_fields", f"/2/nodes/{NODE}/storage?storage_type=file")
    rec.job(
        "node_storage_modify", "PUT", f"/2/nodes/{NODE}/storage/modify?storage_type=file&name=x&allocatable=1"
    )
    rec.job("node_storage_repair", "PUT", f"/2/nodes/{NODE}/storage/repair?storage_type=file&name=x")
    rec.job("node_modify", "POST", f"/2/nodes/{NODE}/modify", {"ndparams": {"spindle_count": 1}})
    rec.job("node_role_master_candidate", "PUT", f"/2/nodes/{NODE}/role", "master-candidate")
    rec.job("node_role_drained", "PUT", f"/2/nodes/{NODE}/role", "drained")
    rec.save("submit_node_role_bad", *call("PUT", f"/2/nodes/{NODE}/role", "boss"))
    rec.job("node_powercycle", "POST", f"/2/nodes/{NODE}/powercycle")
    rec.job("node_evacuate", "POST", f"/2/nodes/{NODE}/evacuate", {"mode": "all"})
    rec.job("node_migrate", "POST", f"/2/nodes/{NODE}/migrate", {"mode": "live"})

    # ---- instances
    rec.get("instance", f"/2/instances/{inst_a}")
    rec.get("instance_tags", f"/2/instances/{inst_a}/tags")
    rec.get("instance_console", f"/2/instances/{inst_a}/console")
    rec.get("error_503_console_stopped", f"/2/instances/{inst_b}/console")
    rec.job("instance_info", "GET", f"/2/instances/{inst_a}/info")
    rec.job("instance_info_static", "GET", f"/2/instances/{inst_b}/info?static=1")
    rec.job("tags_add_instance", "PUT", f"/2/instances/{inst_a}/tags?tag=fx:inst")
    rec.job("tags_del_instance", "DELETE", f"/2/instances/{inst_a}/tags?tag=fx:inst")
    rec.job("instance_reinstall", "POST", f"/2/instances/{inst_b}/reinstall", {"os": "noop", "start": False})
    rec.job("instance_grow_disk", "POST", f"/2/instances/{inst_b}/disk/0/grow", {"amount": 1024})
    rec.job("instance_activate_disks", "PUT", f"/2/instances/{inst_b}/activate-disks")
    rec.job("instance_deactivate_disks", "PUT", f"/2/instances/{inst_b}/deactivate-disks")
    rec.job("instance_recreate_disks", "POST", f"/2/instances/{inst_b}/recreate-disks")
    rec.job(
        "instance_replace_disks", "POST", f"/2/instances/{inst_b}/replace-disks", {"mode": "replace_auto"}
    )
    rec.job("instance_migrate", "PUT", f"/2/instances/{inst_a}/migrate", {})
    rec.job("instance_failover", "PUT", f"/2/instances/{inst_a}/failover", {})
    rec.job("instance_prepare_export", "PUT", f"/2/instances/{inst_b}/prepare-export?mode=local")
    rec.job("instance_export", "PUT", f"/2/instances/{inst_b}/export", {"destination": NODE, "mode": "local"})
    rec.job("instance_shutdown_c", "PUT", "/2/instances/fx-c.ganeti.test/shutdown")
    rec.job("instance_rename", "PUT", "/2/instances/fx-c.ganeti.test/rename",
            {"new_name": "fx-renamed.ganeti.test", "name_check": False, "ip_check": False})  # fmt: skip
    rec.get("instance_renamed", "/2/instances/fx-renamed.ganeti.test")

    # ---- queries
    fields = {
        "instance": "name,status,oper_state,pnode,tags,disk.sizes,nic.ips",
        "node": "name,role,mfree,dfree,offline,drained,tags",
        "group": "name,uuid,node_cnt,alloc_policy,tags",
        "network": "name,network,gateway,free_count,reserved_count,tags",
        "job": "id,status,summary,received_ts",
        "filter": "uuid,priority,action",
        "lock": "name,mode,owner",
        "export": "node,export",
    }
    for resource, wanted in fields.items():
        rec.get(f"query_{resource}", f"/2/query/{resource}?fields={wanted}")
        rec.get(f"query_{resource}_fields", f"/2/query/{resource}/fields")
    rec.get("query_instance_fields_some", "/2/query/instance/fields?fields=name,status,nosuch")
    rec.save("query_instance_put_filter",
             *call("PUT", "/2/query/instance", {"fields": ["name", "status"], "qfilter": ["=", "name", inst_a]}))  # fmt: skip
    rec.get("error_query_unknown_resource", "/2/query/nosuch?fields=name")
    rec.get("error_query_no_fields", "/2/query/instance")

    # ---- clean-up writes that are recorded too
    rec.job(
        "network_disconnect_error_in_use", "PUT", "/2/networks/fxnet/disconnect", {"group_name": "default"}
    )
    rec.job("instance_modify_nic_remove", "PUT", f"/2/instances/{inst_a}/modify", {"nics": [["remove", {}]]})
    rec.job("network_disconnect", "PUT", "/2/networks/fxnet/disconnect", {"group_name": "default"})
    rec.job("group_remove", "DELETE", "/2/groups/fxgroup2")
    rec.job("network_remove", "DELETE", "/2/networks/fxnet")


if __name__ == "__main__":
    main()
