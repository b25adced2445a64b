"""One network across backends (issue 28 item 3), on two fake Ganetis and both databases: each
backend hands out its own range of the subnet (no address twice), placement goes only where a
spec's networks are and have a free address, a network that exists nowhere is refused at once,
and the reconciler reports an address held by two instances (``address_conflict``)."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from synnefo_ganeti import ControlPlane, ValidationError
from synnefo_ganeti.allocate import backend_range
from synnefo_ganeti.config import Settings
from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.rapi import InstanceSpec
from synnefo_ganeti.reconcile import Reconciler
from synnefo_ganeti.store import InstanceStatus, Request, RequestStatus, Store, StoredInstance
from synnefo_ganeti.testing import FakeGaneti
from tests import helpers
from tests.helpers import eventually
from tests.unit.test_dispatcher import backend, creates, fakes, running, settings_for
from tests.unit.test_networks_reconciler import cli

QUICK = {"OP_INSTANCE_CREATE": 0.02, "OP_INSTANCE_REMOVE": 0.01, "OP_NETWORK_ADD": 0.01,
         "OP_NETWORK_CONNECT": 0.01, "OP_NETWORK_DISCONNECT": 0.01, "OP_NETWORK_REMOVE": 0.01,
         "OP_NETWORK_SET_PARAMS": 0.01}  # fmt: skip
NET = "cnet-wide"


def on(network: str, name: str, ip: str = "pool") -> InstanceSpec:
    return helpers.spec(name, nics=[{"network": network, "ip": ip}])


@asynccontextmanager
async def cloud(db_url: str) -> AsyncIterator[tuple[FakeGaneti, FakeGaneti, Store, ControlPlane, Settings]]:
    """Two fake backends f1 and f2, a store and a ControlPlane (no dispatcher yet)."""
    async with fakes(2, op_times=QUICK) as (f1, f2):
        settings = settings_for(db_url, [backend("f1", f1), backend("f2", f2)])
        async with Store(db_url) as store, ControlPlane(settings, store=store) as cp:
            yield f1, f2, store, cp, settings


async def ended(cp: ControlPlane, ids: list[str]) -> list[Request]:
    done = [await cp.wait_request(rid, timeout=20) for rid in ids]
    assert all(r.status is RequestStatus.SUCCEEDED for r in done), [r.error for r in done]
    return done


async def address(store: Store, request: Request) -> tuple[str, str]:
    """(backend, the address Ganeti gave the request's instance), once the store has it."""
    assert request.backend is not None and request.instance is not None
    backend_name, name = request.backend, request.instance

    async def stored() -> StoredInstance | None:
        found = await store.get_instance(backend_name, name)
        ok = found is not None and found.nics and found.nics[0].get("ip") not in (None, "pool")
        return found if ok else None

    instance: StoredInstance = await eventually(stored, what=f"{name}'s address to be stored")
    return backend_name, str(instance.nics[0]["ip"])


def external(fake: FakeGaneti, network: str) -> set[str]:
    return set(fake.cluster.model.networks[network].pool.external())


async def test_a_network_on_two_backends_gives_no_address_twice(db_url: str) -> None:
    async with cloud(db_url) as (f1, f2, store, cp, settings):
        await cp.create_network(NET, subnet="10.88.0.0/28", gateway="10.88.0.1")
        # f1 hands out 10.88.0.1-7 (the gateway among them), f2 10.88.0.8-14; each pool holds
        # the other's range reserved, before any group was connected
        assert external(f1, NET) == {"10.88.0.0", "10.88.0.1", "10.88.0.15"} | {
            f"10.88.0.{i}" for i in range(8, 15)
        }
        assert external(f2, NET) == {"10.88.0.0", "10.88.0.15"} | {f"10.88.0.{i}" for i in range(1, 8)}
        async with running(Dispatcher(settings, store=store, status_server=False)):
            ids = [await cp.request_instance(on(NET, f"wide{i}.example")) for i in range(10)]
            done = await ended(cp, ids)
            got = [await address(store, request) for request in done]
        addresses = [ip for _, ip in got]
        assert len(set(addresses)) == 10, got  # never one address twice
        for backend_name, ip in got:
            low, high = backend_range("10.88.0.0/28", ["f1", "f2"], backend_name) or (None, None)
            assert low is not None and high is not None and low <= ipaddress.IPv4Address(ip) <= high, got
        assert {b for b, _ in got} == {"f1", "f2"}  # 6 free on f1, 7 on f2: 10 need both


async def test_placement_goes_only_where_the_network_is(db_url: str) -> None:
    async with cloud(db_url) as (f1, f2, store, cp, settings):
        await cp.create_network("solo", subnet="10.89.0.0/24", backends=["f2"])
        assert "solo" not in f1.cluster.model.networks
        async with running(Dispatcher(settings, store=store, status_server=False)):
            ids = [await cp.request_instance(on("solo", f"solo{i}.example")) for i in range(6)]
            done = await ended(cp, ids)
        assert [r.backend for r in done] == ["f2"] * 6
        assert creates(f1) == 0 and len(f2.cluster.instances) == 6


async def test_a_full_pool_is_skipped_while_another_has_room_and_a_delete_frees_one(db_url: str) -> None:
    async with cloud(db_url) as (f1, f2, store, cp, settings):
        # a /29: f1 hands out .1-.3 (the gateway .1 reserved: 2 free), f2 .4-.6 (3 free)
        await cp.create_network(NET, subnet="10.90.0.0/29", gateway="10.90.0.1")
        async with running(Dispatcher(settings, store=store, status_server=False)) as d:
            ids = [await cp.request_instance(on(NET, f"full{i}.example")) for i in range(5)]
            done = await ended(cp, ids)
            got = sorted([await address(store, r) for r in done], key=lambda g: ipaddress.IPv4Address(g[1]))
            assert got == [("f1", "10.90.0.2"), ("f1", "10.90.0.3"),
                           ("f2", "10.90.0.4"), ("f2", "10.90.0.5"), ("f2", "10.90.0.6")]  # fmt: skip

            # both pools full (once the stats after the creates are read): no backend takes one more
            sixth = on(NET, "full5.example")

            def refused() -> dict[str, str] | None:
                reasons = d.allocator.rejected(sixth)
                return reasons if all("no free address" in reasons.get(b, "") for b in ("f1", "f2")) else None

            await eventually(refused, what="both backends refused for want of an address")

            # a delete gives its address back; the next request takes it
            freed = next(r for r in done if r.backend == "f1")
            await cp.delete_instance(str(freed.instance), backend="f1")

            async def destroyed() -> bool:
                found = await store.get_instance("f1", str(freed.instance))
                return found is not None and found.status is InstanceStatus.DESTROYED

            await eventually(destroyed, what="the deleted instance to be DESTROYED")
            (last,) = await ended(cp, [await cp.request_instance(sixth)])
            assert await address(store, last) in {("f1", "10.90.0.2"), ("f1", "10.90.0.3")}
        assert creates(f1, f2) == 6


async def test_a_network_that_exists_nowhere_is_refused_at_once(db_url: str) -> None:
    async with cloud(db_url) as (_f1, _f2, _store, cp, _settings):
        with pytest.raises(ValidationError, match="network nowhere not on this backend") as caught:
            await cp.request_instance(on("nowhere", "lost.example"))
        assert caught.value.field == "nics[0].network"
        await cp.create_network("solo", subnet="10.91.0.0/24", backends=["f2"])
        # the catalogs read before the network was made are read again before refusing
        assert await cp.request_instance(on("solo", "found.example"))
        with pytest.raises(ValidationError, match="network solo not on this backend") as pinned:
            await cp.request_instance(on("solo", "pinned.example"), backend="f1")
        assert pinned.value.field == "nics[0].network"
        # a fixed address outside the subnet is refused with its field
        with pytest.raises(ValidationError, match=r"address 10\.0\.0\.5 not in network solo") as outside:
            await cp.request_instance(on("solo", "outside.example", ip="10.0.0.5"), backend="f2")
        assert outside.value.field == "nics[0].ip"
        assert [r.instance for r in await cp.list_requests()] == ["found.example"]  # nothing else written


async def test_an_address_held_by_two_instances_is_reported(db_url: str, tmp_path: Path) -> None:
    async with cloud(db_url) as (f1, f2, store, cp, settings):
        await cp.create_network(NET, subnet="10.92.0.0/28", gateway="10.92.0.1")
        # a network made before ranges (or an operator's gnt-network modify): f2's pool free again
        async with helpers.fake_client(f2) as client:
            freed = [f"10.92.0.{i}" for i in range(2, 8)]
            job = await client.wait_for_job(await client.modify_network(NET, remove_reserved_ips=freed))
            assert job.status.value == "success"
        async with running(Dispatcher(settings, store=store, status_server=False)):
            ids = [await cp.request_instance(on(NET, f"twin{b}.example"), backend=b) for b in ("f1", "f2")]
            done = await ended(cp, ids)
            assert [await address(store, r) for r in done] == [("f1", "10.92.0.2"), ("f2", "10.92.0.2")]
            async with Reconciler(settings, store=store) as reconciler:
                report = await reconciler.run_once()
        assert report.ok and not report.clean
        for backend_report in report.backends:
            conflicts = [d for d in backend_report.networks if d.kind.value == "address_conflict"]
            assert [(d.network, d.address, d.fixed) for d in conflicts] == [(NET, "10.92.0.2", False)]
            assert "twinf1.example (f1), twinf2.example (f2)" in conflicts[0].detail
        assert {i.name for i in f1.cluster.instances.values()} == {"twinf1.example"}  # report-only

        config = tmp_path / "synnefo-ganeti.toml"
        config.write_text(
            f'[database]\nurl = "{db_url}"\n\n'
            + "".join(
                f'[[backends]]\nname = "{name}"\nurl = "{fake.url}"\n'
                f'username = "{fake.username}"\npassword = "{fake.password}"\n\n'
                for name, fake in (("f1", f1), ("f2", f2))
            )
        )
        found = await cli("reconcile", "--config", str(config), "--json")
        data: dict[str, Any] = json.loads(found.stdout)
        kinds = {(b["name"], d["kind"], d["address"]) for b in data["backends"] for d in b["networks"]}
        assert kinds >= {("f1", "address_conflict", "10.92.0.2"), ("f2", "address_conflict", "10.92.0.2")}
        table = await cli("reconcile", "--config", str(config))
        assert table.exit_code == 1 and "address_conflict" in table.output

        # f2's pool leaves f1's range free: out of sync there, and its fix reserves the range again
        assert ("f2", "network_out_of_sync", None) in kinds and (
            "f1",
            "network_out_of_sync",
            None,
        ) not in kinds
        fixed = await cli("reconcile", "--config", str(config), "--json", "--fix-network-out-of-sync")
        after = json.loads(fixed.stdout)
        assert [
            (d["kind"], d["fixed"]) for b in after["backends"] if b["name"] == "f2" for d in b["networks"]
        ] == [
            ("network_out_of_sync", True),
            ("address_conflict", False),
        ]
        assert external(f2, NET) >= set(freed)  # 10.92.0.2 too: held by twinf2 and reserved
        again = json.loads((await cli("reconcile", "--config", str(config), "--json")).stdout)
        assert {d["kind"] for b in again["backends"] for d in b["networks"]} == {"address_conflict"}


async def test_the_fake_refuses_nics_in_ganeti_s_words() -> None:
    """LUInstanceCreate.CheckPrereq and LUInstanceSetParams._PrepareNicModification, as worded in
    Ganeti 3.0: a pool without a free address, a fixed address taken, a network not connected."""
    async with FakeGaneti(tls=False, op_times=QUICK) as fake, helpers.fake_client(fake) as client:
        await client.wait_for_job(await client.create_network("tiny", "10.93.0.0/30"))  # .1 and .2
        await client.wait_for_job(await client.create_network("loose", "10.94.0.0/30"))  # no group
        await client.wait_for_job(await client.connect_network("tiny", "default", "bridged", "br0"))

        async def failure(job_id: int) -> tuple[str, str | None]:
            job = await client.wait_for_job(job_id)
            assert job.failure is not None, job
            return job.failure.message, job.failure.ecode

        made = [on("tiny", f"t{i}.example") for i in range(2)]
        for spec in made:
            assert (await client.wait_for_job(await client.create_instance(spec))).status.value == "success"
        full = helpers.spec("t2.example", nics=[{"mode": "bridged"}, {"network": "tiny", "ip": "pool"}])
        assert await failure(await client.create_instance(full)) == (
            "Unable to get a free IP for NIC 1 from the address pool",
            "wrong_state",
        )
        assert await failure(await client.create_instance(on("tiny", "t3.example", ip="10.93.0.1"))) == (
            "IP address 10.93.0.1 already in use or does not belong to network tiny",
            "not_unique",
        )
        message, ecode = await failure(await client.create_instance(on("loose", "t4.example")))
        assert message.startswith("No netparams found for network loose. Probably not connected to node's ")
        assert ecode == "wrong_input"
        add = await client.modify_instance("t0.example", nics=[["add", {"network": "tiny", "ip": "pool"}]])
        assert await failure(add) == ("Unable to get a free IP from the address pool", "wrong_state")
        taken = await client.modify_instance(
            "t0.example", nics=[["add", {"network": "tiny", "ip": "10.93.0.2"}]]
        )
        assert await failure(taken) == ("IP 10.93.0.2 not available in network tiny", "not_unique")
        loose = await client.modify_instance("t0.example", nics=[["add", {"network": "loose", "ip": "pool"}]])
        assert await failure(loose) == (
            "No netparams found for the network loose, probably not connected",
            "wrong_input",
        )
