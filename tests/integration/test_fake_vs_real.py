"""The fake Ganeti's RAPI answers have the real Ganeti's shapes, compared live.

Same operations on the real testbed and on a FakeGaneti; the answers must have
the same keys and value types at every level.
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import aiohttp
import pytest

from synnefo_ganeti import InstanceSpec, JobStatus, RapiClient
from synnefo_ganeti.testing import FakeGaneti, structure_diff

pytestmark = [pytest.mark.ganeti, pytest.mark.timeout(300)]


async def get(url: str, user: str, password: str, path: str, ca_file: str | None) -> Any:
    auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    import ssl

    context: ssl.SSLContext | bool = False
    if ca_file:
        context = ssl.create_default_context(cafile=ca_file)
        context.check_hostname = False
    async with (
        aiohttp.ClientSession() as session,
        session.get(url + path, headers={"Authorization": auth, "Content-Length": "0"}, ssl=context) as r,
    ):
        assert r.status == 200, path
        return json.loads(await r.read())


async def run_scenario(url: str, user: str, password: str, ca_file: str | None, node: str) -> dict[str, Any]:
    """Create one instance (and fail a second create of it); return the answers to compare."""
    name = f"sg-cmp-{uuid.uuid4().hex[:6]}.ganeti.test"
    spec = InstanceSpec(
        name=name,
        disk_template="diskless",
        os="noop",
        beparams={"memory": 128},
        pnode=node,
        hypervisor="fake",
    )
    async with RapiClient(url, username=user, password=password, ca_file=ca_file) as rapi:
        ok = await rapi.wait_for_job(await rapi.create_instance(spec), timeout=120)
        assert ok.status is JobStatus.SUCCESS, ok.failure
        failed = await rapi.wait_for_job(await rapi.create_instance(spec), timeout=120)
        assert failed.status is JobStatus.ERROR
        try:
            answers = {
                "/2/info": await get(url, user, password, "/2/info", ca_file),
                "/2/nodes?bulk=1": (await get(url, user, password, "/2/nodes?bulk=1", ca_file))[:1],
                "/2/instances?bulk=1": [
                    i
                    for i in await get(url, user, password, "/2/instances?bulk=1", ca_file)
                    if i["name"] == name
                ],
                "/2/jobs/ID": await get(url, user, password, f"/2/jobs/{ok.id}", ca_file),
                "/2/jobs/ID (failed)": await get(url, user, password, f"/2/jobs/{failed.id}", ca_file),
            }
        finally:
            await rapi.wait_for_job(await rapi.delete_instance(name), timeout=120)
    return answers


async def test_fake_answers_like_real_ganeti(testbed) -> None:
    real = await run_scenario(testbed.url, testbed.username, testbed.password, testbed.ca_file, testbed.node)
    async with FakeGaneti(nodes=1, version=testbed.series) as fake:
        ours = await run_scenario(fake.url, fake.username, fake.password, fake.ca_file, "node1.fake.test")
    for key in real:
        assert structure_diff(real[key], ours[key]) == [], key
