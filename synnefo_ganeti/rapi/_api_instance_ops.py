"""Instance disk, move and export RAPI calls: activate, deactivate, recreate, grow and replace disks;
migrate, failover; prepare-export, export.

Each method follows Ganeti 3.0's own client (``GanetiRapiClient``, ``lib/rapi/client.py``) for the
HTTP method, path, query and body, with one exception: ``replace_instance_disks`` sends its
parameters as the body, the form ``R_2_instances_name_replace_disks`` reads first, because in the
legacy query form Ganeti's client uses, the server drops ``early_release``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from synnefo_ganeti.errors import ConfigError
from synnefo_ganeti.rapi._base import RapiBase, choice, job_priority, query_args, some_body
from synnefo_ganeti.rapi._calls import EXPORT_MODES, MIGRATION_MODES, REPLACE_DISKS_MODES

__all__ = ["InstanceOpsApi"]


class InstanceOpsApi(RapiBase):
    """``/2/instances/NAME/{activate,deactivate,recreate,replace}-disks``, ``.../disk/N/grow``,
    ``.../migrate``, ``.../failover``, ``.../prepare-export``, ``.../export``."""

    async def activate_instance_disks(
        self, name: str, *, ignore_size: bool = False, reason: str | None = None
    ) -> int:
        """Activate an instance's disks (``PUT /2/instances/NAME/activate-disks``); returns the job id."""
        query = query_args(("ignore_size", ignore_size or None), reason=reason)
        return await self._write_job("PUT", self._instance_path(name, "activate-disks"), None, query)

    async def deactivate_instance_disks(
        self, name: str, *, force: bool = False, reason: str | None = None
    ) -> int:
        """Deactivate an instance's disks (``PUT /2/instances/NAME/deactivate-disks``); job id."""
        query = query_args(force=force, reason=reason)
        return await self._write_job("PUT", self._instance_path(name, "deactivate-disks"), None, query)

    async def recreate_instance_disks(
        self,
        name: str,
        *,
        disks: Iterable[int] | None = None,
        nodes: Iterable[str] | None = None,
        iallocator: str | None = None,
        reason: str | None = None,
    ) -> int:
        """Recreate an instance's disks (all, or the indexes in ``disks``), on ``nodes`` or where
        ``iallocator`` puts them (``POST /2/instances/NAME/recreate-disks``); returns the job id."""
        body = some_body(
            disks=None if disks is None else [int(index) for index in disks],
            nodes=None if nodes is None else _names(nodes, "nodes"),
            iallocator=iallocator,
        )
        path = self._instance_path(name, "recreate-disks")
        return await self._write_job("POST", path, body, query_args(reason=reason))

    async def grow_instance_disk(
        self,
        name: str,
        disk: int,
        amount: int,
        *,
        wait_for_sync: bool | None = None,
        reason: str | None = None,
    ) -> int:
        """Grow disk number ``disk`` by ``amount`` MiB (``POST /2/instances/NAME/disk/N/grow``); job id."""
        if isinstance(disk, bool) or int(disk) < 0:
            raise ConfigError(f"grow_instance_disk({name!r}): disk must be an index >= 0, not {disk!r}")
        if isinstance(amount, bool) or int(amount) <= 0:
            raise ConfigError(f"grow_instance_disk({name!r}): amount must be > 0 MiB, not {amount!r}")
        body = {"amount": int(amount), **some_body(wait_for_sync=wait_for_sync)}
        path = self._instance_path(name, f"disk/{int(disk)}/grow")
        return await self._write_job("POST", path, body, query_args(reason=reason))

    async def replace_instance_disks(
        self,
        name: str,
        *,
        disks: Iterable[int] | None = None,
        mode: str = "replace_auto",
        remote_node: str | None = None,
        iallocator: str | None = None,
        early_release: bool | None = None,
        reason: str | None = None,
    ) -> int:
        """Replace an instance's DRBD disks (``POST /2/instances/NAME/replace-disks``); job id.

        ``mode``: replace_auto (the default), replace_on_primary, replace_on_secondary, or
        replace_new_secondary (with ``remote_node`` or ``iallocator``).
        """
        choice(mode, REPLACE_DISKS_MODES, "replace-disks mode")
        body: dict[str, Any] = {"mode": mode}
        if disks is not None:
            body["disks"] = [int(index) for index in disks]
        body.update(some_body(remote_node=remote_node, iallocator=iallocator, early_release=early_release))
        path = self._instance_path(name, "replace-disks")
        return await self._write_job("POST", path, body, query_args(reason=reason))

    # ------------------------------------------------------------------ moves

    async def migrate_instance(
        self,
        name: str,
        *,
        mode: str | None = None,
        cleanup: bool | None = None,
        target_node: str | None = None,
        iallocator: str | None = None,
        reason: str | None = None,
        priority: int | None = None,
    ) -> int:
        """Live-migrate an instance (``PUT /2/instances/NAME/migrate``); returns the job id.

        ``mode`` is live or non-live; ``cleanup`` mends a migration that failed half-way;
        ``iallocator`` (shared storage) picks the target (the body is ``OpInstanceMigrate``'s);
        ``priority`` the job's (:func:`~synnefo_ganeti.rapi._base.job_priority`).
        """
        if mode is not None:
            choice(mode, MIGRATION_MODES, "migration mode")
        body = some_body(
            mode=mode,
            cleanup=cleanup,
            target_node=target_node,
            iallocator=iallocator,
            priority=job_priority(priority),
        )
        path = self._instance_path(name, "migrate")
        return await self._write_job("PUT", path, body, query_args(reason=reason))

    async def failover_instance(
        self,
        name: str,
        *,
        iallocator: str | None = None,
        ignore_consistency: bool | None = None,
        target_node: str | None = None,
        reason: str | None = None,
        priority: int | None = None,
    ) -> int:
        """Fail an instance over to its secondary (or, shared storage, another) node
        (``PUT /2/instances/NAME/failover``); returns the job id; ``priority`` as ``migrate_instance``."""
        body = some_body(
            iallocator=iallocator,
            ignore_consistency=ignore_consistency,
            target_node=target_node,
            priority=job_priority(priority),
        )
        path = self._instance_path(name, "failover")
        return await self._write_job("PUT", path, body, query_args(reason=reason))

    # ------------------------------------------------------------------ export

    async def prepare_export(self, name: str, mode: str, *, reason: str | None = None) -> int:
        """Prepare an instance's export (``PUT /2/instances/NAME/prepare-export?mode=``); job id.

        ``mode`` is local or remote; for remote, the job's result holds the X509 key and CA.
        """
        query = query_args(("mode", choice(mode, EXPORT_MODES, "export mode")), reason=reason)
        return await self._write_job("PUT", self._instance_path(name, "prepare-export"), None, query)

    async def export_instance(
        self,
        name: str,
        mode: str,
        destination: Any,
        *,
        shutdown: bool | None = None,
        remove_instance: bool | None = None,
        x509_key_name: Any = None,
        destination_x509_ca: str | None = None,
        compress: str | None = None,
        reason: str | None = None,
    ) -> int:
        """Export an instance (``PUT /2/instances/NAME/export``); returns the job id.

        ``destination`` is the target node (mode local) or the remote import's description
        (mode remote, with ``x509_key_name`` and ``destination_x509_ca`` from ``prepare_export``).
        """
        body = {
            "destination": destination,
            "mode": choice(mode, EXPORT_MODES, "export mode"),
            **some_body(
                shutdown=shutdown,
                remove_instance=remove_instance,
                x509_key_name=x509_key_name,
                destination_x509_ca=destination_x509_ca,
                compress=compress,
            ),
        }
        path = self._instance_path(name, "export")
        return await self._write_job("PUT", path, body, query_args(reason=reason))


def _names(items: Iterable[str], what: str) -> list[str]:
    if isinstance(items, str):
        raise ConfigError(f"{what} must be a list of names, not the string {items!r}")
    return [str(item) for item in items]
