"""The console's node pages and node actions (issue 30 item 5) over a 3-node fake Ganeti, a running
dispatcher and both databases: every node listed with its figures and their time, a node's page
with its instances; an operator drains it, evacuates it (a confirmation, a task whose progress and
report the page shows, the store's node of each instance moved) and fails a dead node over (the
node's name typed); a viewer sees the pages and is refused every action; all of it in the audit log."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from synnefo_ganeti import ControlPlane
from synnefo_ganeti.config import Settings
from synnefo_ganeti.console import Console, hash_password, read_users
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.errors import ConfigError
from synnefo_ganeti.store import InstanceStatus, StatusStore, Store
from synnefo_ganeti.testing import FakeGaneti
from tests.helpers import eventually, spec
from tests.unit.test_console import QUICK, login, write_users

N1, N2, N3 = "node1.fake.test", "node2.fake.test", "node3.fake.test"


@dataclass
class Lab:
    fake: FakeGaneti
    store: Store
    cp: ControlPlane
    console: Console
    client: TestClient[Any, Any]


@pytest.fixture
async def lab(tmp_path: Path, db_url: str) -> AsyncIterator[Lab]:
    users, tokens = write_users(tmp_path)
    async with FakeGaneti(
        tls=False, nodes=3, disk_templates=("diskless", "sharedfile"), op_times=QUICK
    ) as fake:
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
            },
            web={"users_file": str(users), "tokens_file": str(tokens), "secure_cookies": False},
        )
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            dispatcher = Dispatcher(settings, store=store, status_server=False)
            running = asyncio.create_task(dispatcher.run())
            await dispatcher.ready.wait()
            console = Console(settings, store=store, capacity_interval=0.2, live_interval=0.05)
            console.nodes.reads.every = 0.0  # read Ganeti on every page: the test reads right after acting
            client: TestClient[Any, Any] = TestClient(TestServer(console.build()))
            await client.start_server()
            try:
                yield Lab(fake, store, cp, console, client)
            finally:
                await client.close()
                dispatcher.stop()
                await running


async def made(lab: Lab, name: str, node: str, template: str = "sharedfile") -> None:
    extra: dict[str, Any] = {"disks": [{"size": 1024}]} if template != "diskless" else {}
    await lab.cp.create_instance(spec(name, disk_template=template, pnode=node, **extra), backend="alpha")

    async def started() -> bool:
        stored = await lab.store.get_instance("alpha", name)
        # the node is stored from the dispatcher's read of the instance after the create's end,
        # a moment after its status
        return stored is not None and stored.status is InstanceStatus.STARTED and stored.pnode == node

    await eventually(started, what=f"{name} started, on {node} in the store")


def section(page: str, marker: str, end: str = "</section>") -> str:
    assert marker in page, marker
    return page.split(marker, 1)[1].split(end, 1)[0]


async def test_nodes_are_listed_and_a_viewer_sees_but_cannot_act(lab: Lab) -> None:
    await made(lab, "a.example", N2)
    await login(lab.client, "bob")
    page = await (await lab.client.get("/nodes")).text()
    listing = section(page, 'id="nodes-alpha"')
    assert "as of" in listing
    for node in (N1, N2, N3):
        assert f'data-node="{node}"' in listing
    assert 'data-role="master"' in listing
    detail = await (await lab.client.get(f"/nodes/alpha/{N2}")).text()
    primaries = section(detail, 'id="primaries"', "</ul>")
    stored = await lab.store.get_instance("alpha", "a.example")
    assert stored is not None and f'href="/instances/{stored.id}">a.example' in primaries
    assert "figures as of" in detail
    csrf = detail.split('name="csrf-token" content="', 1)[1].split('"', 1)[0]
    for action in ("drain", "undrain", "evacuate", "failover"):
        response = await lab.client.post(f"/nodes/alpha/{N2}/{action}", data={"csrf": csrf})
        assert response.status == 403, action
    assert (await lab.client.get("/nodes/alpha/no-such-node")).status == 404
    assert (await lab.client.get(f"/nodes/nowhere/{N2}")).status == 404
    assert lab.fake.password not in page + detail


async def test_an_operator_drains_and_evacuates_a_node_from_its_page(lab: Lab) -> None:
    await made(lab, "m1.example", N2)
    await made(lab, "m2.example", N2)
    csrf = await login(lab.client, "alice")
    # evacuate before the drain: refused, said why, nothing moved
    await lab.client.post(f"/nodes/alpha/{N2}/evacuate", data={"csrf": csrf})

    async def ended() -> Any:
        work = lab.console.nodes.work.of("alpha", N2)
        return work if work is not None and not work.running else None

    refused = await eventually(ended, what="the evacuation refused")
    assert refused.error is not None and "not drained" in refused.error
    page = await (await lab.client.post(f"/nodes/alpha/{N2}/drain", data={"csrf": csrf})).text()
    assert 'id="role">drained<' in page and f"drained node {N2} on alpha" in page
    confirm = await (await lab.client.get(f"/nodes/alpha/{N2}/evacuate")).text()
    assert 'id="confirm-evacuate"' in confirm and "not drained" not in confirm
    await lab.client.post(f"/nodes/alpha/{N2}/evacuate", data={"csrf": csrf, "iallocator": ""})
    work = await eventually(ended, what="the evacuation's end", timeout=60)
    assert work.error is None and work.report is not None and work.report["ok"], work.report
    assert work.done == work.total == 2
    page = await (await lab.client.get(f"/nodes/alpha/{N2}")).text()
    report = section(page, 'id="node-work"')
    assert 'data-running="no"' in page and report.count('data-outcome="moved"') == 2
    for name in ("m1.example", "m2.example"):
        stored = await lab.store.get_instance("alpha", name)
        assert (
            stored is not None
            and stored.pnode in (N1, N3)
            and stored.pnode == lab.fake.cluster.instances[name].pnode
        )
    await lab.client.post(f"/nodes/alpha/{N2}/undrain", data={"csrf": csrf})
    actions = [(e.action, e.target, e.outcome) for e in await StatusStore(lab.store).audit_log()]
    assert actions == [
        ("node-undrain", N2, "ok"),
        ("node-evacuate", N2, "ok"),
        ("node-evacuate-start", N2, "ok"),
        ("node-drain", N2, "ok"),
        ("node-evacuate", N2, "refused"),
        ("node-evacuate-start", N2, "ok"),
    ]


async def test_a_dead_node_is_failed_over_only_with_its_name_typed(lab: Lab) -> None:
    await made(lab, "f1.example", N3)
    csrf = await login(lab.client, "alice")
    lab.fake.crash_node(N3)
    response = await lab.client.post(f"/nodes/alpha/{N3}/failover", data={"csrf": csrf, "confirm": "wrong"})
    assert "type the node" in await response.text()
    assert lab.console.nodes.work.of("alpha", N3) is None
    await lab.client.post(f"/nodes/alpha/{N3}/failover", data={"csrf": csrf, "confirm": N3, "dead": "yes"})

    async def ended() -> Any:
        work = lab.console.nodes.work.of("alpha", N3)
        return work if work is not None and not work.running else None

    work = await eventually(ended, what="the failover's end", timeout=60)
    assert work.error is None and work.report is not None and work.report["ok"], (work.error, work.report)
    assert lab.fake.cluster.nodes[N3].offline
    stored = await lab.store.get_instance("alpha", "f1.example")
    assert stored is not None and stored.pnode in (N1, N2)
    page = await (await lab.client.get(f"/nodes/alpha/{N3}")).text()
    assert 'id="role">offline<' in page


async def test_an_operator_acts_on_an_instance_from_its_page_and_a_viewer_cannot(lab: Lab) -> None:
    await made(lab, "act.example", N2)
    stored = await lab.store.get_instance("alpha", "act.example")
    assert stored is not None
    path = f"/instances/{stored.id}"

    async def settled(status: InstanceStatus) -> bool:
        now = await lab.store.get_instance("alpha", "act.example")
        return now is not None and now.status is status and now.task is None

    await login(lab.client, "bob")
    page = await (await lab.client.get(path)).text()
    assert 'id="instance-stop"' in page and f'href="/nodes/alpha/{N2}"' in page
    csrf = page.split('name="csrf-token" content="', 1)[1].split('"', 1)[0]
    assert (await lab.client.post(f"{path}/stop", data={"csrf": csrf})).status == 403
    assert (
        "disabled"
        in (await (await lab.client.get(f"{path}/delete")).text()).split('id="confirm-delete"', 1)[1][:40]
    )

    csrf = await login(lab.client, "alice")
    for action, status in (("stop", InstanceStatus.STOPPED), ("start", InstanceStatus.STARTED)):
        page = await (await lab.client.post(f"{path}/{action}", data={"csrf": csrf})).text()
        assert f"{action} of act.example on alpha sent (job" in page, page
        await eventually(lambda status=status: settled(status), what=f"after {action}")
    await lab.client.post(f"{path}/reboot", data={"csrf": csrf})
    await eventually(lambda: settled(InstanceStatus.STARTED), what="after the reboot")
    await lab.client.post(f"{path}/migrate", data={"csrf": csrf})

    async def migrated() -> bool:
        now = await lab.store.get_instance("alpha", "act.example")
        return now is not None and now.task is None and now.pnode not in (None, N2)

    await eventually(migrated, what="the migration's end")
    wrong = await lab.client.post(f"{path}/reinstall", data={"csrf": csrf, "confirm": "nope"})
    assert "not done: type the instance" in await wrong.text()
    await lab.client.post(f"{path}/reinstall", data={"csrf": csrf, "confirm": "act.example"})
    await eventually(lambda: settled(InstanceStatus.STARTED), what="after the reinstall")
    await lab.client.post(f"{path}/delete", data={"csrf": csrf, "confirm": "act.example"})
    await eventually(lambda: settled(InstanceStatus.DESTROYED), what="the delete")
    assert "act.example" not in lab.fake.cluster.instances
    log = [(e.action, e.outcome, e.job_id is not None) for e in await StatusStore(lab.store).audit_log()]
    assert log == [
        ("instance-delete", "ok", True),
        ("instance-reinstall", "ok", True),
        ("instance-migrate", "ok", True),
        ("instance-reboot", "ok", True),
        ("instance-start", "ok", True),
        ("instance-stop", "ok", True),
    ]


async def test_an_operator_of_some_backends_acts_only_there(tmp_path: Path) -> None:
    """``operator@beta``: an operator of beta and a viewer of alpha (the node, instance, drain and
    reconcile actions refused there with a 403, and the pages hide them), a reconcile over every
    backend refused; a bad role line is an error naming the file and the line."""
    users = tmp_path / "console.users"
    users.write_text(f"otto:operator@beta:{hash_password('otto-Pa55-word')}\n")
    db_url = f"sqlite:///{tmp_path / 'store.db'}"
    async with (
        FakeGaneti(tls=False, nodes=2, op_times=QUICK) as a,
        FakeGaneti(tls=False, nodes=2, op_times=QUICK) as b,
    ):
        settings = Settings(
            database={"url": db_url},
            backends=[
                {"name": "alpha", "url": a.url, "username": a.username, "password": a.password},
                {"name": "beta", "url": b.url, "username": b.username, "password": b.password},
            ],
            web={"users_file": str(users), "secure_cookies": False},
        )
        async with Store(db_url) as store, ControlPlane(settings, store=store):
            console = Console(settings, store=store, capacity_interval=0.2, live_interval=0.05)
            client: TestClient[Any, Any] = TestClient(TestServer(console.build()))
            await client.start_server()
            try:
                response = await client.post(
                    "/login", data={"username": "otto", "password": "otto-Pa55-word"}, allow_redirects=False
                )
                assert response.status == 303
                page = await (await client.get("/")).text()
                assert "operator of beta" in page
                csrf = page.split('name="csrf-token" content="', 1)[1].split('"', 1)[0]
                node_a, node_b = sorted(a.cluster.nodes)[-1], sorted(b.cluster.nodes)[-1]
                refused = await client.post(f"/nodes/alpha/{node_a}/drain", data={"csrf": csrf})
                assert refused.status == 403 and "not of backend alpha" in await refused.text()
                assert not a.cluster.nodes[node_a].drained
                assert (await client.post("/backends/alpha/drain", data={"csrf": csrf})).status == 403
                assert (await client.post("/drift/run", data={"csrf": csrf})).status == 403  # every backend
                done = await client.post(f"/nodes/beta/{node_b}/drain", data={"csrf": csrf})
                assert done.status == 200 and b.cluster.nodes[node_b].drained
                shown = await (await client.get(f"/nodes/alpha/{node_a}")).text()
                assert '<div class="actions op-only" hidden>' in shown
                assert (
                    '<div class="actions op-only">'
                    in await (await client.get(f"/nodes/beta/{node_b}")).text()
                )
            finally:
                await client.close()
    users.write_text(f"otto:operator@:{hash_password('x')}\n")
    with pytest.raises(ConfigError, match="line 1: role 'operator@' names no backend"):
        read_users(users)
