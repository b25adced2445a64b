"""Rolling maintenance of a backend: :class:`RollingMaintenance` plans it, runs it, resumes it.

Design. The plan is decided in pure code (:func:`~synnefo_ganeti.allocate.plan_maintenance`,
after hroller: groups of nodes sharing no instance, split until what moves fits, the master
alone and last) from one read of Ganeti's nodes and instances; the run then does, group after
group, for every node of the group, one phase at a time:

1. ``drain`` (:meth:`~synnefo_ganeti.ControlPlane.drain_node`): nothing new lands there (the
   dispatcher already places creates off drained nodes, so creates go on meanwhile); every node
   of the group is drained before any is evacuated, so that no instance moves to a node of the
   group;
2. ``evacuate`` (:meth:`~synnefo_ganeti.ControlPlane.evacuate_node`): live-migrate what runs,
   fail over the rest; an instance that failed to move fails the run (it would stop);
3. ``command``: the operator's command with ``{node}`` replaced by the node's name (a reboot, an
   upgrade), run by a shell; a non-zero exit fails the run;
4. ``wait``: until Ganeti reads the node's live figures again (``GET /2/nodes/NAME``: ``mfree``
   not null, not offline), within :attr:`MaintenanceOptions.wait_timeout`;
5. ``undrain``.

The master's group (one node) starts with ``failover``: Ganeti drains the master only after a
master failover, and RAPI has none, so :attr:`MaintenanceOptions.master_failover_command` runs
with ``{node}`` the new master (a master candidate, online, not drained, read up), and the run
waits until RAPI names that node master (RAPI moves with the master: the client's URL must
follow the cluster's address). It ends with ``failback`` (the same command with ``{node}`` the
old master) unless ``master_back`` is off. Ganeti's ``master-failover`` may exit 1 while the
role did move ("The master IP did not come up within 30 seconds"): what Ganeti reads decides.

Every job (drains, moves) goes at :data:`~synnefo_ganeti.rapi._base.PRIORITY_LOW`, below the
cloud's actions (normal). The position (group, phase, node, the nodes done in the phase, steps
done) is stored before and after every step (:class:`~synnefo_ganeti.store.operations._maintenance.MaintenanceStore`),
every step is logged and written to the audit log, and a heartbeat says the run is alive while a
long step runs. A process killed in the middle leaves its run ``running`` with an old heartbeat:
:meth:`RollingMaintenance.run` again resumes it at the step it was in (the stored plan, not a
new one; that step runs again: each one is idempotent but the command, which runs again). A
failed step leaves the run ``failed`` at that step: after the operator's fix, ``run`` resumes
it; ``cancel`` ends it (the nodes stay as they are: a drained node stays drained).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any
from uuid import uuid4

from synnefo_ganeti.allocate import MaintenancePlan, maintenance_inputs, plan_maintenance
from synnefo_ganeti.control._maintenance_steps import Steps
from synnefo_ganeti.errors import (
    ConfigError,
    ConflictError,
    InvalidError,
    MaintenanceStepError,
    NotFoundError,
)
from synnefo_ganeti.rapi._base import PRIORITY_LOW, job_priority
from synnefo_ganeti.store.operations._maintenance import MaintenanceRecord, MaintenanceStore
from synnefo_ganeti.store.operations._status import StatusStore

if TYPE_CHECKING:
    from synnefo_ganeti.control._facade import ControlPlane

__all__ = [
    "CommandResult",
    "CommandRunner",
    "MaintenanceOptions",
    "MaintenanceProgress",
    "RollingMaintenance",
    "shell_command",
]

log = logging.getLogger("synnefo_ganeti.maintenance")

#: the phases of a node's turn, in order; the master's turn adds failover before and failback after
PHASES = ("drain", "evacuate", "command", "wait", "undrain")


@dataclass(frozen=True, slots=True)
class CommandResult:
    """How a command ended: its exit status and its output (stdout and stderr together)."""

    returncode: int
    output: str


CommandRunner = Callable[[str, float], Awaitable[CommandResult]]
#: ``progress(steps_done, steps_total, what)``
MaintenanceProgress = Callable[[int, int, str], None]


async def shell_command(command: str, timeout: float) -> CommandResult:
    """Run ``command`` by ``/bin/sh``; killed after ``timeout`` seconds (exit status -9 then)."""
    proc = await asyncio.create_subprocess_shell(
        command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True
    )
    try:
        async with asyncio.timeout(timeout):
            out, _ = await proc.communicate()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        await proc.wait()
        return CommandResult(-9, f"killed after {timeout:g} s")
    return CommandResult(proc.returncode or 0, out.decode(errors="replace"))


@dataclass(frozen=True, slots=True, kw_only=True)
class MaintenanceOptions:
    """How a run goes (stored with a new run: a resumed run keeps the options it started with)."""

    #: run with ``{node}`` the new master (the old one when handing the role back)
    master_failover_command: str = "ssh {node} gnt-cluster master-failover"
    #: hand the master role back to the old master at the end of its turn
    master_back: bool = True
    #: seconds for Ganeti to read a node again after the command
    wait_timeout: float = 900.0
    #: seconds the operator's command may take (then it is killed and the run fails)
    command_timeout: float = 3600.0
    #: seconds for RAPI to name the new master after the failover command
    master_timeout: float = 300.0
    #: seconds between two reads of Ganeti while waiting
    poll_interval: float = 2.0
    #: the priority of the run's jobs (Ganeti's low: below the cloud's actions)
    priority: int = PRIORITY_LOW

    def __post_init__(self) -> None:
        job_priority(self.priority)
        if min(self.wait_timeout, self.command_timeout, self.master_timeout, self.poll_interval) <= 0:
            raise ConfigError("maintenance timeouts and the poll interval must be above 0")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MaintenanceOptions:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


class RollingMaintenance:
    """Plans, runs, lists and cancels the rolling maintenance of ``cp``'s backends.

    ``actor`` and ``via`` go to the audit log (who, through what); ``stale_after``: a running
    run whose heartbeat is older is taken for killed and may be resumed; ``heartbeat`` the
    seconds between two heartbeats of a run in progress; ``run_command`` runs a shell command
    (tests give their own)."""

    def __init__(
        self,
        cp: ControlPlane,
        *,
        actor: str = "unknown",
        via: str = "cli",
        stale_after: float = 60.0,
        heartbeat: float = 10.0,
        run_command: CommandRunner = shell_command,
    ) -> None:
        self.cp = cp
        self.actor = actor
        self.via = via
        self.stale_after = stale_after
        self.heartbeat = heartbeat
        self.run_command = run_command
        self.owner = f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid4().hex[:8]}"
        self.runs_store = MaintenanceStore(cp.store)

    def __repr__(self) -> str:
        return f"<RollingMaintenance owner {self.owner}, by {self.actor} via {self.via}>"

    async def plan(self, backend: str) -> MaintenancePlan:
        """The groups of ``backend``'s nodes as Ganeti reads them now (pure plan, one read)."""
        self._known(backend)
        client = await self.cp.client(backend)
        nodes, instances = await asyncio.gather(client.list_nodes(), client.list_instances())
        return plan_maintenance(*maintenance_inputs(nodes, instances))

    async def runs(self, backend: str | None = None, *, limit: int = 50) -> list[MaintenanceRecord]:
        """The newest runs first (of ``backend``)."""
        return await self.runs_store.runs(backend=backend, limit=limit)

    async def get(self, run_id: str) -> MaintenanceRecord:
        return await self.runs_store.get(run_id)

    async def cancel(self, backend: str) -> MaintenanceRecord:
        """Cancel ``backend``'s unfinished run (:class:`NotFoundError` without one)."""
        record = await self.runs_store.cancel(backend, by=self.actor)
        where = record.position.get("phase"), record.position.get("node")
        await self._audit("maintenance cancel", record, None, detail=f"at {where[0]} of {where[1]}")
        log.warning("maintenance run %s of %s canceled by %s", record.id, backend, self.actor)
        return record

    async def run(
        self,
        backend: str,
        command: str | None = None,
        *,
        options: MaintenanceOptions | None = None,
        progress: MaintenanceProgress | None = None,
    ) -> MaintenanceRecord:
        """Run ``backend``'s rolling maintenance with ``command`` (``{node}`` in it), or resume its
        unfinished run (killed, or failed at a step); the run as it ended (``done``, ``failed``
        with its ``error``, ``canceled``).

        Refusals raise: :class:`ConflictError` while another process's run holds the backend,
        for a new plan with problems (an instance that would stop), or a ``command`` other than
        the unfinished run's; :class:`InvalidError` for no command and nothing to resume, or a
        command without ``{node}``; :class:`NotFoundError` for an unknown backend."""
        self._known(backend)
        latest = await self.runs_store.runs(backend=backend, limit=1)
        unfinished = [r for r in latest if r.status in ("running", "failed")]
        new: tuple[str, dict[str, Any], dict[str, Any]] | None = None
        if unfinished:
            held = unfinished[0]
            if command is not None and command != held.command:
                raise ConflictError(
                    f"backend {backend} has an unfinished maintenance run {held.id} ({held.status}) of "
                    f"command {held.command!r}: run 'synnefo-ganeti maintenance run {backend}' to resume "
                    f"it, or 'synnefo-ganeti maintenance cancel {backend}' first to start another"
                )
        else:
            if command is None:
                raise InvalidError(
                    f"backend {backend} has no maintenance run to resume: give the command (--command)"
                )
            if "{node}" not in command:
                raise InvalidError(f"the command {command!r} must name the node: {{node}}")
            opts = options or MaintenanceOptions()
            plan = await self.plan(backend)
            if plan.problems:
                raise ConflictError(
                    f"backend {backend} cannot be maintained keeping every instance running: "
                    + "; ".join(plan.problems)
                )
            total = sum(len(_phases(g.master, opts.master_back)) * len(g.nodes) for g in plan.groups)
            position: dict[str, Any] = {"group": 0, "phase": None, "node": None, "done": [],
                                        "steps_done": 0, "steps_total": total}  # fmt: skip
            new = (command, {**plan.to_json(), "options": opts.to_json()}, position)
        record, resumed = await self.runs_store.begin(
            backend, owner=self.owner, started_by=self.actor, stale_after=self.stale_after, new=new
        )
        where = f" at {record.position.get('phase')} of {record.position.get('node')}" if resumed else ""
        log.info(
            "maintenance run %s of %s %s%s", record.id, backend, "resumed" if resumed else "started", where
        )
        await self._audit("maintenance resume" if resumed else "maintenance start", record, None,
                          detail=f"command {record.command!r}{where}")  # fmt: skip
        return await self._execute(record, progress)

    # -- the run ---------------------------------------------------------------------------------

    async def _execute(
        self, record: MaintenanceRecord, progress: MaintenanceProgress | None
    ) -> MaintenanceRecord:
        plan = MaintenancePlan.from_json(record.plan)
        opts = MaintenanceOptions.from_json(record.options)
        steps = Steps(self.cp, record.backend, record.command, opts, self.run_command)
        position: dict[str, Any] = dict(record.position)
        lost = asyncio.Event()
        beat = asyncio.create_task(self._beat(record.id, lost), name=f"maintenance heartbeat {record.id}")
        try:
            for index in range(int(position.get("group", 0)), len(plan.groups)):
                group = plan.groups[index]
                phases = _phases(group.master, opts.master_back)
                start = phases.index(position["phase"]) if position.get("phase") in phases else 0
                for phase in phases[start:]:
                    done = list(position.get("done", ())) if position.get("phase") == phase else []
                    for node in group.nodes:
                        if node in done:
                            continue
                        position.update(group=index, phase=phase, node=node, done=done)
                        if lost.is_set() or not await self.runs_store.save(record.id, self.owner, position):
                            return await self._stopped(record)
                        what = f"group {index + 1}/{len(plan.groups)}: {phase} {node}"
                        if progress is not None:
                            progress(int(position["steps_done"]), int(position["steps_total"]), what)
                        log.info("maintenance %s of %s: %s", record.id, record.backend, what)
                        try:
                            detail = await steps.run(phase, node)
                        except MaintenanceStepError as exc:
                            return await self._failed(record, phase, node, str(exc))
                        except Exception as exc:  # Ganeti refused, a transport error: the run stops there
                            return await self._failed(record, phase, node, f"{type(exc).__name__}: {exc}")
                        done.append(node)
                        position.update(done=done, steps_done=int(position["steps_done"]) + 1)
                        await self._audit(f"maintenance {phase}", record, node, detail=detail)
                        if not await self.runs_store.save(record.id, self.owner, position):
                            return await self._stopped(record)
                    position.update(phase=None, node=None, done=[])
                position.update(group=index + 1, phase=None, node=None, done=[])
            if progress is not None:
                progress(int(position["steps_total"]), int(position["steps_total"]), "done")
            await self.runs_store.save(record.id, self.owner, position)
            await self.runs_store.finish(record.id, self.owner, "done")
            log.info("maintenance run %s of %s done", record.id, record.backend)
            await self._audit("maintenance done", record, None)
            return await self.runs_store.get(record.id)
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat

    async def _beat(self, run_id: str, lost: asyncio.Event) -> None:
        while not lost.is_set():
            await asyncio.sleep(self.heartbeat)
            try:
                if not await self.runs_store.heartbeat(run_id, self.owner):
                    lost.set()
            except Exception:  # the database could not: the next one may
                log.warning("maintenance run %s: heartbeat not written", run_id, exc_info=True)

    async def _failed(self, record: MaintenanceRecord, phase: str, node: str, why: str) -> MaintenanceRecord:
        error = (
            f"{phase} of {node} failed: {why}; fix it and run 'synnefo-ganeti maintenance run "
            f"{record.backend}' to resume there, or 'synnefo-ganeti maintenance cancel {record.backend}'"
        )
        log.error("maintenance run %s of %s: %s", record.id, record.backend, error)
        await self.runs_store.finish(record.id, self.owner, "failed", error)
        await self._audit(f"maintenance {phase}", record, node, outcome="failed", detail=why)
        return await self.runs_store.get(record.id)

    async def _stopped(self, record: MaintenanceRecord) -> MaintenanceRecord:
        now = await self.runs_store.get(record.id)
        log.warning("maintenance run %s of %s stopped: it is %s", record.id, record.backend, now.status)
        return now

    async def _audit(
        self,
        action: str,
        record: MaintenanceRecord,
        node: str | None,
        *,
        outcome: str = "ok",
        detail: str | None = None,
    ) -> None:
        text = f"run {record.id}" + (f": {detail}" if detail else "")
        try:
            await StatusStore(self.cp.store).audit(
                self.actor,
                action,
                via=self.via,
                backend=record.backend,
                target=node,
                outcome=outcome,
                detail=text,
            )
        except Exception:  # the run goes on; the log has it
            log.warning("maintenance run %s: audit entry %s not written", record.id, action, exc_info=True)

    def _known(self, backend: str) -> None:
        try:
            self.cp.settings.backend(backend)
        except ConfigError as exc:
            raise NotFoundError(str(exc)) from None


def _phases(master: bool, master_back: bool) -> tuple[str, ...]:
    if not master:
        return PHASES
    return ("failover", *PHASES, *(("failback",) if master_back else ()))
