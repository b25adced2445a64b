"""A cloud API on synnefo-ganeti: a small aiohttp app to copy and grow (docs/cloud-api.md).

Run it beside the dispatcher, both with the same configuration (so the same database)::

    synnefo-ganeti dispatcher --config /etc/synnefo-ganeti/config.toml &
    python examples/cloud_api.py --config /etc/synnefo-ganeti/config.toml --port 8080

The app only writes requests and actions and reads what the database holds; the
dispatcher places each request on a backend, submits it and follows every job to its end.

Routes (JSON in and out)::

    POST   /servers              {"name", "memory", "vcpus", "disk", "os", ["disk_template", "backend",
                                 "request_id"]}; header Idempotency-Key -> 202 {"request_id", "server"}
    GET    /servers/{id}         a server by its id, or by the request id while it is not placed
    GET    /servers              ?limit=&after=&backend=&status=&name= -> {"servers", "next"}
    POST   /servers/{id}/action  {"action": "start" | "stop" | "reboot", ["type": "soft"]} -> 202 {"job_id"}
    DELETE /servers/{id}         -> 202 {"job_id"}
    GET    /events               ?since=N: server-sent events (Accept: text/event-stream), else a long-poll

Errors are the library's types mapped to statuses (:data:`ERRORS`), with a body
``{"error": type, "message": ...}`` (and ``"field"`` when the library names one).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pydantic
from aiohttp import web

from synnefo_ganeti import (
    Change,
    ConflictError,
    ControlPlane,
    GanetiError,
    InstanceSpec,
    InstanceStatus,
    InvalidError,
    NotFoundError,
    Request,
    RequestStatus,
    Settings,
    StoredInstance,
    StoreError,
    TransportError,
    UnavailableError,
)

__all__ = ["ERRORS", "main", "make_app"]

log = logging.getLogger("cloud_api")

CONTROL_PLANE = web.AppKey("control_plane", ControlPlane)
STOPPING = web.AppKey("stopping", asyncio.Event)

#: the library's error types as HTTP statuses: the first match wins; any other GanetiError is a 502
ERRORS: tuple[tuple[type[GanetiError], int], ...] = (
    (InvalidError, 400),  # ValidationError (a spec no backend takes), ConfigError (an unknown backend), ...
    (NotFoundError, 404),  # no such server or request
    (ConflictError, 409),  # a name taken, an idempotency key reused, an action in progress
    (StoreError, 503),  # the database cannot answer now: try again
    (UnavailableError, 503),  # Ganeti's queue is full or drained
    (TransportError, 503),  # Ganeti did not answer
)

#: what a server's status reads as in the API (OpenStack's words) for each instance status
SERVER_STATUS = {
    InstanceStatus.BUILD: "BUILD",
    InstanceStatus.STARTED: "ACTIVE",
    InstanceStatus.STOPPED: "STOPPED",
    InstanceStatus.ERROR: "ERROR",
    InstanceStatus.DESTROYED: "DELETED",
}
#: ... and for a request not placed yet (or never placed)
REQUEST_STATUS = {
    RequestStatus.PENDING: "BUILD",
    RequestStatus.SUBMITTED: "BUILD",
    RequestStatus.SUCCEEDED: "BUILD",
    RequestStatus.FAILED: "ERROR",
    RequestStatus.CANCELED: "DELETED",
}
PAGE, MAX_PAGE = 50, 1000
KEEPALIVE = 15.0  # seconds between comments on an idle event stream
LONG_POLL, MAX_LONG_POLL = 25.0, 60.0
#: Idempotency-Key -> request id: the same key always names the same request (scope it per tenant)
KEY_NAMESPACE = uuid.UUID("5d3a0bd4-8b0e-4f4b-9a51-5b0a7d1f2c11")


# -- from the library's objects to the API's JSON ---------------------------------------------------


def server_json(instance: StoredInstance, *, request_id: str | None = None) -> dict[str, Any]:
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
    )
    return {
        **{key: stored[key] for key in fields},
        "status": SERVER_STATUS[instance.status],
        "state": stored["status"],
        "request_id": request_id,
        "created_at": stored["created_at"],
        "updated_at": stored["updated_at"],
    }


def request_json(request: Request) -> dict[str, Any]:
    stored = request.to_json()
    return {
        "id": request.id,
        "name": request.instance,
        "backend": request.backend,
        "status": REQUEST_STATUS[request.status],
        "state": stored["status"],
        "task": None if request.is_final else "build",
        "error": request.error,
        "request_id": request.id,
        "created_at": stored["created_at"],
        "updated_at": stored["updated_at"],
    }


def error_response(exc: GanetiError) -> web.Response:
    status = next((code for kind, code in ERRORS if isinstance(exc, kind)), 502)
    body: dict[str, Any] = {"error": type(exc).__name__, "message": str(exc)}
    field = getattr(exc, "field", None)  # a ValidationError names the spec field
    if field is not None:
        body["field"] = field
    return web.json_response(body, status=status)


@web.middleware
async def errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except GanetiError as exc:
        if not isinstance(exc, InvalidError | NotFoundError | ConflictError):
            log.warning("%s %s: %r", request.method, request.path, exc)
        return error_response(exc)


# -- reading the request ----------------------------------------------------------------------------


async def json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        raise InvalidError("the body is not JSON: send a JSON object") from None
    if not isinstance(body, dict):
        raise InvalidError("the body must be a JSON object")
    return body


def field(
    body: dict[str, Any], name: str, kind: type[Any], default: Any = None, *, required: bool = False
) -> Any:
    value = body.get(name, default)
    if value is None and not required:
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise InvalidError(f"{name}: give {'an integer' if kind is int else 'a string'} (got {value!r})")
    return value


def query_int(request: web.Request, name: str, default: int, *, low: int, high: int) -> int:
    text = request.query.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise InvalidError(f"{name}: give an integer from {low} to {high} (got {text!r})") from None
    if not low <= value <= high:
        raise InvalidError(f"{name}: give an integer from {low} to {high} (got {value})")
    return value


def spec_from(body: dict[str, Any]) -> InstanceSpec:
    """The InstanceSpec of a create body; the library checks the values (ValidationError)."""
    name = field(body, "name", str, required=True)
    memory = field(body, "memory", int, required=True)
    vcpus = field(body, "vcpus", int, 1)
    disk = field(body, "disk", int)  # GiB; none: no disk
    template = field(body, "disk_template", str, "plain" if disk else "diskless")
    try:
        return InstanceSpec(
            name=name,
            os=field(body, "os", str, required=True),
            disk_template=template,
            disks=[] if disk is None else [{"size": disk * 1024}],
            beparams={"memory": memory, "vcpus": vcpus},
        )
    except pydantic.ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise InvalidError(f"the server is not valid: {problems}") from None


# -- the handlers -----------------------------------------------------------------------------------


async def find(cp: ControlPlane, server_id: str) -> tuple[StoredInstance | None, Request | None]:
    """The instance ``server_id`` names (its id, or its request's id), and that request if any."""
    instance = await cp.get_instance(server_id)
    if instance is not None:
        return instance, None
    try:
        request = await cp.get_request(server_id)
    except NotFoundError:
        raise NotFoundError(f"no server has id {server_id}: check the id (GET /servers lists them)") from None
    if request.instance_id is not None:
        return await cp.get_instance(request.instance_id), request
    return None, request


async def view(cp: ControlPlane, server_id: str) -> dict[str, Any]:
    instance, request = await find(cp, server_id)
    if instance is not None:
        return server_json(instance, request_id=None if request is None else request.id)
    assert request is not None
    return request_json(request)


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
    server = await view(cp, request_id)
    headers = {"Location": f"/servers/{request_id}"}
    return web.json_response({"request_id": request_id, "server": server}, status=202, headers=headers)


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


async def server_action(request: web.Request) -> web.Response:
    cp = request.app[CONTROL_PLANE]
    body = await json_body(request)
    action = field(body, "action", str, required=True)
    instance, create = await find(cp, request.match_info["id"])
    if instance is None:
        assert create is not None
        raise ConflictError(
            f"server {create.id} has no instance yet (its request is {create.status}): "
            "wait until the server is placed (task build), or delete it"
        )
    if action == "start":
        job_id = await cp.startup_instance(instance.id)
    elif action == "stop":
        job_id = await cp.shutdown_instance(instance.id)
    elif action == "reboot":
        kind = field(body, "type", str, "soft")
        if kind not in ("soft", "hard", "full"):
            raise InvalidError(f"type: give soft, hard or full (got {kind!r})")
        job_id = await cp.reboot_instance(instance.id, reboot_type=kind)
    else:
        raise InvalidError(f"action: give start, stop or reboot (got {action!r})")
    return web.json_response({"job_id": job_id, "server": await view(cp, instance.id)}, status=202)


async def delete_server(request: web.Request) -> web.Response:
    """Delete a server; a request not placed yet is canceled instead."""
    cp = request.app[CONTROL_PLANE]
    instance, create = await find(cp, request.match_info["id"])
    if instance is None:
        assert create is not None
        canceled = await cp.cancel_request(create.id)
        return web.json_response({"job_id": canceled.job_id, "server": request_json(canceled)}, status=202)
    job_id = await cp.delete_instance(instance.id)  # None: nothing was left to remove in Ganeti
    return web.json_response({"job_id": job_id, "server": await view(cp, instance.id)}, status=202)


# -- the change feed --------------------------------------------------------------------------------


def since_of(request: web.Request) -> int | None:
    """``?since=N`` (or an event stream's ``Last-Event-ID`` on reconnect); None: from now on."""
    text = request.query.get("since") or request.headers.get("Last-Event-ID")
    if text is None:
        return None
    if not text.isdigit():
        raise InvalidError(f"since: give the id of the last change you have, an integer (got {text!r})")
    return int(text)


async def events(request: web.Request) -> web.StreamResponse:
    if "text/event-stream" in request.headers.get("Accept", ""):
        return await stream_events(request, since_of(request))
    return await poll_events(request, since_of(request))


async def poll_events(request: web.Request, since: int | None) -> web.Response:
    """A long-poll: the changes after ``since`` as soon as there is one, or none after ``timeout``;
    ``last`` is the ``since`` of the next call."""
    cp = request.app[CONTROL_PLANE]
    limit = query_int(request, "limit", 100, low=1, high=MAX_PAGE)
    timeout = query_int(request, "timeout", int(LONG_POLL), low=0, high=int(MAX_LONG_POLL))
    after = await cp.store.last_change_id() if since is None else since
    changes = await cp.store.list_changes(after=after, limit=limit)
    if not changes and timeout:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout), contextlib.aclosing(cp.changes(after)) as feed:
                async for _ in feed:
                    break
        changes = await cp.store.list_changes(after=after, limit=limit)
    last = changes[-1].id if changes else after
    return web.json_response({"changes": [change.to_json() for change in changes], "last": last})


def sse(change: Change) -> bytes:
    return f"id: {change.id}\nevent: {change.kind}\ndata: {json.dumps(change.to_json())}\n\n".encode()


async def stream_events(request: web.Request, since: int | None) -> web.StreamResponse:
    """Server-sent events, one per change, until the client leaves or the app stops."""
    cp, stopping = request.app[CONTROL_PLANE], request.app[STOPPING]
    queue: asyncio.Queue[Change | None] = asyncio.Queue(maxsize=1000)

    async def pump() -> None:
        try:
            async with contextlib.aclosing(cp.changes(since)) as feed:
                async for change in feed:
                    await queue.put(change)
        except GanetiError as exc:
            log.warning("event stream: %r", exc)
            await queue.put(None)  # the stream ends; the client reconnects with Last-Event-ID

    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    await response.write(b": connected\n\n")
    feeding = asyncio.create_task(pump(), name="event stream feed")
    stopped = asyncio.create_task(stopping.wait(), name="event stream stop")
    try:
        while not stopping.is_set():
            get = asyncio.create_task(queue.get())
            await asyncio.wait({get, stopped}, timeout=KEEPALIVE, return_when=asyncio.FIRST_COMPLETED)
            if not get.done():
                get.cancel()
                await response.write(b": keep-alive\n\n")
                continue
            change = get.result()
            if change is None:
                break
            await response.write(sse(change))
    except ConnectionResetError:
        pass  # the client left
    finally:
        for task in (feeding, stopped):
            task.cancel()
        await asyncio.gather(feeding, stopped, return_exceptions=True)
    return response


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
