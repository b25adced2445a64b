"""The console's "Needs attention" page lists the open incidents (issue 30 item 2): kind, backend,
node, instance, the repair sent (or "report only") and what is wrong; closed ones are not there.
(On a backend the world's dispatcher does not serve, so that its repair task leaves them be.)"""

from __future__ import annotations

from synnefo_ganeti.store import IncidentStore
from tests.unit.test_console import World, login, world

__all__ = ["world"]  # (the fixture, shared with test_console.py)


async def test_needs_attention_shows_the_open_incidents(world: World) -> None:
    incidents = IncidentStore(world.store)
    node = await incidents.open_incident("node-down", "athens", node="n3.example", detail="down for 130 s")
    vm = await incidents.open_incident(
        "instance-error", "athens", node="n3.example", instance="vm.example", detail="its node is offline"
    )
    await incidents.set_repair(vm.id, "failover", job_id=77)
    gone = await incidents.open_incident("instance-stopped", "athens", node="n1.example", instance="old")
    await incidents.close_incident(gone.id, "resolved")
    await login(world.client, "bob")
    page = await (await world.client.get("/attention")).text()
    part = page.split('id="open-incidents"', 1)[1].split("</section>", 1)[0]
    assert ">2</span>" in part
    down = part.split(f'data-incident="{node.id}"', 1)[1].split("</tr>", 1)[0]
    assert "node-down" in down and "n3.example" in down and "report only" in down and "down for 130 s" in down
    moving = part.split(f'data-incident="{vm.id}"', 1)[1].split("</tr>", 1)[0]
    assert "failover" in moving and 'href="/jobs/athens/77"' in moving and "vm.example" in moving
    assert f'data-incident="{gone.id}"' not in part
