"""The console's node pages and node actions: drain, undrain, evacuate, failover (operators).

``/nodes`` lists every backend's nodes (role, up or down since when, CPUs, memory, disk, instances,
group, the figures' "as of" time); ``/nodes/BACKEND/NODE`` shows one with its primary and secondary
instances and, for operators, its actions. Node reads go through :class:`NodeReads`: one read of
Ganeti per backend at most every :data:`READ_EVERY` seconds, shared by every viewer (a viewer never
makes the console call Ganeti on each page).

Drain and undrain run at once (one Ganeti job each). Evacuate and failover move every primary
instance and may take minutes: each runs as a task of the console (:class:`NodeWork`), one per
node at a time, after a confirmation page (failover: the node's name typed, and "the node is dead
or fenced" ticked when Ganeti still reaches it); the node page shows its progress and its report.
Each action, its start and its end, is in the audit log.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from synnefo_ganeti.allocate._node_info import BackendNodes, NodeInfo
from synnefo_ganeti.console._actions import Actions
from synnefo_ganeti.console._auth import Session, page, require_operator
from synnefo_ganeti.control import ControlPlane
from synnefo_ganeti.errors import ConfigError, GanetiError, NotFoundError

__all__ = ["READ_EVERY", "NodePages", "NodeReads", "NodeWork"]

log = logging.getLogger("synnefo_ganeti.console")

#: the node pages read Ganeti at most this often (seconds); an action reads again at once
READ_EVERY = 5.0


class NodeReads:
    """Every backend's nodes, read at most every :data:`READ_EVERY` seconds, one read at a time."""

    def __init__(self, cp: Callable[[], ControlPlane], *, every: float = READ_EVERY) -> None:
        self._cp = cp
        self.every = every
        self._last: list[BackendNodes] | None = None
        self._at = 0.0
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"<NodeReads every {self.every:g} s>"

    def stale(self) -> None:
        """Read again on the next page (after an action)."""
        self._at = 0.0

    async def all(self) -> list[BackendNodes]:
        async with self._lock:
            if self._last is None or time.monotonic() - self._at >= self.every:
                self._last = await self._cp().nodes()
                self._at = time.monotonic()
            return self._last

    async def one(self, backend: str, name: str) -> NodeInfo:
        for answer in await self.all():
            if answer.backend != backend:
                continue
            if answer.error is not None:
                raise web.HTTPServiceUnavailable(text=f"backend {backend} did not answer: {answer.error}")
            for node in answer.nodes:
                if node.name == name:
                    return node
        raise web.HTTPNotFound(text=f"node {name} of backend {backend} is not in its Ganeti cluster")


@dataclass(slots=True)
class Work:
    """An evacuate or failover of one node running in the console (or ended)."""

    operation: str
    backend: str
    node: str
    by: str
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    done: int = 0
    total: int = 0
    ended_at: datetime | None = None
    report: dict[str, Any] | None = None
    error: str | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def running(self) -> bool:
        return self.ended_at is None


class NodeWork:
    """The node moves running in this console: one per node at a time; the last of each is kept."""

    def __init__(self) -> None:
        self.works: dict[tuple[str, str], Work] = {}

    def __repr__(self) -> str:
        running = sum(1 for w in self.works.values() if w.running)
        return f"<NodeWork {running} running, {len(self.works)} known>"

    def of(self, backend: str, node: str) -> Work | None:
        return self.works.get((backend, node))

    async def stop(self) -> None:
        tasks = [w.task for w in self.works.values() if w.task is not None and not w.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class NodePages:
    """The routes of the node pages and actions."""

    def __init__(self, cp: Callable[[], ControlPlane], actions: Actions) -> None:
        self._cp = cp
        self.actions = actions
        self.reads = NodeReads(cp)
        self.work = NodeWork()

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/nodes", self.nodes_page),
            web.get("/nodes/{backend}/{node}", self.node_page),
            web.post("/nodes/{backend}/{node}/drain", self.drain),
            web.post("/nodes/{backend}/{node}/undrain", self.undrain),
            web.get("/nodes/{backend}/{node}/evacuate", self.confirm_move),
            web.get("/nodes/{backend}/{node}/failover", self.confirm_move),
            web.post("/nodes/{backend}/{node}/evacuate", self.evacuate),
            web.post("/nodes/{backend}/{node}/failover", self.failover),
        ]

    def _where(self, request: web.Request) -> tuple[str, str]:
        backend, node = request.match_info["backend"], request.match_info["node"]
        try:
            self._cp().settings.backend(backend)
        except ConfigError as exc:
            raise web.HTTPNotFound(text=str(exc)) from None
        return backend, node

    # -- pages ------------------------------------------------------------------------------------

    async def nodes_page(self, request: web.Request) -> web.Response:
        answers = await self.reads.all()
        return page("nodes.html", request, {"page": "nodes", "answers": answers, "work": self.work})

    async def node_page(self, request: web.Request) -> web.Response:
        backend, name = self._where(request)
        node = await self.reads.one(backend, name)
        store = self._cp().store
        ids: dict[str, str] = {}
        for instance in (*node.primary_instances, *node.secondary_instances):
            stored = await store.get_instance(backend, instance)
            if stored is not None:
                ids[instance] = stored.id
        context = {"page": "nodes", "n": node, "ids": ids, "work": self.work.of(backend, name)}
        return page("node.html", request, context)

    async def confirm_move(self, request: web.Request) -> web.Response:
        """The confirmation page of an evacuate or a failover (a GET: a viewer sees it, cannot send it)."""
        backend, name = self._where(request)
        operation = request.path.rsplit("/", 1)[1]
        node = await self.reads.one(backend, name)
        return page("confirm_node.html", request, {"page": "nodes", "n": node, "operation": operation})

    # -- actions ----------------------------------------------------------------------------------

    async def drain(self, request: web.Request) -> web.Response:
        return await self._set_drained(request, True)

    async def undrain(self, request: web.Request) -> web.Response:
        return await self._set_drained(request, False)

    async def _set_drained(self, request: web.Request, drained: bool) -> web.Response:
        require_operator(request)
        backend, name = self._where(request)
        session = require_operator(request, backend)
        action = "node-drain" if drained else "node-undrain"
        cp = self._cp()
        try:
            await (cp.drain_node(backend, name) if drained else cp.undrain_node(backend, name))
        except NotFoundError as exc:
            raise web.HTTPNotFound(text=str(exc)) from None
        except GanetiError as exc:
            what = f"{'drain' if drained else 'undrain'} of node {name} on {backend} refused: {exc}"
            await self.actions.audit(session, what, backend, action=action, target=name, outcome="refused")
        else:
            what = f"{'drained' if drained else 'undrained'} node {name} on {backend}"
            await self.actions.audit(session, what, backend, action=action, target=name)
        self.reads.stale()
        self.actions.capacity.refresh_soon()
        raise web.HTTPSeeOther(f"/nodes/{backend}/{name}")

    async def evacuate(self, request: web.Request) -> web.Response:
        require_operator(request)
        backend, name = self._where(request)
        session = require_operator(request, backend)
        form = await request.post()
        iallocator = form.get("iallocator") or None
        if iallocator is not None and not isinstance(iallocator, str):
            raise web.HTTPBadRequest(text="iallocator: a name")
        return await self._start(
            session,
            backend,
            name,
            "evacuate",
            lambda cp, progress: cp.evacuate_node(backend, name, iallocator=iallocator, progress=progress),
        )

    async def failover(self, request: web.Request) -> web.Response:
        require_operator(request)
        backend, name = self._where(request)
        session = require_operator(request, backend)
        form = await request.post()
        if form.get("confirm") != name:
            session.flash.append(f"not failed over: type the node's name ({name}) to confirm")
            raise web.HTTPSeeOther(f"/nodes/{backend}/{name}/failover")
        yes = form.get("dead") == "yes"
        return await self._start(
            session,
            backend,
            name,
            "failover",
            lambda cp, progress: cp.failover_node(backend, name, yes=yes, progress=progress),
        )

    async def _start(
        self,
        session: Session,
        backend: str,
        name: str,
        operation: str,
        call: Callable[[ControlPlane, Callable[[int, int, Any], None]], Any],
    ) -> web.Response:
        current = self.work.of(backend, name)
        if current is not None and current.running:
            session.flash.append(f"a {current.operation} of {name} by {current.by} runs already")
            raise web.HTTPSeeOther(f"/nodes/{backend}/{name}")
        work = Work(operation, backend, name, by=session.user)

        def progress(done: int, total: int, _move: Any) -> None:
            work.done, work.total = done, total

        async def run() -> None:
            try:
                report = await call(self._cp(), progress)
            except GanetiError as exc:
                work.error = str(exc)
                outcome, what = "refused", f"{operation} of node {name} on {backend} refused: {exc}"
            except Exception as exc:  # the console lives on; the log has the traceback
                log.exception("console: %s of node %s on %s failed", operation, name, backend)
                work.error = f"{type(exc).__name__}: {exc}"
                outcome, what = "failed", f"{operation} of node {name} on {backend} failed: {work.error}"
            else:
                work.report = report.to_json()
                counts = ", ".join(f"{n} {k}" for k, n in report.counts.items() if n)
                outcome = "ok" if report.ok else "failed"
                what = f"{operation} of node {name} on {backend} ended: {counts or 'nothing to move'}"
            finally:
                work.ended_at = datetime.now(UTC)
                self.reads.stale()
                self.actions.capacity.refresh_soon()
            await self.actions.audit(
                session, what, backend, action=f"node-{operation}", target=name, outcome=outcome
            )

        self.work.works[(backend, name)] = work
        await self.actions.audit(
            session,
            f"{operation} of node {name} on {backend} started",
            backend,
            action=f"node-{operation}-start",
            target=name,
        )
        work.task = asyncio.create_task(run(), name=f"console {operation} {backend}/{name}")
        raise web.HTTPSeeOther(f"/nodes/{backend}/{name}")
