"""The RAPI client knows each backend's Ganeti version and sends only what that version takes.

``GanetiVersion`` parsing and order (the ``software_version`` strings of the recorded ``/2/info``
answers); then, against a small aiohttp server that answers ``/2/info`` as each recorded Ganeti
(3.0.2: ``tests/fixtures/ganeti-3.0-rapi/info.json``; 3.1.0~rc2:
``tests/fixtures/ganeti-3.1-rapi/GET_info.json``; 2.16.2 and 2.9.0: the 3.0 answer with their
version) and refuses ``hotplug_if_possible`` with 3.1's recorded 400, the body each call sends;
the version read once, and again after a lost connection (a restarted ganeti-rapi) or a new master
seen in ``/2/info``; ``rename_network`` refused before 3.1 and sent on 3.1.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from synnefo_ganeti import (
    BadRequestError,
    GanetiVersion,
    InvalidError,
    RapiClient,
    RapiConnectionError,
    RapiError,
    RapiTimeoutError,
    UnsupportedError,
)
from synnefo_ganeti.rapi._versions import VersionCache
from tests.helpers import FAST_RETRY, FIXTURES, rapi_fixture, spec

V31 = FIXTURES / "ganeti-3.1-rapi"


def record(name: str) -> Any:
    """A recorded 3.1 answer: ``{"status": ..., "body": ..., ["job": ...]}``."""
    return orjson.loads((V31 / name).read_bytes())


INFO_30: dict[str, Any] = rapi_fixture("info.json")
INFO_31: dict[str, Any] = record("GET_info.json")["body"]
REFUSED_31 = record("PUT_instance_modify.json")["hotplug_if_possible"]  # 400, as 3.1 answered it
RENAME_31 = record("PUT_network_rename.json")  # 200 and a job id
NOT_FOUND = {"code": 404, "message": "Not Found", "explain": "Nothing matches the given URI"}  # 3.0's


def info_of(version: str, master: str | None = None) -> dict[str, Any]:
    """``/2/info`` as that Ganeti answers it: the recorded answer of its series (3.1 or 3.0; the 3.0
    one, with its version, for older ones: 2.16 was not recorded)."""
    base = INFO_31 if version.startswith("3.1") else INFO_30
    return {**base, "software_version": version, **({"master": master} if master else {})}


# -- the version itself ------------------------------------------------------------------------------


def test_the_recorded_versions_parse() -> None:
    v30 = GanetiVersion.parse(INFO_30["software_version"])
    v31 = GanetiVersion.parse(INFO_31["software_version"])
    assert (v30.major, v30.minor, v30.patch, v30.suffix, v30.text) == (3, 0, 2, "", "3.0.2")
    assert (v31.major, v31.minor, v31.patch, v31.suffix, v31.text) == (3, 1, 0, "~rc2", "3.1.0~rc2")
    assert str(v31) == "3.1.0~rc2" and repr(v31) == "GanetiVersion('3.1.0~rc2')"
    assert v31.is_prerelease and not v30.is_prerelease
    assert GanetiVersion.parse("2.16.2") == GanetiVersion(2, 16, 2)
    assert GanetiVersion.parse(" 3.1 ").text == "3.1" and GanetiVersion.parse("3.1").patch == 0


@pytest.mark.parametrize("text", ["", "3", "three.one", "v3.1.0", "3.x.0", "3.1.0 beta"])
def test_text_that_is_no_version_is_refused(text: str) -> None:
    with pytest.raises(InvalidError, match="not a Ganeti version"):
        GanetiVersion.parse(text)


def test_versions_order_as_releases() -> None:
    texts = ["3.1.1", "3.1.0", "2.16.2", "3.1.0~rc10", "3.0.2", "3.1.0~rc2", "2.9.0", "3.1.0~beta1", "2.16.0"]
    ordered = sorted(GanetiVersion.parse(t) for t in texts)
    assert [v.text for v in ordered] == [
        "2.9.0", "2.16.0", "2.16.2", "3.0.2", "3.1.0~beta1", "3.1.0~rc2", "3.1.0~rc10", "3.1.0", "3.1.1",
    ]  # fmt: skip
    assert GanetiVersion.parse("3.1") == GanetiVersion.parse("3.1.0")
    assert len({GanetiVersion.parse("3.1"), GanetiVersion.parse("3.1.0")}) == 1
    assert GanetiVersion.parse("3.1.0~rc2").at_least(3, 1) and not GanetiVersion.parse("3.0.2").at_least(3, 1)


# (text, has hotplug, has hotplug_if_possible, hotplug default, name/ip check default, network rename)
TAKES = [
    ("2.9.0", False, False, False, True, False),
    ("2.16.2", True, True, False, True, False),
    ("3.0.2", True, True, False, True, False),
    ("3.1.0~rc2", True, False, True, False, True),
    ("3.1.1", True, False, True, False, True),
]


@pytest.mark.parametrize(("text", "hotplug", "if_possible", "default", "checks", "rename"), TAKES)
def test_what_each_version_takes(
    text: str, hotplug: bool, if_possible: bool, default: bool, checks: bool, rename: bool
) -> None:
    """Read from ganeti/ganeti's src/Ganeti/OpParams.hs at v2.9.0, v2.16.2, v3.0.2 and v3.1.0."""
    version = GanetiVersion.parse(text)
    assert version.has_hotplug is hotplug
    assert version.has_hotplug_if_possible is if_possible
    assert version.hotplug_default is default
    assert version.name_check_default is checks and version.ip_check_default is checks
    assert version.has_network_rename is rename


def test_the_cache_tells_its_state_and_what_changed() -> None:
    cache = VersionCache()
    assert repr(cache) == "<VersionCache unknown, 0 reads>" and cache.current(0) is None
    assert cache.observe(GanetiVersion.parse("3.0.2"), "node1", losses=1) == []
    assert cache.current(1) == GanetiVersion.parse("3.0.2") and cache.current(2) is None  # stale after a loss
    changed = cache.observe(GanetiVersion.parse("3.1.0"), "node2", losses=2)
    assert changed == ["Ganeti version 3.0.2 -> 3.1.0", "master node1 -> node2"]
    assert repr(cache) == "<VersionCache ganeti 3.1.0 master=node2 2 reads, 1 changes>"


# -- a server that answers as each version --------------------------------------------------------------


@dataclass
class Sent:
    method: str
    path: str
    body: Any


@dataclass
class VersionedRapi:
    """Answers ``/2/info`` as Ganeti ``version`` (with ``master``; None: an answer without
    ``software_version``); ``PUT .../modify`` naming a hotplug key the version lacks with a 400
    (3.1's recorded one for ``hotplug_if_possible``); ``PUT /2/networks/NAME/rename`` with 3.1's
    recorded job id, 404 before; ``GET /2/instances/slow`` never; other calls with a job id."""

    version: str | None
    master: str = "node1.ganeti.test"
    sent: list[Sent] = field(default_factory=list)
    server: TestServer | None = None
    port: int = 0
    never: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def writes(self) -> list[Sent]:
        return [s for s in self.sent if s.method != "GET"]

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._answer)
        self.server = TestServer(app, host="127.0.0.1", port=self.port)
        await self.server.start_server()
        self.port = self.server.port or 0

    async def stop(self) -> None:
        """ganeti-rapi stopped (an upgrade, a failover): connections are refused until ``start``."""
        assert self.server is not None
        await self.server.close()

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = orjson.loads(raw) if raw else None
        self.sent.append(Sent(request.method, request.path, body))
        if request.path == "/2/info":
            if self.version is None:
                return _json({k: v for k, v in INFO_30.items() if k != "software_version"})
            return _json(info_of(self.version, self.master))
        if request.path == "/2/features":
            return _json(["instance-create-reqv1"])
        if request.path == "/2/instances/slow":
            await self.never.wait()  # cancelled when the server closes
        assert self.version is not None
        version = GanetiVersion.parse(self.version)
        if request.path.endswith("/modify") and body:
            if "hotplug_if_possible" in body and version.at_least(3, 1):
                return _json(REFUSED_31["body"], REFUSED_31["status"])
            refused = [k for k in ("hotplug", "hotplug_if_possible") if k in body and not version.has_hotplug]
            if refused:
                message = (
                    "Invalid body parameters: Object OpInstanceSetParams doesn't support the parameter "
                    f"'{refused[0]}'"
                )
                return _json({"code": 400, "message": message, "explain": "Bad request"}, 400)
        if request.path.startswith("/2/networks/") and request.path.endswith("/rename"):
            if not version.has_network_rename:
                return _json(NOT_FOUND, 404)
            return _json(RENAME_31["body"])
        return _json(4242)


def _json(value: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(value), status=status, content_type="application/json")


@pytest.fixture
async def ganeti(request: pytest.FixtureRequest) -> AsyncIterator[VersionedRapi]:
    server = VersionedRapi(getattr(request, "param", "3.0.2"))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def client_of(server: VersionedRapi) -> RapiClient:
    return RapiClient(server.url, username="ci", password="ci", retry=FAST_RETRY)


def test_the_stub_refuses_what_31_refused() -> None:
    """The recorded 400 is the one the stub gives (its message HTML-escaped, as ganeti-rapi sends it)."""
    assert REFUSED_31["status"] == 400
    assert (
        "doesn&#x27;t support the parameter &#x27;hotplug_if_possible&#x27;" in REFUSED_31["body"]["message"]
    )
    assert RENAME_31["status"] == 200 and isinstance(RENAME_31["body"], int)


# -- what each version is sent ---------------------------------------------------------------------------

NIC_ADD = [["add", -1, {}]]
# version -> the hotplug keys of a modify with hotplug_if_possible=True / hotplug=True / neither
BODIES: dict[str, tuple[dict[str, bool], dict[str, bool] | None, dict[str, bool]]] = {
    "2.9.0": ({}, None, {}),  # None: UnsupportedError, nothing sent
    "2.16.2": ({"hotplug": False, "hotplug_if_possible": True}, {"hotplug": True}, {"hotplug": False}),
    "3.0.2": ({"hotplug": False, "hotplug_if_possible": True}, {"hotplug": True}, {"hotplug": False}),
    "3.1.0~rc2": ({"hotplug": True}, {"hotplug": True}, {"hotplug": False}),
}


@pytest.mark.parametrize("ganeti", list(BODIES), indirect=True)
async def test_a_modify_sends_the_hotplug_keys_its_version_takes(ganeti: VersionedRapi) -> None:
    assert ganeti.version is not None
    if_possible, strict, neither = BODIES[ganeti.version]
    async with client_of(ganeti) as rapi:
        assert await rapi.modify_instance("vm1", nics=NIC_ADD, hotplug_if_possible=True) == 4242
        if strict is None:
            with pytest.raises(UnsupportedError) as caught:
                await rapi.modify_instance("vm1", nics=NIC_ADD, hotplug=True)
            assert caught.value.version == ganeti.version and caught.value.needed == "2.10"
        else:
            assert await rapi.modify_instance("vm1", nics=NIC_ADD, hotplug=True) == 4242
        assert await rapi.modify_instance("vm1", beparams={"memory": 256}) == 4242
        assert rapi.known_version == GanetiVersion.parse(ganeti.version)
    bodies = [s.body for s in ganeti.writes()]
    expected = [{"nics": NIC_ADD, **if_possible}]
    if strict is not None:
        expected.append({"nics": NIC_ADD, **strict})
    expected.append({"beparams": {"memory": 256}, **neither})
    assert bodies == expected
    assert [s.path for s in ganeti.sent].count("/2/info") == 1  # read once


@pytest.mark.parametrize("ganeti", ["3.0.2", "3.1.0~rc2"], indirect=True)
async def test_create_and_rename_send_name_and_ip_check_explicitly(ganeti: VersionedRapi) -> None:
    """3.1 made both default to false (3.0: true): sent either way, false unless asked."""
    async with client_of(ganeti) as rapi:
        await rapi.create_instance(spec("vm9.ganeti.test"))
        await rapi.rename_instance("vm1", "vm2")
        await rapi.rename_instance("vm2", "vm3", name_check=True, ip_check=True)
    create, rename, checked = (s.body for s in ganeti.writes())
    assert (create["name_check"], create["ip_check"]) == (False, False)
    assert rename == {"new_name": "vm2", "name_check": False, "ip_check": False}
    assert checked == {"new_name": "vm3", "name_check": True, "ip_check": True}


@pytest.mark.parametrize("ganeti", ["3.0.2", "2.16.2"], indirect=True)
async def test_rename_network_is_refused_before_31_and_nothing_is_sent(ganeti: VersionedRapi) -> None:
    async with client_of(ganeti) as rapi:
        with pytest.raises(UnsupportedError) as caught:
            await rapi.rename_network("net1", "net2")
    error = caught.value
    assert isinstance(error, InvalidError) and not isinstance(error, BadRequestError)
    assert (error.version, error.needed, error.url) == (ganeti.version, "3.1", ganeti.url)
    assert f"Ganeti {ganeti.version}" in str(error) and "3.1" in str(error)
    assert ganeti.writes() == []


@pytest.mark.parametrize("ganeti", ["3.1.0~rc2"], indirect=True)
async def test_rename_network_is_sent_on_31(ganeti: VersionedRapi) -> None:
    async with client_of(ganeti) as rapi:
        assert await rapi.rename_network("nonet", "nonet2", reason="why") == RENAME_31["body"]
    (sent,) = ganeti.writes()
    assert (sent.method, sent.path, sent.body) == ("PUT", "/2/networks/nonet/rename", {"new_name": "nonet2"})


async def test_many_calls_at_once_read_the_version_once(ganeti: VersionedRapi) -> None:
    async with client_of(ganeti) as rapi:
        jobs = await asyncio.gather(
            *(rapi.modify_instance(f"vm{i}", nics=NIC_ADD, hotplug_if_possible=True) for i in range(10))
        )
    assert jobs == [4242] * 10
    assert [s.path for s in ganeti.sent].count("/2/info") == 1


# -- read again ------------------------------------------------------------------------------------------


async def test_the_version_is_read_again_after_a_lost_connection(ganeti: VersionedRapi) -> None:
    """An upgrade: ganeti-rapi stops (connections refused), comes back as 3.1 on the same port."""
    async with client_of(ganeti) as rapi:
        # not read yet: the repr names no version
        assert repr(rapi).startswith(f"<RapiClient {ganeti.url} user='ci' tls=plain-http 0/20")
        await rapi.modify_instance("vm1", nics=NIC_ADD, hotplug_if_possible=True)
        assert str(rapi.known_version) == "3.0.2"
        assert "tls=plain-http ganeti=3.0.2 0/20 in flight" in repr(rapi)
        await ganeti.stop()
        with pytest.raises(RapiConnectionError):
            await rapi.version()
        assert rapi.known_version is None  # stale: whatever answers next may be another Ganeti
        ganeti.version = "3.1.0~rc2"
        await ganeti.start()
        await rapi.modify_instance("vm1", nics=NIC_ADD, hotplug_if_possible=True)
        assert rapi.known_version == GanetiVersion.parse("3.1.0~rc2")
    first, second = (s.body for s in ganeti.writes())
    assert first == {"nics": NIC_ADD, "hotplug": False, "hotplug_if_possible": True}
    assert second == {"nics": NIC_ADD, "hotplug": True}  # 3.1 would refuse the first form with a 400
    assert [s.path for s in ganeti.sent].count("/2/info") == 2


async def test_a_slow_answer_keeps_the_version(ganeti: VersionedRapi) -> None:
    """A timeout after the request went out is the server being slow, not another server."""
    async with RapiClient(ganeti.url, username="ci", password="ci", retry=FAST_RETRY, timeout=0.2) as rapi:
        await rapi.ganeti_version()
        with pytest.raises(RapiTimeoutError):
            await rapi.get_instance("slow")
        assert rapi.known_version == GanetiVersion.parse("3.0.2")
        await rapi.modify_instance("vm1", beparams={"memory": 256})
    assert [s.path for s in ganeti.sent].count("/2/info") == 1


async def test_a_new_master_or_version_in_any_info_read_is_noticed(
    ganeti: VersionedRapi, caplog: pytest.LogCaptureFixture
) -> None:
    """A failover to a node already upgraded: the next /2/info (the health check's) tells it."""
    async with client_of(ganeti) as rapi:
        assert await rapi.ganeti_version() == GanetiVersion.parse("3.0.2")
        assert await rapi.features() == ["instance-create-reqv1"]
        ganeti.version, ganeti.master = "3.1.0~rc2", "node2.ganeti.test"
        with caplog.at_level(logging.WARNING, logger="synnefo_ganeti.rapi"):
            info = await rapi.info()
        assert info.master == "node2.ganeti.test"
        assert rapi.known_version == GanetiVersion.parse("3.1.0~rc2")
        assert repr(rapi._versions) == (
            "<VersionCache ganeti 3.1.0~rc2 master=node2.ganeti.test 2 reads, 1 changes>"
        )
        await rapi.features()  # asked again: what the RAPI offers may have changed with the version
        await rapi.modify_instance("vm1", nics=NIC_ADD, hotplug_if_possible=True)  # no /2/info: just read
    assert "Ganeti version 3.0.2 -> 3.1.0~rc2, master node1.ganeti.test -> node2.ganeti.test" in caplog.text
    paths = [s.path for s in ganeti.sent]
    assert paths == ["/2/info", "/2/features", "/2/info", "/2/features", "/2/instances/vm1/modify"]
    assert ganeti.writes()[0].body == {"nics": NIC_ADD, "hotplug": True}


async def test_a_master_change_alone_is_noticed(
    ganeti: VersionedRapi, caplog: pytest.LogCaptureFixture
) -> None:
    async with client_of(ganeti) as rapi:
        await rapi.info()
        ganeti.master = "node2.ganeti.test"
        with caplog.at_level(logging.WARNING, logger="synnefo_ganeti.rapi"):
            await rapi.info()
        assert rapi._versions.master == "node2.ganeti.test"
        assert rapi.known_version == GanetiVersion.parse("3.0.2")
    assert "master node1.ganeti.test -> node2.ganeti.test" in caplog.text
    assert "Ganeti version" not in caplog.text


async def test_an_info_without_a_version_fails_the_calls_that_need_one_only(ganeti: VersionedRapi) -> None:
    ganeti.version = None
    async with client_of(ganeti) as rapi:
        assert (await rapi.info()).software_version is None  # info itself is fine
        with pytest.raises(RapiError, match="not a Ganeti version"):
            await rapi.modify_instance("vm1", beparams={"memory": 256})
        with pytest.raises(RapiError, match="not a Ganeti version"):
            await rapi.rename_network("net1", "net2")
    assert ganeti.writes() == []
