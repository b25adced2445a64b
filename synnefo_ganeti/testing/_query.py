"""``/2/query/RESOURCE`` and ``/2/query/RESOURCE/fields`` as Ganeti 3.0 answers them.

Jobs are queried field by field below. The other resources (instance, node, group,
network, filter, lock, export) take their field definitions from the ones recorded from
Ganeti 3.0 (data/query_fields.json) and their values from the fake's RAPI views; a field
Ganeti knows but the fake does not compute is ``RS_NODATA`` (2) with ``null``.

Instances: the fields the reconciler asks for (and ``be/NAME``, each filled backend
parameter, as ``query._GetInstanceParameterFields``) are computed from the instance alone,
not from its whole bulk view: a query of a few fields over thousands of instances costs the
fake what it costs Ganeti, a little per field. ``beparams`` is the filled parameters
(``ctx.inst_beparams``), without the ``memory`` that only ``GET /2/instances`` adds
(``rlib2._UpdateBeparams``).

Nodes Ganeti reads no live data from (offline, or crashed: ``FakeNode.live``): a node's live
fields (``query._NODE_LIVE_FIELDS``) are ``RS_OFFLINE`` (4) for an offline node and
``RS_NODATA`` (2) for one that does not answer (``_GetLiveNodeField``); an instance on such a
node has ``status`` ``ERROR_nodeoffline``/``ERROR_nodedown`` (``_GetInstStatus``) and its live
fields (``oper_state``, ``oper_ram``, ``oper_vcpus``) ``RS_NODATA`` (``_GetInstOperState``,
``_GetInstLiveData``; on an offline node ``oper_ram`` and ``oper_vcpus`` are ``RS_OFFLINE``, as
luxid answered), as recorded in tests/fixtures/ganeti-3.0-nodefail.

The answer is ``objects.QueryResponse.ToDict()`` (``rapi/rlib2.py`` ``R_2_query``): the
field definitions (``name``, ``title``, ``kind``, ``doc`` from ``query._BuildJobFields``)
and, per job in id order, each field as ``[status, value]`` (``RS_NORMAL`` 0; an unknown
field is ``RS_UNKNOWN`` 1 with ``null``, its kind ``unknown``). ``opstart`` is each op's
``start_timestamp`` (before acquiring locks), ``opexec`` its ``exec_timestamp`` (after).
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from synnefo_ganeti._gc import gc_paused
from synnefo_ganeti.testing import _opcodes
from synnefo_ganeti.testing._cluster import instance_status
from synnefo_ganeti.testing._errors import HTTPError
from synnefo_ganeti.testing._node_faults import wait_for_live_data
from synnefo_ganeti.testing._views import filter_view, group_view, network_view

if TYPE_CHECKING:
    from synnefo_ganeti.testing._cluster import FakeInstance, FakeNode
    from synnefo_ganeti.testing._engine import FakeCluster
    from synnefo_ganeti.testing._jobs import FakeJob

__all__ = ["QUERY_RESOURCES", "answer_query", "query", "query_fields", "query_jobs", "query_json"]

_Getter = Callable[["FakeJob"], Any]
_TS = "(tuple containing seconds and microseconds)"
# name -> (title, kind, doc, value), as query._BuildJobFields
_JOB_FIELDS: dict[str, tuple[str, str, str, _Getter]] = {
    "id": ("ID", "number", "Job ID", lambda j: j.id),
    "status": ("Status", "text", "Job status", lambda j: j.status.value),
    "priority": ("Priority", "number", "Current job priority (19 to -20)", lambda j: 0),
    "archived": ("Archived", "bool", "Whether job is archived", lambda j: j.archived),
    "ops": ("OpCodes", "other", "List of all opcodes", lambda j: [op.input for op in j.ops]),
    "opresult": ("OpCode_result", "other", "List of opcodes results", lambda j: [op.result for op in j.ops]),
    "opstatus": ("OpCode_status", "other", "List of opcodes status", lambda j: [op.status.value for op in j.ops]),
    "oplog": ("OpCode_log", "other", "List of opcode output logs", lambda j: [op.log for op in j.ops]),
    "opstart": ("OpCode_start", "other", "List of opcode start timestamps (before acquiring locks)",
                lambda j: [op.start_timestamp for op in j.ops]),
    "opexec": ("OpCode_exec", "other", "List of opcode execution start timestamps (after acquiring locks)",
               lambda j: [op.exec_timestamp for op in j.ops]),
    "opend": ("OpCode_end", "other", "List of opcode execution end timestamps",
              lambda j: [op.end_timestamp for op in j.ops]),
    "oppriority": ("OpCode_prio", "other", "List of opcode priorities", lambda j: [0 for _ in j.ops]),
    "summary": ("Summary", "other", "List of per-opcode summaries",
                lambda j: [_opcodes.summary(op.input) for op in j.ops]),
    "received_ts": ("Received", "other", f"Timestamp of when job was received {_TS}",
                    lambda j: j.received_timestamp),
    "start_ts": ("Start", "other", f"Timestamp of job start {_TS}", lambda j: j.start_timestamp),
    "end_ts": ("End", "other", f"Timestamp of job end {_TS}", lambda j: j.end_timestamp),
}  # fmt: skip


def query_jobs(cluster: FakeCluster, fields: list[str]) -> dict[str, Any]:
    """``QueryResponse.ToDict()`` of a job query for ``fields`` over the jobs still in the queue."""
    defs: list[dict[str, Any]] = []
    for name in fields:
        title, kind, doc, _ = _JOB_FIELDS.get(name, (name, "unknown", f"Unknown field '{name}'", _unknown))
        defs.append({"name": name, "title": title, "kind": kind, "doc": doc})
    data = [
        [[0, _JOB_FIELDS[name][3](job)] if name in _JOB_FIELDS else [1, None] for name in fields]
        for job in sorted(cluster.jobs.values(), key=lambda j: j.id)
        if not job.archived
    ]
    return {"fields": defs, "data": data}


def _unknown(job: FakeJob) -> None:
    return None


_DEFS: dict[str, list[dict[str, Any]]] = json.loads(
    (Path(__file__).parent / "data" / "query_fields.json").read_text()
)
#: the resources ``/2/query`` serves (``constants.QR_VIA_RAPI``)
QUERY_RESOURCES = ("export", "filter", "group", "instance", "job", "lock", "network", "node")


def _definition(resource: str, name: str) -> dict[str, Any]:
    if resource == "job" and name in _JOB_FIELDS:
        title, kind, doc, _ = _JOB_FIELDS[name]
        return {"name": name, "title": title, "kind": kind, "doc": doc}
    for item in _DEFS.get(resource, []):
        if item["name"] == name:
            return dict(item)
    return {"name": name, "title": name, "kind": "unknown", "doc": f"Unknown field '{name}'"}


def query_fields(resource: str, fields: list[str] | None) -> dict[str, Any]:
    """``GET /2/query/RESOURCE/fields``: ``QueryFieldsResponse.ToDict()``."""
    if fields is None:
        return {"fields": [dict(item) for item in _DEFS[resource]]}
    return {"fields": [_definition(resource, name) for name in fields]}


_InstGetter = Callable[["FakeInstance", str], Any]


def _be_param(name: str) -> _InstGetter:
    return lambda inst, _: inst.beparams.get(name) if name != "memory" else None


def _status(inst: FakeInstance) -> str:
    """``status`` as ``instance_view`` (``query._GetInstStatus`` for a node that answers)."""
    if inst.admin_state == "up":
        return "running" if inst.oper_state else "ERROR_down"
    return "ERROR_up" if inst.oper_state else "ADMIN_down"


#: ``constants.BES_PARAMETER_COMPAT``: ``be/memory`` is served too (the filled parameters
#: have no ``memory``: ``null``, as ``_GetInstBeParam`` gives)
_BE_FIELDS = ("always_failover", "auto_balance", "maxmem", "memory", "minmem", "spindle_use", "vcpus")
#: instance fields computed from the instance alone; each equals its key in ``instance_view``
#: (tests/unit/test_reconcile_query.py checks it)
_INSTANCE_FIELDS: dict[str, _InstGetter] = {
    "name": lambda i, _: i.name,
    "admin_state": lambda i, _: i.admin_state,
    "oper_state": lambda i, _: i.oper_state,
    "status": lambda i, _: _status(i),
    "os": lambda i, _: i.os,
    "pnode": lambda i, _: i.pnode,
    "disk_template": lambda i, _: i.disk_template,
    "tags": lambda i, _: list(i.tags),
    "nic.macs": lambda i, _: [nic["mac"] for nic in i.nics],
    "nic.ips": lambda i, _: [nic.get("ip") for nic in i.nics],
    "nic.modes": lambda i, _: [nic.get("mode", "bridged") for nic in i.nics],
    "nic.links": lambda i, link: [nic.get("link", link) for nic in i.nics],
    "nic.networks": lambda i, _: [nic.get("network_uuid", nic.get("network")) for nic in i.nics],
    "nic.networks.names": lambda i, _: [nic.get("network") for nic in i.nics],
    "disk.sizes": lambda i, _: [int(d["size"]) for d in i.disks],
    "disk.uuids": lambda i, _: [d["uuid"] for d in i.disks],
    "beparams": lambda i, _: {k: v for k, v in i.beparams.items() if k != "memory"},
    "uuid": lambda i, _: i.uuid,
    "serial_no": lambda i, _: i.serial_no,
} | {f"be/{name}": _be_param(name) for name in _BE_FIELDS}


RS_NODATA, RS_OFFLINE = 2, 4  # constants.RS_NODATA, RS_OFFLINE
#: an instance's fields read from its primary node (``_GetInstOperState``, ``_GetInstLiveData``)
INSTANCE_LIVE_FIELDS = frozenset({"oper_state", "oper_ram", "oper_vcpus"})
#: a node's live fields (``query._NODE_LIVE_FIELDS``)
NODE_LIVE_FIELDS = frozenset({"bootid", "cnodes", "cnos", "csockets", "ctotal", "dfree", "dtotal", "spfree",
                              "sptotal", "mfree", "mnode", "mtotal"})  # fmt: skip
_LIVE_BY_RESOURCE = {"instance": INSTANCE_LIVE_FIELDS | {"status"}, "node": NODE_LIVE_FIELDS}
#: a row's key naming its fields without live data: field -> ``RS_NODATA`` or ``RS_OFFLINE``
_NO_DATA = "\0no-data"


def _cell_on_bad_node(
    name: str, get: _InstGetter, inst: FakeInstance, link: str, node: FakeNode
) -> list[Any]:
    """One cell of an instance whose primary node gives no live data (offline or crashed)."""
    if name == "status":
        return [0, instance_status(inst, node)]
    if name in INSTANCE_LIVE_FIELDS:
        return [_instance_no_data(name, node), None]
    return [0, get(inst, link)]


def _instance_no_data(name: str, node: FakeNode) -> int:
    """The status of a live field of an instance on ``node`` (offline or crashed): as the lab's
    luxid answered, ``oper_state`` is always ``RS_NODATA``, the others ``RS_OFFLINE`` on an
    offline node (tests/fixtures/ganeti-3.0-nodefail/query_instance_live_offline.json)."""
    return RS_OFFLINE if node.offline and name != "oper_state" else RS_NODATA


def _instance_data(cluster: FakeCluster, fields: list[str], qfilter: Any) -> list[list[list[Any]]] | None:
    """The rows of an instance query from ``_INSTANCE_FIELDS``; None when a field needs the whole view."""
    if any(name not in _INSTANCE_FIELDS for name in fields) or (
        qfilter and any(name not in _INSTANCE_FIELDS for name in _filter_fields(qfilter))
    ):
        return None
    link = cluster.link
    getters = [_INSTANCE_FIELDS[name] for name in fields]
    bad = {name: node for name, node in cluster.nodes.items() if not node.live}  # mostly none
    named = list(zip(fields, getters, strict=True))
    data = []
    names = requested_names(qfilter)
    if names is None:
        insts = sorted(cluster.instances.values(), key=lambda i: i.name)
    else:  # only the instances named (luxid's Query.Filter requestedNames): no scan of all
        missing = sorted(name for name in names if name not in cluster.instances)
        if missing:
            # luxid looks each requested name up and fails the whole query on an unknown one
            # (seen on the real lab: HTTP 500, "('Instance name X not found', 'unknown_entity')")
            raise HTTPError(
                500, f"(&#x27;Instance name {missing[0]} not found&#x27;, &#x27;unknown_entity&#x27;)"
            )
        insts = [cluster.instances[name] for name in sorted(names)]
    for inst in insts:
        node = bad.get(inst.pnode) if bad else None
        if qfilter and not _matches(_filter_row(inst, link, node, qfilter), qfilter):
            continue
        if node is None:
            data.append([[0, get(inst, link)] for get in getters])
        else:
            data.append([_cell_on_bad_node(name, get, inst, link, node) for name, get in named])
    return data


def _filter_row(inst: FakeInstance, link: str, node: FakeNode | None, qfilter: Any) -> dict[str, Any]:
    """The values a filter reads of ``inst`` (no live data where ``node`` gives none)."""
    row = {}
    for name in _filter_fields(qfilter):
        row[name] = _INSTANCE_FIELDS[name](inst, link) if node is None else _cell_on_bad_node(
            name, _INSTANCE_FIELDS[name], inst, link, node)[1]  # fmt: skip
    return row


def requested_names(qfilter: Any) -> set[str] | None:
    """The names a filter of ``=`` on ``name`` (alone or or-ed) selects; None for any other
    filter. Ganeti looks only those items up (``requestedNames`` in luxid's
    ``Ganeti.Query.Filter``, ``RequestedNames`` in ``lib/query.py``)."""
    if not isinstance(qfilter, list) or not qfilter:
        return None
    op, *args = qfilter
    if op in ("=", "==") and len(args) == 2 and args[0] == "name" and isinstance(args[1], str):
        return {args[1]}
    if op == "|" and args:
        names: set[str] = set()
        for arg in args:
            found = requested_names(arg)
            if found is None:
                return None
            names |= found
        return names
    return None


def _filter_fields(qfilter: Any) -> set[str]:
    """The field names a ``qlang`` filter reads."""
    if not isinstance(qfilter, list) or not qfilter:
        return set()
    op, *args = qfilter
    if op in ("&", "|", "!"):
        return set().union(*(_filter_fields(arg) for arg in args))
    return {args[0]} if args and isinstance(args[0], str) else set()


def _rows(cluster: FakeCluster, resource: str) -> list[dict[str, Any]]:
    model = cluster.model
    if resource == "instance":
        # the bulk view, with what only the query serves (be/NAME) and its own beparams
        link = cluster.link
        insts = sorted(cluster.instances.values(), key=lambda i: i.name)
        rows = [
            view | {name: get(inst, link) for name, get in _INSTANCE_FIELDS.items() if name not in view or name == "beparams"}
            for view, inst in zip(cluster.instance_views(), insts, strict=True)
        ]  # fmt: skip
        for row, inst in zip(rows, insts, strict=True):
            node = cluster.nodes.get(inst.pnode)
            if node is not None and not node.live:
                row[_NO_DATA] = {name: _instance_no_data(name, node) for name in INSTANCE_LIVE_FIELDS}
        return rows
    if resource == "node":
        rows = sorted(cluster.node_views(), key=lambda v: str(v["name"]))
        for row in rows:
            node = cluster.nodes.get(str(row["name"]))
            if node is not None and not node.live:
                row[_NO_DATA] = dict.fromkeys(NODE_LIVE_FIELDS, RS_OFFLINE if node.offline else RS_NODATA)
        return rows
    if resource == "group":
        return [group_view(cluster, g) for g in sorted(model.groups.values(), key=lambda g: g.name)]
    if resource == "network":
        return [network_view(cluster, n) for n in sorted(model.networks.values(), key=lambda n: n.name)]
    if resource == "filter":
        return [filter_view(f) for f in sorted(model.filters.values(), key=lambda f: (f.priority, f.uuid))]
    if resource == "export":
        return [{"node": node, "export": name} for name, node in sorted(model.exports.items())]
    return []  # lock: none held between jobs


def _matches(row: dict[str, Any], qfilter: Any) -> bool:
    """``qlang`` filters: ``&``, ``|``, ``!``, ``=``, ``!=``, ``=~``, ``<``, ``>``, ``<=``, ``>=``, ``=[]``, ``?``."""
    if not qfilter:
        return True
    op, *args = qfilter
    if op == "&":
        return all(_matches(row, arg) for arg in args)
    if op == "|":
        return any(_matches(row, arg) for arg in args)
    if op == "!":
        return not _matches(row, args[0])
    if op == "?":
        return bool(row.get(args[0]))
    value, wanted = row.get(args[0]), args[1]
    if op in ("=", "=="):
        return bool(value == wanted)
    if op == "!=":
        return bool(value != wanted)
    if op == "=~":
        return value is not None and re.search(str(wanted), str(value)) is not None
    if op == "=[]":
        return isinstance(value, list) and wanted in value
    compare: dict[str, Callable[[Any, Any], bool]] = {
        "<": lambda a, b: a < b, ">": lambda a, b: a > b, "<=": lambda a, b: a <= b, ">=": lambda a, b: a >= b,
    }  # fmt: skip
    return value is not None and op in compare and compare[op](value, wanted)


def query(cluster: FakeCluster, resource: str, fields: list[str], qfilter: Any = None) -> dict[str, Any]:
    """``GET``/``PUT /2/query/RESOURCE``: ``QueryResponse.ToDict()``.

    Built with the cyclic garbage collector paused: an answer of thousands of items is made
    of small acyclic lists, and the collections they set off (full ones included, over the
    whole fake cluster) cost more than the answer (2,000 instances: ~45 µs an instance with
    the collector, ~6 without; benchmarks/reconcile.py runs 50 such fakes on two CPUs)."""
    with gc_paused():
        return _query(cluster, resource, fields, qfilter)


async def answer_query(cluster: FakeCluster, resource: str, fields: list[str], qfilter: Any = None) -> bytes:
    """:func:`query_json`, once Ganeti would have read the live data the fields need: a crashed
    node makes that wait its RPC timeout (``_node_faults.wait_for_live_data``)."""
    if cluster.model.version.posix_regex:
        _refuse_perl_groups(resource, fields, qfilter)
    live = _LIVE_BY_RESOURCE.get(resource, frozenset())
    if any(name in live for name in fields):
        await wait_for_live_data(cluster)
    return query_json(cluster, resource, fields, qfilter)


def _patterns(qfilter: Any) -> list[str]:
    if not isinstance(qfilter, list) or not qfilter:
        return []
    op, *args = qfilter
    if op in ("&", "|", "!"):
        return [pattern for arg in args for pattern in _patterns(arg)]
    return [str(args[1])] if op == "=~" and len(args) == 2 else []


def _refuse_perl_groups(resource: str, fields: list[str], qfilter: Any) -> None:
    """Ganeti 3.1's luxid (``Text.Regex.TDFA``) fails the whole query on a ``(?`` in a pattern: a
    502 whose message quotes the request and the parser's complaint (as the 3.1 lab answered)."""
    for pattern in _patterns(qfilter):
        at = pattern.find("(?")
        if at < 0:
            continue
        request = json.dumps([resource, fields, qfilter])
        message = (
            f"Failed to parse request: Cannot convert value '{request}', error: parseRegex for "
            f'Text.Regex.TDFA.String failed:"{pattern}" (line 1, column {at + 2}):\nunexpected "?"\n'
            "expecting empty () or anchor ^ or $ or an atom"
        )
        raise HTTPError(502, html.escape(message, quote=True))


def query_json(cluster: FakeCluster, resource: str, fields: list[str], qfilter: Any = None) -> bytes:
    """:func:`query`'s answer as its JSON text: built, dumped and let go with the collector
    paused. Let go while it was still alive, the collector scanned the answer's ~56,000
    small lists at its first allocation after (~3 ms an answer of 2,000 instances, a third
    of it); let go before, they are no longer counted."""
    with gc_paused():
        return orjson.dumps(_query(cluster, resource, fields, qfilter))


def _query(cluster: FakeCluster, resource: str, fields: list[str], qfilter: Any) -> dict[str, Any]:
    if resource == "job":
        answer = query_jobs(cluster, fields)
        if qfilter:
            jobs = [job for job in sorted(cluster.jobs.values(), key=lambda j: j.id) if not job.archived]
            keep = [
                _matches({name: _JOB_FIELDS[name][3](job) for name in _JOB_FIELDS}, qfilter) for job in jobs
            ]
            answer["data"] = [row for row, wanted in zip(answer["data"], keep, strict=True) if wanted]
        return answer
    known = {item["name"] for item in _DEFS[resource]}
    defs = [_definition(resource, name) for name in fields]
    fast = _instance_data(cluster, fields, qfilter) if resource == "instance" else None
    if fast is not None:
        return {"fields": defs, "data": fast}
    data = [
        [_cell(row, name, known) for name in fields]
        for row in _rows(cluster, resource)
        if _matches(row, qfilter)
    ]
    return {"fields": defs, "data": data}


def _cell(row: dict[str, Any], name: str, known: set[str]) -> list[Any]:
    """``[status, value]``: ``RS_NORMAL`` with the row's value, the row's own status for a field
    without live data, ``RS_NODATA`` for a field Ganeti knows and the fake lacks, else ``RS_UNKNOWN``."""
    if name in row:
        missing = row.get(_NO_DATA)
        if missing is not None and name in missing:
            return [missing[name], None]
        return [0, row[name]]
    return [RS_NODATA, None] if name in known else [1, None]
