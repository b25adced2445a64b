"""The rest of the RAPI (networks, groups, tags, node role and storage, queries), compared live.

The same requests on the real testbed and on a one-node FakeGaneti; every answer and every
job (once ended) must have the same keys and value types at every level.
"""

from __future__ import annotations

import base64
import json
import ssl
import uuid
from typing import Any

import aiohttp
import pytest

from synnefo_ganeti.testing import FakeGaneti, structure_diff
from tests.helpers import eventually

pytestmark = [pytest.mark.ganeti, pytest.mark.timeout(300)]


class Client:
    def __init__(self, url: str, user: str, password: str, ca_file: str | None) -> None:
        self.url = url
        self.auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.ssl: ssl.SSLContext | bool = False
        if ca_file:
            self.ssl = ssl.create_default_context(cafile=ca_file)
            self.ssl.check_hostname = False

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        data = b"" if body is None else json.dumps(body).encode()
        headers = {
            "Authorization": self.auth,
            "Content-Type": "application/json",
            "Content-Length": str(len(data)),
        }
        async with (
            aiohttp.ClientSession() as session,
            session.request(method, self.url + path, data=data, headers=headers, ssl=self.ssl) as answer,
        ):
            assert answer.status == 200, (method, path, await answer.read())
            return json.loads(await answer.read())

    async def job(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        job_id = await self.call(method, path, body)

        async def ended() -> dict[str, Any] | None:
            job: dict[str, Any] = await self.call("GET", f"/2/jobs/{job_id}")
            return job if job["status"] in ("success", "error", "canceled") else None

        found: dict[str, Any] = await eventually(
            ended, timeout=60, interval=0.1, what=f"job {job_id} ({method} {path}) to end"
        )
        return found


async def scenario(client: Client, node: str, inst: str) -> dict[str, Any]:
    """``inst``: the same name on both (the detailed info is keyed by it)."""
    net, group = f"sgnet{uuid.uuid4().hex[:6]}", f"sggrp{uuid.uuid4().hex[:6]}"
    out: dict[str, Any] = {}
    out["network_add"] = await client.job("POST", "/2/networks", {"network_name": net, "network": "10.77.0.0/28",
                                                                 "gateway": "10.77.0.1", "tags": ["sg:x"]})  # fmt: skip
    try:
        out["network"] = await client.call("GET", f"/2/networks/{net}")
        connect = {"group_name": "default", "network_mode": "bridged", "network_link": "gntbr0"}
        out["network_connect"] = await client.job("PUT", f"/2/networks/{net}/connect", connect)
        out["network_modify"] = await client.job("PUT", f"/2/networks/{net}/modify", {"add_reserved_ips": ["10.77.0.9"]})  # fmt: skip
        out["network_connected"] = await client.call("GET", f"/2/networks/{net}")
        out["network_tags"] = await client.call("GET", f"/2/networks/{net}/tags")
        out["network_disconnect"] = await client.job("PUT", f"/2/networks/{net}/disconnect", {"group_name": "default"})  # fmt: skip
    finally:
        out["network_remove"] = await client.job("DELETE", f"/2/networks/{net}")
    out["group_add"] = await client.job("POST", "/2/groups", {"group_name": group})
    out["group_rename"] = await client.job("PUT", f"/2/groups/{group}/rename", {"new_name": group + "b"})
    out["group"] = await client.call("GET", f"/2/groups/{group}b")
    out["group_remove"] = await client.job("DELETE", f"/2/groups/{group}b")
    out["default_group"] = await client.call("GET", "/2/groups/default")
    out["node_tags_add"] = await client.job("PUT", f"/2/nodes/{node}/tags?tag=sg:n")
    out["node_tags_del"] = await client.job("DELETE", f"/2/nodes/{node}/tags?tag=sg:n")
    out["node_role"] = await client.call("GET", f"/2/nodes/{node}/role")
    out["node_storage"] = await client.job(
        "GET", f"/2/nodes/{node}/storage?storage_type=file&output_fields=name,size,used,free"
    )
    create = {"__version__": 1, "name": inst, "mode": "create", "os": "noop", "disk_template": "diskless",
              "disks": [], "nics": [{}], "beparams": {"memory": 128}, "pnode": node, "name_check": False,
              "ip_check": False}  # fmt: skip
    out["instance_create"] = await client.job("POST", "/2/instances", create)
    try:
        out["instance_console"] = await client.call("GET", f"/2/instances/{inst}/console")
        out["instance_info"] = await client.job("GET", f"/2/instances/{inst}/info")
        out["instance_tags_add"] = await client.job("PUT", f"/2/instances/{inst}/tags?tag=sg:i")
        out["instance_tags"] = await client.call("GET", f"/2/instances/{inst}/tags")
        out["query_instance"] = await client.call("PUT", "/2/query/instance",
                                                  {"fields": ["name", "status", "tags"], "qfilter": ["=", "name", inst]})  # fmt: skip
    finally:
        out["instance_remove"] = await client.job("DELETE", f"/2/instances/{inst}")
    for resource in ("instance", "node", "group", "network", "job"):
        out[f"query_{resource}_fields"] = await client.call(
            "GET", f"/2/query/{resource}/fields?fields=name,nosuch"
        )
    out["query_node"] = await client.call("GET", "/2/query/node?fields=name,role,mfree,tags")
    return out


async def test_fake_serves_the_rest_like_real_ganeti(testbed) -> None:
    inst = f"sgi{uuid.uuid4().hex[:6]}.ganeti.test"
    real = await scenario(
        Client(testbed.url, testbed.username, testbed.password, testbed.ca_file), testbed.node, inst
    )
    async with FakeGaneti(nodes=1, version=testbed.series) as fake:
        ours = await scenario(
            Client(fake.url, fake.username, fake.password, fake.ca_file), "node1.fake.test", inst
        )
    for key in real:
        assert structure_diff(real[key], ours[key]) == [], key
