"""A cloud API on synnefo-ganeti: a small aiohttp app to copy and grow (docs/cloud-api.md).

Run it beside the dispatcher, both with the same configuration (so the same database)::

    synnefo-ganeti dispatcher --config /etc/synnefo-ganeti/config.toml &
    python examples/cloud_api.py --config /etc/synnefo-ganeti/config.toml --port 8080

The app only writes requests and actions and reads what the database holds; the
dispatcher places each request on a backend, submits it and follows every job to its end.

Routes (JSON in and out)::

    POST   /servers              {"name", "memory", "vcpus", "disk", "os", ["disk_template", "backend",
                                 "request_id", "networks"]}; header Idempotency-Key -> 202 {"id",
                                 "request_id", "server"}: "id" is the server's, at once and for good;
                                 "networks": a NIC on each, its address from the pool
    GET    /servers/{id}         a server by its id (its request's id finds it too)
    GET    /servers              ?limit=&after=&backend=&status=&name= -> {"servers", "next"}
    POST   /servers/{id}/action  {"action": "start" | "stop" | "reboot", ["type": "soft"]} -> 202 {"job_id"}
                                 {"action": "resize", ["memory"], ["vcpus"]}: memory MiB, from the next start
                                 {"action": "grow_disk", "disk": index, "amount": GiB}
    GET    /servers/{id}/console -> {"console": {"kind", "host", "port", ...}} (409 unless running)
    POST   /servers/{id}/nics    {["network"], ["ip"]}: attach a NIC ("ip": "pool" for one of the
                                 network's addresses) -> 202 {"job_id"}
    DELETE /servers/{id}/nics/{index}     -> 202 {"job_id"}
    POST   /servers/{id}/volumes {"size": GiB}: attach a disk -> 202 {"job_id"}
    DELETE /servers/{id}/volumes/{index}  -> 202 {"job_id"} (stop the server first)
    DELETE /servers/{id}         -> 202 {"job_id"}: at any stage, at once (never 409); a server
                                 still building is canceled, or removed as soon as its build ends
    GET    /backends/{name}      what the backend offers (OSes, disk templates, networks, policy, ...)
    POST   /networks             {"name", "subnet", ["gateway"], ["mac_prefix"], ["backends"]}: made on
                                 every backend (or those), answered once it is -> 201 {"network"}
    GET    /networks             -> {"networks": [{"name", "subnet", "gateway", "status", "backends"}]}
    DELETE /networks/{name}      -> 204 (409 while a server has a NIC on it)
    GET    /events               ?since=N: server-sent events (Accept: text/event-stream), else a long-poll

Errors are the library's types mapped to statuses (:data:`ERRORS`), with a body
``{"error": type, "message": ...}`` (and ``"field"`` when the library names one).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pydantic
from aiohttp import web

if not __package__:  # run as a script (python examples/cloud_api.py): its folder's package too
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.cloud_api_events import events
from examples.cloud_api_http import (
    CONTROL_PLANE,
    ERRORS,
    MAX_PAGE,
    STOPPING,
    errors,
    field,
    json_body,
    query_int,
)
from synnefo_ganeti import (
    ConflictError,
    ControlPlane,
    InstanceSpec,
    InstanceStatus,
    InvalidError,
    NotFoundError,
    Request,
    Settings,
    StoredInstance,
    StoredNetwork,
    ValidationError,
)

__all__ = ["ERRORS", "main", "make_app"]

log = logging.getLogger("cloud_api")


#: what a server's status reads as in the API (OpenStack's words) for each instance status
SERVER_STATUS = {
    InstanceStatus.BUILD: "BUILD",
    InstanceStatus.STARTED: "ACTIVE",
    InstanceStatus.STOPPED: "STOPPED",
    InstanceStatus.ERROR: "ERROR",
    InstanceStatus.DESTROYED: "DELETED",
}
PAGE = 50  # a listing's page unless ?limit= (at most MAX_PAGE)
#: Idempotency-Key -> request id: the same key always names the same request (scope it per tenant)
KEY_NAMESPACE = uuid.UUID("5d3a0bd4-8b0e-4f4b-9a51-5b0a7d1f2c11")


# -- from the library's objects to the API's JSON ---------------------------------------------------


def server_json(instance: StoredInstance, *, request: Request | None = None) -> dict[str, Any]:
    """A server: its instance, and while its request waits to be placed, why (``waiting``)."""
    stored = instance.to_json()
    fields = (
        "id",
        "name",
        "backend",
        "task",
        "last_error",
        "memory",
        "vcpus",
        "os",
        "pnode",
        "nics",
        "disks",
        "request_id",
        "delete_requested_at",
    )
    waiting = None if request is None or request.is_final else request.waiting_reason
    return {
        **{key: stored[key] for key in fields},
        "status": SERVER_STATUS[instance.status],
        "state": stored["status"],
        "attempts": None if request is None else request.attempts,
        "waiting": waiting,
        "created_at": stored["created_at"],
        "updated_at": stored["updated_at"],
    }


# -- reading the request ----------------------------------------------------------------------------


def spec_from(body: dict[str, Any]) -> InstanceSpec:
    """The InstanceSpec of a create body; the library checks the values (ValidationError)."""
    name = field(body, "name", str, required=True)
    memory = field(body, "memory", int, required=True)
    vcpus = field(body, "vcpus", int, 1)
    disk = field(body, "disk", int)  # GiB; none: no disk
    template = field(body, "disk_template", str, "plain" if disk else "diskless")
    networks = body.get("networks", [])  # a NIC on each, its address from the network's pool
    if not isinstance(networks, list) or not all(isinstance(name, str) for name in networks):
        raise InvalidError(f"networks: give a list of network names (got {networks!r})")
    try:
        return InstanceSpec(
            name=name,
            os=field(body, "os", str, required=True),
            disk_template=template,
            disks=[] if disk is None else [{"size": disk * 1024}],
            nics=[{"network": network, "ip": "pool"} for network in networks] or [{}],
            beparams={"memory": memory, "vcpus": vcpus},
        )
    except pydantic.ValidationError as exc:
        errors = exc.errors()
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors)
        first = ".".join(map(str, errors[0]["loc"])) if errors and errors[0]["loc"] else None
        if first is None:
            raise InvalidError(f"the server is not valid: {problems}") from None
        raise ValidationError(f"the server is not valid: {problems}", field=first) from None


# -- the handlers -----------------------------------------------------------------------------------


async def find(cp: ControlPlane, server_id: str) -> StoredInstance:
    """The server ``server_id`` names: its id (given at once by ``request_instance``, through the
    request's ``instance_id``), or its request's id (older clients)."""
    instance = await cp.get_instance(server_id)
    if instance is not None:
        return instance
    try:
        request = await cp.get_request(server_id)
    except NotFoundError:
        raise NotFoundError(f"no server has id {server_id}: check the id (GET /servers lists them)") from None
    found = None if request.instance_id is None else await cp.get_instance(request.instance_id)
    if found is None:
        raise NotFoundError(f"request {server_id} has no server (written before its id was given at once)")
    return found


async def view(cp: ControlPlane, server_id: str) -> dict[str, Any]:
    instance = await find(cp, server_id)
    request = None if instance.request_id is None else await cp.get_request(instance.request_id)
    return server_json(instance, request=request)


async def create_server(request: web.Request) -> web.Response:
    cp = request.app[CONTROL_PLANE]
    body = await json_body(request)
    spec = spec_from(body)
    key = request.headers.get("Idempotency-Key") or field(body, "request_id", str)
    request_id = await cp.request_instance(
        spec,
        backend=field(body, "backend", str),
        request_id=None if key is None else str(uuid.uuid5(KEY_NAMESPACE, key)),
    )
    server_id = (await cp.get_request(request_id)).instance_id  # the server's id, at once
    assert server_id is not None
    server = await view(cp, server_id)
    headers = {"Location": f"/servers/{server_id}"}
    body = {"id": server_id, "request_id": request_id, "server": server}
    return web.json_response(body, status=202, headers=headers)


async def get_server(request: web.Request) -> web.Response:
    return web.json_response(await view(request.app[CONTROL_PLANE], request.match_info["id"]))


async def list_servers(request: web.Request) -> web.Response:
    """One page, ordered by id; ``next`` is the ``after`` of the next page (None: the last)."""
    limit = query_int(request, "limit", PAGE, low=1, high=MAX_PAGE)
    wanted = request.query.get("status")
    statuses: list[InstanceStatus] = [
        status for status in InstanceStatus if status is not InstanceStatus.DESTROYED
    ]
    if wanted:
        by_name = {api: state for state, api in SERVER_STATUS.items()} | {s.value: s for s in InstanceStatus}
        unknown = [word for word in wanted.split(",") if word.upper() not in by_name]
        if unknown:
            raise InvalidError(f"status: {', '.join(unknown)} unknown; give some of {', '.join(by_name)}")
        statuses = [by_name[word.upper()] for word in wanted.split(",")]
    page = await request.app[CONTROL_PLANE].list_instances(
        backend=request.query.get("backend"),
        status=statuses,
        name_prefix=request.query.get("name"),
        limit=limit,
        after=request.query.get("after"),
    )
    servers = [server_json(instance) for instance in page]
    return web.json_response({"servers": servers, "next": page[-1].id if len(page) == limit else None})


async def placed(cp: ControlPlane, server_id: str) -> StoredInstance:
    """The instance of a server placed on a backend; one still waiting to be placed is a 409."""
    instance = await find(cp, server_id)
    if instance.backend is None:
        raise ConflictError(
            f"server {instance.id} is {instance.status} and not placed on a backend yet (its request "
            f"{instance.request_id}): wait until it is built, or delete it"
        )
    return instance


def path_index(request: web.Request) -> int:
    text = request.match_info["index"]
    if not text.isdigit():
        raise InvalidError(f"index: give the NIC's or volume's position, an integer from 0 (got {text!r})")
    return int(text)


async def accepted(cp: ControlPlane, instance: StoredInstance, job_id: int | None) -> web.Response:
    return web.json_response({"job_id": job_id, "server": await view(cp, instance.id)}, status=202)


async def server_action(request: web.Request) -> web.Response:
    cp = request.app[CONTROL_PLANE]
    body = await json_body(request)
    action = field(body, "action", str, required=True)
    instance = await placed(cp, request.match_info["id"])
    if action == "start":
        job_id = await cp.startup_instance(instance.id)
    elif action == "stop":
        job_id = await cp.shutdown_instance(instance.id)
    elif action == "reboot":
        kind = field(body, "type", str, "soft")
        if kind not in ("soft", "hard", "full"):
            raise InvalidError(f"type: give soft, hard or full (got {kind!r})")
        job_id = await cp.reboot_instance(instance.id, reboot_type=kind)
    elif action == "resize":
        job_id = await cp.resize_instance(
            instance.id, memory=field(body, "memory", int), vcpus=field(body, "vcpus", int)
        )
    elif action == "grow_disk":
        amount = field(body, "amount", int, required=True)  # GiB
        job_id = await cp.grow_disk(instance.id, disk=field(body, "disk", int, 0), amount=amount * 1024)
    else:
        raise InvalidError(f"action: give start, stop, reboot, resize or grow_disk (got {action!r})")
    return await accepted(cp, instance, job_id)


async def server_console(request: web.Request) -> web.Response:
    """How to reach the server's console (Ganeti's answer); a server not running is a 409."""
    cp = request.app[CONTROL_PLANE]
    instance = await placed(cp, request.match_info["id"])
    console = await cp.console_instance(instance.id)
    return web.json_response({"console": console.model_dump(mode="json", exclude_none=True)})


async def attach_nic(request: web.Request) -> web.Response:
    cp = request.app[CONTROL_PLANE]
    body = await json_body(request)
    instance = await placed(cp, request.match_info["id"])
    job_id = await cp.attach_nic(instance.id, network=field(body, "network", str), ip=field(body, "ip", str))
    return await accepted(cp, instance, job_id)


async def detach_nic(request: web.Request) -> web.Response:
    cp = request.app[CONTROL_PLANE]
    instance = await placed(cp, request.match_info["id"])
    return await accepted(cp, instance, await cp.detach_nic(instance.id, index=path_index(request)))


async def attach_volume(request: web.Request) -> web.Response:
    cp = request.app[CONTROL_PLANE]
    body = await json_body(request)
    instance = await placed(cp, request.match_info["id"])
    size = field(body, "size", int, required=True)  # GiB
    return await accepted(cp, instance, await cp.attach_disk(instance.id, size=size * 1024))


async def detach_volume(request: web.Request) -> web.Response:
    cp = request.app[CONTROL_PLANE]
    instance = await placed(cp, request.match_info["id"])
    return await accepted(cp, instance, await cp.detach_disk(instance.id, index=path_index(request)))


async def get_backend(request: web.Request) -> web.Response:
    """What a backend offers: a real API builds its flavors and images from this."""
    catalog = await request.app[CONTROL_PLANE].catalog(request.match_info["name"])
    return web.json_response(catalog.to_json())


async def delete_server(request: web.Request) -> web.Response:
    """Delete a server at any stage, at once: the outcome (DELETED) comes by GET or /events."""
    cp = request.app[CONTROL_PLANE]
    instance = await find(cp, request.match_info["id"])
    job_id = await cp.delete_instance(instance.id)  # None: canceled, nothing left, or it follows a build
    return web.json_response({"job_id": job_id, "server": await view(cp, instance.id)}, status=202)


# -- the change feed --------------------------------------------------------------------------------


def network_json(network: StoredNetwork) -> dict[str, Any]:
    return {
        "name": network.name,
        "subnet": network.subnet,
        "gateway": network.gateway,
        "status": network.status.value,
        "backends": {
            name: {"state": on.state.value, "groups": on.groups, "error": on.error}
            for name, on in network.backends.items()
        },
    }


async def create_network(request: web.Request) -> web.Response:
    """The network on every backend (or ``backends``), answered once Ganeti made it everywhere."""
    cp = request.app[CONTROL_PLANE]
    body = await json_body(request)
    backends = body.get("backends")
    if backends is not None and (
        not isinstance(backends, list) or not all(isinstance(name, str) for name in backends)
    ):
        raise InvalidError(f"backends: give a list of backend names (got {backends!r})")
    network = await cp.create_network(
        field(body, "name", str, required=True),
        subnet=field(body, "subnet", str, required=True),
        gateway=field(body, "gateway", str),
        mac_prefix=field(body, "mac_prefix", str),
        backends=backends,
    )
    return web.json_response({"network": network_json(network)}, status=201)


async def list_networks(request: web.Request) -> web.Response:
    networks = await request.app[CONTROL_PLANE].list_networks()
    return web.json_response({"networks": [network_json(network) for network in networks]})


async def delete_network(request: web.Request) -> web.Response:
    await request.app[CONTROL_PLANE].delete_network(request.match_info["name"])  # 409 while in use
    return web.Response(status=204)


# -- the app ----------------------------------------------------------------------------------------


def make_app(settings: Settings) -> web.Application:
    """The app, with a ControlPlane over ``settings`` opened on startup and closed on cleanup."""
    app = web.Application(middlewares=[errors])
    app[STOPPING] = asyncio.Event()

    async def control_plane(app: web.Application) -> AsyncIterator[None]:
        async with ControlPlane(settings) as cp:
            app[CONTROL_PLANE] = cp
            yield

    async def on_shutdown(app: web.Application) -> None:
        app[STOPPING].set()  # event streams end, so that shutdown does not wait for them

    app.cleanup_ctx.append(control_plane)
    app.on_shutdown.append(on_shutdown)
    app.router.add_post("/servers", create_server)
    app.router.add_get("/servers", list_servers)
    app.router.add_get("/servers/{id}", get_server)
    app.router.add_post("/servers/{id}/action", server_action)
    app.router.add_delete("/servers/{id}", delete_server)
    app.router.add_get("/servers/{id}/console", server_console)
    app.router.add_post("/servers/{id}/nics", attach_nic)
    app.router.add_delete("/servers/{id}/nics/{index}", detach_nic)
    app.router.add_post("/servers/{id}/volumes", attach_volume)
    app.router.add_delete("/servers/{id}/volumes/{index}", detach_volume)
    app.router.add_get("/backends/{name}", get_backend)
    app.router.add_post("/networks", create_network)
    app.router.add_get("/networks", list_networks)
    app.router.add_delete("/networks/{name}", delete_network)
    app.router.add_get("/events", events)
    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="An example cloud API on synnefo-ganeti")
    parser.add_argument("--config", required=True, help="the synnefo-ganeti TOML configuration")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    web.run_app(make_app(Settings.from_file(args.config)), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
