"""The rest of Ganeti 3.0's RAPI (``rapi/connector.py``): cluster tags, modify, redistribute-config,
filters, groups, networks, node and instance sub-resources, tags, and ``/2/query``.

Each write builds its opcode as ``rlib2``'s resource does (``GetXOpInput``: the body, and
the static parameters from the URL, which the body cannot overwrite; ``dry_run`` only where
the resource passes ``dry-run``) and submits it, answering the job id. Reads answer the
fake cluster's state in ``rlib2``'s shapes (:mod:`._views`, :mod:`._query`).
"""

from __future__ import annotations

import html
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from synnefo_ganeti.testing._errors import HTTPError
from synnefo_ganeti.testing._model import FakeFilter
from synnefo_ganeti.testing._ops_tags import tags_of
from synnefo_ganeti.testing._query import QUERY_RESOURCES, answer_query, query_fields
from synnefo_ganeti.testing._views import console_view, filter_view, group_view, network_view

if TYPE_CHECKING:
    from synnefo_ganeti.testing._server import RapiApp

__all__ = ["Surface"]

Route = tuple[str, str, Callable[[web.Request], Awaitable[Any]]]
_ROLES = {"M": "master", "C": "master-candidate", "D": "drained", "O": "offline", "R": "regular"}
_NO_BODY = object()


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


class Surface:
    """The routes :class:`~._server.RapiApp` serves besides its own (instances, jobs, nodes list)."""

    def __init__(self, app: RapiApp) -> None:
        self.app = app
        self.cluster = app.cluster

    # ------------------------------------------------------------------ helpers

    async def _raw(self, request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            return _NO_BODY
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise HTTPError(400, "Unable to parse JSON data") from None

    async def _fill(
        self,
        request: web.Request,
        static: dict[str, Any],
        rename: dict[str, str] | None = None,
        *,
        body: bool = True,
    ) -> dict[str, Any]:
        """``baserlib.FillOpcode``: the body (a dict), renamed, then the static parameters."""
        data = await self._raw(request) if body else _NO_BODY
        params: Any = {} if data is _NO_BODY or data is None else data
        if not isinstance(params, dict):
            raise HTTPError(400, "Invalid body contents, not a dictionary")
        params = dict(params)
        for old, new in (rename or {}).items():
            if old in params and new in params:
                raise HTTPError(
                    400, _esc(f"Parameter '{old}' was renamed to '{new}', but both are specified")
                )
            if old in params:
                params[new] = params.pop(old)
        overwritten = sorted(set(params) & set(static))
        if overwritten:
            raise HTTPError(400, _esc(f"Can't overwrite static parameters {set(overwritten)!r}"))
        merged: dict[str, Any] = {**params, **static}
        return merged

    def _submit(self, request: web.Request, ops: list[tuple[str, dict[str, Any]]], resource: str) -> int:
        """Submit; an op's ``dry_run`` is the ``dry-run`` flag where given as static, else unset."""
        for refusal in filter(None, (self.cluster.model.version.refusal(*op) for op in ops)):
            raise HTTPError(400, refusal)  # FillOpcode: what this version's opcode does not take
        reason = request.query.get("reason")
        prepared = [(op_id, {"dry_run": None} | params) for op_id, params in ops]
        return self.cluster.submit(prepared, resource=resource, dry_run=False, user_reason=reason)

    def _dry(self, request: web.Request) -> bool:
        return self.app._flag(request, "dry-run")

    def _int(self, request: web.Request, name: str) -> int:
        try:
            return int(request.query.get(name, "0") or 0)
        except ValueError:
            raise HTTPError(400, _esc(f"Invalid value for '{name}': not an integer")) from None

    # ------------------------------------------------------------------ routes

    def routes(self) -> list[Route]:
        r: list[Route] = [
            ("GET", "/", self._root), ("GET", "/2", self._root),
            ("PUT", "/2/redistribute-config", self._redist), ("PUT", "/2/modify", self._cluster_modify),
            ("GET", "/2/filters", self._filters), ("POST", "/2/filters", self._filter_add),
            ("GET", "/2/filters/{uuid}", self._filter), ("PUT", "/2/filters/{uuid}", self._filter_replace),
            ("DELETE", "/2/filters/{uuid}", self._filter_delete),
            ("GET", "/2/groups", self._groups), ("POST", "/2/groups", self._group_add),
            ("GET", "/2/groups/{name}", self._group), ("DELETE", "/2/groups/{name}", self._group_remove),
            ("PUT", "/2/groups/{name}/modify", self._group_modify),
            ("PUT", "/2/groups/{name}/rename", self._group_rename),
            ("PUT", "/2/groups/{name}/assign-nodes", self._group_assign),
            ("GET", "/2/networks", self._networks), ("POST", "/2/networks", self._network_add),
            ("GET", "/2/networks/{name}", self._network), ("DELETE", "/2/networks/{name}", self._network_remove),
            ("PUT", "/2/networks/{name}/connect", self._network_op("OP_NETWORK_CONNECT", "connect", True)),
            ("PUT", "/2/networks/{name}/disconnect", self._network_op("OP_NETWORK_DISCONNECT", "disconnect", True)),
            ("PUT", "/2/networks/{name}/modify", self._network_op("OP_NETWORK_SET_PARAMS", "modify", False)),
            ("GET", "/2/nodes/{name}/role", self._node_role), ("PUT", "/2/nodes/{name}/role", self._node_set_role),
            ("POST", "/2/nodes/{name}/powercycle", self._node_powercycle),
            ("POST", "/2/nodes/{name}/evacuate", self._node_evacuate),
            ("POST", "/2/nodes/{name}/migrate", self._node_migrate),
            ("POST", "/2/nodes/{name}/modify", self._node_modify),
            ("GET", "/2/nodes/{name}/storage", self._node_storage),
            ("PUT", "/2/nodes/{name}/storage/modify", self._node_storage_change("OP_NODE_MODIFY_STORAGE", "modify")),
            ("PUT", "/2/nodes/{name}/storage/repair", self._node_storage_change("OP_REPAIR_NODE_STORAGE", "repair")),
            ("GET", "/2/instances/{name}/info", self._instance_info),
            ("GET", "/2/instances/{name}/console", self._console),
            ("POST", "/2/instances/{name}/reinstall", self._reinstall),
            ("POST", "/2/instances/{name}/disk/{disk}/grow", self._grow),
            ("GET", "/2/query/{resource}", self._query), ("PUT", "/2/query/{resource}", self._query_put),
            ("GET", "/2/query/{resource}/fields", self._query_fields),
        ]  # fmt: skip
        simple = [  # (method, suffix, OP_ID, query-arg statics, body?)
            ("POST", "replace-disks", "OP_INSTANCE_REPLACE_DISKS", {}, True),
            ("PUT", "activate-disks", "OP_INSTANCE_ACTIVATE_DISKS", {"ignore_size": "int"}, False),
            ("PUT", "deactivate-disks", "OP_INSTANCE_DEACTIVATE_DISKS", {"force": "int"}, False),
            ("POST", "recreate-disks", "OP_INSTANCE_RECREATE_DISKS", {}, True),
            ("PUT", "prepare-export", "OP_BACKUP_PREPARE", {"mode": "str"}, False),
            ("PUT", "export", "OP_BACKUP_EXPORT", {}, True),
            ("PUT", "migrate", "OP_INSTANCE_MIGRATE", {}, True),
            ("PUT", "failover", "OP_INSTANCE_FAILOVER", {}, True),
            ("PUT", "rename", "OP_INSTANCE_RENAME", {}, True),
        ]
        for method, suffix, op_id, args, body in simple:
            r.append(
                (method, f"/2/instances/{{name}}/{suffix}", self._instance_op(op_id, suffix, args, body))
            )
        for prefix, kind in (("/2", "cluster"), ("/2/instances/{name}", "instance"), ("/2/nodes/{name}", "node"),
                             ("/2/groups/{name}", "nodegroup"), ("/2/networks/{name}", "network")):  # fmt: skip
            r += [("GET", f"{prefix}/tags", self._tags_get(kind)), ("PUT", f"{prefix}/tags", self._tags_op(kind)),
                  ("DELETE", f"{prefix}/tags", self._tags_op(kind))]  # fmt: skip
        return r

    # ------------------------------------------------------------------ cluster

    async def _root(self, request: web.Request) -> Any:
        return None

    async def _redist(self, request: web.Request) -> Any:
        params = await self._fill(request, {})
        return self._submit(request, [("OP_CLUSTER_REDIST_CONF", params)], "redist_config")

    async def _cluster_modify(self, request: web.Request) -> Any:
        params = await self._fill(request, {})
        if "compression_tools" in params:
            raise HTTPError(400, _esc("The parameter 'compression_tools' cannot be used via RAPI"))
        return self._submit(request, [("OP_CLUSTER_SET_PARAMS", params)], "cluster_modify")

    def _tags_get(self, kind: str) -> Callable[[web.Request], Awaitable[Any]]:
        async def handler(request: web.Request) -> Any:
            from synnefo_ganeti.testing._cluster import OpFailure

            try:
                return list(tags_of(self.cluster, kind, request.match_info.get("name")))
            except OpFailure:
                raise HTTPError(404) from None

        return handler

    def _tags_op(self, kind: str) -> Callable[[web.Request], Awaitable[Any]]:
        resource = {"cluster": "tags", "instance": "instances_name_tags", "node": "nodes_name_tags",
                    "nodegroup": "groups_name_tags", "network": "networks_name_tags"}[kind]  # fmt: skip

        async def handler(request: web.Request) -> Any:
            op_id = "OP_TAGS_SET" if request.method == "PUT" else "OP_TAGS_DEL"
            params = {"kind": kind, "name": request.match_info.get("name"), "tags": request.query.getall("tag", []),
                      "dry_run": self._dry(request)}  # fmt: skip
            return self._submit(request, [(op_id, params)], resource)

        return handler

    # ------------------------------------------------------------------ filters (luxid's, no job)

    @staticmethod
    def _filter_params(body: Any) -> tuple[int, list[Any], Any, list[Any]]:
        """``rlib2.checkFilterParameters``."""
        if not isinstance(body, dict):
            raise HTTPError(400, "Invalid body contents, not a dictionary")
        for key in body:
            if key not in ("priority", "predicates", "action", "reason"):
                raise HTTPError(
                    400, _esc(f"Invalid body parameters: filter rule doesn't support the parameter '{key}'")
                )
        priority, predicates = body.get("priority", 0), body.get("predicates", [])
        reason = body.get("reason", [])
        if not isinstance(priority, int) or not isinstance(predicates, list) or not isinstance(reason, list):
            raise HTTPError(
                400, "Invalid body parameters: priority must be an int, predicates and reason lists"
            )
        return priority, predicates, body.get("action", "CONTINUE"), reason

    def _replace_filter(self, rule_uuid: str | None, body: Any) -> str:
        priority, predicates, action, reason = self._filter_params(body)
        rule_uuid = rule_uuid or str(uuid.uuid4())
        trail = [*reason, ["luxid", "", time.time_ns()]]
        self.cluster.model.filters[rule_uuid] = FakeFilter(
            uuid=rule_uuid, priority=priority, predicates=predicates, action=action, reason_trail=trail,
            watermark=max(self.cluster.jobs, default=0),
        )  # fmt: skip
        self.cluster.schedule()  # configChangeNeedsRescheduling: the filters changed
        return rule_uuid

    async def _filters(self, request: web.Request) -> Any:
        rules = sorted(self.cluster.model.filters.values(), key=lambda f: (f.priority, f.uuid))
        if self.app._flag(request, "bulk"):
            return [filter_view(rule) for rule in rules]
        return [{"uuid": rule.uuid, "uri": f"/2/filters/{rule.uuid}"} for rule in rules]

    async def _filter_add(self, request: web.Request) -> Any:
        body = await self._raw(request)
        return self._replace_filter(None, {} if body is _NO_BODY else body)

    async def _filter(self, request: web.Request) -> Any:
        rule = self.cluster.model.filters.get(request.match_info["uuid"])
        if rule is None:
            raise HTTPError(404)
        return filter_view(rule)

    async def _filter_replace(self, request: web.Request) -> Any:
        body = await self._raw(request)
        return self._replace_filter(request.match_info["uuid"], {} if body is _NO_BODY else body)

    async def _filter_delete(self, request: web.Request) -> Any:
        if self.cluster.model.filters.pop(request.match_info["uuid"], None) is None:
            raise HTTPError(404)
        self.cluster.schedule()  # a job the rule paused may run now
        return None

    # ------------------------------------------------------------------ groups

    async def _groups(self, request: web.Request) -> Any:
        groups = sorted(self.cluster.model.groups.values(), key=lambda g: g.name)
        if self.app._flag(request, "bulk"):
            return [group_view(self.cluster, group) for group in groups]
        return [{"name": group.name, "uri": f"/2/groups/{group.name}"} for group in groups]

    async def _group(self, request: web.Request) -> Any:
        group = self.cluster.model.groups.get(request.match_info["name"])
        if group is None:
            raise HTTPError(404)
        return group_view(self.cluster, group)

    async def _group_add(self, request: web.Request) -> Any:
        params = await self._fill(request, {"dry_run": self._dry(request)}, {"name": "group_name"})
        return self._submit(request, [("OP_GROUP_ADD", params)], "groups")

    async def _group_remove(self, request: web.Request) -> Any:
        params = {"group_name": request.match_info["name"], "dry_run": self._dry(request)}
        return self._submit(request, [("OP_GROUP_REMOVE", params)], "groups_name")

    async def _group_modify(self, request: web.Request) -> Any:
        rename = {
            "custom_ndparams": "ndparams",
            "custom_ipolicy": "ipolicy",
            "custom_diskparams": "diskparams",
        }
        params = await self._fill(request, {"group_name": request.match_info["name"]}, rename)
        return self._submit(request, [("OP_GROUP_SET_PARAMS", params)], "groups_name_modify")

    async def _group_rename(self, request: web.Request) -> Any:
        static = {"group_name": request.match_info["name"], "dry_run": self._dry(request)}
        return self._submit(
            request, [("OP_GROUP_RENAME", await self._fill(request, static))], "groups_name_rename"
        )

    async def _group_assign(self, request: web.Request) -> Any:
        static = {"group_name": request.match_info["name"], "dry_run": self._dry(request),
                  "force": self.app._flag(request, "force")}  # fmt: skip
        params = await self._fill(request, static)
        return self._submit(request, [("OP_GROUP_ASSIGN_NODES", params)], "groups_name_assign_nodes")

    # ------------------------------------------------------------------ networks

    async def _networks(self, request: web.Request) -> Any:
        nets = sorted(self.cluster.model.networks.values(), key=lambda n: n.name)
        if self.app._flag(request, "bulk"):
            return [network_view(self.cluster, net) for net in nets]
        return [{"name": net.name, "uri": f"/2/networks/{net.name}"} for net in nets]

    async def _network(self, request: web.Request) -> Any:
        net = self.cluster.model.networks.get(request.match_info["name"])
        if net is None:
            raise HTTPError(404)
        return network_view(self.cluster, net)

    async def _network_add(self, request: web.Request) -> Any:
        params = await self._fill(request, {"dry_run": self._dry(request)}, {"name": "network_name"})
        return self._submit(request, [("OP_NETWORK_ADD", params)], "networks")

    async def _network_remove(self, request: web.Request) -> Any:
        params = await self._fill(
            request, {"network_name": request.match_info["name"], "dry_run": self._dry(request)}
        )
        return self._submit(request, [("OP_NETWORK_REMOVE", params)], "networks_name")

    def _network_op(self, op_id: str, suffix: str, dry_run: bool) -> Callable[[web.Request], Awaitable[Any]]:
        async def handler(request: web.Request) -> Any:
            static: dict[str, Any] = {"network_name": request.match_info["name"]}
            if dry_run:
                static["dry_run"] = self._dry(request)
            return self._submit(
                request, [(op_id, await self._fill(request, static))], f"networks_name_{suffix}"
            )

        return handler

    # ------------------------------------------------------------------ nodes

    def _node_view(self, name: str) -> dict[str, Any]:
        for view in self.cluster.node_views():
            if view["name"] == name:
                return view
        raise HTTPError(404)

    async def _node_role(self, request: web.Request) -> Any:
        return _ROLES[str(self._node_view(request.match_info["name"])["role"])]

    async def _node_set_role(self, request: web.Request) -> Any:
        role = await self._raw(request)
        if not isinstance(role, str):
            raise HTTPError(400, "Invalid type for body contents: expected a string")
        flags: dict[str, bool | None] = {  # type: ignore[assignment]
            "regular": {"master_candidate": False, "offline": False, "drained": False},
            "master-candidate": {"master_candidate": True, "offline": None, "drained": None},
            "drained": {"master_candidate": None, "offline": None, "drained": True},
            "offline": {"master_candidate": None, "offline": True, "drained": None},
        }.get(role, {})
        if not flags:
            raise HTTPError(400, _esc(f"Can't set '{role}' role"))
        params = {"node_name": request.match_info["name"], **flags, "force": self.app._flag(request, "force"),
                  "auto_promote": bool(self._int(request, "auto-promote"))}  # fmt: skip
        return self._submit(request, [("OP_NODE_SET_PARAMS", params)], "nodes_name_role")

    async def _node_powercycle(self, request: web.Request) -> Any:
        static = {"node_name": request.match_info["name"], "force": self.app._flag(request, "force")}
        return self._submit(request, [("OP_NODE_POWERCYCLE", await self._fill(request, static))],
                            "nodes_name_powercycle")  # fmt: skip

    async def _node_evacuate(self, request: web.Request) -> Any:
        static = {"node_name": request.match_info["name"], "dry_run": self._dry(request)}
        return self._submit(
            request, [("OP_NODE_EVACUATE", await self._fill(request, static))], "nodes_name_evacuate"
        )

    async def _node_migrate(self, request: web.Request) -> Any:
        static = {"node_name": request.match_info["name"]}
        if request.query:  # the old style: live= or mode= in the query
            if "live" in request.query and "mode" in request.query:
                raise HTTPError(400, _esc("Only one of 'live' and 'mode' should be passed"))
            mode = ("live" if self._int(request, "live") else "non-live") if "live" in request.query else None
            params = {"mode": request.query.get("mode", mode)} | static
        else:
            params = await self._fill(request, static)
        return self._submit(request, [("OP_NODE_MIGRATE", params)], "nodes_name_migrate")

    async def _node_modify(self, request: web.Request) -> Any:
        params = await self._fill(request, {"node_name": request.match_info["name"]})
        return self._submit(request, [("OP_NODE_SET_PARAMS", params)], "nodes_name_modify")

    async def _node_storage(self, request: web.Request) -> Any:
        fields = request.query.get("output_fields")
        if not fields:
            raise HTTPError(400, "Missing the required &#x27;output_fields&#x27; parameter")
        params = {"nodes": [request.match_info["name"]], "storage_type": request.query.get("storage_type"),
                  "output_fields": fields.split(",")}  # fmt: skip
        return self._submit(request, [("OP_NODE_QUERY_STORAGE", params)], "nodes_name_storage")

    def _node_storage_change(self, op_id: str, suffix: str) -> Callable[[web.Request], Awaitable[Any]]:
        async def handler(request: web.Request) -> Any:
            name = request.query.get("name")
            if not name:
                raise HTTPError(400, "Missing the required &#x27;name&#x27; parameter")
            params: dict[str, Any] = {"node_name": request.match_info["name"],
                                      "storage_type": request.query.get("storage_type"), "name": name}  # fmt: skip
            if op_id == "OP_NODE_MODIFY_STORAGE":
                allocatable = {"allocatable": bool(self._int(request, "allocatable"))}
                params["changes"] = allocatable if "allocatable" in request.query else {}
            return self._submit(request, [(op_id, params)], f"nodes_name_storage_{suffix}")

        return handler

    # ------------------------------------------------------------------ instances

    async def _instance_info(self, request: web.Request) -> Any:
        params = {"instances": [request.match_info["name"]], "static": bool(self._int(request, "static"))}
        return self._submit(request, [("OP_INSTANCE_QUERY_DATA", params)], "instances_name_info")

    async def _console(self, request: web.Request) -> Any:
        inst = self.cluster.instances.get(request.match_info["name"])
        if inst is None:
            raise HTTPError(404)
        if not inst.oper_state:
            raise HTTPError(503, "Instance console unavailable")
        return console_view(inst)

    async def _reinstall(self, request: web.Request) -> Any:
        name = request.match_info["name"]
        body = await self._raw(request)
        if body is not _NO_BODY and body:
            if request.query:
                raise HTTPError(400, "Can&#x27;t combine query and body parameters")
        elif request.query:  # the legacy interface
            body = {"os": request.query.get("os"), "start": not self._int(request, "nostartup")}
        else:
            body = {}
        if not isinstance(body, dict):
            raise HTTPError(400, "Invalid body contents, not a dictionary")
        start = body.get("start", True)
        if not isinstance(start, bool):
            raise HTTPError(400, _esc("Invalid type for 'start': expected a boolean"))
        ops: list[tuple[str, dict[str, Any]]] = [
            ("OP_INSTANCE_SHUTDOWN", {"instance_name": name}),
            ("OP_INSTANCE_REINSTALL", {"instance_name": name, "os_type": body.get("os"),
                                       "osparams": body.get("osparams")}),
        ]  # fmt: skip
        if start:
            ops.append(("OP_INSTANCE_STARTUP", {"instance_name": name, "force": False}))
        # rlib2 builds these ops itself: no reason trail but each op's own, no dry_run
        prepared = [(op_id, {"dry_run": None} | params) for op_id, params in ops]
        return self.cluster.submit(prepared, resource="instances_name_reinstall", library_reason=False)

    async def _grow(self, request: web.Request) -> Any:
        try:
            disk = int(request.match_info["disk"])
        except ValueError:
            raise HTTPError(404) from None
        params = await self._fill(request, {"instance_name": request.match_info["name"], "disk": disk})
        return self._submit(request, [("OP_INSTANCE_GROW_DISK", params)], "instances_name_disk_grow")

    def _instance_op(
        self, op_id: str, suffix: str, args: dict[str, str], body: bool
    ) -> Callable[[web.Request], Awaitable[Any]]:
        rename = {"destination": "target_node"} if op_id == "OP_BACKUP_EXPORT" else None

        async def handler(request: web.Request) -> Any:
            static: dict[str, Any] = {"instance_name": request.match_info["name"]}
            for arg, kind in args.items():
                static[arg] = bool(self._int(request, arg)) if kind == "int" else request.query.get(arg)
            params = await self._fill(request, static, rename, body=body)
            return self._submit(request, [(op_id, params)], f"instances_name_{suffix.replace('-', '_')}")

        return handler

    # ------------------------------------------------------------------ queries

    def _resource(self, request: web.Request) -> str:
        resource = request.match_info["resource"]
        if resource not in QUERY_RESOURCES:
            message = (f"Failed to parse request: Cannot convert value '[\"{resource}\", [\"name\"], null]', error: "
                       f"Can't parse value '{resource}' as neitherQueryTypeLuxi nor QueryTypeOp")  # fmt: skip
            raise HTTPError(502, _esc(message))
        return resource

    async def _query(self, request: web.Request) -> Any:
        if "fields" not in request.query:
            raise HTTPError(400, "Missing &#x27;fields&#x27; query argument")
        fields = [name.strip() for name in request.query["fields"].split(",")]
        return await answer_query(self.cluster, self._resource(request), fields)

    async def _query_put(self, request: web.Request) -> Any:
        body = await self._raw(request)
        if not isinstance(body, dict):
            raise HTTPError(400, "Invalid body contents, not a dictionary")
        fields = body.get("fields")
        if fields is None:
            if "fields" not in request.query:
                raise HTTPError(400, "Missing &#x27;fields&#x27; query argument")
            fields = [name.strip() for name in request.query["fields"].split(",")]
        qfilter = body.get("qfilter", body.get("filter"))
        return await answer_query(self.cluster, self._resource(request), [str(f) for f in fields], qfilter)

    async def _query_fields(self, request: web.Request) -> Any:
        raw = request.query.get("fields")
        fields = None if raw is None else [name.strip() for name in raw.split(",")]
        return query_fields(self._resource(request), fields)
