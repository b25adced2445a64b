"""The typed RAPI client: ``async with RapiClient(...) as rapi:``.

Layers (each knows only the one below): :class:`Transport` (session, TLS, auth,
slots, error mapping) -> retry rules (:mod:`._retry`) -> typed calls here.

``RapiClient`` covers every public method of Ganeti 3.0's own client
(``ganeti.rapi.client.GanetiRapiClient``; the table is in ``docs/rapi-client.md``). This
module is its core: construction, listing and creating instances, jobs. The other
resources are mixins, one module per group (``_api_cluster``, ``_api_instances``,
``_api_instance_ops``, ``_api_nodes``, ``_api_groups``, ``_api_networks``, ``_api_query``),
all calling through the plumbing of :class:`~._base.RapiBase`; ``_api_versions`` keeps the
backend's Ganeti version (``ganeti_version()``), so that each call sends what that version takes
(``_versions.py``: hotplug keys of a modify, Ganeti 3.1's network rename).

Concurrency: every call may be made from many tasks at once; the transport keeps
at most ``max_connections`` requests in flight and long-polls to their share.
``create_instances`` runs ``max_connections`` workers over the specs, so a burst of
N creates costs N requests and nothing else (no ``/2/features`` before each create,
unlike Ganeti's own client).

Creates are never sent twice blindly. Each create carries a request id in its
reason trail (``?reason=synnefo-ganeti:<id>``, stored by Ganeti as
``["gnt:user", "synnefo-ganeti:<id>", ts]`` in the job's op). A create is sent again only
when it surely did not reach Ganeti: no connection, a 503 (answered before anything is
submitted), or a 502 (ganeti-rapi could not reach its master daemon) after the job list
shows no job carrying its id. When its outcome is unknown (the connection broke or timed
out after sending, a 504, a success answer that is not a job id) the client looks for the
job once and, not finding it, raises :class:`CreateOutcomeUnknownError`: ganeti-rapi forks
per connection, and a POST it accepted can reach the queue long after the client gave up
(over 30 s with a node down), so "no job yet" never means "not sent". The dispatcher then
looks again until the job appears or ``[dispatcher] unknown_outcome_wait`` has passed.
Every other write is sent again only when it surely did not reach Ganeti
(:func:`~._retry.is_unsent`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import Any, Self

from pydantic import SecretStr

from synnefo_ganeti._gc import gc_paused
from synnefo_ganeti.errors import (
    ConfigError,
    CreateOutcomeUnknownError,
    GanetiError,
    JobNotFoundError,
    NotFoundError,
    RapiError,
    RapiTimeoutError,
    UnavailableError,
)
from synnefo_ganeti.rapi._api_cluster import ClusterApi
from synnefo_ganeti.rapi._api_groups import GroupApi
from synnefo_ganeti.rapi._api_instance_ops import InstanceOpsApi
from synnefo_ganeti.rapi._api_instances import InstanceApi
from synnefo_ganeti.rapi._api_networks import NetworkApi
from synnefo_ganeti.rapi._api_nodes import NodeApi
from synnefo_ganeti.rapi._api_query import QueryApi
from synnefo_ganeti.rapi._base import query_args
from synnefo_ganeti.rapi._calls import REASON_PREFIX, CreateProgress, RebootType, new_request_id
from synnefo_ganeti.rapi._models import CancelResult, Instance, InstanceSpec, Job
from synnefo_ganeti.rapi._retry import RetryPolicy, is_transient, is_unsent
from synnefo_ganeti.rapi._tls import build_tls
from synnefo_ganeti.rapi._transport import LONG_POLL_GRACE, Transport
from synnefo_ganeti.rapi._versions import VersionCache

__all__ = ["CreateProgress", "RapiClient", "RebootType", "new_request_id"]

logger = logging.getLogger("synnefo_ganeti.rapi")


class RapiClient(ClusterApi, InstanceApi, InstanceOpsApi, NodeApi, GroupApi, NetworkApi, QueryApi):
    """An asyncio client of one Ganeti cluster's RAPI.

    ``url`` is the RAPI's base URL (``https://master:5080``); credentials are given
    apart (never in the URL). Trust Ganeti's self-signed certificate with
    ``ca_file`` or ``fingerprint`` (see :mod:`synnefo_ganeti.rapi._tls`).

    ``max_connections`` bounds the requests in flight (ganeti-rapi serves 20);
    ``long_poll_slots`` bounds how many of them ``wait_for_job`` may hold;
    ``timeout`` is the per-request limit in seconds; ``retry`` the policy for
    transient failures; ``name`` the backend's name, the ``backend`` label of the
    RAPI metrics (the URL's ``host:port`` when not given).

    It has one method per public method of Ganeti 3.0's ``GanetiRapiClient`` (the table
    is in ``docs/rapi-client.md``): the core here, each resource group in its mixin.
    """

    def __init__(
        self,
        url: str,
        *,
        username: str,
        password: str | SecretStr,
        ca_file: str | os.PathLike[str] | None = None,
        fingerprint: str | None = None,
        insecure: bool = False,
        max_connections: int = 20,
        timeout: float = 30.0,
        long_poll_slots: int | None = None,
        verify_hostname: bool | None = None,
        retry: RetryPolicy | None = None,
        name: str | None = None,
    ) -> None:
        url = url.rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"RAPI URL {url!r} must start with https:// (or http:// for a test server)")
        if "@" in url.split("//", 1)[1].split("/", 1)[0]:
            raise ConfigError("RAPI URL must not carry credentials; pass username= and password= instead")
        if max_connections < 1:
            raise ConfigError(f"{url}: max_connections must be >= 1, not {max_connections}")
        if timeout <= 0:
            raise ConfigError(f"{url}: timeout must be > 0 seconds, not {timeout}")
        if long_poll_slots is None:
            long_poll_slots = max(1, max_connections // 4)
        if not 1 <= long_poll_slots <= max_connections:
            raise ConfigError(
                f"{url}: long_poll_slots must be between 1 and max_connections ({max_connections})"
            )
        if not username:
            raise ConfigError(f"{url}: username is empty; ganeti-rapi requires authentication")
        secret = password.get_secret_value() if isinstance(password, SecretStr) else password
        tls, tls_mode = build_tls(
            url, ca_file=ca_file, fingerprint=fingerprint, insecure=insecure, verify_hostname=verify_hostname
        )
        self.url = url
        self.username = username
        self.max_connections = max_connections
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self._transport = Transport(
            url,
            username=username,
            password=secret,
            tls=tls,
            tls_mode=tls_mode,
            max_connections=max_connections,
            long_poll_slots=long_poll_slots,
            timeout=timeout,
            name=name,
        )
        self.name = self._transport.name
        #: how error messages name this backend: ``name (url)``, or the URL alone when unnamed
        self.where = self._transport.where
        self._features: list[str] | None = None
        self._versions = VersionCache()

    def __repr__(self) -> str:
        t = self._transport
        known = self.known_version
        ganeti = f"ganeti={known} " if known is not None else ""
        return (
            f"<RapiClient {self.url} user={self.username!r} tls={t.tls_mode} {ganeti}"
            f"{t.in_flight}/{t.max_connections} in flight, {t.waiting} waiting, "
            f"{t.long_polls}/{t.long_poll_slots} long-polls>"
        )

    async def __aenter__(self) -> Self:
        await self._transport.open()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._transport.close()

    @property
    def in_flight(self) -> int:
        """Requests being sent or answered right now."""
        return self._transport.in_flight

    # ------------------------------------------------------------------ instances

    async def list_instances(self) -> list[Instance]:
        """Every instance with its state (``GET /2/instances?bulk=1``)."""
        answer = await self._get("/2/instances", {"bulk": "1"})
        with gc_paused():
            return [self._parse(Instance, item, "GET /2/instances?bulk=1") for item in answer]

    async def get_instance(self, name: str, *, reason: str | None = None) -> Instance:
        """One instance (``GET /2/instances/NAME``); :class:`NotFoundError` if Ganeti has none."""
        path = self._instance_path(name)
        return self._parse(Instance, await self._get(path, query_args(reason=reason)), f"GET {path}")

    async def create_instance(
        self, spec: InstanceSpec, *, dry_run: bool = False, request_id: str | None = None
    ) -> int:
        """Submit one create (``POST /2/instances``) and return its job id at once.

        The job's outcome comes later: ``wait_for_job``, or the queue watcher.
        ``request_id`` (default: a new one) lets a caller that retries after a
        crash find the job of its earlier attempt; see the module docstring.
        """
        rid = request_id or new_request_id()
        query = {"reason": f"{REASON_PREFIX}{rid}"}
        if dry_run:
            query["dry-run"] = "1"
        body = spec.to_rapi_body()
        delays = self.retry.delays()
        while True:
            try:
                answer = await self._transport.request("POST", "/2/instances", query=query, body=body)
                return self._job_id(answer, "POST /2/instances")
            except GanetiError as exc:
                if not is_unsent(exc):
                    if not (is_transient(exc) or _garbled(exc)):
                        raise  # Ganeti answered: a refusal
                    found = await self._find_create(rid, spec.name, dry_run=dry_run, cause=exc)
                    if found is not None:
                        logger.info("%s: create %s was submitted after all, as job %d", self.url, rid, found)
                        return found
                    if not _no_master(exc):
                        # Sent, maybe: ganeti-rapi forks per connection, and a POST it accepted
                        # reaches the queue even after we gave up (over 30 s later with a node
                        # down). "No job yet" is not "not sent": never send it again from here.
                        raise CreateOutcomeUnknownError(
                            f"{self.where}: the create of {spec.name} (request {rid}) got no answer ({exc}) "
                            "and no job carries its request id yet; Ganeti may still be queueing it, so it "
                            f"was not sent again: look for a job whose reason is '{REASON_PREFIX}{rid}' "
                            "(again a minute later) before creating it again",
                            url=self.url,
                            request_id=rid,
                        ) from exc
                delay = next(delays, None)
                if delay is None:
                    raise
                logger.info("%s: retrying create of %s in %.2f s after: %s", self.url, spec.name, delay, exc)
                await asyncio.sleep(delay)

    async def _find_create(
        self, request_id: str, name: str, *, dry_run: bool, cause: GanetiError
    ) -> int | None:
        """After an unknown outcome: the job carrying ``request_id``, or None if Ganeti got nothing."""
        wanted = f"{REASON_PREFIX}{request_id}"
        try:
            jobs = await self.list_jobs()
            for job in jobs:
                if wanted in job.request_ids:
                    return job.id
            if dry_run:
                return None
            try:
                await self.get_instance(name)
            except NotFoundError:
                return None
        except GanetiError as exc:
            raise CreateOutcomeUnknownError(
                f"{self.where}: the create of {name} (request {request_id}) may or may not have been submitted "
                f"({cause}), and looking it up failed too ({exc}); look for a job whose reason is "
                f"'{wanted}' before creating it again",
                url=self.url,
                request_id=request_id,
            ) from exc
        raise CreateOutcomeUnknownError(
            f"{self.where}: the create of {name} (request {request_id}) got no answer ({cause}); no queued job "
            f"carries its request id, but instance {name} exists: it may be ours (job already archived) or "
            "another creator's; check with 'gnt-instance info' before creating it again",
            url=self.url,
            request_id=request_id,
        )

    async def create_instances(
        self,
        specs: Iterable[InstanceSpec],
        *,
        dry_run: bool = False,
        on_progress: Callable[[CreateProgress], object] | None = None,
    ) -> list[int | GanetiError]:
        """Submit many creates concurrently, up to ``max_connections`` at a time.

        Returns one entry per spec, in input order: the job id, or the
        :class:`GanetiError` that create met. One failure does not stop the others.
        ``on_progress`` is called after each create with a :class:`CreateProgress`.
        """
        items = list(specs)
        total = len(items)
        results: list[int | GanetiError | None] = [None] * total
        queue = iter(enumerate(items))
        done = 0

        async def worker() -> None:
            nonlocal done
            for index, spec in queue:
                result: int | GanetiError
                try:
                    result = await self.create_instance(spec, dry_run=dry_run)
                except GanetiError as exc:
                    result = exc
                results[index] = result
                done += 1
                if on_progress is not None:
                    on_progress(CreateProgress(done=done, total=total, index=index, result=result))

        async with asyncio.TaskGroup() as group:
            for number in range(min(total, self.max_connections)):
                group.create_task(worker(), name=f"create-worker-{number}")
        return [result for result in results if result is not None]

    # ------------------------------------------------------------------ jobs

    async def list_jobs(self) -> list[Job]:
        """Every unarchived job (``GET /2/jobs?bulk=1``; archived ones only by id)."""
        answer = await self._get("/2/jobs", {"bulk": "1"})
        with gc_paused():
            return [self._parse(Job, item, "GET /2/jobs?bulk=1") for item in answer]

    async def get_job(self, job_id: int) -> Job:
        """One job, also from the archive (``GET /2/jobs/ID``); :class:`JobNotFoundError` if unknown."""
        path = f"/2/jobs/{int(job_id)}"
        try:
            answer = await self._get(path)
        except NotFoundError:
            answer = None
        # Ganeti 3.0 answers an unknown job with 200 and every field null.
        if not isinstance(answer, dict) or answer.get("status") is None or answer.get("ops") is None:
            raise self._unknown_job(job_id)
        return self._parse(Job, answer, f"GET {path}")

    def _unknown_job(self, job_id: int) -> JobNotFoundError:
        return JobNotFoundError(
            f"{self.where}: job {job_id} is unknown to Ganeti (neither queued nor archived); check the id",
            url=self.url,
            job_id=int(job_id),
        )

    async def wait_for_job(self, job_id: int, *, timeout: float | None = None) -> Job:
        """Wait until the job ends and return it, whatever its final status.

        Long-polls ``GET /2/jobs/ID/wait`` with the previous status and log serial,
        as Ganeti intends: each call returns as soon as the job changes (or after
        ~10 s unchanged). Raises only :class:`RapiTimeoutError` when ``timeout``
        seconds pass, a transport or authentication error, or
        :class:`JobNotFoundError`.
        """
        job_id = int(job_id)
        previous_info: list[Any] | None = None
        previous_serial: int | None = None
        try:
            async with asyncio.timeout(timeout):
                while True:
                    answer = await self.wait_for_job_change(
                        job_id, ["status"], previous_info, previous_serial
                    )
                    if answer is None:  # older Ganetis: "nothing changed"
                        continue
                    info = answer.get("job_info")
                    if not info or info[0] is None:
                        raise self._unknown_job(job_id)
                    for entry in answer.get("log_entries") or []:
                        previous_serial = max(previous_serial or 0, int(entry[0]))
                    previous_info = list(info)
                    if str(info[0]) in ("canceled", "success", "error"):
                        return await self.get_job(job_id)
        except TimeoutError as exc:
            if isinstance(exc, RapiTimeoutError):
                raise
            raise RapiTimeoutError(
                f"{self.where}: job {job_id} did not end within {timeout:g} s; it is still in Ganeti's queue "
                "(wait again, or cancel it)",
                url=self.url,
            ) from None

    async def wait_for_job_change(
        self,
        job_id: int,
        fields: Sequence[str],
        previous_job_info: list[Any] | None,
        previous_log_serial: int | None,
    ) -> dict[str, Any] | None:
        """One long-poll of ``GET /2/jobs/ID/wait`` (Ganeti's ``WaitForJobChange``).

        Returns as soon as the job's ``fields`` differ from ``previous_job_info`` or it has log
        entries after ``previous_log_serial``, or after ~10 s unchanged:
        ``{"job_info": [...], "log_entries": [[serial, [sec, usec], type, message], ...]}``
        (``None`` from old Ganetis when nothing changed). Needs write access; holds one of the
        ``long_poll_slots``; :class:`JobNotFoundError` for an unknown job.
        """
        job_id = int(job_id)
        path = f"/2/jobs/{job_id}/wait"
        body = {
            "fields": list(fields),
            "previous_job_info": previous_job_info,
            "previous_log_serial": previous_log_serial,
        }
        per_request = max(self.timeout, LONG_POLL_GRACE + 10.0)
        try:
            answer = await self._retrying(
                lambda: self._transport.request("GET", path, body=body, timeout=per_request, long_poll=True),
                is_transient,
            )
        except RapiError as exc:
            if exc.status == 404 or (exc.status == 500 and "load job" in (exc.ganeti_message or "")):
                raise self._unknown_job(job_id) from None
            raise
        if answer is None:
            return None
        if not isinstance(answer, dict):
            raise self._unknown_job(job_id)
        return answer

    async def cancel_job(self, job_id: int, *, dry_run: bool = False) -> CancelResult:
        """Cancel a job (``DELETE /2/jobs/ID``); Ganeti cancels only jobs not yet running."""
        path = f"/2/jobs/{int(job_id)}"
        query = query_args(dry_run=dry_run)
        answer = await self._retrying(lambda: self._transport.request("DELETE", path, query=query), is_unsent)
        if isinstance(answer, list) and len(answer) == 2:
            return CancelResult(bool(answer[0]), str(answer[1]))
        raise RapiError(
            f"{self.where}: DELETE {path} answered {answer!r}, not [success, message]", url=self.url
        )


def _no_master(error: GanetiError) -> bool:
    """A 502: ganeti-rapi could not reach its master daemon (``luxi.NoMasterError``, answered
    before anything is submitted: ``rapi/baserlib.py``), so a create with no job is not in Ganeti."""
    return isinstance(error, UnavailableError) and error.status == 502


def _garbled(error: GanetiError) -> bool:
    """A create answered with success but not with a job id: Ganeti may hold the job."""
    return type(error) is RapiError and (error.status is None or error.status < 400)
