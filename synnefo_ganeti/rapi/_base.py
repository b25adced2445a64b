"""The plumbing every part of :class:`~synnefo_ganeti.rapi.RapiClient` calls through.

``RapiClient`` is one class assembled from a core (``_client.py``: construction,
creates, jobs) and one mixin per RAPI resource group (``_api_cluster.py``,
``_api_instances.py``, ``_api_nodes.py``, ``_api_groups.py``, ``_api_networks.py``,
``_api_query.py``). They all derive from :class:`RapiBase`, which holds the only
ways to talk to ganeti-rapi, so that each call kind keeps its retry rule:

* ``_read``/``_get``: safe to repeat (reads, queries, read-only jobs such as
  ``GET /2/os``): retried on 502/503/504, timeouts and connection errors;
* ``_write``/``_write_job``: retried only when the request surely did not reach
  Ganeti (:func:`~synnefo_ganeti.rapi.is_unsent`): never sent twice blindly.

It also builds the query strings Ganeti's own client builds (``dry-run=1``,
``force=1``, ``reason=...``, one ``tag=`` per tag, booleans as ``0``/``1``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

from pydantic import BaseModel, ValidationError

from synnefo_ganeti.errors import ConfigError, GanetiError, RapiError
from synnefo_ganeti.rapi._retry import RetryPolicy, is_transient, is_unsent
from synnefo_ganeti.rapi._transport import QueryArgs

if TYPE_CHECKING:
    from synnefo_ganeti.rapi._transport import Transport

__all__ = ["JOB_PRIORITIES", "PRIORITY_LOW", "QueryValue", "RapiBase", "job_priority", "query_args"]

logger = logging.getLogger("synnefo_ganeti.rapi")

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

QueryValue = str | int | bool | None


def query_args(
    *pairs: tuple[str, QueryValue],
    dry_run: bool = False,
    force: bool = False,
    reason: str | None = None,
) -> list[tuple[str, str]]:
    """Query pairs as Ganeti's client sends them: pairs whose value is ``None`` are left out,
    booleans become ``0``/``1``; then ``force=1``, ``dry-run=1`` and ``reason`` when given."""
    args = [(name, _encode(value)) for name, value in pairs if value is not None]
    if force:
        args.append(("force", "1"))
    if dry_run:
        args.append(("dry-run", "1"))
    if reason:
        args.append(("reason", reason))
    return args


def _encode(value: QueryValue) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def choice(value: str, allowed: Iterable[str], what: str) -> str:
    """``value`` if it is one of ``allowed``, else a :class:`ConfigError` naming them."""
    options = sorted(allowed)
    if value not in options:
        raise ConfigError(f"{what} must be one of {', '.join(options)}, not {value!r}")
    return value


#: the priorities a job may be submitted with (``constants.OP_PRIO_SUBMIT_VALID``: high, normal,
#: low; Ganeti runs a lower number first and every opcode takes ``priority`` in its body)
JOB_PRIORITIES = (-10, 0, 10)
#: ``constants.OP_PRIO_LOW``: below the cloud's actions (submitted at the default, normal 0)
PRIORITY_LOW = 10


def job_priority(priority: int | None) -> int | None:
    """``priority`` checked against :data:`JOB_PRIORITIES` (None: Ganeti's default, not sent)."""
    if priority is not None and (isinstance(priority, bool) or priority not in JOB_PRIORITIES):
        raise ConfigError(
            f"job priority {priority!r}: one of {', '.join(map(str, JOB_PRIORITIES))} (high, normal, low)"
        )
    return priority


def some_body(**items: Any) -> dict[str, Any]:
    """A request body of the items that are not ``None`` (Ganeti's ``_SetItemIf(..., x is not None)``)."""
    return {key: value for key, value in items.items() if value is not None}


class RapiBase:
    """What the parts of ``RapiClient`` share: the transport, the retry policy, the plumbing."""

    url: str
    where: str
    retry: RetryPolicy
    _transport: Transport

    # ------------------------------------------------------------------ sending

    async def _retrying(
        self, call: Callable[[], Awaitable[T]], retryable: Callable[[GanetiError], bool]
    ) -> T:
        delays = self.retry.delays()
        while True:
            try:
                return await call()
            except GanetiError as exc:
                if not retryable(exc):
                    raise
                delay = next(delays, None)
                if delay is None:
                    raise
                logger.info("%s: retrying in %.2f s after: %s", self.url, delay, exc)
                await asyncio.sleep(delay)

    async def _get(
        self,
        path: str,
        query: QueryArgs | None = None,
        retryable: Callable[[GanetiError], bool] = is_transient,
    ) -> Any:
        return await self._retrying(lambda: self._transport.request("GET", path, query=query), retryable)

    async def _read(self, method: str, path: str, body: Any, query: QueryArgs | None = None) -> Any:
        """A call safe to repeat that carries a body (``PUT /2/query/...``)."""
        return await self._retrying(
            lambda: self._transport.request(method, path, query=query, body=body), is_transient
        )

    async def _write(self, method: str, path: str, body: Any = None, query: QueryArgs | None = None) -> Any:
        payload = {} if body is None else body
        return await self._retrying(
            lambda: self._transport.request(method, path, query=query, body=payload), is_unsent
        )

    async def _write_job(
        self, method: str, path: str, body: Any = None, query: QueryArgs | None = None
    ) -> int:
        return self._job_id(await self._write(method, path, body, query), f"{method} {path}")

    async def _get_job(self, path: str, query: QueryArgs | None = None) -> int:
        """A GET that submits a read-only job (``/2/instances/NAME/info``) and answers its id."""
        return self._job_id(await self._get(path, query), f"GET {path}")

    # ------------------------------------------------------------------ answers

    def _job_id(self, answer: Any, what: str) -> int:
        try:
            if isinstance(answer, bool):
                raise TypeError
            return int(answer)
        except (TypeError, ValueError):
            raise RapiError(
                f"{self.where}: {what} answered {answer!r}, not a job id; is this a ganeti-rapi?",
                url=self.url,
            ) from None

    def _parse(self, model: type[M], data: Any, what: str) -> M:
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise RapiError(
                f"{self.where}: {what} answered data of an unexpected shape ({exc.error_count()} problems, "
                f"first: {first['loc']} {first['msg']}); report this with the Ganeti version",
                url=self.url,
            ) from None

    def _parse_list(self, model: type[M], data: Any, what: str) -> list[M]:
        if not isinstance(data, list):
            raise RapiError(f"{self.where}: {what} answered {data!r:.80}, not a list", url=self.url)
        return [self._parse(model, item, what) for item in data]

    def _strings(self, data: Any, what: str) -> list[str]:
        if not isinstance(data, list):
            raise RapiError(f"{self.where}: {what} answered {data!r:.80}, not a list", url=self.url)
        return [str(item) for item in data]

    # ------------------------------------------------------------------ paths and tags

    @staticmethod
    def _path(kind: str, name: str, action: str = "") -> str:
        """``/2/<kind>/<name>[/<action>]`` with the name quoted; an empty name is refused."""
        if not name:
            raise ConfigError(f"{kind.rstrip('s')} name is empty")
        path = f"/2/{kind}/{quote(str(name), safe='')}"
        return f"{path}/{action}" if action else path

    @staticmethod
    def _instance_path(name: str, action: str = "") -> str:
        return RapiBase._path("instances", name, action)

    async def _get_tags(self, path: str, reason: str | None) -> list[str]:
        return self._strings(await self._get(path, query_args(reason=reason)), f"GET {path}")

    async def _tag_job(
        self,
        method: str,
        path: str,
        tags: Iterable[str],
        *,
        dry_run: bool,
        reason: str | None,
        body: Any = None,
    ) -> int:
        """``PUT``/``DELETE .../tags?tag=a&tag=b``: one job for all the tags."""
        if isinstance(tags, str):
            raise ConfigError(f"tags must be a list of strings, not the string {tags!r}")
        names = [str(tag) for tag in tags]
        if not names:
            raise ConfigError(f"{method} {path} needs at least one tag")
        query = query_args(*(("tag", tag) for tag in names), dry_run=dry_run, reason=reason)
        return await self._write_job(method, path, body, query)
