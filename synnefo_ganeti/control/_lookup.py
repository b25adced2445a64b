"""Finding an instance by its id or by its name, for the facade's calls.

An instance's public id (:attr:`StoredInstance.id`, a UUID string) is given when its row
is first written and never reused; its name is unique on its backend (across backends
too with ``[ownership] unique_names = "global"``) only while it is not DESTROYED. So a
call without ``backend`` takes an id, and a call with ``backend`` a name, as before.
"""

from __future__ import annotations

from synnefo_ganeti.errors import ConflictError, NotFoundError
from synnefo_ganeti.store import InstanceStatus, Store, StoredInstance

__all__ = ["backend_of", "find_instance", "resolve_instance"]


def backend_of(instance: StoredInstance) -> str:
    """The backend ``instance`` is placed on; a request's instance not placed yet (or ended
    with nothing made) is a :class:`ConflictError`: nothing can act on it but a delete."""
    if instance.backend is None and instance.status is InstanceStatus.DESTROYED:
        raise NotFoundError(
            f"instance {instance.id} ({instance.name}) is DESTROYED: its request {instance.request_id} "
            "was canceled before anything was made"
        )
    if instance.backend is None:
        raise ConflictError(
            f"instance {instance.id} ({instance.name}) is {instance.status} and not placed on a backend "
            f"(its request {instance.request_id}); wait until it is built, or delete it"
        )
    return instance.backend


async def find_instance(store: Store, name_or_id: str, backend: str | None) -> StoredInstance | None:
    """The instance ``name_or_id`` names: by name on ``backend``, by id without one; None: none."""
    if backend is not None:
        return await store.get_instance(backend, name_or_id)
    return await store.get_instance(None, None, id=name_or_id)


async def resolve_instance(store: Store, name_or_id: str, backend: str | None) -> tuple[str, str]:
    """(backend, name) of the instance ``name_or_id`` names (see :func:`find_instance`).

    With ``backend`` it is passed through as it is (the caller reports an unknown name);
    without, an id the database does not hold is a :class:`NotFoundError`."""
    if backend is not None:
        return backend, name_or_id
    instance = await find_instance(store, name_or_id, None)
    if instance is None:
        raise NotFoundError(
            f"no instance has id {name_or_id}; check the id, or give the instance's name with its backend"
        )
    backend = backend_of(instance)
    if instance.status is InstanceStatus.DESTROYED:
        # its name may have a new life (another row, another id): never act on that one
        current = await store.get_instance(backend, instance.name)
        if current is not None and current.id != instance.id:
            raise NotFoundError(
                f"instance {instance.id} ({instance.name} of backend {instance.backend}) is DESTROYED; "
                f"its name is now instance {current.id}'s: use that id to act on the new one"
            )
    return backend, instance.name
