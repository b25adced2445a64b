"""The console's instance actions (operators): start, stop, reboot, migrate, reinstall, delete.

Each goes through the control plane as a cloud's call does (its task reserved first: another
action in progress is refused and said so; the job recorded; the instance's state following the
job's end), from the instance's page (``/instances/ID``). Start, stop, reboot and migrate are one
button each; reinstall and delete, which destroy the instance's disks, go behind a confirmation
page where the operator types the instance's name. Each action, refused or sent, is in the audit
log with its job.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from synnefo_ganeti.console._actions import Actions
from synnefo_ganeti.console._auth import page, require_operator
from synnefo_ganeti.control import ControlPlane
from synnefo_ganeti.errors import GanetiError, NotFoundError
from synnefo_ganeti.store import InstanceStatus, StoredInstance

__all__ = ["ACTIONS", "CONFIRMED", "InstanceActions"]

#: the actions, each with what the flash message says once it is sent
ACTIONS = {
    "start": "start",
    "stop": "stop",
    "reboot": "reboot",
    "migrate": "migration",
    "reinstall": "reinstall",
    "delete": "delete",
}
#: the actions that destroy data: the instance's name typed first
CONFIRMED = frozenset({"reinstall", "delete"})


class InstanceActions:
    """The routes of the instance actions."""

    def __init__(self, cp: Callable[[], ControlPlane], actions: Actions) -> None:
        self._cp = cp
        self.actions = actions

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/instances/{id}/{action:reinstall|delete}", self.confirm),
            web.post("/instances/{id}/{action:start|stop|reboot|migrate|reinstall|delete}", self.act),
        ]

    async def _instance(self, request: web.Request) -> StoredInstance:
        instance = await self._cp().get_instance(request.match_info["id"])
        if instance is None or instance.backend is None:
            raise web.HTTPNotFound(text=f"instance {request.match_info['id']} is not in the database")
        return instance

    async def confirm(self, request: web.Request) -> web.Response:
        """The confirmation page of a reinstall or a delete (a GET: a viewer sees it, cannot send it)."""
        instance = await self._instance(request)
        context = {"page": "instances", "i": instance, "action": request.match_info["action"]}
        return page("confirm_instance.html", request, context)

    async def act(self, request: web.Request) -> web.Response:
        require_operator(request)
        instance = await self._instance(request)
        session = require_operator(request, instance.backend)
        action = request.match_info["action"]
        back = f"/instances/{instance.id}"
        if action in CONFIRMED:
            typed = (await request.post()).get("confirm")
            if typed != instance.name:
                session.flash.append(
                    f"not done: type the instance's name ({instance.name}) to confirm the {action}"
                )
                raise web.HTTPSeeOther(f"{back}/{action}")
        if instance.status is InstanceStatus.DESTROYED:
            session.flash.append(f"{instance.name} is destroyed: nothing to {action}")
            raise web.HTTPSeeOther(back)
        backend = instance.backend
        assert backend is not None
        cp = self._cp()
        calls: dict[str, Callable[[], Awaitable[int | None]]] = {
            "start": lambda: cp.startup_instance(instance.id),
            "stop": lambda: cp.shutdown_instance(instance.id),
            "reboot": lambda: cp.reboot_instance(instance.id),
            "migrate": lambda: cp.migrate_instance(instance.id),
            "reinstall": lambda: cp.reinstall_instance(instance.id),
            "delete": lambda: cp.delete_instance(instance.id),
        }
        audit = f"instance-{action}"
        try:
            job_id = await calls[action]()
        except NotFoundError as exc:
            raise web.HTTPNotFound(text=str(exc)) from None
        except GanetiError as exc:
            what = f"{ACTIONS[action]} of {instance.name} on {backend} refused: {exc}"
            await self.actions.audit(
                session, what, backend, action=audit, target=instance.name, outcome="refused", event=False
            )
            raise web.HTTPSeeOther(back) from None
        sent = f" (job {job_id})" if job_id is not None else ""
        await self.actions.audit(
            session,
            f"{ACTIONS[action]} of {instance.name} on {backend} sent{sent}",
            backend,
            action=audit,
            target=instance.name,
            job_id=job_id,
            event=False,
        )
        self.actions.hub.mark(("instance", instance.id))
        raise web.HTTPSeeOther(back)
