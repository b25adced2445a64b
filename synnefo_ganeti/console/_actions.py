"""What an operator can do from the console (POST): reconcile, fix, delete an orphan, drain, cancel.

Every handler first checks the role (a viewer gets a 403), the middleware has checked
the CSRF token already; each action is logged at WARNING with who did it, written to the
audit log (``StatusStore.audit``: who, what, on what, which job, how it ended, refusals
too; the page ``/audit``) and, when it is about a backend, stored as that backend's event
``console``; then the browser is sent back to the page with a message saying what happened
(post/redirect/get).

Deleting an orphan (an instance Ganeti has, tagged ours, that the database lacks) goes
behind a confirmation page where the operator types the instance's name; the backend is
checked again first, and only an instance that is still an orphan is deleted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from urllib.parse import urlencode

from aiohttp import web

from synnefo_ganeti.console._auth import Session, page, require_operator
from synnefo_ganeti.console._data import Capacity, Reports
from synnefo_ganeti.console._live import Hub
from synnefo_ganeti.control import ControlPlane
from synnefo_ganeti.errors import ConfigError, ConflictError, GanetiError, NotFoundError
from synnefo_ganeti.reconcile import DriftKind, Fix, Reconciler, Report
from synnefo_ganeti.store import StatusStore

__all__ = ["Actions"]

log = logging.getLogger("synnefo_ganeti.console")


async def _field(request: web.Request, name: str) -> str:
    form = await request.post()
    value = form.get(name)
    if not isinstance(value, str) or not value:
        raise web.HTTPBadRequest(text=f"the form lacks {name!r}")
    return value


class Actions:
    """The POST handlers; one reconcile (pass, fix or orphan check) at a time."""

    def __init__(
        self, cp: Callable[[], ControlPlane], hub: Hub, capacity: Capacity, reports: Reports
    ) -> None:
        self._cp = cp
        self.hub = hub
        self.capacity = capacity
        self.reports = reports
        self._reconciling = asyncio.Lock()

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/drift/run", self.run_pass),
            web.post("/drift/fix", self.fix_kind),
            web.get("/drift/orphan", self.confirm_orphan),
            web.post("/drift/orphan", self.delete_orphan),
            web.post("/backends/{name}/drain", self.drain),
            web.post("/backends/{name}/undrain", self.undrain),
            web.post("/requests/{id}/cancel", self.cancel_request),
        ]

    async def audit(
        self,
        session: Session,
        what: str,
        backend: str | None = None,
        *,
        action: str,
        target: str | None = None,
        job_id: int | None = None,
        outcome: str = "ok",
        event: bool = True,
    ) -> None:
        log.warning("console action by %s (%s): %s", session.user, session.role, what)
        session.flash.append(what)
        try:
            await StatusStore(self._cp().store).audit(
                session.user,
                action,
                via="console",
                backend=backend,
                target=target,
                job_id=job_id,
                outcome=outcome,
                detail=what,
            )
        except GanetiError as exc:
            log.warning("console: could not write %s's action to the audit log (%s)", session.user, exc)
        if backend is not None and event:
            try:
                await self._cp().store.add_backend_event(backend, "console", f"{session.user}: {what}")
            except GanetiError as exc:
                log.warning("console: could not store the event of %s's action (%s)", session.user, exc)
        self.hub.mark(("overview", ""))

    def _backend(self, name: str) -> str:
        try:
            return self._cp().settings.backend(name).name
        except ConfigError as exc:
            raise web.HTTPNotFound(text=str(exc)) from None

    async def _reconcile(
        self, session: Session, backends: list[str] | None, fixes: frozenset[Fix] = frozenset()
    ) -> Report:
        if self._reconciling.locked():
            raise web.HTTPConflict(text="a reconcile pass started from the console runs already; wait for it")
        async with self._reconciling:
            cp = self._cp()
            async with Reconciler(cp.settings, store=cp.store) as reconciler:
                report = await reconciler.run_once(backends=backends, fixes=fixes)
        self.reports.record(report, by=session.user)
        return report

    async def run_pass(self, request: web.Request) -> web.Response:
        form = await request.post()
        name = form.get("backend")
        backends = [self._backend(name)] if isinstance(name, str) and name else None
        session = require_operator(request, backends[0] if backends else None)
        report = await self._reconcile(session, backends)
        await self.audit(
            session,
            f"reconcile pass (report only): {report.summary()}",
            action="reconcile",
            target=backends[0] if backends else None,
        )
        raise web.HTTPSeeOther("/drift")

    async def fix_kind(self, request: web.Request) -> web.Response:
        require_operator(request)
        backend = self._backend(await _field(request, "backend"))
        session = require_operator(request, backend)
        kind = await _field(request, "fix")
        try:
            fix = Fix(kind)
        except ValueError:
            raise web.HTTPBadRequest(text=f"unknown fix {kind!r}: one of {', '.join(Fix)}") from None
        report = await self._reconcile(session, [backend], frozenset({fix}))
        fixed = sum(1 for drift in report.drifts if drift.fixed)
        await self.audit(
            session,
            f"fix {fix.value} on {backend}: {fixed} fixed ({report.summary()})",
            backend,
            action=f"fix-{fix.value}",
        )
        self.capacity.refresh_soon()
        raise web.HTTPSeeOther("/drift")

    async def confirm_orphan(self, request: web.Request) -> web.Response:
        """The confirmation page (a GET: a viewer sees it, and cannot send it)."""
        backend = self._backend(request.query.get("backend", ""))
        name = request.query.get("name", "")
        if not name:
            raise web.HTTPBadRequest(text="which orphan? (?backend=...&name=...)")
        context = {"page": "drift", "backend": backend, "name": name}
        return page("confirm_orphan.html", request, context)

    async def delete_orphan(self, request: web.Request) -> web.Response:
        require_operator(request)
        backend = self._backend(await _field(request, "backend"))
        session = require_operator(request, backend)
        name = await _field(request, "name")
        typed = (await request.post()).get("confirm")
        if typed != name:
            session.flash.append(f"not deleted: type the instance's name ({name}) to confirm")
            raise web.HTTPSeeOther("/drift/orphan?" + urlencode({"backend": backend, "name": name}))
        report = await self._reconcile(session, [backend])  # is it still an orphan?
        still = any(d.kind is DriftKind.ORPHAN and d.instance == name for d in report.drifts)
        if not still:
            session.flash.append(f"not deleted: {name} is no longer an orphan of {backend}")
            raise web.HTTPSeeOther("/drift")
        try:
            job_id = await (await self._cp().client(backend)).delete_instance(name)
        except GanetiError as exc:
            await self.audit(
                session,
                f"Ganeti refused to delete {name}: {exc}",
                backend,
                action="delete-orphan",
                target=name,
                outcome="refused",
                event=False,
            )
            raise web.HTTPSeeOther("/drift") from None
        await self.audit(
            session,
            f"deleted orphan {name} from Ganeti on {backend} (job {job_id})",
            backend,
            action="delete-orphan",
            target=name,
            job_id=job_id,
        )
        raise web.HTTPSeeOther("/drift")

    async def drain(self, request: web.Request) -> web.Response:
        return await self._set_drained(request, True)

    async def undrain(self, request: web.Request) -> web.Response:
        return await self._set_drained(request, False)

    async def _set_drained(self, request: web.Request, drained: bool) -> web.Response:
        require_operator(request)
        backend = self._backend(request.match_info["name"])
        session = require_operator(request, backend)
        changed = await self._cp().store.set_backend_drained(backend, drained)
        what = "drained" if drained else "undrained"
        await self.audit(
            session,
            f"{what} {backend}" + ("" if changed else f" (it was {what} already)"),
            backend,
            action="backend-drain" if drained else "backend-undrain",
            target=backend,
        )
        raise web.HTTPSeeOther("/")

    async def cancel_request(self, request: web.Request) -> web.Response:
        require_operator(request)
        request_id = request.match_info["id"]
        try:
            held = await self._cp().get_request(request_id)
        except NotFoundError as exc:
            raise web.HTTPNotFound(text=str(exc)) from None
        # (a request not placed yet: only an operator of every backend, or of the one it names)
        session = require_operator(request, held.backend or held.want_backend)
        try:
            req = await self._cp().cancel_request(request_id)
        except NotFoundError as exc:
            raise web.HTTPNotFound(text=str(exc)) from None
        except (ConflictError, GanetiError) as exc:
            await self.audit(
                session,
                f"request {request_id} not canceled: {exc}",
                action="cancel-request",
                target=request_id,
                outcome="refused",
            )
            raise web.HTTPSeeOther(f"/requests/{request_id}") from None
        await self.audit(
            session,
            f"canceled request {request_id} ({req.instance}): now {req.status.value}",
            action="cancel-request",
            target=request_id,
            job_id=req.job_id,
        )
        self.hub.mark(("request", request_id))
        raise web.HTTPSeeOther(f"/requests/{request_id}")
