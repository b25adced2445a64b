#!/usr/bin/env python3
"""Record what a node failure looks like in a real Ganeti 3.0 cluster (issue 27).

Usage (root; the 3-node testbed up and no other user of it)::

    scripts/ganeti-testbed up --nodes 3
    eval "$(scripts/ganeti-testbed env)"
    python3 scripts/record-node-failure.py tests/fixtures/ganeti-3.0-nodefail

Makes four diskless instances (``nf-a`` on node1, ``nf-b`` on node2, ``nf-c`` and ``nf-d``
(not started) on node3), crashes node3 the way ``shared/ganeti/multi/crash-node-multi.sh``
does (SIGKILL of every process in its network namespace, its bridge down and its addresses
flushed, its ``/run/ganeti`` wiped), then records, each answer byte for byte as
``<name>.json`` (``.txt`` for an error: the body, then the HTTP status) and each job's final
``GET /2/jobs/ID`` as ``job_<name>.json`` with its job file as ``queue_<name>.json``:

1. node3 dead: ``/2/nodes?bulk=1``, ``/2/nodes/node3``, ``/2/instances?bulk=1``, the
   reconciler's ``PUT /2/query/instance``, a create on node3, creates on node1 (how long the
   POST takes, one at a time and six at once), a POST whose client gives up after 2 s (when
   its job appears), a create by the default iallocator (hail), a shutdown, a startup and a
   remove of instances on node3;
2. node3 marked offline (``POST /2/nodes/node3/modify {"offline": true}``, what
   ``gnt-node modify --offline yes`` submits): the same reads, a create on node3, one by hail,
   a POST's time, a shutdown and a remove of instances on node3;
3. node3 back (``scripts/ganeti-testbed up --nodes 3``, then ``offline: false``): how long until
   ``/2/nodes?bulk=1`` shows its figures; then a second crash without offline and the same;
4. every instance it made removed.

Every timing goes to ``timings.json`` (seconds). The password comes from the environment and is
never written. Leaves the testbed up and healthy, node3 online.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TESTBED = ROOT / "scripts" / "ganeti-testbed"
URL = os.environ.get("SYNNEFO_GANETI_TEST_RAPI_URL", "https://127.0.0.1:5080")
USER = os.environ.get("SYNNEFO_GANETI_TEST_RAPI_USER", "ci")
PASSWORD = os.environ.get("SYNNEFO_GANETI_TEST_RAPI_PASSWORD", "ci")
QUEUE = Path(os.environ.get("SYNNEFO_GANETI_TEST_QUEUE", "/var/lib/ganeti-multi/node1/lib/queue"))
STATE = Path("/var/lib/ganeti-multi")
DOMAIN = "ganeti.test"
DEAD = "node3"
DEAD_FQDN = f"{DEAD}.{DOMAIN}"
CTX = ssl.create_default_context()
CTX.check_hostname = False
CTX.verify_mode = ssl.CERT_NONE
AUTH = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
#: the fields the reconciler asks (synnefo_ganeti/reconcile/_fetch.py INSTANCE_FIELDS)
INSTANCE_FIELDS = [
    "name", "admin_state", "oper_state", "status", "os", "pnode",
    "be/maxmem", "be/minmem", "be/vcpus", "be/auto_balance", "be/always_failover", "be/spindle_use",
    "nic.macs", "nic.ips", "nic.networks.names", "nic.modes", "nic.links",
    "disk.sizes", "disk.uuids", "tags",
]  # fmt: skip
#: node fields: static ones, and the live ones (``query._BuildNodeFields``, ``_NODE_LIVE_FIELDS``)
NODE_FIELDS = ["name", "offline", "role", "master_candidate", "pinst_cnt", "mtotal", "mnode", "mfree",
               "dtotal", "dfree", "ctotal", "cnos", "cnodes", "csockets"]  # fmt: skip
#: instance fields that read live data (``oper_ram``, ``oper_vcpus``) besides the reconciler's
INSTANCE_LIVE_FIELDS = ["name", "status", "oper_state", "oper_ram", "oper_vcpus", "pnode"]
FINAL = ("success", "error", "canceled")


def call(method: str, path: str, body: Any = None, timeout: float = 300) -> tuple[int, bytes, float]:
    """One request; (HTTP status, body, seconds it took). Status 0: no answer within ``timeout``."""
    data = b"" if body is None else json.dumps(body).encode()
    request = urllib.request.Request(URL + path, data=data, method=method)
    request.add_header("Authorization", AUTH)
    request.add_header("Content-Type", "application/json")
    request.add_header("Content-Length", str(len(data)))
    start = time.monotonic()
    try:
        with urllib.request.urlopen(request, context=CTX, timeout=timeout) as answer:
            return answer.status, answer.read(), time.monotonic() - start
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), time.monotonic() - start
    except (TimeoutError, urllib.error.URLError) as exc:
        if isinstance(exc, urllib.error.URLError) and not isinstance(exc.reason, TimeoutError):
            raise
        return 0, b"", time.monotonic() - start


def sh(*argv: str | Path) -> float:
    start = time.monotonic()
    subprocess.run([str(a) for a in argv], check=True)
    return time.monotonic() - start


def crash(node: str) -> None:
    """What shared/ganeti/multi/crash-node-multi.sh does."""
    pids = subprocess.run(
        ["ip", "netns", "pids", f"gm-{node}"], capture_output=True, text=True
    ).stdout.split()
    if pids:
        subprocess.run(["kill", "-9", *pids], check=False)
    subprocess.run(["ip", "-n", f"gm-{node}", "addr", "flush", "dev", "gntbr0"], check=True)
    subprocess.run(["ip", "-n", f"gm-{node}", "link", "set", "gntbr0", "down"], check=True)
    run = STATE / node / "run"
    for child in run.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    print(f"[record] {node} crashed (killed {len(pids)} processes)")


class Recorder:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.timings: dict[str, Any] = {}
        folder.mkdir(parents=True, exist_ok=True)

    def note(self, key: str, value: Any) -> None:
        self.timings[key] = round(value, 2) if isinstance(value, float) else value
        print(f"[record]   {key} = {self.timings[key]}")
        (self.folder / "timings.json").write_text(json.dumps(self.timings, indent=1) + "\n")

    def save(self, name: str, status: int, raw: bytes) -> Any:
        if status == 200:
            (self.folder / f"{name}.json").write_bytes(raw)
            print(f"[record] {name}.json: 200")
            return json.loads(raw)
        (self.folder / f"{name}.txt").write_bytes(raw + f"\n{status}\n".encode())
        print(f"[record] {name}.txt: {status} {raw[:160]!r}")
        return None

    def get(self, name: str, path: str) -> Any:
        status, raw, took = call("GET", path)
        self.note(f"{name}.seconds", took)
        return self.save(name, status, raw)

    def query(self, name: str, resource: str = "instance", fields: list[str] = INSTANCE_FIELDS) -> Any:
        status, raw, took = call("PUT", f"/2/query/{resource}", {"fields": fields})
        self.note(f"{name}.seconds", took)
        return self.save(name, status, raw)

    def submit(self, name: str, method: str, path: str, body: Any = None) -> int | None:
        status, raw, took = call(method, path, body)
        self.note(f"{name}.submit_seconds", took)
        if status != 200:
            self.save(f"submit_{name}", status, raw)
            return None
        return int(json.loads(raw))

    def job(self, name: str, method: str, path: str, body: Any = None, *, keep: bool = True) -> Any:
        """Submit a write, wait for its job to end; record the job and its file (``keep``)."""
        job_id = self.submit(name, method, path, body)
        if job_id is None:
            return None
        return self.finish(name, job_id, keep=keep)

    def finish(self, name: str, job_id: int, *, keep: bool = True) -> Any:
        start = time.monotonic()
        while True:
            _, raw, _ = call("GET", f"/2/jobs/{job_id}")
            job = json.loads(raw)
            if job["status"] in FINAL:
                break
            time.sleep(0.2)
        self.note(f"{name}.job_seconds_after_submit", time.monotonic() - start)
        print(f"[record]   job {job_id} {job['status']} {json.dumps(job['opresult'])[:300]}")
        if keep:
            self.save(f"job_{name}", 200, raw)
            for candidate in (
                QUEUE / f"job-{job_id}",
                QUEUE / "archive" / str(job_id // 10000) / f"job-{job_id}",
            ):
                if candidate.exists():
                    shutil.copy(candidate, self.folder / f"queue_{name}.json")
                    break
        return job


def create_body(name: str, node: str | None, *, start: bool = True) -> dict[str, Any]:
    """A diskless create on ``node``; ``None``: no pnode (the cluster's default iallocator, hail)."""
    body = {
        "__version__": 1, "mode": "create", "name": f"{name}.{DOMAIN}", "os": "noop",
        "disk_template": "diskless", "disks": [], "nics": [{}], "beparams": {"memory": 128},
        "hypervisor": "fake", "name_check": False, "ip_check": False, "start": start,
    }  # fmt: skip
    if node is not None:
        body["pnode"] = f"{node}.{DOMAIN}"
    return body


def burst(rec: Recorder, prefix: str, count: int) -> None:
    """``count`` creates POSTed at once (pnode node1 and node2 in turn): how long each POST takes."""
    took: list[float] = [0.0] * count
    ids: list[int | None] = [None] * count

    def post(index: int) -> None:
        node = ("node1", "node2")[index % 2]
        status, raw, seconds = call("POST", "/2/instances", create_body(f"{prefix}{index}", node))
        took[index] = round(seconds, 2)
        ids[index] = int(json.loads(raw)) if status == 200 else None

    threads = [threading.Thread(target=post, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rec.note(f"{prefix}.post_seconds", sorted(took))
    for index, job_id in enumerate(ids):
        if job_id is not None:
            rec.finish(f"{prefix}{index}", job_id, keep=False)


def node3_live(nodes: list[dict[str, Any]]) -> bool:
    return any(n["name"] == DEAD_FQDN and n["mfree"] is not None for n in nodes)


def wait_for_figures(rec: Recorder, key: str, limit: float = 180) -> None:
    start = time.monotonic()
    while time.monotonic() - start < limit:
        status, raw, _ = call("GET", "/2/nodes?bulk=1")
        if status == 200 and node3_live(json.loads(raw)):
            rec.note(key, time.monotonic() - start)
            return
        time.sleep(0.5)
    rec.note(key, f"not within {limit} s")


def give_up_early(rec: Recorder, name: str, node: str) -> None:
    """A create POST whose client gives up after 2 s (curl --max-time 2): does its job appear?"""
    body = create_body(name, node)
    last = max((int(job["id"]) for job in json.loads(call("GET", "/2/jobs")[1])), default=0)
    posted = time.time()
    status, _, took = call("POST", "/2/instances", body, timeout=2)
    rec.note(f"{name}.client_gave_up_after", took)
    rec.note(f"{name}.client_status", status)
    start = time.monotonic()
    fqdn = f"{name}.{DOMAIN}"
    while time.monotonic() - start < 180:
        _, jraw, _ = call("GET", "/2/jobs?bulk=1")
        for job in json.loads(jraw):
            ops = job.get("ops") or []
            ours = any(
                op.get("OP_ID") == "OP_INSTANCE_CREATE" and op.get("instance_name") == fqdn for op in ops
            )
            if ours and int(job["id"]) > last:
                rec.note(f"{name}.job_listed_after_give_up", time.monotonic() - start + took)
                rec.note(f"{name}.job_id", job["id"])
                ended = rec.finish(name, int(job["id"]), keep=False)
                sec, usec = ended["received_ts"]
                rec.note(f"{name}.job_received_after_post", sec + usec / 1e6 - posted)
                return
        time.sleep(0.5)
    rec.note(f"{name}.job_listed_after_give_up", "never (180 s)")


def remove_all(names: list[str]) -> None:
    """Remove those of ``names`` the cluster has (no failing delete jobs for the others)."""
    listed = {item["id"] for item in json.loads(call("GET", "/2/instances")[1])}
    ids = []
    for name in (name for name in names if f"{name}.{DOMAIN}" in listed):
        status, raw, _ = call("DELETE", f"/2/instances/{name}.{DOMAIN}")
        if status == 200:
            ids.append(int(json.loads(raw)))
    for job_id in ids:
        while json.loads(call("GET", f"/2/jobs/{job_id}")[1])["status"] not in FINAL:
            time.sleep(0.3)


def main() -> None:
    rec = Recorder(Path(sys.argv[1]))
    mine = ["nf-a", "nf-b", "nf-c", "nf-d", "nf-dead1", "nf-slow1", "nf-slow2", "nf-slow3", "nf-giveup1",
            "nf-offline1", "nf-fast1", "nf-giveup2", "nf-hail1", "nf-hail2", *(f"nf-burst{i}" for i in range(6))]  # fmt: skip
    remove_all(mine)

    # ---- healthy
    for name, node, start in (("nf-a", "node1", True), ("nf-b", "node2", True), ("nf-c", DEAD, True),
                              ("nf-d", DEAD, False)):  # fmt: skip
        rec.job(
            f"create_{name}",
            "POST",
            "/2/instances",
            create_body(name, node, start=start),
            keep=name == "nf-c",
        )
    rec.get("nodes_bulk_healthy", "/2/nodes?bulk=1")
    rec.get("node3_healthy", f"/2/nodes/{DEAD_FQDN}")
    rec.query("query_instance_healthy")

    # ---- node3 dead, not offline
    crash(DEAD)
    t_crash = time.monotonic()
    rec.get("nodes_bulk_dead", "/2/nodes?bulk=1")
    rec.get("nodes_bulk_dead_again", "/2/nodes?bulk=1")
    rec.get("node3_dead", f"/2/nodes/{DEAD_FQDN}")
    rec.get("instances_bulk_dead", "/2/instances?bulk=1")
    rec.query("query_instance_dead")
    rec.query("query_instance_live_dead", fields=INSTANCE_LIVE_FIELDS)
    rec.query("query_node_dead", "node", NODE_FIELDS)
    rec.get("instance_nf_c_dead", f"/2/instances/nf-c.{DOMAIN}")
    rec.job("create_on_dead_node", "POST", "/2/instances", create_body("nf-dead1", DEAD))
    for index in (1, 2, 3):
        rec.job(
            f"create_slow{index}",
            "POST",
            "/2/instances",
            create_body(f"nf-slow{index}", "node1"),
            keep=index == 1,
        )
    burst(rec, "nf-burst", 6)
    give_up_early(rec, "nf-giveup1", "node1")
    rec.job("create_iallocator_dead", "POST", "/2/instances", create_body("nf-hail1", None))
    rec.job("shutdown_on_dead_node", "PUT", f"/2/instances/nf-c.{DOMAIN}/shutdown")
    rec.job("startup_on_dead_node", "PUT", f"/2/instances/nf-d.{DOMAIN}/startup")
    rec.job("remove_on_dead_node", "DELETE", f"/2/instances/nf-d.{DOMAIN}")
    rec.note("dead_phase_seconds", time.monotonic() - t_crash)

    # ---- node3 offline
    rec.job("node3_set_offline", "POST", f"/2/nodes/{DEAD_FQDN}/modify", {"offline": True})
    rec.get("nodes_bulk_offline", "/2/nodes?bulk=1")
    rec.get("node3_offline", f"/2/nodes/{DEAD_FQDN}")
    rec.get("instances_bulk_offline", "/2/instances?bulk=1")
    rec.query("query_instance_offline")
    rec.query("query_instance_live_offline", fields=INSTANCE_LIVE_FIELDS)
    rec.query("query_node_offline", "node", NODE_FIELDS)
    rec.job("create_on_offline_node", "POST", "/2/instances", create_body("nf-offline1", DEAD))
    rec.job("create_fast1", "POST", "/2/instances", create_body("nf-fast1", "node1"), keep=False)
    rec.job("create_iallocator_offline", "POST", "/2/instances", create_body("nf-hail2", None))
    rec.job("shutdown_on_offline_node", "PUT", f"/2/instances/nf-c.{DOMAIN}/shutdown")
    rec.job("remove_on_offline_node", "DELETE", f"/2/instances/nf-d.{DOMAIN}")

    # ---- node3 back
    rec.note("testbed_up_seconds", sh(TESTBED, "up", "--nodes", "3"))
    t_up = time.monotonic()
    rec.job("node3_set_online", "POST", f"/2/nodes/{DEAD_FQDN}/modify", {"offline": False})
    wait_for_figures(rec, "figures_back_after_online_seconds")
    rec.note("figures_back_after_up_seconds", time.monotonic() - t_up)
    rec.get("nodes_bulk_restored", "/2/nodes?bulk=1")
    rec.query("query_instance_restored")

    # ---- a second crash, no offline: how long until the figures come back after `up`
    crash(DEAD)
    rec.get("nodes_bulk_dead2", "/2/nodes?bulk=1")
    give_up_early(rec, "nf-giveup2", "node1")
    rec.note("testbed_up2_seconds", sh(TESTBED, "up", "--nodes", "3"))
    t_up = time.monotonic()
    wait_for_figures(rec, "figures_back_after_up2_seconds")
    rec.query("query_instance_restored2")

    remove_all(mine)
    rec.get("nodes_bulk_end", "/2/nodes?bulk=1")


if __name__ == "__main__":
    main()
