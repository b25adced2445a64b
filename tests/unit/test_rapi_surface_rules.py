"""RapiClient's calls beyond Ganeti's client: arguments refused before sending, the retry rules of the
new calls (a write is never sent twice blindly), the table of ``docs/rapi-client.md``, the exports.

The calls themselves, and what each sends, are in ``test_rapi_surface.py`` (``CASES``).
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import pytest
from aiohttp import web

import synnefo_ganeti.rapi
from synnefo_ganeti import ConfigError, InvalidError, RapiClient, TransportError, UnavailableError
from synnefo_ganeti.rapi import FilterRule, Group, InstanceConsole, Network, QueryField, QueryResult
from tests.helpers import StubRapi, ganeti_error, json_response, rapi_fixture, stub_client
from tests.unit.test_rapi_surface import CASES, INST, Case

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "rapi-client.md"
GANETI_CLIENT = Path("/usr/share/ganeti/3.0/ganeti/rapi/client.py")
GANETI_SRC_CLIENT = Path("/work/ganeti-src/root/usr/share/ganeti/3.0/ganeti/rapi/client.py")

# -- refused before sending ------------------------------------------------------------------------------

BAD_CALLS: list[tuple[str, Callable[[RapiClient], Awaitable[Any]], str]] = [
    ("unknown role", lambda c: c.set_node_role("n1", cast(Any, "boss")), "role must be one of drained, master-candidate"),
    ("master role", lambda c: c.set_node_role("n1", "master"), "master-failover"),
    ("tags as a string", lambda c: c.add_instance_tags("vm1", "abc"), "list of strings"),
    ("no tags", lambda c: c.delete_node_tags("n1", []), "at least one tag"),
    ("unknown query resource", lambda c: c.query("vms", ["name"]), "query resource must be one of"),
    ("no query fields", lambda c: c.query("node", []), "at least one field"),
    ("iallocator and remote node", lambda c: c.evacuate_node("n1", iallocator="hail", remote_node="n2"),
     "not both"),
    ("unknown evacuation mode", lambda c: c.evacuate_node("n1", mode="some"), "evacuation mode"),
    ("unknown migration mode", lambda c: c.migrate_instance("vm1", mode="fast"), "migration mode"),
    ("unknown replace mode", lambda c: c.replace_instance_disks("vm1", mode="replace_all"), "replace-disks mode"),
    ("unknown export mode", lambda c: c.prepare_export("vm1", "cloud"), "export mode"),
    ("unknown storage type", lambda c: c.repair_node_storage_units("n1", "zfs", "tank"), "storage_type"),
    ("unknown alloc policy", lambda c: c.create_group("g", alloc_policy="sometimes"), "alloc_policy"),
    ("unknown network mode", lambda c: c.connect_network("net1", "default", "nat", "br0"), "network mode"),
    ("negative disk", lambda c: c.grow_instance_disk("vm1", -1, 10), "disk must be an index"),
    ("no growth", lambda c: c.grow_instance_disk("vm1", 0, 0), "amount must be > 0"),
    ("empty modify", lambda c: c.modify_group("g"), "at least one parameter"),
    ("empty name", lambda c: c.get_group(""), "group name is empty"),
    ("no instances", lambda c: c.instances_multi_alloc([]), "at least one instance"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("call", "message"), [(c, m) for _, c, m in BAD_CALLS], ids=[i for i, _, _ in BAD_CALLS]
)
async def test_bad_arguments_are_refused_before_anything_is_sent(
    call: Callable[[RapiClient], Awaitable[Any]], message: str
) -> None:
    async with StubRapi() as stub, stub_client(stub.url) as rapi:
        with pytest.raises(ConfigError, match=re.escape(message)) as caught:
            await call(rapi)
    assert isinstance(caught.value, InvalidError)
    assert stub.seen == []


# -- retries ----------------------------------------------------------------------------------------------


async def _drop_connection(request: web.Request) -> web.StreamResponse:
    await request.read()
    assert request.transport is not None
    request.transport.close()
    await asyncio.sleep(0.05)  # the handler outlives the closed connection, as a busy server's does
    return web.Response()


WRITES = [
    c for c in CASES if c.ganeti in {"SetNodeRole", "AddInstanceTags", "CreateGroup", "InstancesMultiAlloc",
                                     "EvacuateNode", "DeleteNetwork", "ModifyCluster", "DeleteFilter"}
]  # fmt: skip


@pytest.mark.parametrize("case", WRITES, ids=[case.ganeti for case in WRITES])
async def test_a_write_whose_connection_broke_after_sending_is_not_sent_again(case: Case) -> None:
    async with StubRapi() as stub:
        stub.route(case.method, case.path, _drop_connection)
        async with stub_client(stub.url) as rapi:
            with pytest.raises(TransportError) as caught:
                await case.call(rapi)
    assert caught.value.maybe_sent
    assert len(stub.seen) == 1  # Ganeti may hold the job: never a blind second one


@pytest.mark.parametrize("case", WRITES, ids=[case.ganeti for case in WRITES])
async def test_a_write_refused_with_503_is_sent_again(case: Case) -> None:
    answers = [503, 200]

    async def handler(_request: web.Request) -> web.StreamResponse:
        return ganeti_error(503, "Job queue is full") if answers.pop(0) == 503 else json_response(case.answer)

    async with StubRapi() as stub:
        stub.route(case.method, case.path, handler)
        async with stub_client(stub.url) as rapi:
            assert case.check(await case.call(rapi))
    assert len(stub.seen) == 2


READS = [c for c in CASES if c.ganeti in {"Query", "GetNodeStorageUnits", "GetGroups", "GetInstanceConsole"}]


@pytest.mark.parametrize("case", READS, ids=[case.ganeti for case in READS])
async def test_a_read_whose_connection_broke_is_retried(case: Case) -> None:
    calls = 0

    async def handler(request: web.Request) -> web.StreamResponse:
        nonlocal calls
        calls += 1
        return await _drop_connection(request) if calls == 1 else json_response(case.answer)

    async with StubRapi() as stub:
        stub.route(case.method, case.path, handler)
        async with stub_client(stub.url) as rapi:
            assert case.check(await case.call(rapi))
    assert calls == 2


# -- the table of docs/rapi-client.md ----------------------------------------------------------------------


def _doc_rows() -> list[list[str]]:
    text = DOC.read_text()
    section = text.split("## Every method of Ganeti's client", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if re.match(r"\|\s*\d+\s*\|", line)]
    return [[cell.strip().strip("`") for cell in row.strip().strip("|").split("|")] for row in rows]


#: methods of Ganeti 3.1's client that 3.0's lacks (the table's rows after the 81 of 3.0)
GANETI_31_ONLY = {"RenameNetwork"}


def test_the_docs_table_lists_all_81_methods_each_mapped_to_a_method_of_ours() -> None:
    rows = _doc_rows()
    assert len(rows) == 81 + len(GANETI_31_ONLY)
    ganeti = [row[1] for row in rows]
    assert len(set(ganeti)) == len(rows) and set(ganeti[81:]) == GANETI_31_ONLY
    for _, name, request, ours, _returns in rows:
        method = getattr(RapiClient, ours, None)
        assert method is not None, f"{name}: RapiClient has no {ours}"
        if ours != "instance_allocation":  # the one that sends nothing
            assert inspect.iscoroutinefunction(method), ours
            assert request.split()[0] in {"GET", "PUT", "POST", "DELETE"}, (name, request)


def test_the_docs_table_says_what_each_call_sends() -> None:
    by_name = {row[1]: row for row in _doc_rows()}
    for case in CASES:
        request = by_name[case.ganeti][2]
        method, path = request.split()[0], request.split()[1].split("?")[0].split("[")[0]
        pattern = re.sub(r"NAME|UUID|ID|WHAT|N(?=/)", "[^/]+", re.escape(path).replace(r"\-", "-"))
        assert method == case.method and re.fullmatch(pattern, case.path), (case.ganeti, request, case.path)


def test_every_method_of_ganetis_client_is_covered() -> None:
    """Against Ganeti 3.0's client itself where it is installed; else the table's 81 names stand (and
    3.1's ``RenameNetwork``)."""
    source = next((path for path in (GANETI_CLIENT, GANETI_SRC_CLIENT) if path.exists()), None)
    documented = sorted(row[1] for row in _doc_rows())
    tested = {case.ganeti for case in CASES} | {"AddFilter", "ReplaceFilter", "InstanceAllocation",
                                                "WaitForJobCompletion"}  # fmt: skip
    assert sorted(tested) == documented  # each one has its test here
    of_30 = sorted(set(documented) - GANETI_31_ONLY)
    if source is None:
        assert len(of_30) == 81
        return
    tree = ast.parse(source.read_text())
    (cls,) = [
        node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "GanetiRapiClient"
    ]
    names = [f.name for f in cls.body if isinstance(f, ast.FunctionDef) and not f.name.startswith("_")]
    assert sorted(names) == of_30


async def test_the_console_of_a_stopped_instance_is_not_asked_again() -> None:
    async def stopped(_request: web.Request) -> web.StreamResponse:
        return ganeti_error(503, "Instance console unavailable", "Service Unavailable")

    async with StubRapi() as stub:
        stub.route("GET", f"{INST}/console", stopped)
        async with stub_client(stub.url) as rapi:
            with pytest.raises(UnavailableError, match="Instance console unavailable"):
                await rapi.get_instance_console("vm1.ganeti.test")
    assert len(stub.seen) == 1


def test_the_new_models_are_exported_from_the_rapi_package() -> None:
    new = {"FilterRule", "Group", "InstanceConsole", "Network", "NodeRole", "QueryField", "QueryResult"}
    assert new <= set(synnefo_ganeti.rapi.__all__)
    assert all(getattr(synnefo_ganeti.rapi, name) is not None for name in new)


# -- real answers --------------------------------------------------------------------------------------------

RECORDED: list[tuple[str, Callable[[Any], Any]]] = [
    ("group.json", Group.model_validate),
    ("groups_bulk.json", lambda data: [Group.model_validate(item) for item in data]),
    ("filter.json", FilterRule.model_validate),
    ("filters_bulk.json", lambda data: [FilterRule.model_validate(item) for item in data]),
    ("instance_console.json", InstanceConsole.model_validate),
    ("network_connected.json", Network.model_validate),
    ("networks_bulk.json", lambda data: [Network.model_validate(item) for item in data]),
    ("query_instance.json", QueryResult.model_validate),
    ("query_instance_put_filter.json", QueryResult.model_validate),
    ("query_node_fields.json", lambda data: [QueryField.model_validate(item) for item in data["fields"]]),
]


@pytest.mark.parametrize(("name", "parse"), RECORDED, ids=[name for name, _ in RECORDED])
def test_real_ganeti_answers_parse_into_the_models(name: str, parse: Callable[[Any], Any]) -> None:
    """Answers recorded from a real Ganeti 3.0.2 (tests/fixtures/ganeti-3.0-rapi/README.md)."""
    parsed = parse(rapi_fixture(name))
    assert parsed


def test_a_real_query_answer_reads_as_rows() -> None:
    result = QueryResult.model_validate(rapi_fixture("query_instance_put_filter.json"))
    assert result.rows == [{"name": "fx-a.ganeti.test", "status": "running"}]
    console = InstanceConsole.model_validate(rapi_fixture("instance_console.json"))
    assert console.kind == "msg" and console.host is None


async def test_features_of_a_server_without_the_resource_are_none() -> None:
    """Ganeti's client: ``GetFeatures`` answers [] when the server has no /2/features (404)."""

    async def missing(_request: web.Request) -> web.Response:
        return ganeti_error(404, "Not Found")

    async with StubRapi() as stub, stub_client(stub.url) as rapi:
        stub.route("GET", "/2/features", missing)
        assert await rapi.features() == []
        assert await rapi.features() == []  # asked once per client
    assert [seen.path for seen in stub.seen] == ["/2/features"]
