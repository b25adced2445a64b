"""The generic query resource: ``/2/query/WHAT`` and ``/2/query/WHAT/fields``.

Follows Ganeti 3.0's client (``Query``, ``QueryFields`` in ``lib/rapi/client.py``): a query is a
``PUT`` with the fields and the filter in the body (Ganeti's client sends the filter twice, as
``qfilter`` and as the pre-2.7 ``filter``; so does this one). Neither submits a job: both are
answered by luxid at once, so they are retried like reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from synnefo_ganeti._gc import gc_paused
from synnefo_ganeti.errors import ConfigError, RapiError
from synnefo_ganeti.rapi._base import RapiBase, choice, query_args
from synnefo_ganeti.rapi._calls import QUERY_RESOURCES
from synnefo_ganeti.rapi._models import QueryField, QueryResult

__all__ = ["QueryApi"]


class QueryApi(RapiBase):
    """``/2/query/WHAT`` (export, filter, group, instance, job, lock, network, node)."""

    async def query(
        self,
        what: str,
        fields: Sequence[str],
        *,
        qfilter: list[Any] | None = None,
        reason: str | None = None,
    ) -> QueryResult:
        """Ask for ``fields`` of every ``what`` that ``qfilter`` selects (``PUT /2/query/WHAT``).

        ``qfilter`` is Ganeti's query language as lists (``["=", "name", "vm1"]``,
        ``["|", [...], [...]]``). Use :attr:`QueryResult.rows` for ``{field: value}`` rows.
        """
        path = self._query_path(what)
        names = _fields(fields, "query")
        body: dict[str, Any] = {"fields": names}
        if qfilter is not None:
            body["qfilter"] = qfilter
            body["filter"] = qfilter
        answer = await self._read("PUT", path, body, query_args(reason=reason))
        return self._parse(QueryResult, answer, f"PUT {path}")

    async def query_rows(
        self,
        what: str,
        fields: Sequence[str],
        *,
        qfilter: list[Any] | None = None,
        reason: str | None = None,
    ) -> list[list[Any]]:
        """:meth:`query` without models: each item's values in the order of ``fields``.

        A value Ganeti could not give (status other than ``RS_NORMAL``) is ``None``. For
        listings of many items (the reconciler reads 100,000 instances a pass): a model per
        cell costs more than the answer's decoding; here the shape is checked, not each value.
        """
        path = self._query_path(what)
        body: dict[str, Any] = {"fields": _fields(fields, "query_rows")}
        if qfilter is not None:
            body["qfilter"] = qfilter
            body["filter"] = qfilter
        answer = await self._read("PUT", path, body, query_args(reason=reason))
        data = answer.get("data") if isinstance(answer, dict) else None
        width = len(body["fields"])
        rows: list[list[Any]] | None = None
        if isinstance(data, list):
            with gc_paused():
                try:
                    rows = [[value if status == 0 else None for status, value in row] for row in data]
                except (TypeError, ValueError):
                    rows = None
        if rows is None or any(len(row) != width for row in rows):
            raise RapiError(
                f"{self.where}: PUT {path} answered data of an unexpected shape (not {width} "
                "[status, value] cells per item); report this with the Ganeti version",
                url=self.url,
            )
        return rows

    async def query_fields(
        self, what: str, fields: Sequence[str] | None = None, *, reason: str | None = None
    ) -> list[QueryField]:
        """The fields ``/2/query/WHAT`` serves, or only those named (``GET /2/query/WHAT/fields``)."""
        path = self._query_path(what) + "/fields"
        pairs = [] if fields is None else [("fields", ",".join(_fields(fields, "query_fields")))]
        answer = await self._get(path, query_args(*pairs, reason=reason))
        if not isinstance(answer, dict):
            raise RapiError(f"{self.where}: GET {path} answered {answer!r:.80}, not fields", url=self.url)
        return self._parse_list(QueryField, answer.get("fields"), f"GET {path}")

    @staticmethod
    def _query_path(what: str) -> str:
        return f"/2/query/{choice(what, QUERY_RESOURCES, 'the query resource')}"


def _fields(fields: Sequence[str], call: str) -> list[str]:
    if isinstance(fields, str):
        raise ConfigError(f"{call}: fields must be a list of field names, not the string {fields!r}")
    names = [str(name) for name in fields]
    if not names:
        raise ConfigError(f"{call} needs at least one field name")
    return names
