"""The transport and error mapping, against an in-process server answering like ganeti-rapi."""

from __future__ import annotations

import logging

import pytest
from aiohttp import web

from synnefo_ganeti import (
    AuthenticationError,
    BadRequestError,
    ConfigError,
    GanetiError,
    RapiClient,
    RapiConnectionError,
    RapiError,
    RapiNotFoundError,
    RapiTimeoutError,
    RetryPolicy,
    UnavailableError,
)
from tests.helpers import (
    FAST_RETRY,
    PASSWORD,
    USER,
    StubRapi,
    ganeti_error,
    json_response,
    never_answer,
    rapi_fixture,
    stub_client,
)

client = stub_client


async def test_requests_carry_auth_json_and_no_connection_close() -> None:
    async with StubRapi() as stub:
        stub.route("GET", "/version", 2)
        stub.route("POST", "/2/instances", 7)
        async with client(stub.url) as rapi:
            assert await rapi.version() == 2
            from synnefo_ganeti import InstanceSpec

            await rapi.create_instance(InstanceSpec(name="a", disk_template="diskless", os="noop"))
    get, post = stub.seen
    assert get.headers["Authorization"].startswith("Basic ")
    # A GET without Content-Length, or with "Connection: close", costs ~40 ms in ganeti-rapi.
    assert get.headers["Content-Length"] == "0"
    assert get.headers.get("Connection", "").lower() != "close"
    assert post.headers["Content-Type"] == "application/json"
    assert post.headers.get("Connection", "").lower() != "close"
    assert post.headers["User-Agent"].startswith("synnefo-ganeti/")


@pytest.mark.parametrize(
    ("status", "error", "hint"),
    [
        (401, AuthenticationError, "check the username and password"),
        (403, AuthenticationError, "write access"),
        (404, RapiNotFoundError, "check the name"),
        (400, BadRequestError, "fix the request"),
        (415, BadRequestError, "fix the request"),
        (502, UnavailableError, "retry later"),
        (503, UnavailableError, "retry later"),
        (504, UnavailableError, "retry later"),
        (500, RapiError, "rapi-daemon.log"),
    ],
)
async def test_http_errors_map_to_the_tree(status, error, hint) -> None:
    async def handler(_request: web.Request) -> web.StreamResponse:
        return ganeti_error(status, "Invalid body parameters: (&quot;bad&quot;, &#x27;wrong_input&#x27;)")

    async with StubRapi() as stub:
        stub.route("GET", "/2/info", handler)
        async with client(stub.url) as rapi:
            with pytest.raises(error) as caught:
                await rapi.info()
    exc = caught.value
    assert type(exc) is error
    assert exc.status == status and stub.url in str(exc) and hint in str(exc)
    assert exc.ganeti_message == "Invalid body parameters: (\"bad\", 'wrong_input')"  # entities decoded
    assert PASSWORD not in str(exc) and PASSWORD not in repr(exc)


async def test_real_400_and_401_bodies() -> None:
    async def bad(_request: web.Request) -> web.StreamResponse:
        return json_response(rapi_fixture("error_400_missing_params.txt"), status=400)

    async with StubRapi() as stub:
        stub.route("POST", "/2/instances", bad)
        async with client(stub.url, password="wrong") as rapi:
            with pytest.raises(AuthenticationError, match="refused user 'ci'"):
                await rapi.version()
        async with client(stub.url) as rapi:
            from synnefo_ganeti import InstanceSpec

            with pytest.raises(BadRequestError, match=r"OP_INSTANCE_CREATE\.instance_name' fails validation"):
                await rapi.create_instance(InstanceSpec(name="a", disk_template="diskless", os="noop"))


async def test_safe_calls_retry_unavailable_then_succeed() -> None:
    answers = [503, 502, 200]

    async def flaky(_request: web.Request) -> web.StreamResponse:
        status = answers.pop(0)
        return ganeti_error(status, "Job queue is drained") if status != 200 else json_response(2)

    async with StubRapi() as stub:
        stub.route("GET", "/version", flaky)
        async with client(stub.url) as rapi:
            assert await rapi.version() == 2
    assert len(stub.seen) == 3


async def test_retries_are_bounded() -> None:
    async with StubRapi() as stub:
        stub.route("GET", "/version", lambda _r: _async(ganeti_error(503, "Job queue is full")))
        async with client(stub.url) as rapi:
            with pytest.raises(UnavailableError):
                await rapi.version()
    assert len(stub.seen) == FAST_RETRY.attempts


async def test_writes_do_not_retry_ambiguous_failures() -> None:
    async with StubRapi() as stub:
        stub.route("PUT", "/2/instances/vm1/shutdown", lambda _r: _async(ganeti_error(504, "Timeout")))
        async with client(stub.url) as rapi:
            with pytest.raises(UnavailableError):
                await rapi.shutdown_instance("vm1")
    assert len(stub.seen) == 1  # a 504 may have submitted the job: not sent again


async def test_writes_retry_503() -> None:
    answers = [503, 200]

    async def flaky(_request: web.Request) -> web.StreamResponse:
        return ganeti_error(503, "Job queue is drained") if answers.pop(0) == 503 else json_response(41)

    async with StubRapi() as stub:
        stub.route("PUT", "/2/instances/vm1/startup", flaky)
        async with client(stub.url) as rapi:
            assert await rapi.startup_instance("vm1") == 41


async def test_timeout_names_the_limit() -> None:
    async with StubRapi() as stub:
        stub.route("GET", "/2/info", never_answer)
        async with client(stub.url, timeout=0.2, retry=RetryPolicy(attempts=1)) as rapi:
            with pytest.raises(RapiTimeoutError, match=r"no answer within 0.2 s") as caught:
                await rapi.info()
    assert isinstance(caught.value, TimeoutError)


async def test_connection_refused_is_unsent() -> None:
    async with StubRapi() as stub:
        url = stub.url
    async with client(url) as rapi:
        with pytest.raises(RapiConnectionError, match="cannot connect") as caught:
            await rapi.version()
    assert caught.value.maybe_sent is False


async def test_malformed_json_is_a_clear_error() -> None:
    async def broken(_request: web.Request) -> web.StreamResponse:
        return web.Response(body=b"<html>proxy</html>", content_type="text/html")

    async with StubRapi() as stub:
        stub.route("GET", "/2/info", broken)
        async with client(stub.url) as rapi:
            with pytest.raises(RapiError, match="not JSON"):
                await rapi.info()


async def test_unexpected_shape_is_a_clear_error() -> None:
    async with StubRapi() as stub:
        stub.route("GET", "/2/nodes", [{"no_name": True}])
        async with client(stub.url) as rapi:
            with pytest.raises(RapiError, match="unexpected shape"):
                await rapi.list_nodes()


async def test_password_never_shows(caplog) -> None:
    caplog.set_level(logging.DEBUG)
    async with StubRapi() as stub:
        stub.route("GET", "/version", 2)
        async with client(stub.url) as rapi:
            await rapi.version()
            text = repr(rapi) + str(rapi.__dict__) + repr(rapi._transport)
        async with client(stub.url, password="wrong-" + PASSWORD) as rapi:
            with pytest.raises(AuthenticationError) as caught:
                await rapi.version()
    assert PASSWORD not in text and PASSWORD not in caplog.text
    assert PASSWORD not in str(caught.value) and PASSWORD not in repr(caught.value)
    assert "in flight" in text


async def test_repr_tells_the_state() -> None:
    rapi = client("https://rapi.example.org:5080", insecure=True)
    assert repr(rapi) == (
        "<RapiClient https://rapi.example.org:5080 user='ci' tls=insecure 0/20 in flight, 0 waiting, 0/5 long-polls>"
    )
    assert "closed" in repr(rapi._transport)


async def test_unopened_client_says_how_to_use_it() -> None:
    rapi = client("http://127.0.0.1:9")
    with pytest.raises(GanetiError, match="async with RapiClient"):
        await rapi.version()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"url": "ftp://x"}, "must start with https://"),
        ({"url": "https://ci:pw@x:5080"}, "must not carry credentials"),
        ({"max_connections": 0}, "max_connections must be >= 1"),
        ({"timeout": 0}, "timeout must be > 0"),
        ({"long_poll_slots": 30}, "long_poll_slots must be between 1 and max_connections"),
        ({"username": ""}, "username is empty"),
        ({"ca_file": "/nonexistent/rapi.pem"}, "ca_file /nonexistent/rapi.pem does not exist"),
        ({"fingerprint": "abc"}, "is not a SHA-256 digest"),
        ({"fingerprint": "00" * 32, "insecure": True}, "only one of ca_file, fingerprint or insecure"),
        ({"url": "http://x:5080", "fingerprint": "00" * 32}, "needs an https:// URL"),
    ],
)
def test_bad_settings_are_named(kwargs, message) -> None:
    args = {"url": "https://x:5080", "username": USER, "password": PASSWORD} | kwargs
    with pytest.raises(ConfigError, match=message) as caught:
        RapiClient(args.pop("url"), **args)
    assert PASSWORD not in str(caught.value)


async def _async(value):
    return value
