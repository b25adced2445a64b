"""The operator console over a fake Ganeti, a SQLite store and a running dispatcher, through
aiohttp's test client: login and sessions, roles, CSRF, the pages, the actions, the event stream."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient, TestServer

from synnefo_ganeti import ControlPlane
from synnefo_ganeti.config import Settings
from synnefo_ganeti.console import Console, hash_password, hash_token
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.store import InstanceStatus, RequestStatus, StatusStore, Store
from synnefo_ganeti.testing import FakeGaneti
from tests.helpers import eventually, fake_client, spec

QUICK = {"OP_INSTANCE_CREATE": 0.05, "OP_INSTANCE_REMOVE": 0.01, "OP_INSTANCE_SHUTDOWN": 0.01}
OWNED = "synnefo-ganeti:owned"
PASSWORDS = {"alice": "alice-op-Pa55", "bob": "bob-view-Pa55"}
TOKEN = "tok-" + "x" * 40


@dataclass
class World:
    fake: FakeGaneti
    store: Store
    cp: ControlPlane
    dispatcher: Dispatcher
    console: Console
    client: TestClient[Any, Any]
    settings: Settings


def write_users(tmp_path: Path) -> tuple[Path, Path]:
    users = tmp_path / "console.users"
    users.write_text(
        "# name:role:hash\n"
        f"alice:operator:{hash_password(PASSWORDS['alice'])}\n"
        f"bob:viewer:{hash_password(PASSWORDS['bob'])}\n"
    )
    tokens = tmp_path / "console.tokens"
    tokens.write_text(f"robot:viewer:{hash_token(TOKEN)}\n")
    return users, tokens


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    users, tokens = write_users(tmp_path)
    db_url = f"sqlite:///{tmp_path / 'store.db'}"
    async with FakeGaneti(tls=False, nodes=2, op_times=QUICK) as fake:
        settings = Settings(
            database={"url": db_url},
            backends=[
                {"name": "alpha", "url": fake.url, "username": fake.username, "password": fake.password}
            ],
            dispatcher={
                "status_port": None,
                "poll_interval": 0.05,
                "health_interval": 0.2,
                "stats_interval": 0.5,
                "shutdown_timeout": 5.0,
            },
            web={"users_file": str(users), "tokens_file": str(tokens), "secure_cookies": False},
        )
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            dispatcher = Dispatcher(settings, store=store, status_server=False)
            running = asyncio.create_task(dispatcher.run())
            await dispatcher.ready.wait()
            console = Console(settings, store=store, capacity_interval=0.2, live_interval=0.05)
            client = TestClient(TestServer(console.build()))
            await client.start_server()
            try:
                yield World(fake, store, cp, dispatcher, console, client, settings)
            finally:
                await client.close()
                dispatcher.stop()
                await running


async def login(client: TestClient[Any, Any], name: str) -> str:
    """Log ``name`` in; the session's CSRF token (from the page's meta tag)."""
    response = await client.post(
        "/login", data={"username": name, "password": PASSWORDS[name]}, allow_redirects=False
    )
    assert response.status == 303, await response.text()
    page = await (await client.get("/")).text()
    marker = 'name="csrf-token" content="'
    assert marker in page
    return page.split(marker, 1)[1].split('"', 1)[0]


async def succeeded_request(world: World, name: str = "vm1.example") -> str:
    request_id = await world.cp.request_instance(spec(name))
    world.dispatcher.wake()
    done = await world.cp.wait_request(request_id, timeout=20)
    assert done.status is RequestStatus.SUCCEEDED, done.error
    return request_id


# -- nothing without a login -------------------------------------------------------------------------


async def test_nothing_is_served_without_a_login(world: World) -> None:
    client = world.client
    for path in ("/", "/requests", "/instances", "/jobs", "/drift", "/backend-events", "/audit"):
        response = await client.get(path, allow_redirects=False)
        assert response.status == 303 and response.headers["Location"] == f"/login?next={path}", path
    assert (await client.get("/events?topics=overview")).status == 401
    assert (await client.post("/drift/run", allow_redirects=False)).status == 401
    login_page = await client.get("/login")
    assert login_page.status == 200 and 'name="password"' in await login_page.text()
    assert "frame-ancestors 'none'" in login_page.headers["Content-Security-Policy"]
    static = await client.get("/static/htmx.min.js")
    assert static.status == 200 and "htmx" in await static.text()
    assert (await client.get("/static/htmx.LICENSE")).status == 200


async def test_a_wrong_password_or_token_opens_nothing(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    client = world.client
    with caplog.at_level(logging.INFO, logger="synnefo_ganeti.console"):
        wrong = await client.post(
            "/login", data={"username": "alice", "password": "nope"}, allow_redirects=False
        )
        unknown = await client.post(
            "/login", data={"username": "eve", "password": "x"}, allow_redirects=False
        )
        token = await client.post("/login", data={"token": "not-it"}, allow_redirects=False)
    for response in (wrong, unknown, token):
        assert response.status == 401 and "wrong name, password or token" in await response.text()
        assert "Set-Cookie" not in response.headers
    assert "failed login for 'alice'" in caplog.text and "nope" not in caplog.text
    assert (await client.get("/", allow_redirects=False)).status == 303


async def test_session_cookie_flags_and_logout(world: World, tmp_path: Path) -> None:
    response = await world.client.post(
        "/login", data={"username": "bob", "password": PASSWORDS["bob"], "next": "//evil.example/"},
        allow_redirects=False,
    )  # fmt: skip
    assert response.status == 303 and response.headers["Location"] == "/"  # no open redirect
    cookie = response.headers["Set-Cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/" in cookie
    csrf = await login(world.client, "bob")
    page = await world.client.get("/")
    assert "bob" in await page.text() and page.headers["Cache-Control"] == "no-store"
    out = await world.client.post("/logout", data={"csrf": csrf}, allow_redirects=False)
    assert out.status == 303 and out.headers["Location"] == "/login"
    assert (await world.client.get("/", allow_redirects=False)).status == 303
    # with secure_cookies (the default) the cookie is Secure
    secure = Console(world.settings.model_copy(update={"web": world.settings.web.model_copy(
        update={"secure_cookies": True})}), store=world.store)  # fmt: skip
    async with TestClient(TestServer(secure.build())) as other:
        response = await other.post(
            "/login", data={"username": "bob", "password": PASSWORDS["bob"]}, allow_redirects=False
        )
        flags = [part.strip().lower() for part in response.headers["Set-Cookie"].split(";")]
        assert "secure" in flags and "httponly" in flags and "samesite=strict" in flags


async def test_token_and_one_time_logins(world: World) -> None:
    response = await world.client.post("/login", data={"token": TOKEN}, allow_redirects=False)
    assert response.status == 303
    assert "robot" in await (await world.client.get("/")).text()
    path = world.console.one_time_login("demo", "operator")
    first = await world.client.get(path, allow_redirects=False)
    assert first.status == 303 and first.headers["Location"] == "/"
    second = await world.client.get(path, allow_redirects=False)
    assert second.status == 403 and "used already" in await second.text()


# -- pages ------------------------------------------------------------------------------------------


async def test_every_page_renders_with_real_data_and_no_secret(world: World) -> None:
    request_id = await succeeded_request(world)
    await login(world.client, "bob")
    request = await world.cp.get_request(request_id)
    assert request.instance_id is not None and request.job_id is not None
    await eventually(lambda: "alpha" in world.console.capacity.totals, what="node stats")
    pages = {
        "/": ["alpha", "up", "memory", "disk", "succeeded", "Ganeti 3.0.2"],
        "/requests": ["vm1.example", "succeeded"],
        "/requests?status=succeeded&backend=alpha&age=1h": ["vm1.example"],
        f"/requests/{request_id}": ["vm1.example", "placement attempts", '"memory": 256'],
        "/instances": ["vm1.example", "STARTED"],
        "/instances?q=vm1": ["vm1.example"],
        f"/instances?q={request.instance_id}": ["vm1.example"],
        f"/instances/{request.instance_id}": ["vm1.example", "NICs", "Disks", f"job {request.job_id}"],
        "/jobs": [f"/jobs/alpha/{request.job_id}", "success"],
        f"/jobs/alpha/{request.job_id}": ["OP_INSTANCE_CREATE", "success", "Log"],
        "/drift": ["alpha", "no report yet"],
        "/backend-events": ["Backend events"],
        "/audit": ["Audit log", "no operator action yet"],
    }
    for path, wanted in pages.items():
        response = await world.client.get(path)
        text = await response.text()
        assert response.status == 200, (path, text)
        for needle in wanted:
            assert needle in text, (path, needle)
        assert world.fake.password not in text and "$argon2" not in text, path
    assert (await world.client.get("/requests?status=bogus")).status == 400
    assert (await world.client.get("/requests/no-such-id")).status == 404
    assert (await world.client.get("/jobs/alpha/99999")).status == 404
    assert "vm1.example" not in await (await world.client.get("/instances?q=zzz")).text()


# -- actions: roles, CSRF, what they do -------------------------------------------------------------


async def test_a_viewer_is_refused_every_action(world: World, caplog: pytest.LogCaptureFixture) -> None:
    csrf = await login(world.client, "bob")
    with caplog.at_level(logging.WARNING, logger="synnefo_ganeti.console"):
        for path in ("/drift/run", "/backends/alpha/drain", "/drift/fix"):
            response = await world.client.post(
                path, data={"csrf": csrf, "backend": "alpha", "fix": "operstate"}
            )
            assert response.status == 403, path
            assert "bob is a viewer" in await response.text()
    assert "bob (viewer) tried POST /drift/run: refused" in caplog.text
    assert world.console.reports.last == {}
    assert await world.store.drained_backends() == set()


async def test_actions_need_the_sessions_csrf_token_and_this_origin(world: World) -> None:
    csrf = await login(world.client, "alice")
    assert (await world.client.post("/drift/run", data={})).status == 403
    assert (await world.client.post("/drift/run", data={"csrf": "forged"})).status == 403
    foreign = await world.client.post(
        "/drift/run", data={"csrf": csrf}, headers={"Origin": "https://evil.example"}
    )
    assert foreign.status == 403
    assert world.console.reports.last == {}
    ok = await world.client.post("/drift/run", data={"csrf": csrf}, allow_redirects=False)
    assert ok.status == 303 and ok.headers["Location"] == "/drift"
    assert "alpha" in world.console.reports.last


async def test_operator_runs_a_pass_fixes_a_drift_and_is_logged(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    await succeeded_request(world, "vm2.example")
    csrf = await login(world.client, "alice")
    world.fake.cluster.instances["vm2.example"].oper_state = False  # shut down behind our back
    with caplog.at_level(logging.WARNING, logger="synnefo_ganeti.console"):
        await world.client.post("/drift/run", data={"csrf": csrf})
        page = await (await world.client.get("/drift")).text()
        assert "operstate" in page and "vm2.example" in page and 'id="fix-alpha-operstate"' in page
        response = await world.client.post(
            "/drift/fix", data={"csrf": csrf, "backend": "alpha", "fix": "operstate"}
        )
        assert response.status == 200 and "fix operstate on alpha: 1 fixed" in await response.text()
    instance = await world.store.get_instance("alpha", "vm2.example")
    assert instance is not None and instance.status is InstanceStatus.STOPPED
    assert "console action by alice (operator): fix operstate on alpha" in caplog.text
    events = await world.store.backend_events(backend="alpha")
    assert any(e["kind"] == "console" and e["message"].startswith("alice: fix operstate") for e in events)
    assert (
        await world.client.post("/drift/fix", data={"csrf": csrf, "backend": "alpha", "fix": "x"})
    ).status == 400
    assert (
        await world.client.post("/drift/fix", data={"csrf": csrf, "backend": "nope", "fix": "tags"})
    ).status == 404


async def test_an_orphan_is_deleted_only_after_typing_its_name(world: World) -> None:
    async with fake_client(world.fake) as rapi:
        job_id = await rapi.create_instance(spec("orphan.example", tags=[OWNED]))
        await rapi.wait_for_job(job_id, timeout=10)
    csrf = await login(world.client, "alice")
    await world.client.post("/drift/run", data={"csrf": csrf})
    page = await (await world.client.get("/drift")).text()
    assert "/drift/orphan?backend=alpha&amp;name=orphan.example" in page
    confirm = await world.client.get("/drift/orphan?backend=alpha&name=orphan.example")
    assert "Type the instance" in await confirm.text()
    wrong = await world.client.post(
        "/drift/orphan",
        data={"csrf": csrf, "backend": "alpha", "name": "orphan.example", "confirm": "orphan"},
    )
    assert "not deleted: type the instance" in await wrong.text()
    assert "orphan.example" in world.fake.cluster.instances
    done = await world.client.post(
        "/drift/orphan",
        data={"csrf": csrf, "backend": "alpha", "name": "orphan.example", "confirm": "orphan.example"},
    )
    assert "deleted orphan orphan.example" in await done.text()
    await eventually(lambda: "orphan.example" not in world.fake.cluster.instances, what="the orphan deleted")


async def test_drain_and_undrain_from_the_overview(world: World) -> None:
    csrf = await login(world.client, "alice")
    page = await (await world.client.post("/backends/alpha/drain", data={"csrf": csrf})).text()
    assert "drained alpha" in page and "drained (operator)" in page
    assert await world.store.drained_backends() == {"alpha"}
    await world.client.post("/backends/alpha/undrain", data={"csrf": csrf})
    assert await world.store.drained_backends() == set()
    # both in the audit log: who, what, on what, how it ended (the newest first)
    log = await StatusStore(world.store).audit_log()
    assert [(e.actor, e.via, e.action, e.target, e.outcome) for e in log] == [
        ("alice", "console", "backend-undrain", "alpha", "ok"),
        ("alice", "console", "backend-drain", "alpha", "ok"),
    ]
    await login(world.client, "bob")  # a viewer reads the log
    page = await (await world.client.get("/audit")).text()
    assert page.count('class="audit-row o-ok"') == 2 and 'data-action="backend-drain"' in page
    assert (
        "alice" in page
        and 'data-action="backend-drain"' not in await (await world.client.get("/audit?actor=nobody")).text()
    )


# -- live -------------------------------------------------------------------------------------------


async def read_fragments(response: ClientResponse, want: str, *, timeout: float = 20) -> dict[str, Any]:
    """Read the event stream until a fragment whose target is ``want``; that fragment."""
    event = None
    async with asyncio.timeout(timeout):
        async for raw in response.content:
            line = raw.decode().rstrip("\r\n")
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and event == "fragment":
                fragment: dict[str, Any] = orjson.loads(line.split(":", 1)[1].strip())
                if fragment["target"] == want:
                    return fragment
    raise AssertionError(f"the stream ended before a fragment for {want}")


async def test_a_change_reaches_every_viewer_from_one_render(world: World) -> None:
    await login(world.client, "bob")
    streams = [await world.client.get("/events?topics=requests,overview") for _ in range(4)]
    for stream in streams:
        assert stream.status == 200 and stream.headers["Content-Type"].startswith("text/event-stream")
    await eventually(lambda: world.console.hub.viewers == 4, what="four viewers")
    reads: list[str] = []
    get_request = world.store.get_request

    async def counted(request_id: str) -> Any:
        reads.append(request_id)
        return await get_request(request_id)

    world.store.get_request = counted  # type: ignore[method-assign]
    renders_before = world.console.hub.renders
    request_id = await world.cp.request_instance(spec("live.example"))
    world.dispatcher.wake()
    fragments = await asyncio.gather(*(read_fragments(s, f"request-{request_id}") for s in streams))
    for fragment in fragments:
        assert fragment["into"] == "rows" and "live.example" in fragment["html"]
    succeeded = await asyncio.gather(*(read_fragments(s, "overview") for s in streams))
    assert all("alpha" in f["html"] for f in succeeded)
    # the request read once per render (a batch of its changes), not once per viewer
    renders = world.console.hub.renders - renders_before
    assert 1 <= reads.count(request_id) <= renders, (reads, renders)
    for stream in streams:
        stream.close()
    await eventually(lambda: world.console.hub.viewers == 0, what="the streams closed")


async def test_a_request_page_follows_its_request_to_succeeded(world: World) -> None:
    await login(world.client, "bob")
    request_id = await world.cp.request_instance(spec("follow.example"), backend="alpha")
    stream = await world.client.get(f"/events?topics=request:{request_id}")
    world.dispatcher.wake()
    while True:
        fragment = await read_fragments(stream, "detail")
        if ">succeeded<" in fragment["html"]:
            break
    stream.close()
    assert (await world.client.get("/events?topics=nope")).status == 400
    assert (await world.client.get("/events?topics=")).status == 400


async def test_a_slow_viewer_is_told_to_reload_instead_of_queueing_forever(world: World) -> None:
    from synnefo_ganeti.console._live import Fragment, Subscriber

    sub = Subscriber(["requests"], size=2)
    for index in range(5):
        sub.offer(Fragment("requests", f"r{index}", "<tr></tr>"))
    assert sub.overflowed and "queued=2" in repr(sub)
    assert (await sub.next()) is not None and (await sub.next()) is None
    assert "viewers" in repr(world.console.hub) and "sessions" not in repr(world.console.hub)


async def test_jobs_and_drift_pages_are_live_too(world: World) -> None:
    csrf = await login(world.client, "alice")
    jobs = await world.client.get("/events?topics=jobs")
    drift = await world.client.get("/events?topics=drift")
    await eventually(lambda: world.console.hub.viewers == 2, what="two viewers")
    request_id = await succeeded_request(world, "jobs.example")
    job_id = (await world.cp.get_request(request_id)).job_id
    row = await read_fragments(jobs, f"job-alpha-{job_id}")
    assert row["into"] == "rows" and "OP_INSTANCE_CREATE" in row["html"]
    await world.client.post("/drift/run", data={"csrf": csrf})
    while True:  # the first may be the page's state as the stream opened, before the run
        report = await read_fragments(drift, "drift")
        if "clean" in report["html"]:
            break
    assert "alpha" in report["html"]
    assert csrf not in report["html"] and 'name="csrf"' not in report["html"]  # one render for all viewers
    jobs.close()
    drift.close()


async def test_an_instance_page_follows_its_jobs(world: World) -> None:
    request_id = await succeeded_request(world, "inst.example")
    instance_id = (await world.cp.get_request(request_id)).instance_id
    assert instance_id is not None
    await login(world.client, "bob")
    stream = await world.client.get(f"/events?topics=instance:{instance_id}")
    await eventually(lambda: world.console.hub.viewers == 1, what="the instance page's stream")
    job_id = await world.cp.shutdown_instance(instance_id)
    while True:
        fragment = await read_fragments(stream, "detail")
        if f"job {job_id}</a> shutdown" in fragment["html"] and ">STOPPED<" in fragment["html"]:
            break
    stream.close()


async def test_a_page_whose_stream_opens_after_a_change_is_brought_up_to_date(world: World) -> None:
    """A page is rendered before its stream opens: what changed in between comes on the stream (the
    thing a detail page shows, and the rows a list shows that changed just before)."""
    world.console.hub.recent = 120.0  # this machine may be slow between the change and the stream
    request_id = await succeeded_request(world, "late.example")
    instance_id = (await world.cp.get_request(request_id)).instance_id
    assert instance_id is not None
    await login(world.client, "bob")
    job_id = await world.cp.shutdown_instance(instance_id)
    await eventually(
        lambda: _status_is(world, instance_id, InstanceStatus.STOPPED), what="the instance stopped"
    )
    # the page was "rendered" before (STARTED); its stream opens only now, after the change
    detail = await world.client.get(f"/events?topics=instance:{instance_id}")
    rows = await world.client.get("/events?topics=requests")
    fragment = await read_fragments(detail, "detail")
    assert ">STOPPED<" in fragment["html"] and f"job {job_id}</a> shutdown" in fragment["html"]
    row = await read_fragments(rows, f"request-{request_id}")
    assert row["into"] == "rows" and "late.example" in row["html"]
    detail.close()
    rows.close()


async def _status_is(world: World, instance_id: str, status: InstanceStatus) -> bool:
    instance = await world.store.get_instance(None, None, id=instance_id)
    return instance is not None and instance.status is status


# -- what the overview says of a backend's health and its node figures ------------------------------


async def test_a_backend_stored_down_is_shown_down_and_node_figures_say_as_of_when(tmp_path: Path) -> None:
    """The store keeps health as the text "up" or "down": a backend the dispatcher found down is shown
    down (it was shown "up": both texts are truthy), and the node figures carry their time."""
    users, tokens = write_users(tmp_path)
    db_url = f"sqlite:///{tmp_path / 'store.db'}"
    async with FakeGaneti(tls=False, nodes=2) as fake:
        settings = Settings(
            database={"url": db_url},
            backends=[
                {"name": "alpha", "url": fake.url, "username": fake.username, "password": fake.password},
                {"name": "beta", "url": fake.url, "username": fake.username, "password": fake.password},
            ],
            web={"users_file": str(users), "tokens_file": str(tokens), "secure_cookies": False},
        )
        async with Store(db_url) as store:
            await store.set_backend_health("alpha", False, detail="connection refused")
            await store.set_backend_health("beta", True)
            console = Console(settings, store=store, capacity_interval=0.2, live_interval=0.05)
            client = TestClient(TestServer(console.build()))
            await client.start_server()
            try:
                await login(client, "bob")
                await eventually(lambda: "beta" in console.capacity.totals, what="node stats")
                page = await (await client.get("/")).text()
            finally:
                await client.close()
    alpha = page.split('id="backend-alpha"', 1)[1].split("</section>", 1)[0]
    beta = page.split('id="backend-beta"', 1)[1].split("</section>", 1)[0]
    assert 'data-health="down"' in alpha and ">down</span>" in alpha and "connection refused" in alpha
    assert 'data-health="up"' in beta and ">up</span>" in beta
    at = console.capacity.totals["beta"].at
    stamp = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S")
    assert f"as of {stamp} UTC" in beta


async def test_needs_attention_shows_failed_jobs_instances_in_error_and_why_requests_wait(
    world: World,
) -> None:
    """A create whose node crashed fails in Ganeti: its job (with Ganeti's message) and its instance
    (with its last error) are on the page; a request no backend can take says why it waits."""
    node = sorted(world.fake.cluster.nodes)[-1]
    world.fake.crash_node(node)
    _instance, job_id = await world.cp.create_instance(spec("broken.example", pnode=node), backend="alpha")

    async def failed() -> bool:
        stored = await world.store.get_instance("alpha", "broken.example")
        return stored is not None and stored.status is InstanceStatus.ERROR

    await eventually(failed, what="the create failed and applied")
    await world.store.set_backend_drained("alpha", True)  # nowhere to place: the request waits
    await eventually(lambda: world.dispatcher.allocator.view("alpha").drained, what="the drain seen")
    request_id = await world.cp.request_instance(spec("waits.example"))
    world.dispatcher.wake()

    async def waiting() -> bool:
        return bool((await world.cp.get_request(request_id)).waiting_reason)

    await eventually(waiting, what="the request's waiting reason")
    await login(world.client, "bob")
    page = await (await world.client.get("/attention")).text()
    jobs = page.split('id="failed-jobs"', 1)[1].split("</section>", 1)[0]
    row = jobs.split(f'data-job="{job_id}"', 1)[1].split("</tr>", 1)[0]
    assert "OP_INSTANCE_CREATE" in row and "broken.example" in row and node.split(".")[0] in row, row
    errors = page.split('id="error-instances"', 1)[1].split("</section>", 1)[0]
    assert 'data-instance="broken.example"' in errors and f"job {job_id}" in errors
    waits = page.split('id="waiting-requests"', 1)[1].split("</section>", 1)[0]
    assert f'data-request="{request_id}"' in waits and "drained" in waits
    assert world.fake.password not in page
