"""Incidents in the store (``IncidentStore``) on both databases: opened once per problem, a repair
recorded, closed once; each write a change of the feed (kind "incident") in its transaction, seen
by a follower (woken by NOTIFY on PostgreSQL) and POSTed by the webhook."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from synnefo_ganeti.dispatch import Dispatcher
from synnefo_ganeti.errors import NotFoundError
from synnefo_ganeti.store import IncidentStore, Store
from tests.helpers import eventually
from tests.unit.test_change_feed import _settings, receiver
from tests.unit.test_dispatcher import running


async def test_incidents_open_once_take_a_repair_and_close_once(db_url: str) -> None:
    async with Store(db_url) as store:
        incidents = IncidentStore(store)
        assert "IncidentStore" in repr(incidents)
        first = await incidents.open_incident("instance-error", "b", node="n3", instance="vm", detail="lost")
        again = await incidents.open_incident("instance-error", "b", node="n3", instance="vm")
        assert again == first and first.open and first.action is None
        moved_on = await incidents.open_incident(
            "instance-error", "b", node="n3", instance="vm", detail="now"
        )
        assert moved_on.id == first.id and moved_on.detail == "now"  # the detail follows
        node = await incidents.open_incident("node-down", "b", node="n3")
        assert node.id != first.id
        repaired = await incidents.set_repair(first.id, "failover", job_id=42)
        assert (repaired.action, repaired.job_id) == ("failover", 42)
        closed = await incidents.close_incident(first.id, "repaired", detail="job 42 ended success")
        assert not closed.open and closed.outcome == "repaired" and closed.closed_at is not None
        assert await incidents.close_incident(first.id, "failed") == closed  # closed: unchanged
        assert [i.id for i in await incidents.incidents(open_only=True)] == [node.id]
        assert [i.id for i in await incidents.incidents(backend="b")] == [node.id, first.id]  # newest first
        assert await incidents.incidents(backend="other") == []
        assert closed.to_json() | {"opened": None, "updated": None, "closed": None} == {
            "id": first.id, "kind": "instance-error", "backend": "b", "node": "n3", "instance": "vm",
            "opened": None, "updated": None, "action": "failover", "job": 42, "closed": None,
            "outcome": "repaired", "detail": "job 42 ended success",
        }  # fmt: skip
        # a new problem after the close is a new incident
        assert (await incidents.open_incident("instance-error", "b", node="n3", instance="vm")).id != first.id
        with pytest.raises(NotFoundError):
            await incidents.get(10_000)
        with pytest.raises(ValueError, match="incident kind"):
            await incidents.open_incident("bogus", "b")
        with pytest.raises(ValueError, match="outcome"):
            await incidents.close_incident(node.id, "fine")


async def test_each_incident_write_is_a_change_of_the_feed(db_url: str) -> None:
    async with Store(db_url, poll_interval=0.05) as store, Store(db_url, poll_interval=0.05) as other:
        incidents = IncidentStore(store)
        seen: list[tuple[str, str, str | None, str | None]] = []

        async def follow() -> None:
            async with contextlib.aclosing(other.changes(0)) as feed:
                async for c in feed:  # (endless: no comprehension)
                    seen.append((c.kind, c.key, c.status, c.task))  # noqa: PERF401

        follower = asyncio.create_task(follow())
        try:
            incident = await incidents.open_incident("node-down", "b", node="n3", detail="down 130 s")
            await incidents.set_repair(incident.id, "fence")
            await incidents.close_incident(incident.id, "repaired")
            key = str(incident.id)
            await eventually(lambda: len(seen) >= 3, what="three incident changes in another store")
            assert seen == [("incident", key, "open", None), ("incident", key, "open", "fence"),
                            ("incident", key, "repaired", "fence")]  # fmt: skip
        finally:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower
        (first, *_) = await store.list_changes()
        assert first.to_json() == {
            "id": first.id, "kind": "incident", "key": key, "status": "open", "task": None,
            "error": "down 130 s", "at": first.at.isoformat(),
        }  # fmt: skip


async def test_the_webhook_posts_incident_changes(db_url: str, tmp_path: Path) -> None:
    async with receiver() as (recv, url), Store(db_url, poll_interval=0.05) as store:
        incident = await IncidentStore(store).open_incident("instance-stopped", "b", node="n1", instance="vm")
        async with running(Dispatcher(_settings(db_url, url, tmp_path), store=store, status_server=False)):
            await eventually(lambda: recv.delivered(), what="the incident's change POSTed")
        body = recv.posts[0][0]
        assert (body["kind"], body["key"], body["status"]) == ("incident", str(incident.id), "open")
        assert "node_state" not in body and "waiting_reason" not in body
