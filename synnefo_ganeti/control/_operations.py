"""Every instance operation a cloud needs, on the facade: :class:`InstanceOperations`, a base of
:class:`~synnefo_ganeti.ControlPlane`.

Each operation but the console is an action (:mod:`synnefo_ganeti.control._actions`): its task
reserved first (another action in progress, or a build, is a :class:`ConflictError` before
anything is sent), the Ganeti job submitted, the job recorded with what it changes; the job's
end, applied by the writer when the watcher or the dispatcher stores it, clears the task, sets
or clears ``last_error`` and moves the stored instance (``store/instances/_outcomes.py``,
``changes_after``). The dispatcher's observer then stores Ganeti's own values (a new NIC's MAC
and IP, a disk's uuid, the node a migration chose).

=======================  ==========================================  ==================================
method                   Ganeti job                                  the stored instance after success
=======================  ==========================================  ==================================
``resize_instance``      ``OP_INSTANCE_SET_PARAMS`` (beparams)       ``memory``, ``vcpus``, ``beparams``
``grow_disk``            ``OP_INSTANCE_GROW_DISK``                   ``disks[i].size`` grown
``attach_nic``           ``OP_INSTANCE_SET_PARAMS`` (nics add)       one more NIC (MAC, IP: observed)
``detach_nic``           ``OP_INSTANCE_SET_PARAMS`` (nics remove)    that NIC gone
``attach_disk``          ``OP_INSTANCE_SET_PARAMS`` (disks add)      one more disk (uuid: observed)
``detach_disk``          ``OP_INSTANCE_SET_PARAMS`` (disks remove)   that disk gone
``rename_instance``      ``OP_INSTANCE_RENAME``                      ``name``
``reinstall_instance``   shutdown, ``OP_INSTANCE_REINSTALL``, start  ``os``; STARTED (STOPPED: start=False)
``migrate_instance``     ``OP_INSTANCE_MIGRATE``                     ``pnode``
``failover_instance``    ``OP_INSTANCE_FAILOVER``                    ``pnode``
``add_instance_tags``    ``OP_TAGS_SET``                             ``tags`` (ours only)
``remove_instance_tags`` ``OP_TAGS_DEL``                             ``tags`` (ours only)
=======================  ==========================================  ==================================

NICs and disks are added and removed with ``hotplug_if_possible=True``: hot-plugged where the
hypervisor can, else seen by the guest at its next start. The RAPI client sends it as the backend's
Ganeti version takes it (``hotplug: true`` on 3.1, which refuses ``hotplug_if_possible``), so these
operations hold no version logic of their own.

Checks made before anything is written or sent raise :class:`ValidationError` (naming the
argument); a rename to a name another instance or open request holds, under ``[ownership]
unique_names``, is a :class:`ConflictError` in the reservation's transaction. While the
rename's job is in flight its new name is held (``store/requests/_names.py``: every name check looks at
the unapplied rename jobs, through a partial index of them). Between the reservation and the
job being recorded (one RAPI submit) it is not: if the database took the name then, the
rename's end keeps the old name and sets ``last_error`` (``store/instances/_column_changes.py``).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection

from synnefo_ganeti.allocate import BackendCatalog, check_name
from synnefo_ganeti.control._actions import run_action
from synnefo_ganeti.control._lookup import backend_of, resolve_instance
from synnefo_ganeti.control._offers import read_catalog
from synnefo_ganeti.errors import ConflictError, NotFoundError, UnavailableError, ValidationError
from synnefo_ganeti.rapi import InstanceConsole, RapiClient
from synnefo_ganeti.reconcile._observe import expected_beparams, our_tags
from synnefo_ganeti.store import InstanceAction, InstanceStatus, StoredInstance
from synnefo_ganeti.store.requests._names import check_name_free

if TYPE_CHECKING:
    from synnefo_ganeti.config import Settings
    from synnefo_ganeti.control._validate import SpecChecker
    from synnefo_ganeti.store import Store

__all__ = ["InstanceOperations"]

Call = Callable[[RapiClient], Awaitable[int]]
NIC_FIELDS = ("network", "ip", "mac", "mode", "link")
VALID_TAG = re.compile(r"^[\w.+*/:@-]+$")
MAX_TAG_LEN = 128


def _positive(value: Any, field: str, unit: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValidationError(f"{field} {value!r}: must be a positive integer{unit}", field=field)
    return value


def _index(value: Any, items: list[Any] | None, field: str, what: str, instance: StoredInstance) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValidationError(f"{field} {value!r}: must be an index >= 0", field=field)
    if items is not None and value >= len(items):
        raise ValidationError(
            f"{field} {value}: instance {instance.name} has {len(items)} {what} "
            f"(indexes 0 to {len(items) - 1}); see its {what} in get_instance",
            field=field,
        )
    return value


class InstanceOperations:
    """The cloud's operations on an instance (see the module). Each takes the instance's id, or
    its name with ``backend``, as ``startup_instance`` does, and returns the job id."""

    if TYPE_CHECKING:
        _checker: SpecChecker

        @property
        def store(self) -> Store: ...

        @property
        def settings(self) -> Settings: ...

        async def client(self, backend: str) -> RapiClient: ...

    async def _live(self, name: str, backend: str | None) -> StoredInstance:
        backend, name = await resolve_instance(self.store, name, backend)
        instance = await self.store.get_instance(backend, name)
        if instance is None or instance.status is InstanceStatus.DESTROYED:
            state = "DESTROYED" if instance is not None else "not in the database"
            raise NotFoundError(
                f"instance {name} of backend {backend} is {state}; "
                "only instances this control plane created (or adopted) can be managed through it"
            )
        return instance

    async def _operate(
        self,
        instance: StoredInstance,
        action: InstanceAction,
        call: Call,
        params: dict[str, Any],
        *,
        start: bool | None = None,
        precheck: Callable[[Connection], None] | None = None,
    ) -> int:
        backend = backend_of(instance)
        client = await self.client(backend)
        return await run_action(
            self.store,
            client,
            backend,
            instance.name,
            action,
            call,
            params=params,
            start=start,
            precheck=precheck,
        )

    # -- connection details ----------------------------------------------------------------------

    async def console_instance(self, name: str, *, backend: str | None = None) -> InstanceConsole:
        """How to reach the instance's console (Ganeti's answer: ``kind`` msg, ssh, spice or vnc,
        with ``host``, ``port``, ``user``, ``command``, ``display``); no job.

        :class:`ConflictError` when the instance is not running (start it first)."""
        instance = await self._live(name, backend)
        if instance.status is not InstanceStatus.STARTED:
            raise ConflictError(
                f"instance {instance.name} of backend {instance.backend} is {instance.status}: "
                "a console needs it running; start it first"
            )
        client = await self.client(backend_of(instance))
        try:
            return await client.get_instance_console(instance.name)
        except UnavailableError as exc:
            if exc.status != 503:
                raise
            raise ConflictError(
                f"instance {instance.name} of backend {instance.backend} is not running in Ganeti "
                f"({exc}); start it, or wait for the reconciler to store its state"
            ) from exc

    # -- resize ----------------------------------------------------------------------------------

    async def resize_instance(
        self, name: str, *, backend: str | None = None, memory: int | None = None, vcpus: int | None = None
    ) -> int:
        """Give the instance ``memory`` MiB and/or ``vcpus``; takes effect at its next start
        in Ganeti (as ``gnt-instance modify -B``)."""
        if memory is None and vcpus is None:
            raise ValidationError("resize_instance needs memory or vcpus (or both)", field="memory")
        beparams: dict[str, int] = {}
        if memory is not None:
            beparams["memory"] = _positive(memory, "memory", " (MiB)")
        if vcpus is not None:
            beparams["vcpus"] = _positive(vcpus, "vcpus")
        instance = await self._live(name, backend)
        return await self._operate(
            instance,
            InstanceAction.RESIZE,
            lambda c: c.modify_instance(instance.name, beparams=beparams),
            expected_beparams(beparams),
        )

    async def grow_disk(self, name: str, *, backend: str | None = None, disk: int = 0, amount: int) -> int:
        """Grow disk number ``disk`` by ``amount`` MiB."""
        amount = _positive(amount, "amount", " (MiB)")
        instance = await self._live(name, backend)
        index = _index(disk, instance.disks, "disk", "disks", instance)
        return await self._operate(
            instance,
            InstanceAction.GROW_DISK,
            lambda c: c.grow_instance_disk(instance.name, index, amount),
            {"disk": index, "amount": amount},
        )

    # -- NICs and disks --------------------------------------------------------------------------

    async def attach_nic(
        self,
        name: str,
        *,
        backend: str | None = None,
        network: str | None = None,
        ip: str | None = None,
        mac: str | None = None,
        mode: str | None = None,
        link: str | None = None,
    ) -> int:
        """Add a NIC: on ``network`` (``ip="pool"``: an address from its pool), or with ``mode``
        and ``link``; Ganeti gives the MAC unless ``mac`` is set. Hot-plugged where the
        hypervisor can; else the guest sees it at its next start."""
        if network is not None and (mode is not None or link is not None):
            raise ValidationError(
                "attach_nic: give a network, or a mode and link, not both (a network sets them)",
                field="network",
            )
        if ip == "pool" and network is None:
            raise ValidationError('attach_nic: ip="pool" needs the network whose pool to use', field="ip")
        nic = {
            key: value for key, value in zip(NIC_FIELDS, (network, ip, mac, mode, link), strict=True) if value
        }
        instance = await self._live(name, backend)
        return await self._operate(
            instance,
            InstanceAction.ATTACH_NIC,
            lambda c: c.modify_instance(instance.name, nics=[["add", -1, nic]], hotplug_if_possible=True),
            {"nic": nic},
        )

    async def detach_nic(self, name: str, *, backend: str | None = None, index: int) -> int:
        """Remove NIC number ``index`` (its pool address goes back to the pool)."""
        instance = await self._live(name, backend)
        at = _index(index, instance.nics, "index", "NICs", instance)
        return await self._operate(
            instance,
            InstanceAction.DETACH_NIC,
            lambda c: c.modify_instance(instance.name, nics=[["remove", at, {}]], hotplug_if_possible=True),
            {"index": at},
        )

    async def attach_disk(self, name: str, *, backend: str | None = None, size: int) -> int:
        """Add a disk of ``size`` MiB (of the instance's disk template)."""
        size = _positive(size, "size", " (MiB)")
        instance = await self._live(name, backend)
        return await self._operate(
            instance,
            InstanceAction.ATTACH_DISK,
            lambda c: c.modify_instance(
                instance.name, disks=[["add", -1, {"size": size}]], hotplug_if_possible=True
            ),
            {"disk": {"size": size}},
        )

    async def detach_disk(self, name: str, *, backend: str | None = None, index: int) -> int:
        """Remove disk number ``index`` and its data. Ganeti refuses it on a running instance
        unless the hypervisor hot-unplugs (the job fails: ``last_error``); stop it first."""
        instance = await self._live(name, backend)
        at = _index(index, instance.disks, "index", "disks", instance)
        return await self._operate(
            instance,
            InstanceAction.DETACH_DISK,
            lambda c: c.modify_instance(instance.name, disks=[["remove", at, {}]], hotplug_if_possible=True),
            {"index": at},
        )

    # -- name, OS, node --------------------------------------------------------------------------

    async def rename_instance(self, name: str, new_name: str, *, backend: str | None = None) -> int:
        """Rename the instance to ``new_name``; the stored name follows when the job succeeds (its
        id stays). Ganeti renames a stopped instance only (:class:`ConflictError` otherwise); a
        name another live instance or open request holds is a ConflictError at once."""
        check_name(new_name)
        instance = await self._live(name, backend)
        if new_name == instance.name:
            raise ValidationError(
                f"new_name {new_name!r}: the instance has that name already", field="new_name"
            )
        if instance.status is not InstanceStatus.STOPPED:
            raise ConflictError(
                f"instance {instance.name} of backend {instance.backend} is {instance.status}: Ganeti "
                "renames a stopped instance only; stop it first"
            )
        unique = self.settings.ownership.unique_names

        def name_free(conn: Connection) -> None:
            # (itself excluded: a new case of its own name is a rename Ganeti takes)
            check_name_free(
                conn, new_name, backend=instance.backend, unique_names=unique, exclude_instance=instance.id
            )

        return await self._operate(
            instance,
            InstanceAction.RENAME,
            lambda c: c.rename_instance(instance.name, new_name, name_check=False, ip_check=False),
            {"new_name": new_name},
            precheck=name_free,
        )

    async def reinstall_instance(
        self,
        name: str,
        *,
        backend: str | None = None,
        os: str | None = None,
        start: bool = True,
        osparams: dict[str, Any] | None = None,
    ) -> int:
        """Reinstall the instance's disks with ``os`` (None: the one it has): one job that stops
        it, reinstalls and starts it again (unless ``start=False``). Its data is lost."""
        instance = await self._live(name, backend)
        if instance.disk_template == "diskless" or instance.disks == []:
            raise ValidationError(
                f"instance {instance.name} has no disks: Ganeti reinstalls an OS onto an instance's "
                "disks (LUInstanceReinstall refuses a diskless one); attach a disk first",
                field="disks",
            )
        if os is not None:
            await self._check_os(backend_of(instance), os)
        return await self._operate(
            instance,
            InstanceAction.REINSTALL,
            lambda c: c.reinstall_instance(instance.name, os=os, no_startup=not start, osparams=osparams),
            {"os": os, "start": start},
            start=start,
        )

    async def _check_os(self, backend: str, os: str) -> None:
        catalogs = await self._checker.catalogs.get([backend])
        if catalogs and not catalogs[0].offers_os(os):
            offered = ", ".join(sorted(catalogs[0].oses or ()))
            raise ValidationError(
                f"os {os}: backend {backend} does not offer it (offered: {offered})", field="os"
            )

    async def migrate_instance(
        self,
        name: str,
        *,
        backend: str | None = None,
        target_node: str | None = None,
        mode: str | None = None,
    ) -> int:
        """Live-migrate the instance (``mode`` live or non-live) to its secondary node, or to
        ``target_node`` (shared storage; else the cluster's allocator picks one)."""
        instance = await self._live(name, backend)
        return await self._operate(
            instance,
            InstanceAction.MIGRATE,
            lambda c: c.migrate_instance(instance.name, mode=mode, target_node=target_node),
            {"target_node": target_node},
        )

    async def failover_instance(
        self, name: str, *, backend: str | None = None, target_node: str | None = None
    ) -> int:
        """Fail the instance over (stop it here, start it there) to its secondary node, or to
        ``target_node`` (shared storage; else the cluster's allocator picks one)."""
        instance = await self._live(name, backend)
        return await self._operate(
            instance,
            InstanceAction.FAILOVER,
            lambda c: c.failover_instance(instance.name, target_node=target_node),
            {"target_node": target_node},
        )

    # -- tags ------------------------------------------------------------------------------------

    def _tags(self, tags: Iterable[str]) -> list[str]:
        if isinstance(tags, str):
            raise ValidationError(f"tags must be a list of tags, not the string {tags!r}", field="tags")
        found = list(dict.fromkeys(str(tag) for tag in tags))
        if not found:
            raise ValidationError("tags: give at least one tag", field="tags")
        for tag in found:  # Ganeti's TaggableObject.ValidateTag (objects.py)
            if len(tag) > MAX_TAG_LEN or not VALID_TAG.match(tag):
                raise ValidationError(
                    f"tag {tag!r}: Ganeti takes 1 to {MAX_TAG_LEN} letters, digits and . + * / : @ - _",
                    field="tags",
                )
        return found

    async def add_instance_tags(self, name: str, tags: Iterable[str], *, backend: str | None = None) -> int:
        """Tag the instance in Ganeti; the tags under ``[ownership] tag_namespace`` are stored."""
        wanted = self._tags(tags)
        instance = await self._live(name, backend)
        ours = our_tags(wanted, self.settings.ownership.tag_namespace)
        return await self._operate(
            instance,
            InstanceAction.ADD_TAGS,
            lambda c: c.add_instance_tags(instance.name, wanted),
            {"tags": ours},
        )

    async def remove_instance_tags(
        self, name: str, tags: Iterable[str], *, backend: str | None = None
    ) -> int:
        """Remove tags from the instance in Ganeti (and ours from the stored ones). The ownership
        tag is refused: without it the instance would no longer be this control plane's."""
        wanted = self._tags(tags)
        owned = set(self.settings.ownership.tags_for_new())
        if owned & set(wanted):
            raise ValidationError(
                f"tags: {', '.join(sorted(owned & set(wanted)))} marks the instance as ours; it is not removed",
                field="tags",
            )
        instance = await self._live(name, backend)
        ours = our_tags(wanted, self.settings.ownership.tag_namespace)
        return await self._operate(
            instance,
            InstanceAction.REMOVE_TAGS,
            lambda c: c.delete_instance_tags(instance.name, wanted),
            {"tags": ours},
        )

    # -- what a backend offers -------------------------------------------------------------------

    async def catalog(self, backend: str) -> BackendCatalog:
        """What ``backend`` offers: OSes with variants, disk templates, networks, the instance
        policy, node groups and each node's stats, read now (the OS list at most every few
        minutes). Refreshes the catalog the create checks use. An unknown backend is a
        :class:`~synnefo_ganeti.ConfigError`; one that does not answer raises the RAPI's error."""
        self.settings.backend(backend)
        return await read_catalog(backend, await self.client(backend), self._checker.catalogs)
