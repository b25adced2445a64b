"""Instance RAPI calls: power, remove, modify, rename, reinstall, info, console, multi-alloc, tags.

Each method follows Ganeti 3.0's own client (``GanetiRapiClient``, ``lib/rapi/client.py``) for the
HTTP method, path, query and body; ``lib/rapi/rlib2.py`` (``R_2_instances*``) for their meaning.
``modify_instance`` sends the hotplug keys the backend's Ganeti version takes (``_versions.py``);
``rename_instance`` always sends ``name_check`` and ``ip_check``, whose defaults 3.1 changed.
Listing, reading and creating instances live in the core (``_client.py``); disks, migration and
export in ``_api_instance_ops.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from synnefo_ganeti.errors import ConfigError, GanetiError, UnavailableError
from synnefo_ganeti.rapi._api_versions import VersionApi
from synnefo_ganeti.rapi._base import query_args, some_body
from synnefo_ganeti.rapi._calls import RebootType
from synnefo_ganeti.rapi._models import InstanceConsole, InstanceSpec
from synnefo_ganeti.rapi._retry import is_transient, is_unsent
from synnefo_ganeti.rapi._versions import hotplug_fields

__all__ = ["InstanceApi"]


class InstanceApi(VersionApi):
    """Everything under ``/2/instances/NAME`` but disks, moves and exports; ``/2/instances-multi-alloc``."""

    async def delete_instance(
        self, name: str, *, dry_run: bool = False, reason: str | None = None, **params: Any
    ) -> int:
        """Remove an instance (``DELETE /2/instances/NAME``); returns the job id.

        ``params`` (``shutdown_timeout=...``) travel as the body, as in Ganeti's client.
        """
        path = self._instance_path(name)
        query = query_args(dry_run=dry_run, reason=reason)
        if params:
            return await self._write_job("DELETE", path, params, query)
        answer = await self._retrying(lambda: self._transport.request("DELETE", path, query=query), is_unsent)
        return self._job_id(answer, f"DELETE {path}")

    async def startup_instance(
        self, name: str, *, dry_run: bool = False, no_remember: bool = False, reason: str | None = None
    ) -> int:
        """Start an instance (``PUT /2/instances/NAME/startup``); returns the job id.

        ``no_remember``: start it without recording that it should run.
        """
        query = query_args(("no_remember", no_remember or None), dry_run=dry_run, reason=reason)
        return await self._write_job("PUT", self._instance_path(name, "startup"), None, query)

    async def shutdown_instance(
        self,
        name: str,
        *,
        dry_run: bool = False,
        no_remember: bool = False,
        reason: str | None = None,
        **params: Any,
    ) -> int:
        """Stop an instance (``PUT /2/instances/NAME/shutdown``); returns the job id.

        ``params`` (``timeout=120``) travel as the body, as in Ganeti's client.
        """
        query = query_args(("no_remember", no_remember or None), dry_run=dry_run, reason=reason)
        return await self._write_job("PUT", self._instance_path(name, "shutdown"), params, query)

    async def reboot_instance(
        self,
        name: str,
        *,
        reboot_type: RebootType = "soft",
        ignore_secondaries: bool | None = None,
        dry_run: bool = False,
        reason: str | None = None,
        **params: Any,
    ) -> int:
        """Reboot an instance (``POST /2/instances/NAME/reboot``); returns the job id."""
        if reboot_type not in ("soft", "hard", "full"):
            raise ConfigError(f"reboot_type must be soft, hard or full, not {reboot_type!r}")
        query = query_args(
            ("type", reboot_type), ("ignore_secondaries", ignore_secondaries), dry_run=dry_run, reason=reason
        )
        return await self._write_job("POST", self._instance_path(name, "reboot"), params, query)

    async def modify_instance(
        self,
        name: str,
        *,
        hotplug: bool = False,
        hotplug_if_possible: bool = False,
        reason: str | None = None,
        **params: Any,
    ) -> int:
        """Change an instance's parameters (``PUT /2/instances/NAME/modify``); returns the job id.

        ``params`` are Ganeti's (``beparams={"memory": 256}``, ``hvparams=...``, ``nics=...``).
        ``hotplug_if_possible``: hot-plug the NICs and disks added or removed where the hypervisor
        can, else change them for the next start; ``hotplug``: hot-plug or fail (Ganeti before 3.1;
        3.1 falls back as ``hotplug_if_possible`` does). Sent as the backend's version takes them
        (``hotplug: true`` on 3.1; ``hotplug_if_possible: true, hotplug: false`` on 2.10 to 3.0),
        ``hotplug`` always explicit: false unless asked, on every version.
        """
        if not params:
            raise ConfigError(f"modify_instance({name!r}) needs at least one parameter to change")
        path = self._instance_path(name, "modify")
        query = query_args(reason=reason)

        async def send() -> Any:
            # the version is asked at each attempt: a retry after a lost connection reads it again
            version = await self.ganeti_version()
            fields = hotplug_fields(
                version,
                hotplug=hotplug,
                hotplug_if_possible=hotplug_if_possible,
                where=self.where,
                url=self.url,
            )
            return await self._transport.request("PUT", path, query=query, body={**params, **fields})

        return self._job_id(await self._retrying(send, is_unsent), f"PUT {path}")

    async def rename_instance(
        self,
        name: str,
        new_name: str,
        *,
        ip_check: bool = False,
        name_check: bool = False,
        reason: str | None = None,
    ) -> int:
        """Rename an instance (``PUT /2/instances/NAME/rename``); returns the job id.

        ``name_check`` (the new name must resolve) and ``ip_check`` (its address must not answer)
        are always sent, false unless asked: Ganeti 3.1 defaults them to false, earlier ones to true.
        """
        if not new_name:
            raise ConfigError(f"rename_instance({name!r}): the new name is empty")
        body = {"new_name": new_name, "ip_check": bool(ip_check), "name_check": bool(name_check)}
        return await self._write_job(
            "PUT", self._instance_path(name, "rename"), body, query_args(reason=reason)
        )

    async def reinstall_instance(
        self,
        name: str,
        *,
        os: str | None = None,
        no_startup: bool = False,
        osparams: Mapping[str, Any] | None = None,
        reason: str | None = None,
    ) -> int:
        """Reinstall an instance's OS (``POST /2/instances/NAME/reinstall``); returns the job id.

        One job: shutdown, reinstall (``os``, or the current one), then startup unless
        ``no_startup``. Sent in the body form of Ganeti >= 2.5 (``instance-reinstall-reqv1``).
        """
        body: dict[str, Any] = {"start": not no_startup}
        if os is not None:
            body["os"] = os
        if osparams is not None:
            body["osparams"] = dict(osparams)
        path = self._instance_path(name, "reinstall")
        return await self._write_job("POST", path, body, query_args(reason=reason))

    async def get_instance_info(
        self, name: str, *, static: bool | None = None, reason: str | None = None
    ) -> int:
        """Ask for an instance's detailed information (``GET /2/instances/NAME/info``); returns the
        id of the ``OP_INSTANCE_QUERY_DATA`` job whose result holds it (``static``: configuration only,
        without asking the nodes)."""
        query = query_args(("static", static), reason=reason)
        return await self._get_job(self._instance_path(name, "info"), query)

    async def get_instance_console(self, name: str, *, reason: str | None = None) -> InstanceConsole:
        """How to reach a running instance's console (``GET /2/instances/NAME/console``).

        Ganeti answers 503 (:class:`UnavailableError`) for an instance that is not running: that
        one is not retried.
        """
        path = self._instance_path(name, "console")
        answer = await self._get(path, query_args(reason=reason), _console_retryable)
        return self._parse(InstanceConsole, answer, f"GET {path}")

    # ------------------------------------------------------------------ multi-allocation

    @staticmethod
    def instance_allocation(spec: InstanceSpec) -> dict[str, Any]:
        """One entry of ``instances_multi_alloc``'s list (Ganeti's ``InstanceAllocation``): the create
        body without its ``__version__``."""
        body = spec.to_rapi_body()
        body.pop("__version__", None)
        return body

    async def instances_multi_alloc(
        self,
        specs: Iterable[InstanceSpec],
        *,
        iallocator: str | None = None,
        opportunistic_locking: bool | None = None,
        dry_run: bool = False,
        reason: str | None = None,
        **params: Any,
    ) -> int:
        """Place and create many instances in one job (``POST /2/instances-multi-alloc``); job id.

        The job (``OP_INSTANCE_MULTI_ALLOC``) runs the allocator once for all of them and submits
        one create job per instance it could place (its result lists them). Sent once: retried only
        when it surely did not reach Ganeti (unlike ``create_instance``, no request id is searched).
        """
        instances = [self.instance_allocation(spec) for spec in specs]
        if not instances:
            raise ConfigError("instances_multi_alloc needs at least one instance spec")
        body: dict[str, Any] = {
            "instances": instances,
            **some_body(iallocator=iallocator, opportunistic_locking=opportunistic_locking),
            **params,
        }
        query = query_args(dry_run=dry_run, reason=reason)
        return await self._write_job("POST", "/2/instances-multi-alloc", body, query)

    # ------------------------------------------------------------------ tags

    async def get_instance_tags(self, name: str, *, reason: str | None = None) -> list[str]:
        """An instance's tags (``GET /2/instances/NAME/tags``)."""
        return await self._get_tags(self._instance_path(name, "tags"), reason)

    async def add_instance_tags(
        self, name: str, tags: Iterable[str], *, dry_run: bool = False, reason: str | None = None
    ) -> int:
        """Add tags to an instance (``PUT /2/instances/NAME/tags?tag=...``); returns the job id."""
        path = self._instance_path(name, "tags")
        return await self._tag_job("PUT", path, tags, dry_run=dry_run, reason=reason)

    async def delete_instance_tags(
        self, name: str, tags: Iterable[str], *, dry_run: bool = False, reason: str | None = None
    ) -> int:
        """Remove tags from an instance (``DELETE /2/instances/NAME/tags?tag=...``); returns the job id."""
        path = self._instance_path(name, "tags")
        return await self._tag_job("DELETE", path, tags, dry_run=dry_run, reason=reason)


def _console_retryable(error: GanetiError) -> bool:
    """The console's 503 means "instance not running" (``R_2_instances_name_console``), not "busy"."""
    return is_transient(error) and not (isinstance(error, UnavailableError) and error.status == 503)
