"""The steps of a rolling maintenance (:mod:`._maintenance`): one node, one phase, each safe to run
again after a kill (what is done already is read from Ganeti and skipped), but the operator's
command.

* ``failover`` / ``failback``: the configuration redistributed to every node first (a node just
  rebooted may hold a stale copy, which the master role would carry), then the master failover
  command with ``{node}`` the node to become master; then Ganeti is read (through RAPI, which answers from wherever the master is; reads
  that fail while the role moves are retried) until it names that node master. The command's
  exit status alone decides nothing: Ganeti 3.0's ``master-failover`` exits 1 when the master
  IP came up late although the role moved.
* ``drain`` / ``undrain``: the facade's ``drain_node`` / ``undrain_node`` at the run's priority,
  skipped when the node already is.
* ``evacuate``: the facade's ``evacuate_node`` at the run's priority; an instance that failed to
  move fails the step (``skipped`` ones, which Ganeti cannot move and the plan let through
  because they do not run, are told in the audit detail).
* ``command``: the operator's command, ``{node}`` replaced (plain text replacement: a shell's
  own braces stay); a non-zero exit fails the step with its output's end.
* ``wait``: until Ganeti reads the node's live figures (``mfree``) and it is not offline.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from synnefo_ganeti.errors import GanetiError, MaintenanceStepError
from synnefo_ganeti.rapi import Node

if TYPE_CHECKING:
    from synnefo_ganeti.control._facade import ControlPlane
    from synnefo_ganeti.control._maintenance import CommandRunner, MaintenanceOptions

__all__ = ["MaintenanceStepError", "Steps"]

log = logging.getLogger("synnefo_ganeti.maintenance")

#: characters of a failed command's output kept in the error
OUTPUT_TAIL = 600


class Steps:
    """The steps of one backend's run with its options (see the module)."""

    def __init__(
        self,
        cp: ControlPlane,
        backend: str,
        command: str,
        options: MaintenanceOptions,
        run_command: CommandRunner,
    ) -> None:
        self.cp = cp
        self.backend = backend
        self.command = command
        self.options = options
        self.run_command = run_command

    def __repr__(self) -> str:
        return f"<Steps of {self.backend}, priority {self.options.priority}>"

    async def run(self, phase: str, node: str) -> str:
        """Run ``phase`` for ``node``; what it did, for the audit log."""
        step = getattr(self, f"_{phase}", None)
        if step is None:
            raise MaintenanceStepError(f"unknown maintenance phase {phase!r}")
        result: str = await step(node)
        return result

    async def _node(self, node: str) -> Node:
        return await (await self.cp.client(self.backend)).get_node(node)

    async def _drain(self, node: str) -> str:
        if (await self._node(node)).drained:
            return "already drained"
        await self.cp.drain_node(self.backend, node, priority=self.options.priority)
        return "drained"

    async def _undrain(self, node: str) -> str:
        if not (await self._node(node)).drained:
            return "not drained"
        await self.cp.undrain_node(self.backend, node, priority=self.options.priority)
        return "undrained"

    async def _evacuate(self, node: str) -> str:
        report = await self.cp.evacuate_node(self.backend, node, priority=self.options.priority)
        failed = [m for m in report.moves if m.outcome.value == "failed"]
        if failed:
            raise MaintenanceStepError(
                f"{len(failed)} instance(s) did not move off {node}: "
                + "; ".join(f"{m.name}: {m.error}" for m in failed)
            )
        moved = [f"{m.name} to {m.target}" for m in report.moves if m.outcome.value == "moved"]
        skipped = [f"{m.name} ({m.error})" for m in report.moves if m.outcome.value == "skipped"]
        text = f"moved {', '.join(moved) or 'nothing'}"
        return text + (f"; left (not running, cannot move): {', '.join(skipped)}" if skipped else "")

    async def _command(self, node: str) -> str:
        return await self._shell(self.command, node, check=True)

    async def _shell(self, template: str, node: str, *, check: bool) -> str:
        """``template`` run with ``{node}``; a non-zero exit fails the step when ``check``."""
        command = template.replace("{node}", node)
        timeout = self.options.command_timeout
        started = time.monotonic()
        result = await self.run_command(command, timeout)
        took = time.monotonic() - started
        tail = result.output.strip()[-OUTPUT_TAIL:]
        log.info("maintenance command %r exited %d after %.1f s%s", command, result.returncode, took,
                 f": {tail}" if tail else "")  # fmt: skip
        if result.returncode != 0 and check:
            raise MaintenanceStepError(
                f"command {command!r} exited {result.returncode} after {took:.0f} s: {tail or 'no output'}"
            )
        return f"{command!r} exited {result.returncode} after {took:.0f} s"

    async def _wait(self, node: str) -> str:
        started = time.monotonic()

        async def seen() -> bool:
            found = await self._node(node)
            return found.mfree is not None and not found.offline

        await self._until(seen, self.options.wait_timeout, lambda: (
            f"Ganeti did not read node {node} of backend {self.backend} again within "
            f"{self.options.wait_timeout:g} s after the command (its live figures stay unread): bring "
            "it back, then resume"
        ))  # fmt: skip
        return f"read again after {time.monotonic() - started:.0f} s"

    async def _failover(self, node: str) -> str:
        if (await self._master()) != node:
            return f"{node} is not the master any more: nothing to hand over"
        nodes = await (await self.cp.client(self.backend)).list_nodes()
        candidates = sorted(
            n.name for n in nodes
            if n.name != node and n.role == "C" and not n.drained and not n.offline and n.mfree is not None
        )  # fmt: skip
        if not candidates:
            raise MaintenanceStepError(
                f"no master candidate of backend {self.backend} (online, not drained, read up) to take the "
                f"master role from {node}"
            )
        return await self._hand_over(candidates[0], node)

    async def _failback(self, node: str) -> str:
        if (await self._master()) == node:
            return f"{node} is the master already"
        return await self._hand_over(node, None)

    async def _hand_over(self, new_master: str, old: str | None) -> str:
        # every node's copy of the configuration made current first (``PUT /2/redistribute-config``):
        # a node that was just rebooted may have missed writes while it was down, and the master
        # role carries the new master's copy with it (seen on the lab: instances removed while a
        # node was away came back with it as master)
        client = await self.cp.client(self.backend)
        job = await client.wait_for_job(
            await client.redistribute_config(reason="synnefo-ganeti maintenance: before a master failover"),
            timeout=self.options.master_timeout,
        )
        if job.status.value != "success":
            why = job.failure.message if job.failure is not None else job.status.value
            raise MaintenanceStepError(
                f"the configuration of backend {self.backend} could not be redistributed before handing the "
                f"master role to {new_master} (job {job.id}: {why}); check the nodes, then resume"
            )
        output = await self._shell(self.options.master_failover_command, new_master, check=False)

        async def moved() -> bool:
            return (await self._master()) == new_master

        await self._until(moved, self.options.master_timeout, lambda: (
            f"the master role of backend {self.backend} did not move to {new_master} within "
            f"{self.options.master_timeout:g} s of the failover command ({output})"
        ))  # fmt: skip
        return f"master role to {new_master}" + (f" from {old}" if old else "") + f"; {output}"

    async def _master(self) -> str | None:
        nodes = await (await self.cp.client(self.backend)).list_nodes()
        return next((n.name for n in nodes if n.role == "M"), None)

    async def _until(
        self, check: Callable[[], Awaitable[bool]], timeout: float, why: Callable[[], str]
    ) -> None:
        """Poll ``check`` (Ganeti's reads; one that fails counts as not yet) until it holds."""
        deadline = time.monotonic() + timeout
        last: str | None = None
        while True:
            try:
                if await check():
                    return
            except (GanetiError, OSError) as exc:  # RAPI away while the master moves, the node down
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() >= deadline:
                raise MaintenanceStepError(why() + (f"; last read: {last}" if last else ""))
            await asyncio.sleep(self.options.poll_interval)
