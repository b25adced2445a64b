"""The fake ganeti-rapi: an aiohttp application answering as Ganeti 3.0 does (or the cluster's version:
:mod:`._versions`).

Requests pass, in order: the ``max_clients`` slots (a request beyond them waits,
as ganeti-rapi's extra connections wait for a free child), the latency knob, slow
submits (:mod:`._slow`: the rest runs later, whatever the client does),
authentication (401 as Ganeti's), injected faults, the JSON content-type check
(415), then the handler. Every answer closes its connection, as ganeti-rapi's do.
"""

from __future__ import annotations

import asyncio
import base64
import fnmatch
import hmac
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from synnefo_ganeti.errors import ConflictError, NotFoundError
from synnefo_ganeti.testing import _node_faults
from synnefo_ganeti.testing._engine import FakeCluster
from synnefo_ganeti.testing._errors import HTTPError, ganeti_error, invalid
from synnefo_ganeti.testing._routes import Surface
from synnefo_ganeti.testing._slow import SlowSubmit, SlowSubmits
from synnefo_ganeti.testing._version_routes import VersionRoutes

__all__ = ["FAULT_KINDS", "Fault", "RapiApp"]

FAULT_KINDS = ("502", "503", "504", "reset", "hang", "slow_body", "malformed_json", "401")

_INFO_TEMPLATE: dict[str, Any] = json.loads((Path(__file__).parent / "data" / "info.json").read_text())
_FEATURES = ["node-evac-res1", "node-migrate-reqv1", "instance-reinstall-reqv1", "instance-create-reqv1"]
# Types OP_INSTANCE_CREATE checks at submit (RAPI answers 400 for these, naming the parameter).
_CREATE_TYPES: dict[str, tuple[type, ...]] = {
    "instance_name": (str,), "mode": (str,), "disk_template": (str,), "os_type": (str,), "disks": (list,),
    "nics": (list,), "beparams": (dict,), "hvparams": (dict,), "osparams": (dict,), "tags": (list,),
    "start": (bool,), "name_check": (bool,), "ip_check": (bool,), "opportunistic_locking": (bool,),
    "conflicts_check": (bool,), "pnode": (str, type(None)), "snode": (str, type(None)),
    "iallocator": (str, type(None)), "hypervisor": (str, type(None)),
}  # fmt: skip
_CREATE_REQUIRED = ("instance_name", "mode", "disk_template", "disks", "nics")


@dataclass
class Fault:
    """A fault answered instead of the real answer, for requests matching ``method`` and ``path`` (a glob)."""

    kind: str
    method: str | None = None
    path: str | None = None
    times: int | None = None  # None: until cleared
    delay: float = 0.5  # slow_body: seconds between bytes
    hits: int = 0

    def matches(self, request: web.Request) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        if self.method is not None and request.method != self.method.upper():
            return False
        return self.path is None or fnmatch.fnmatchcase(request.path, self.path)


@dataclass
class RapiApp:
    """The request pipeline and RAPI resources of a :class:`FakeCluster`."""

    cluster: FakeCluster
    username: str
    password: str
    max_clients: int = 20
    latency: float | Callable[[], float] = 0.0
    wait_timeout: float = 10.0
    faults: list[Fault] = field(default_factory=list)
    slow: SlowSubmits = field(default_factory=SlowSubmits)
    accepted_at: dict[int, float] = field(default_factory=dict)  # connection (handler id) -> accept time
    requests: int = 0
    active: int = 0

    def __post_init__(self) -> None:
        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        self._expected_auth = f"Basic {token}"

    def application(self) -> web.Application:
        app = web.Application(middlewares=[self._pipeline], client_max_size=16 * 1024 * 1024)
        routes: list[tuple[str, str, Callable[[web.Request], Awaitable[Any]]]] = [
            ("GET", "/version", self._version),
            ("GET", "/2/info", self._info),
            ("GET", "/2/features", self._features),
            ("GET", "/2/os", self._os),
            ("GET", "/2/nodes", self._nodes),
            ("GET", "/2/nodes/{name}", self._node),
            ("GET", "/2/instances", self._instances),
            ("POST", "/2/instances", self._create),
            ("POST", "/2/instances-multi-alloc", self._multi_alloc),
            ("GET", "/2/instances/{name}", self._instance),
            ("DELETE", "/2/instances/{name}", self._delete),
            ("PUT", "/2/instances/{name}/startup", self._startup),
            ("PUT", "/2/instances/{name}/shutdown", self._shutdown),
            ("POST", "/2/instances/{name}/reboot", self._reboot),
            ("PUT", "/2/instances/{name}/modify", self._modify),
            ("GET", "/2/jobs", self._jobs),
            ("GET", "/2/jobs/{job_id}", self._job),
            ("DELETE", "/2/jobs/{job_id}", self._cancel),
            ("GET", "/2/jobs/{job_id}/wait", self._wait),
            ("POST", "/__fake__/faults", self._add_fault),
            ("DELETE", "/__fake__/faults", self._clear_faults),
            ("PUT", "/__fake__/knobs", self._set_knobs),
            ("POST", "/__fake__/slow-submit", self._add_slow_submit),
            ("DELETE", "/__fake__/slow-submit", self._clear_slow_submits),
            ("POST", "/__fake__/nodes/{name}/{action:crash|restore}", self._node_fault),
        ]
        surface = Surface(self)  # the rest of Ganeti 3.0's RAPI (_routes.py), and the version's own
        routes += surface.routes() + VersionRoutes(surface).routes()
        for method, path, handler in routes:
            app.router.add_route(method, path, self._json_handler(handler))
        return app

    # ------------------------------------------------------------------ pipeline

    @web.middleware
    async def _pipeline(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        self.active += 1
        self.requests += 1
        loop = asyncio.get_running_loop()
        # The latency is the whole time to answer: from the connection's accept (the fake
        # accepts its own connections) to the answer, the fake's own work included.
        started = self.accepted_at.get(id(request.protocol)) or loop.time()
        control = request.path.startswith("/__fake__/")
        delay = 0.0 if control else self.latency() if callable(self.latency) else self.latency
        try:
            slow = None if control else self.slow.match(request)
            if slow is None:
                response = await self._answer(request, handler, control)
            else:
                response = await self.slow.answer(
                    request, slow, started, lambda: self._answer(request, handler, control)
                )
            remaining = delay - (loop.time() - started)
            if remaining > 0:
                await asyncio.sleep(remaining)
            return response
        finally:
            self.active -= 1

    async def _answer(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
        control: bool,
    ) -> web.StreamResponse:
        if not hmac.compare_digest(request.headers.get("Authorization", ""), self._expected_auth):
            return ganeti_error(401)
        for fault in [] if control else self.faults:
            if fault.matches(request):
                fault.hits += 1
                return await self._fault(request, fault)
        body = await request.read()
        if request.method in ("POST", "PUT") and body and request.content_type != "application/json":
            return ganeti_error(415)
        try:
            response = await handler(request)
        except web.HTTPNotFound:
            return ganeti_error(404)
        except web.HTTPMethodNotAllowed:
            return ganeti_error(501, f"Method {request.method} is unsupported for resource")
        except HTTPError as exc:  # the message as this Ganeti version writes it
            return ganeti_error(exc.status, self.cluster.model.version.message(exc.message))
        response.headers["Connection"] = "close"
        return response

    async def _fault(self, request: web.Request, fault: Fault) -> web.StreamResponse:
        if fault.kind in ("502", "503", "504", "401"):
            return ganeti_error(int(fault.kind))
        if fault.kind == "malformed_json":
            return web.Response(body=b'{"job_info": ["runn', content_type="application/json")
        if fault.kind == "reset":
            await request.read()
            if request.transport is not None:
                request.transport.abort()
            raise asyncio.CancelledError  # the connection is gone; nothing more to answer
        if fault.kind == "hang":
            await asyncio.sleep(3600)
        response = web.StreamResponse(headers={"Content-Type": "application/json", "Connection": "close"})
        await response.prepare(request)
        for byte in b'{"slow": true}':
            await asyncio.sleep(fault.delay)
            await response.write(bytes([byte]))
        await response.write_eof()
        return response

    def _json_handler(
        self, handler: Callable[[web.Request], Awaitable[Any]]
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def wrapped(request: web.Request) -> web.StreamResponse:
            result = await handler(request)
            if isinstance(result, web.StreamResponse):
                return result
            body = result if isinstance(result, bytes) else orjson.dumps(result)  # bytes: dumped already
            return web.Response(body=body, content_type="application/json")

        return wrapped

    @staticmethod
    async def _body(request: web.Request) -> dict[str, Any]:
        raw = await request.read()
        if not raw:
            return {}
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise HTTPError(400, "Unable to parse JSON data") from None
        if not isinstance(data, dict):
            raise HTTPError(400, "Invalid body contents, not a dictionary")
        return data

    @staticmethod
    def _flag(request: web.Request, name: str) -> bool:
        return request.query.get(name, "0") not in ("0", "", "false", "False")

    # ------------------------------------------------------------------ control (not Ganeti's)

    async def _add_fault(self, request: web.Request) -> Any:
        body = await self._body(request)
        kind = str(body.get("kind"))
        if kind not in FAULT_KINDS:
            raise HTTPError(400, f"unknown fault {kind!r}; choose from {', '.join(FAULT_KINDS)}")
        times = body.get("times")
        fault = Fault(
            kind=kind, method=body.get("method"), path=body.get("path"),
            times=int(times) if times is not None else None, delay=float(body.get("delay", 0.5)),
        )  # fmt: skip
        self.faults.append(fault)
        return {"faults": len(self.faults)}

    async def _clear_faults(self, request: web.Request) -> Any:
        self.faults.clear()
        return {"faults": 0}

    async def _set_knobs(self, request: web.Request) -> Any:
        body = await self._body(request)
        if "latency" in body:
            self.latency = float(body["latency"])
        if "max_running_jobs" in body:
            self.cluster.max_running_jobs = int(body["max_running_jobs"])
        if "op_times" in body:
            self.cluster.op_times.update({str(k): float(v) for k, v in dict(body["op_times"]).items()})
        if "rpc_timeout" in body:
            self.cluster.rpc_timeout = max(0.0, float(body["rpc_timeout"]))
        return {"latency": self.latency if not callable(self.latency) else None,
                "max_running_jobs": self.cluster.max_running_jobs, "rpc_timeout": self.cluster.rpc_timeout}  # fmt: skip

    async def _add_slow_submit(self, request: web.Request) -> Any:
        body = await self._body(request)
        try:
            answer_after = float(body.get("answer_after", 0.0))
            job_after = float(body.get("job_after", answer_after))
            times = body.get("times")
            rule = SlowSubmit(
                answer_after=answer_after, job_after=job_after, method=body.get("method", "POST"),
                path=body.get("path", "/2/instances"), times=int(times) if times is not None else None,
                queued_for=float(body.get("queued_for", 0.0)),
            )  # fmt: skip
        except (TypeError, ValueError) as exc:
            raise HTTPError(400, f"bad slow submit: {exc}") from None
        self.slow.rules.append(rule)
        return {"slow_submits": len(self.slow.rules)}

    async def _clear_slow_submits(self, request: web.Request) -> Any:
        self.slow.rules.clear()
        return {"slow_submits": 0}

    async def _node_fault(self, request: web.Request) -> Any:
        name, action = request.match_info["name"], request.match_info["action"]
        try:
            if action == "crash":
                _node_faults.crash_node(self.cluster, name)
            else:
                _node_faults.restore_node(self.cluster, name)
        except NotFoundError as exc:
            raise HTTPError(404, str(exc)) from None
        except ConflictError as exc:
            raise HTTPError(409, str(exc)) from None
        node = self.cluster.nodes[name]
        return {"name": name, "crashed": node.crashed, "offline": node.offline}

    # ------------------------------------------------------------------ resources

    async def _version(self, request: web.Request) -> Any:
        return 2

    async def _info(self, request: web.Request) -> Any:
        cluster = self.cluster
        master = next((n.name for n in cluster.nodes.values() if n.master), next(iter(cluster.nodes)))
        info = dict(_INFO_TEMPLATE)
        info.update(
            name=cluster.name, master=master, default_hypervisor=cluster.hypervisor,
            enabled_hypervisors=[cluster.hypervisor], enabled_disk_templates=list(cluster.disk_templates),
            max_running_jobs=cluster.max_running_jobs, master_netdev=cluster.link, uuid=cluster.group_uuid,
            default_iallocator=cluster.default_iallocator,
        )  # fmt: skip
        low = {key: bounds[0] for key, bounds in cluster.ipolicy.items()}
        high = {key: bounds[1] for key, bounds in cluster.ipolicy.items()}
        templates = {"disk-templates": list(cluster.disk_templates)}
        info["ipolicy"] = dict(info["ipolicy"], minmax=[{"min": low, "max": high}], **templates)
        return cluster.model.version.info(info)

    async def _os(self, request: web.Request) -> Any:
        # Ganeti answers from an OP_OS_DIAGNOSE job: the valid OSes every node has, "os+variant"
        return sorted(self.cluster.oses)

    async def _features(self, request: web.Request) -> Any:
        return list(_FEATURES)

    async def _nodes(self, request: web.Request) -> Any:
        bulk = self._flag(request, "bulk")
        if bulk:  # live data from every node: a crashed one's RPC timeout first
            await _node_faults.wait_for_live_data(self.cluster)
        views = self.cluster.node_views()
        if bulk:
            return views
        return [{"id": v["name"], "uri": f"/2/nodes/{v['name']}"} for v in views]

    async def _node(self, request: web.Request) -> Any:
        name = request.match_info["name"]
        await _node_faults.wait_for_live_data(self.cluster, [name])
        for view in self.cluster.node_views():
            if view["name"] == name:  # R_2_nodes_name.GET_ALIASES: "sip" also as "secondary_ip"
                return view | {"secondary_ip": view["sip"]}
        raise HTTPError(404)

    async def _instances(self, request: web.Request) -> Any:
        bulk = self._flag(request, "bulk")
        if bulk:
            await _node_faults.wait_for_live_data(self.cluster)
        views = self.cluster.instance_views()
        if bulk:
            return [self._versioned(view) for view in views]
        return [{"id": v["name"], "uri": f"/2/instances/{v['name']}"} for v in views]

    async def _instance(self, request: web.Request) -> Any:
        inst = self.cluster.instances.get(request.match_info["name"])
        if inst is not None:
            await _node_faults.wait_for_live_data(self.cluster, [inst.pnode])
        view = self.cluster.instance_view(request.match_info["name"])
        if view is None:
            raise HTTPError(404)
        return self._versioned(view)

    def _versioned(self, view: dict[str, Any]) -> dict[str, Any]:
        """An instance's view with the fields this Ganeti version adds (3.1: ``custom_osparams``)."""
        inst = self.cluster.instances.get(view["name"])
        return self.cluster.model.version.instance_view(view, inst.osparams if inst is not None else {})

    def _submit(self, request: web.Request, ops: list[tuple[str, dict[str, Any]]], resource: str) -> int:
        for op_id, params in ops:  # FillOpcode: a parameter this version's opcode lacks
            refusal = self.cluster.model.version.refusal(op_id, params)
            if refusal is not None:
                raise HTTPError(400, refusal)
        dry_run, reason = self._flag(request, "dry-run"), request.query.get("reason")
        return self.cluster.submit(ops, resource=resource, dry_run=dry_run, user_reason=reason)

    @staticmethod
    def _create_params(body: dict[str, Any]) -> dict[str, Any]:
        params = {("instance_name" if key == "name" else "os_type" if key == "os" else key): value
                  for key, value in body.items() if key != "__version__"}  # fmt: skip
        for key in _CREATE_REQUIRED:
            if key not in params:
                raise invalid("OP_INSTANCE_CREATE", key)
        for key, types in _CREATE_TYPES.items():
            if key in params and not isinstance(params[key], types):
                raise invalid("OP_INSTANCE_CREATE", key)
            if key in ("disks", "nics") and not all(isinstance(item, dict) for item in params[key]):
                raise invalid("OP_INSTANCE_CREATE", key)
        if not params["instance_name"]:
            raise invalid("OP_INSTANCE_CREATE", "instance_name")
        return params

    async def _create(self, request: web.Request) -> Any:
        body = await self._body(request)
        version = body.get("__version__", 0)
        if version != 1:
            if version == 0:
                raise HTTPError(400, "Instance creation request version 0 is no longer supported")
            raise HTTPError(400, f"Unsupported request data version {version}")
        return self._submit(request, [("OP_INSTANCE_CREATE", self._create_params(body))], "instances")

    async def _multi_alloc(self, request: web.Request) -> Any:
        body = await self._body(request)
        instances = body.get("instances")
        if not isinstance(instances, list) or not all(isinstance(item, dict) for item in instances):
            raise invalid("OP_INSTANCE_MULTI_ALLOC", "instances")
        children = [self._create_params(item) for item in instances]
        params = {
            "instances": children,
            "opportunistic_locking": bool(body.get("opportunistic_locking", False)),
        }
        if body.get("iallocator") is not None:
            params["iallocator"] = body["iallocator"]
        return self._submit(request, [("OP_INSTANCE_MULTI_ALLOC", params)], "instances_multi_alloc")

    async def _delete(self, request: web.Request) -> Any:
        name = request.match_info["name"]
        return self._submit(request, [("OP_INSTANCE_REMOVE", {"instance_name": name})], "instances_name")

    async def _startup(self, request: web.Request) -> Any:
        body = await self._body(request)
        params = {"instance_name": request.match_info["name"], "force": self._flag(request, "force")} | body
        return self._submit(request, [("OP_INSTANCE_STARTUP", params)], "instances_name_startup")

    async def _shutdown(self, request: web.Request) -> Any:
        body = await self._body(request)
        params = {"instance_name": request.match_info["name"]} | body
        return self._submit(request, [("OP_INSTANCE_SHUTDOWN", params)], "instances_name_shutdown")

    async def _reboot(self, request: web.Request) -> Any:
        reboot_type = request.query.get("type", "soft")
        if reboot_type not in ("soft", "hard", "full"):
            raise invalid("OP_INSTANCE_REBOOT", "reboot_type")
        params: dict[str, Any] = {
            "instance_name": request.match_info["name"],
            "reboot_type": reboot_type,
            "ignore_secondaries": self._flag(request, "ignore_secondaries"),
        }
        return self._submit(request, [("OP_INSTANCE_REBOOT", params)], "instances_name_reboot")

    async def _modify(self, request: web.Request) -> Any:
        body = await self._body(request)
        for key in ("beparams", "hvparams", "osparams"):
            if key in body and not isinstance(body[key], dict):
                raise invalid("OP_INSTANCE_SET_PARAMS", key)
        params = {"instance_name": request.match_info["name"]} | body
        if not self._flag(request, "dry-run"):  # R_2_instances_name_modify passes no dry_run
            params["dry_run"] = None
        return self._submit(request, [("OP_INSTANCE_SET_PARAMS", params)], "instances_name_modify")

    def _job_id(self, request: web.Request) -> int:
        try:
            return int(request.match_info["job_id"])
        except ValueError:
            raise HTTPError(400, "Invalid job ID") from None

    async def _jobs(self, request: web.Request) -> Any:
        live = [job for job in self.cluster.jobs.values() if not job.archived]
        if self._flag(request, "bulk"):
            return [job.rapi_view(bulk=True) for job in live]
        return [{"id": job.id, "uri": f"/2/jobs/{job.id}"} for job in live]

    async def _job(self, request: web.Request) -> Any:
        job_id = self._job_id(request)
        job = self.cluster.job(job_id)
        if job is None:  # Ganeti 3.0: 200 with every field null
            return {"id": job_id, "ops": None, "status": None, "summary": None, "opstatus": None,
                    "received_ts": None, "start_ts": None, "end_ts": None, "oplog": None, "opresult": None}  # fmt: skip
        return job.rapi_view()

    async def _cancel(self, request: web.Request) -> Any:
        success, message = self.cluster.cancel(self._job_id(request))
        return [success, message]

    async def _wait(self, request: web.Request) -> Any:
        job = self.cluster.job(self._job_id(request))
        if job is None:
            raise HTTPError(500, "Can&#x27;t load job file")
        body = await self._body(request)
        fields = body.get("fields")
        if not isinstance(fields, list) or not fields:
            raise HTTPError(400, "Missing &#x27;fields&#x27; parameter")
        previous_info = body.get("previous_job_info")
        previous_serial = body.get("previous_log_serial") or 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_timeout
        while True:
            changed = job.changed
            info = job.wait_info(fields)
            entries = job.log_since(int(previous_serial))
            if previous_info is None or info != previous_info or entries or job.status.is_final:
                return {"job_info": info, "log_entries": entries}
            remaining = deadline - loop.time()
            if remaining <= 0:
                return {"job_info": info, "log_entries": []}
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                return {"job_info": job.wait_info(fields), "log_entries": []}
