"""The control-plane facade: what a cloud API calls to create and manage instances.

``async with ControlPlane(settings) as cp:`` opens the store and one pooled RAPI
client per backend (lazily). Each call writes the database first and Ganeti second,
and records the job before it returns:

* ``create_instance`` writes the instance row (BUILD, with what it expects Ganeti to
  report: beparams, NICs, disks, tags), submits the create with the ownership tag
  added, then records the job id. A create Ganeti refused leaves the row in ERROR; a
  create whose fate is unknown leaves it in BUILD for the reconciler to settle.
* ``startup_instance``, ``shutdown_instance``, ``reboot_instance``, ``delete_instance``
  and ``modify_instance`` submit the job and record it against the instance.

The instance's state then follows the jobs' ends as the watcher (or the reconciler)
stores them; a job whose end was stored before it was recorded is applied on record.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from synnefo_ganeti._backends import BackendResources
from synnefo_ganeti.errors import ConfigError, CreateOutcomeUnknownError, GanetiError, StoreError
from synnefo_ganeti.rapi import InstanceSpec, RapiClient
from synnefo_ganeti.reconcile._observe import expectation, expected_beparams
from synnefo_ganeti.store import InstanceAction, InstanceStatus, StoredInstance

__all__ = ["ControlPlane"]

log = logging.getLogger("synnefo_ganeti.control")


class ControlPlane(BackendResources):
    """One control plane over the backends of ``settings``.

    ``store`` and ``clients`` (name -> open :class:`RapiClient`) may be given; what the
    control plane opens itself (the store, one pooled client per backend on first use)
    it closes on exit.
    """

    _usage = "use 'async with ControlPlane(settings) as cp'"

    def __repr__(self) -> str:
        names = ", ".join(backend.name for backend in self.settings.backends)
        return f"<ControlPlane backends=[{names}]>"

    # -- instances -------------------------------------------------------------------------------

    async def create_instance(self, spec: InstanceSpec, *, backend: str) -> tuple[StoredInstance, int]:
        """Create ``spec`` on ``backend``: the instance row (BUILD), the create job, the job recorded.

        Returns the instance as stored and the job id; the instance becomes STARTED (or
        STOPPED for ``start=False``) or ERROR when the job ends.
        """
        settings = self.settings.backend(backend)
        if settings.drained:
            raise ConfigError(
                f"backend {backend} is drained: it takes no new instances (undrain it in the config first)"
            )
        if backend in await self.store.drained_backends():
            raise GanetiError(
                f"backend {backend} is drained by an operator: it takes no new instances "
                f"('synnefo-ganeti backends undrain {backend}' lets them in again)"
            )
        tags = list(dict.fromkeys([*spec.tags, *self.settings.ownership.tags_for_new()]))
        submitted = spec.model_copy(update={"tags": tags})
        await self.store.add_instance(
            backend, spec.name, status=InstanceStatus.BUILD, owned=True, **expectation(spec, tags)
        )
        try:
            job_id = await (await self.client(backend)).create_instance(submitted)
        except CreateOutcomeUnknownError:
            log.warning(
                "create of %s on %s: outcome unknown; the instance stays BUILD until the reconciler settles it",
                spec.name,
                backend,
            )
            raise
        except GanetiError:
            await self.store.update_instance(backend, spec.name, status=InstanceStatus.ERROR)
            raise
        instance = await self.store.record_instance_job(
            backend, spec.name, job_id, InstanceAction.CREATE, start=spec.start
        )
        return instance, job_id

    async def _submit(
        self,
        backend: str,
        name: str,
        action: InstanceAction,
        call: Callable[[RapiClient], Awaitable[int]],
        *,
        params: dict[str, Any] | None = None,
    ) -> int:
        instance = await self.store.get_instance(backend, name)
        if instance is None:
            raise StoreError(
                f"instance {name} of backend {backend} is not in the database; "
                "only instances this control plane created (or adopted) can be managed through it"
            )
        if instance.status is InstanceStatus.DESTROYED:
            raise StoreError(f"instance {name} of backend {backend} is DESTROYED")
        job_id = await call(await self.client(backend))
        await self.store.record_instance_job(backend, name, job_id, action, params=params)
        return job_id

    async def delete_instance(self, name: str, *, backend: str) -> int:
        """Remove the instance from Ganeti; DESTROYED once the job succeeds."""
        return await self._submit(backend, name, InstanceAction.REMOVE, lambda c: c.delete_instance(name))

    async def startup_instance(self, name: str, *, backend: str) -> int:
        return await self._submit(backend, name, InstanceAction.STARTUP, lambda c: c.startup_instance(name))

    async def shutdown_instance(self, name: str, *, backend: str) -> int:
        return await self._submit(backend, name, InstanceAction.SHUTDOWN, lambda c: c.shutdown_instance(name))

    async def reboot_instance(self, name: str, *, backend: str, reboot_type: str = "soft") -> int:
        return await self._submit(
            backend, name, InstanceAction.REBOOT, lambda c: c.reboot_instance(name, reboot_type=reboot_type)
        )

    async def modify_instance(self, name: str, *, backend: str, beparams: dict[str, Any]) -> int:
        """Change beparams (memory, vcpus, ...); the recorded flavor follows when the job succeeds."""
        return await self._submit(
            backend,
            name,
            InstanceAction.MODIFY,
            lambda c: c.modify_instance(name, beparams=beparams),
            params=expected_beparams(beparams),
        )

    async def get_instance(self, name: str, *, backend: str) -> StoredInstance | None:
        return await self.store.get_instance(backend, name)

    async def list_instances(self, *, backend: str | None = None) -> list[StoredInstance]:
        return await self.store.list_instances(backend=backend)
