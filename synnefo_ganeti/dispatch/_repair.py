"""Repair by policy: the dispatcher's root task ``dispatch repair`` (``[repair]``).

Design. Every ``[repair] interval`` seconds the task looks at each backend the health checks
find up, one after the other: it reads Ganeti (``/2/instances?bulk=1``, ``/2/nodes?bulk=1``,
``/2/groups?bulk=1``, the cluster's tags), the store (the backend's instance rows, its open
incidents and the end of their repairs' jobs) and the dispatcher's own node reads (which node is
down since when: ``allocate/_liveness.py``), and asks the pure
:func:`~synnefo_ganeti.allocate._repair.plan_repairs` what to do. Then it does it, in order:
closes the incidents whose problem went away or whose repair ended; opens one incident per
problem found (an open one of the same kind, node and instance is kept, never doubled); and
sends each repair the plan allows:

* ``start``, ``failover`` (``ignore_consistency``: the node is offline, dead), ``migrate``
  (``cleanup``) go through the facade's action machinery
  (:func:`~synnefo_ganeti.control._actions.run_action`): the instance's task is reserved first,
  so a repair never runs beside another action on the same instance (a user's, an operator's,
  another repair), and the job is recorded, so the watcher or the RAPI tracker stores its end;
  the incident keeps the job, and the next pass closes it ``repaired`` or ``failed`` from the
  job's stored end (a move's new primary node then read from Ganeti and stored);
* ``fence`` (a node down for ``node_down_after``): ``fence_command`` runs with the node's name
  (never through a shell, bounded by ``fence_timeout``); its exit 0 is the operator's word that
  the node is safe, and only then the node is marked offline in Ganeti (``auto_promote``), the
  job followed to its end; the incident closes ``repaired`` (or ``failed``: the command's exit
  status, or the job's error). Its instances then read ``ERROR_nodeoffline`` and fail over, each
  its own incident, at the following passes.

Off (``allow`` empty, the default) it still opens and closes incidents: report only. Nothing
here starts an instance whose old node may still run it: a failover waits for the node to be
offline, a start needs its node up (and, after a failed migration, every node up).

Several dispatchers on one PostgreSQL database look at a backend one at a time (an advisory
lock per backend, as the reconciler's). A pass that cannot read a backend (Ganeti or the
database busy) is logged and the next pass tries again; a repair Ganeti refuses closes its incident ``failed``. The task returns never; a
bug in it stops the dispatcher, as any root task's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from synnefo_ganeti.allocate._repair import (
    BackendFacts,
    InstanceFacts,
    NodeFacts,
    OpenFacts,
    Problem,
    plan_repairs,
)
from synnefo_ganeti.control._actions import run_action
from synnefo_ganeti.errors import GanetiError
from synnefo_ganeti.rapi import RapiClient
from synnefo_ganeti.store import (
    Incident,
    IncidentStore,
    InstanceAction,
    InstanceStatus,
    record_observed,
)

if TYPE_CHECKING:
    from synnefo_ganeti.dispatch._base import DispatcherBase

__all__ = ["REPAIR_TASK", "Repairer"]

log = logging.getLogger("synnefo_ganeti.dispatch")

#: every status but DESTROYED
_LIVE = tuple(s for s in InstanceStatus if s is not InstanceStatus.DESTROYED)

#: the root task's name
REPAIR_TASK = "dispatch repair"
#: a repair that failed is not sent again for the same problem within this many seconds
FAILED_HOLD = 3600.0

_ACTIONS = {
    "start": InstanceAction.STARTUP,
    "failover": InstanceAction.FAILOVER,
    "migrate": InstanceAction.MIGRATE,
}


class Repairer:
    """The repair task of one dispatcher (see the module)."""

    def __init__(self, dispatcher: DispatcherBase) -> None:
        self.dispatcher = dispatcher
        self.incidents = IncidentStore(dispatcher.store)
        #: passes done, repairs sent (a test waits for them)
        self.passes = 0
        self.sent = 0
        #: (backend, kind, node, instance) -> when its repair failed
        self._failed: dict[tuple[str, str, str | None, str | None], float] = {}

    def __repr__(self) -> str:
        return f"<Repairer {self.passes} passes, {self.sent} repairs sent>"

    async def run(self) -> None:
        """A pass over every backend that is up, every ``[repair] interval``; never returns."""
        d = self.dispatcher
        while True:
            for name in list(d._backends):
                if d.health is not None and not d.health.tracker.is_up(name):
                    continue
                if d.leases is not None and d.leases.shared and not d.leases.holds(name):
                    continue  # the holder of its follow lease looks at it (one read of it, not N)
                try:
                    await self._held_pass(name)
                except (GanetiError, OSError, TimeoutError) as exc:
                    log.warning("repair: backend %s not looked at (%s); again in the next pass", name, exc)
            self.passes += 1
            await asyncio.sleep(d.settings.repair.interval)

    async def _held_pass(self, backend: str) -> None:
        """:meth:`pass_once` holding the advisory lock ``repair:BACKEND`` on PostgreSQL (the
        dispatcher's liveness connection, as the reconciler's per-backend lock), so that several
        dispatchers on one database repair a backend one at a time (never a node fenced twice)."""
        lock = self.dispatcher._lock
        if lock is None or self.dispatcher.store.dialect != "postgresql":
            await self.pass_once(backend)
            return
        if not await lock._try(f"repair:{backend}"):
            return  # another dispatcher looks at it now
        try:
            await self.pass_once(backend)
        finally:
            await lock._unlock(f"repair:{backend}")

    async def facts(self, backend: str, client: RapiClient) -> BackendFacts:
        """What :func:`plan_repairs` reads of ``backend`` now."""
        d = self.dispatcher
        settings = d.settings.repair
        timeout = max(30.0, 4 * d.settings.dispatcher.health_timeout)
        # the rows first, Ganeti after: a row that says "should run" was so before Ganeti was read,
        # so Ganeti's answer is at least as new. (Read the other way round, a create that ended
        # between the two reads paired its new STARTED row with Ganeti's "ERROR_down" of the
        # instance being made: an incident for nothing.)
        rows = {
            r.name: r
            # (the live rows only: a store keeps every instance it ever had, DESTROYED)
            for r in await d.store.list_instances(backend=backend, status=_LIVE)
            if r.owned
        }
        async with asyncio.timeout(timeout):
            nodes = await client.list_nodes()
            groups = await client.list_groups()
            instances = await client.list_instances()
            cluster_tags = await client.get_cluster_tags()
        group_tags = {g.uuid: tuple(g.tags) for g in groups}
        states = d.allocator.node_states(backend)
        node_facts = {}
        for node in nodes:
            state = states.get(node.name)
            down = state.since if state is not None and state.state == "down" else None
            node_facts[node.name] = NodeFacts(
                node.name, node.offline, down, group_tags.get(node.group_uuid, ())
            )
        instance_facts = []
        for inst in instances:
            row = rows.get(inst.name)
            if row is None:
                continue  # not ours: never repaired
            last = row.last_error or {}
            instance_facts.append(
                InstanceFacts(
                    inst.name,
                    inst.status,
                    inst.pnode,
                    inst.disk_template,
                    tuple(inst.tags),
                    row_status=row.status.value,
                    busy=row.task is not None,
                    migration_failed=last.get("action") == InstanceAction.MIGRATE.value,
                )
            )
        open_facts = []
        for incident in await self.incidents.incidents(open_only=True, backend=backend, limit=None):
            status = None
            if incident.job_id is not None and incident.action in _ACTIONS:
                job = await d.store.get_job(backend, incident.job_id)
                if job is not None and job.status.is_final:
                    status = job.status.value
            open_facts.append(
                OpenFacts(
                    incident.id,
                    incident.kind,
                    incident.node,
                    incident.instance,
                    incident.action,
                    incident.job_id if incident.action in _ACTIONS else None,
                    status,
                )
            )
        now = time.time()
        failed = frozenset(
            key[1:] for key, at in self._failed.items() if key[0] == backend and now - at < FAILED_HOLD
        )
        return BackendFacts(
            backend=backend,
            now=now,
            node_down_after=settings.node_down_after,
            allowed=settings.allowed(d.settings.backend(backend)),
            can_fence=settings.fence_command is not None,
            cluster_tags=tuple(cluster_tags),
            nodes=node_facts,
            instances=tuple(instance_facts),
            open=tuple(open_facts),
            failed=failed,
        )

    async def pass_once(self, backend: str) -> None:
        """One look at ``backend``: incidents closed and opened, repairs sent."""
        client = await self.dispatcher.client(backend)
        facts = await self.facts(backend, client)
        known = {incident.id for incident in facts.open}
        plan = plan_repairs(facts)
        for close in plan.closes:
            incident = await self.incidents.close_incident(close.id, close.outcome, detail=close.detail)
            if close.outcome == "failed":
                self._failed[(backend, incident.kind, incident.node, incident.instance)] = time.time()
            elif incident.action in ("failover", "migrate") and incident.instance is not None:
                await self._landed(backend, client, incident.instance)
            log.warning(
                "repair: incident %d (%s %s) closed %s: %s",
                incident.id, incident.kind, incident.instance or incident.node, close.outcome, close.detail,
            )  # fmt: skip
        for problem in plan.problems:
            incident = await self.incidents.open_incident(
                problem.kind, backend, node=problem.node, instance=problem.instance, detail=problem.detail
            )
            if incident.id not in known:
                log.error("repair: backend %s: %s (incident %d)", backend, problem.detail, incident.id)
            if problem.action is None or incident.action is not None:
                continue
            if problem.action == "fence":
                await self._fence(backend, client, incident)
            else:
                await self._send(backend, client, incident, problem)

    async def _send(self, backend: str, client: RapiClient, incident: Incident, problem: Problem) -> None:
        name = problem.instance
        assert name is not None and problem.action is not None
        action = problem.action
        if action == "start":

            async def submit(c: RapiClient) -> int:
                return await c.startup_instance(name)
        elif action == "failover":

            async def submit(c: RapiClient) -> int:
                return await c.failover_instance(name, ignore_consistency=True)
        else:

            async def submit(c: RapiClient) -> int:
                return await c.migrate_instance(name, cleanup=True)

        try:
            job_id = await run_action(self.dispatcher.store, client, backend, name, _ACTIONS[action], submit)
        except GanetiError as exc:
            log.error("repair: %s of %s on %s not sent: %s", action, name, backend, exc)
            await self.incidents.set_repair(incident.id, action)
            await self._close_failed(backend, incident, f"{action} not sent: {exc}")
            return
        self.sent += 1
        await self.incidents.set_repair(incident.id, action, job_id=job_id)
        log.warning(
            "repair: %s of %s on %s sent (job %d, incident %d)", action, name, backend, job_id, incident.id
        )

    async def _landed(self, backend: str, client: RapiClient, name: str) -> None:
        """After a move succeeded: the instance's primary node as Ganeti reads it, stored."""
        try:
            pnode = (await client.get_instance(name)).pnode
        except GanetiError as exc:
            log.info("repair: %s moved; its node not read (%s): the next reconcile pass stores it", name, exc)
            return
        if pnode is not None:
            await record_observed(self.dispatcher.store, backend, {name: {"pnode": pnode}})

    async def _fence(self, backend: str, client: RapiClient, incident: Incident) -> None:
        settings = self.dispatcher.settings.repair
        node = incident.node
        assert node is not None
        argv = settings.fence_argv(node)
        await self.incidents.set_repair(incident.id, "fence")
        self.sent += 1
        log.warning("repair: fencing node %s of %s: %s", node, backend, argv[0])
        try:
            process = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )  # fmt: skip
        except OSError as exc:
            await self._close_failed(backend, incident, f"fence_command could not run: {exc}")
            return
        try:
            async with asyncio.timeout(settings.fence_timeout):
                output, _ = await process.communicate()
        except TimeoutError:
            process.kill()
            await process.wait()
            await self._close_failed(
                backend, incident, f"fence_command did not end within {settings.fence_timeout:g} s"
            )
            return
        said = output.decode(errors="replace").strip()[-500:]
        if process.returncode != 0:
            await self._close_failed(
                backend, incident, f"fence_command exited {process.returncode}: {said or 'no output'}"
            )
            return
        try:
            job_id = await client.modify_node(node, offline=True, auto_promote=True)
            job = await client.wait_for_job(job_id)
        except GanetiError as exc:
            await self._close_failed(backend, incident, f"fenced; marking {node} offline failed: {exc}")
            return
        await self.incidents.set_repair(incident.id, "fence", job_id=job_id)
        if job.status.value != "success":
            why = job.failure.message if job.failure is not None else f"it ended {job.status.value}"
            await self._close_failed(
                backend, incident, f"fenced; marking {node} offline failed (job {job_id}): {why}"
            )
            return
        await self.incidents.close_incident(
            incident.id,
            "repaired",
            detail=f"fenced ({said or 'exit 0'}); {node} marked offline (job {job_id})",
        )
        log.warning("repair: node %s of %s fenced and marked offline (job %d)", node, backend, job_id)

    async def _close_failed(self, backend: str, incident: Incident, detail: str) -> None:
        log.error("repair: incident %d on %s failed: %s", incident.id, backend, detail)
        self._failed[(backend, incident.kind, incident.node, incident.instance)] = time.time()
        await self.incidents.close_incident(incident.id, "failed", detail=detail)
