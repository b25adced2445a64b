"""The facade's nodes, node, drain_node and undrain_node on the fake Ganeti (issue 30, item 1), on
both databases: every backend at once (one that does not answer reported, not raised), roles,
figures, instances, groups, the dispatcher's stored reads, the master refused as a conflict."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from synnefo_ganeti import ConflictError, ControlPlane, NotFoundError, Settings
from synnefo_ganeti.allocate._node_info import ROLES, master_refusal, node_info, node_role
from synnefo_ganeti.rapi import Node
from synnefo_ganeti.store import NodeRow, Store
from synnefo_ganeti.testing import FakeGaneti
from tests.helpers import spec
from tests.unit.test_dispatcher import backend

N1, N2, N3 = (f"node{i}.fake.test" for i in range(1, 4))


def settings(db_url: str, *backends: dict[str, object]) -> Settings:
    return Settings(database={"url": db_url}, backends=list(backends))


def dead(name: str) -> dict[str, object]:
    """A backend nothing answers at (a closed port)."""
    return {"name": name, "url": "http://127.0.0.1:9", "username": "u", "password": "p", "timeout": 2.0}


@pytest.mark.parametrize(
    ("letter", "role"),
    [("M", "master"), ("C", "candidate"), ("R", "regular"), ("D", "drained"), ("O", "offline")],
)
def test_the_role_is_ganetis_letter(letter: str, role: str) -> None:
    assert node_role(Node(name="n", role=letter)) == role == ROLES[letter]


def test_without_a_letter_the_role_comes_from_the_flags() -> None:
    assert node_role(Node(name="n", offline=True)) == "offline"
    assert node_role(Node(name="n", drained=True)) == "drained"
    assert node_role(Node(name="n", master_candidate=True)) == "candidate"
    assert node_role(Node(name="n")) == "regular"


def test_node_info_joins_figures_groups_and_the_stored_read() -> None:
    at = datetime(2026, 1, 2, tzinfo=UTC)
    raw = {"name": "n1", "role": "C", "mtotal": 4096, "mfree": 1024, "dtotal": 100, "dfree": 40, "ctotal": 4}
    node = Node.model_validate(raw | {"pinst_list": ["b", "a"], "sinst_list": ["c"], "group.uuid": "g-1"})
    row = {"name": "n1", "state": "down", "since": at, "seen_at": at, "detail": "job 3: Error 7"}
    info = node_info("b1", node, read_at=at, groups={"g-1": "default"}, stored=row)
    assert (info.memory_used, info.disk_used, info.cpus, info.group) == (3072, 60, 4, "default")
    assert info.primary_instances == ("a", "b") and info.secondary_instances == ("c",)
    assert (info.state, info.state_since, info.state_detail) == ("down", at, "job 3: Error 7")
    out = info.to_json()
    assert out["read_at"] == at.isoformat() and out["primary_instances"] == ["a", "b"]
    never = node_info("b1", Node(name="n2"), read_at=at)
    assert never.state is None and never.state_since is None and never.memory_used is None


def test_the_masters_refusal_is_read_from_ganetis_message() -> None:
    assert master_refusal("OpPrereqError: The master role can be changed only via master-failover")
    assert not master_refusal("OpPrereqError: Node 'x' not known") and not master_refusal(None)


async def test_nodes_of_every_backend_one_not_answering(db_url: str) -> None:
    async with FakeGaneti(tls=False, nodes=3) as fake, Store(db_url) as store:
        config = settings(db_url, backend("b1", fake), dead("b0"))
        async with ControlPlane(config, store=store) as cp:
            await cp.create_instance(spec("vm1.example", pnode=N2), backend="b1")
            since = datetime.now(UTC) - timedelta(minutes=5)
            await store.set_backend_nodes("b1", {N3: NodeRow("down", since, "job 9: Error 7")})
            await store.set_backend_nodes("b1", {N1: NodeRow("up")})
            listing = await cp.nodes()
            assert [b.backend for b in listing] == ["b0", "b1"]
            down, up = listing
            assert down.nodes == () and down.error
            assert up.error is None and [n.name for n in up.nodes] == [N1, N2, N3]
            by_name = {n.name: n for n in up.nodes}
            assert by_name[N1].role == "master" and by_name[N1].state == "up"
            assert by_name[N2].state is None  # never read by a dispatcher
            assert by_name[N3].state == "down" and by_name[N3].state_detail == "job 9: Error 7"
            assert by_name[N3].state_since is not None
            assert abs(by_name[N3].state_since.timestamp() - since.timestamp()) < 1
            assert by_name[N2].memory_total is not None and by_name[N2].memory_free is not None
            assert by_name[N2].memory_used == by_name[N2].memory_total - by_name[N2].memory_free
            assert by_name[N2].group == "default"
            assert all(n.read_at == up.read_at for n in up.nodes)
            assert [b.backend for b in await cp.nodes("b1")] == ["b1"]
            with pytest.raises(NotFoundError):
                await cp.nodes("nope")
            assert up.to_json()["nodes"][0]["name"] == N1


async def test_node_and_its_not_found(db_url: str) -> None:
    async with FakeGaneti(tls=False, nodes=3) as fake, Store(db_url) as store:
        cp = ControlPlane(settings(db_url, backend("b1", fake)), store=store)
        async with cp:
            _, job = await cp.create_instance(spec("vm1.example", pnode=N2), backend="b1")
            await (await cp.client("b1")).wait_for_job(job, timeout=10)
            node = await cp.node("b1", N2)
            assert node.backend == "b1" and node.role in ("candidate", "regular")
            assert "vm1.example" in node.primary_instances
            with pytest.raises(NotFoundError):
                await cp.node("b1", "nope.fake.test")
            with pytest.raises(NotFoundError):
                await cp.node("nope", N2)


async def test_drain_and_undrain_and_the_master_refused(db_url: str) -> None:
    async with FakeGaneti(tls=False, nodes=3) as fake, Store(db_url) as store:
        cp = ControlPlane(settings(db_url, backend("b1", fake)), store=store)
        async with cp:
            drained = await cp.drain_node("b1", N2)
            assert drained.role == "drained" and drained.drained and fake.cluster.nodes[N2].drained
            undrained = await cp.undrain_node("b1", N2)
            assert undrained.role != "drained" and not fake.cluster.nodes[N2].drained
            with pytest.raises(ConflictError, match="master-failover") as caught:
                await cp.drain_node("b1", N1)
            assert "master" in str(caught.value) and not fake.cluster.nodes[N1].drained
            with pytest.raises(NotFoundError):
                await cp.drain_node("b1", "nope.fake.test")
