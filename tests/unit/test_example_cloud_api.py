"""The example cloud API (examples/cloud_api.py) over HTTP, on both databases: two fake Ganetis,
one followed by the dispatcher's queue watcher (a local ``queue_dir``), the other through RAPI;
a real Dispatcher; the app on an aiohttp test server with a control plane of its own, as a cloud
API in another process has. Create, get, list pages, actions and their conflicts, errors as
statuses, delete, and the change events out of /events (long-poll and server-sent events)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from examples import cloud_api
from synnefo_ganeti import RapiClient
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.store import Store
from synnefo_ganeti.testing import FakeGaneti
from tests.helpers import eventually
from tests.unit.test_dispatcher import QUICK, backend, running, settings_for


@asynccontextmanager
async def cloud(
    tmp_path: Path, db_url: str, fakes: dict[str, FakeGaneti] | None = None
) -> AsyncIterator[TestClient[Any, Any]]:
    """The example app over ``watched`` (queue_dir, watched) and ``rapi`` (followed through RAPI);
    ``fakes``: filled with the two fake Ganetis by name."""
    async with AsyncExitStack() as stack:
        queue = tmp_path / "queue"
        watched = await stack.enter_async_context(FakeGaneti(tls=False, queue_dir=queue, op_times=QUICK))
        rapi = await stack.enter_async_context(FakeGaneti(tls=False, op_times=QUICK))
        if fakes is not None:
            fakes.update(watched=watched, rapi=rapi)
        settings = settings_for(
            db_url, [backend("watched", watched, queue_dir=str(queue)), backend("rapi", rapi)]
        )
        store = await stack.enter_async_context(Store(db_url))
        d = await stack.enter_async_context(running(Dispatcher(settings, store=store, status_server=False)))
        assert d._backends["watched"].watcher is not None and d._backends["rapi"].tracker is not None
        client = TestClient(TestServer(cloud_api.make_app(settings), host="127.0.0.1"))
        await stack.enter_async_context(client)
        yield client


async def call(client: TestClient[Any, Any], method: str, path: str, status: int, **kwargs: Any) -> Any:
    response = await client.request(method, path, **kwargs)
    body = await response.json()
    assert response.status == status, (method, path, response.status, body)
    return body


async def server_until(client: TestClient[Any, Any], server_id: str, status: str) -> dict[str, Any]:
    """The server once it has ``status`` and no task in progress."""

    async def reached() -> dict[str, Any] | None:
        server: dict[str, Any] = await call(client, "GET", f"/servers/{server_id}", 200)
        return server if server["status"] == status and server["task"] is None else None

    found: dict[str, Any] = await eventually(reached, timeout=30, what=f"server {server_id} {status}")
    return found


def body_of(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "memory": 256, "vcpus": 1, "os": "noop", **extra}


@asynccontextmanager
async def held(fakes: dict[str, FakeGaneti], op_id: str) -> AsyncIterator[None]:
    """Every job of ``op_id`` stays queued in these Ganetis (a PAUSE filter rule) until the
    block ends: what the example answers is seen before the job can end (a 0.02 s create
    once ended before the answer to its POST was made, on a loaded machine)."""
    paused = [["opcode", ["=", "OP_ID", op_id]]]
    async with AsyncExitStack() as stack:
        for fake in fakes.values():
            client = await stack.enter_async_context(
                RapiClient(fake.url, username=fake.username, password=fake.password)
            )
            rule = await client.add_filter(predicates=paused, action="PAUSE")
            stack.push_async_callback(client.delete_filter, rule)
        yield


async def test_the_example_cloud_api_end_to_end(tmp_path: Path, db_url: str) -> None:
    fakes: dict[str, FakeGaneti] = {}
    async with cloud(tmp_path, db_url, fakes) as client:
        start = (await call(client, "GET", "/events?timeout=0", 200))["last"]

        # creates: durable requests, idempotent by key; a changed request under a key is a 409
        made = {}
        async with held(fakes, "OP_INSTANCE_CREATE"):
            for name, where in (("web1.example", "watched"), ("web2.example", "rapi"), ("db1.example", None)):
                body = body_of(name) | ({"backend": where} if where else {})
                created = await call(
                    client, "POST", "/servers", 202, json=body, headers={"Idempotency-Key": name}
                )
                assert created["server"]["status"] == "BUILD" and created["server"]["task"] == "build"
                # the server's own id at once, the one it keeps for good
                assert created["id"] == created["server"]["id"] != created["request_id"]
                assert created["server"]["request_id"] == created["request_id"]
                again = await call(
                    client, "POST", "/servers", 202, json=body, headers={"Idempotency-Key": name}
                )
                assert (again["request_id"], again["id"]) == (created["request_id"], created["id"])
                made[name] = (created["request_id"], created["id"])
            changed = await call(
                client, "POST", "/servers", 409, json=body_of("web1.example", memory=512),
                headers={"Idempotency-Key": "web1.example"},
            )  # fmt: skip
            assert changed["error"] == "ConflictError" and "beparams" in changed["message"]

        # each becomes ACTIVE, found by its request id and then by its own id, with Ganeti's NICs
        servers = {}
        for name, (request_id, server_id) in made.items():
            server = await server_until(client, server_id, "ACTIVE")
            assert (server["id"], server["request_id"], server["name"]) == (server_id, request_id, name)
            assert (await call(client, "GET", f"/servers/{request_id}", 200))["id"] == server_id
            servers[name] = await call(client, "GET", f"/servers/{server['id']}", 200)
            assert servers[name]["state"] == "STARTED" and servers[name]["last_error"] is None
        assert (
            servers["web1.example"]["backend"] == "watched" and servers["web2.example"]["backend"] == "rapi"
        )
        for server in servers.values():

            async def ganeti_mac(server_id: str = server["id"]) -> str | None:
                nics = (await call(client, "GET", f"/servers/{server_id}", 200))["nics"]
                return nics[0].get("mac") if nics else None

            await eventually(ganeti_mac, timeout=30, what=f"the MAC Ganeti gave {server['name']}")

        # a name clash, a bad name, bad bodies, unknown ids
        clash = await call(client, "POST", "/servers", 409, json=body_of("web2.example", backend="watched"))
        assert clash["error"] == "ConflictError"
        missing = await call(client, "POST", "/servers", 400, json={"name": "x.example"})
        assert missing["error"] == "InvalidError" and "memory" in missing["message"]
        assert (await call(client, "POST", "/servers", 400, data=b"{not json"))["error"] == "InvalidError"
        unknown = str(uuid.uuid4())
        for method, path in (("GET", f"/servers/{unknown}"), ("DELETE", f"/servers/{unknown}")):
            assert (await call(client, method, path, 404))["error"] == "NotFoundError"
        await call(client, "POST", f"/servers/{unknown}/action", 404, json={"action": "start"})
        assert (await call(client, "GET", "/servers?limit=0", 400))["error"] == "InvalidError"

        # pages by id, and the filters
        first = await call(client, "GET", "/servers?limit=2", 200)
        assert len(first["servers"]) == 2 and first["next"] == first["servers"][-1]["id"]
        rest = await call(client, "GET", f"/servers?limit=2&after={first['next']}", 200)
        assert len(rest["servers"]) == 1 and rest["next"] is None
        listed = {server["name"] for server in first["servers"] + rest["servers"]}
        assert listed == set(made)
        only_rapi = await call(client, "GET", "/servers?backend=rapi", 200)
        assert "web2.example" in {s["name"] for s in only_rapi["servers"]}
        assert {s["backend"] for s in only_rapi["servers"]} == {"rapi"}
        web = await call(client, "GET", "/servers?name=web&status=ACTIVE", 200)
        assert sorted(s["name"] for s in web["servers"]) == ["web1.example", "web2.example"]

        # actions on the RAPI-followed server: a second one while the first runs is a 409
        web2 = servers["web2.example"]["id"]
        async with held({"rapi": fakes["rapi"]}, "OP_INSTANCE_SHUTDOWN"):
            stop = await call(client, "POST", f"/servers/{web2}/action", 202, json={"action": "stop"})
            assert isinstance(stop["job_id"], int) and stop["server"]["task"] == "stop"
            busy = await call(client, "POST", f"/servers/{web2}/action", 409, json={"action": "start"})
            assert busy["error"] == "ConflictError" and "stop" in busy["message"]
        await server_until(client, web2, "STOPPED")
        await call(client, "POST", f"/servers/{web2}/action", 202, json={"action": "start"})
        await server_until(client, web2, "ACTIVE")
        await call(client, "POST", f"/servers/{web2}/action", 202, json={"action": "reboot", "type": "hard"})
        await server_until(client, web2, "ACTIVE")
        await call(client, "POST", f"/servers/{web2}/action", 400, json={"action": "resize"})

        # delete, on both backends; a deleted server is DELETED, and no longer listed
        for name in ("web1.example", "web2.example"):
            deleted = await call(client, "DELETE", f"/servers/{servers[name]['id']}", 202)
            assert isinstance(deleted["job_id"], int)
            await server_until(client, servers[name]["id"], "DELETED")
        left = await call(client, "GET", "/servers", 200)
        assert [s["name"] for s in left["servers"]] == ["db1.example"]

        # the changes since the start: a long-poll, then the same as server-sent events
        polled = await call(client, "GET", f"/events?since={start}&limit=1000", 200)
        changes = polled["changes"]
        assert polled["last"] == changes[-1]["id"] and [c["id"] for c in changes] == sorted(
            c["id"] for c in changes
        )
        assert {"request", "instance"} <= {c["kind"] for c in changes}
        db1_request = made["db1.example"][0]
        assert {"kind": "request", "key": db1_request, "status": "succeeded"}.items() <= next(
            c for c in changes if c["key"] == db1_request and c["status"] == "succeeded"
        ).items()
        web2_ends = [c["status"] for c in changes if c["key"] == web2 and c["task"] is None]
        assert web2_ends[-1] == "DESTROYED" and "STOPPED" in web2_ends
        streamed = await stream(
            client, start, until=lambda c: c["key"] == web2 and c["status"] == "DESTROYED"
        )
        assert [c["id"] for c in streamed] == [c["id"] for c in changes[: len(streamed)]]

        # a long-poll with nothing new answers after its timeout, empty, the same `last`
        idle = await call(client, "GET", f"/events?since={polled['last'] + 10**6}&timeout=0", 200)
        assert idle == {"changes": [], "last": polled["last"] + 10**6}


async def test_a_spec_the_library_refuses_is_a_400_naming_the_field(tmp_path: Path, sqlite_url: str) -> None:
    async with cloud(tmp_path, sqlite_url) as client:
        bad = await call(client, "POST", "/servers", 400, json=body_of("bad name!"))
        assert bad["error"] == "ValidationError" and bad["field"] == "name" and "name" in bad["message"]
        negative = await call(client, "POST", "/servers", 400, json=body_of("vm1.example", memory=-1))
        assert negative["error"] == "ValidationError" and negative["field"] == "beparams.memory"
        assert (await call(client, "GET", "/servers?status=ACTIVE,BUILD,ERROR", 200))["servers"] == []


async def stream(client: TestClient[Any, Any], since: int, *, until: Any) -> list[dict[str, Any]]:
    """The server-sent events after ``since`` up to the first change ``until`` accepts."""
    got: list[dict[str, Any]] = []
    response = await client.get(f"/events?since={since}", headers={"Accept": "text/event-stream"})
    assert response.status == 200 and response.headers["Content-Type"].startswith("text/event-stream")
    try:
        event: dict[str, str] = {}
        async for raw in response.content:
            line = raw.decode().rstrip("\n")
            if line.startswith(":"):
                continue
            if line:
                key, _, value = line.partition(": ")
                event[key] = value
                continue
            if "data" not in event:
                continue  # a blank line after comments (keep-alives): no event
            change = json.loads(event["data"])
            assert int(event["id"]) == change["id"] and event["event"] == change["kind"]
            got.append(change)
            event = {}
            if until(change):
                return got
    finally:
        response.close()
    raise AssertionError(f"the event stream ended after {len(got)} changes")


async def test_the_example_console_resize_and_attach_detach(tmp_path: Path, db_url: str) -> None:
    """The operations endpoints on the RAPI-followed backend: console, resize, grow, NICs, volumes."""
    async with cloud(tmp_path, db_url) as client:
        body = body_of("vol1.example", backend="rapi", disk=1, disk_template="file")
        created = await call(client, "POST", "/servers", 202, json=body)
        server = await server_until(client, created["request_id"], "ACTIVE")
        sid = server["id"]
        console = (await call(client, "GET", f"/servers/{sid}/console", 200))["console"]
        assert console["instance"] == "vol1.example" and console["kind"]

        resized = await call(
            client, "POST", f"/servers/{sid}/action", 202, json={"action": "resize", "memory": 512}
        )
        assert isinstance(resized["job_id"], int) and resized["server"]["task"] in ("resize", None)
        assert (await server_until(client, sid, "ACTIVE"))["memory"] == 512
        bad = await call(
            client, "POST", f"/servers/{sid}/action", 400, json={"action": "resize", "memory": -1}
        )
        assert bad["error"] == "ValidationError" and bad["field"] == "memory"
        await call(client, "POST", f"/servers/{sid}/action", 202, json={"action": "grow_disk", "amount": 1})
        assert (await server_until(client, sid, "ACTIVE"))["disks"][0]["size"] == 2048

        await call(client, "POST", f"/servers/{sid}/nics", 202, json={})
        with_nic = await server_until(client, sid, "ACTIVE")
        assert len(with_nic["nics"]) == 2
        await call(client, "DELETE", f"/servers/{sid}/nics/1", 202)
        assert len((await server_until(client, sid, "ACTIVE"))["nics"]) == 1
        assert (await call(client, "DELETE", f"/servers/{sid}/nics/x", 400))["error"] == "InvalidError"

        await call(client, "POST", f"/servers/{sid}/volumes", 202, json={"size": 1})
        with_volume = await server_until(client, sid, "ACTIVE")
        assert [disk["size"] for disk in with_volume["disks"]] == [2048, 1024]
        # Ganeti removes a volume of a running server only with hotplug: the job fails, last_error says it
        await call(client, "DELETE", f"/servers/{sid}/volumes/1", 202)
        refused = await server_until(client, sid, "ACTIVE")
        assert refused["last_error"]["action"] == "detach_disk" and len(refused["disks"]) == 2
        await call(client, "POST", f"/servers/{sid}/action", 202, json={"action": "stop"})
        await server_until(client, sid, "STOPPED")
        not_running = await call(client, "GET", f"/servers/{sid}/console", 409)
        assert not_running["error"] == "ConflictError"
        await call(client, "DELETE", f"/servers/{sid}/volumes/1", 202)
        detached = await server_until(client, sid, "STOPPED")
        assert [disk["size"] for disk in detached["disks"]] == [2048] and detached["last_error"] is None

        offers = await call(client, "GET", "/backends/rapi", 200)
        assert offers["backend"] == "rapi" and "file" in offers["disk_templates"] and offers["nodes"]
        assert (await call(client, "GET", "/backends/nope", 400))["error"] == "ConfigError"


async def test_the_example_networks_and_pool_addresses(tmp_path: Path, db_url: str) -> None:
    """A network on both backends, a server on it gets an address from the pool, the network cannot
    go while the server uses it, and goes once the server is deleted."""
    async with cloud(tmp_path, db_url) as client:
        bad = await call(client, "POST", "/networks", 400, json={"name": "blue", "subnet": "10.7.0.0/99"})
        assert bad["error"] == "ValidationError" and bad["field"] == "subnet"
        made = await call(
            client,
            "POST",
            "/networks",
            201,
            json={"name": "blue", "subnet": "10.7.0.0/29", "gateway": "10.7.0.1"},
        )
        network = made["network"]
        assert network["status"] == "active" and set(network["backends"]) == {"watched", "rapi"}
        assert (await call(client, "POST", "/networks", 409, json={"name": "blue", "subnet": "10.8.0.0/29"}))[
            "error"
        ] == "ConflictError"
        listed = await call(client, "GET", "/networks", 200)
        assert [item["name"] for item in listed["networks"]] == ["blue"]

        body = body_of("net1.example", backend="rapi", networks=["blue"])
        created = await call(client, "POST", "/servers", 202, json=body)

        async def addressed() -> dict[str, Any] | None:
            server: dict[str, Any] = await call(client, "GET", f"/servers/{created['request_id']}", 200)
            nics = server.get("nics") or []
            # the dispatcher stores what Ganeti gave (the address) once the create ended
            ready = server["status"] == "ACTIVE" and nics and nics[0].get("ip") not in (None, "pool")
            return server if ready else None

        server = await eventually(addressed, timeout=30, what="net1.example ACTIVE with its pool address")
        nic = server["nics"][0]
        assert nic["network"] == "blue" and nic["ip"] in {f"10.7.0.{i}" for i in range(2, 7)}

        in_use = await call(client, "DELETE", "/networks/blue", 409)
        assert in_use["error"] == "ConflictError" and "net1.example" in in_use["message"]
        await call(client, "DELETE", f"/servers/{server['id']}", 202)
        await server_until(client, server["id"], "DELETED")
        response = await client.request("DELETE", "/networks/blue")
        assert response.status == 204
        assert (await call(client, "GET", "/networks", 200))["networks"] == []
        assert (await call(client, "DELETE", "/networks/blue", 404))["error"] == "NotFoundError"
