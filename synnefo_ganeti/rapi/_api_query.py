"""The generic query resource: ``/2/query/WHAT`` and ``/2/query/WHAT/fields``.

Follows Ganeti 3.0's client (``Query``, ``QueryFields`` in ``lib/rapi/client.py``): a query is a
``PUT`` with the fields and the filter in the body (Ganeti's client sends the filter twice, as
``qfilter`` and as the pre-2.7 ``filter``; so does this one). Neither submits a job: both are
answered by luxid at once, so they are retried like reads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from synnefo_ganeti._gc import gc_paused
from synnefo_ganeti.errors import ConfigError, RapiError
from synnefo_ganeti.rapi import _transport
from synnefo_ganeti.rapi._base import RapiBase, choice, query_args
from synnefo_ganeti.rapi._calls import QUERY_RESOURCES
from synnefo_ganeti.rapi._models import QueryField, QueryResult
from synnefo_ganeti.rapi._retry import is_transient

__all__ = ["QueryApi", "cell_values"]


T = TypeVar("T")


def _loaded(load: Callable[[], list[list[list[Any]]]]) -> list[list[list[Any]]]:
    return load()


def cell_values(cells: list[Any]) -> list[Any]:
    """One item's values from its ``[status, value]`` cells (``None`` where the status is not
    ``RS_NORMAL``); ValueError when a cell is not such a pair."""
    try:
        return [value if status == 0 else None for status, value in cells]
    except TypeError:
        raise ValueError("not [status, value] cells") from None


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
        items = await self.query_cells(what, fields, qfilter=qfilter, reason=reason)
        try:
            with gc_paused():
                return [cell_values(cells) for cells in items]
        except ValueError:
            raise self._shape_error(what, len(items[0]) if items else 0) from None

    async def query_cells(
        self,
        what: str,
        fields: Sequence[str],
        *,
        qfilter: list[Any] | None = None,
        reason: str | None = None,
    ) -> list[list[list[Any]]]:
        """:meth:`query_rows` as Ganeti sent them: each item's ``[status, value]`` cells.

        Each item is checked to have one cell per field, not each cell (:func:`cell_values`
        checks and converts one item)."""
        return await self.query_cells_into(what, fields, _loaded, qfilter=qfilter, reason=reason)

    async def query_cells_into(
        self,
        what: str,
        fields: Sequence[str],
        into: Callable[[Callable[[], list[list[list[Any]]]]], T],
        *,
        qfilter: list[Any] | None = None,
        reason: str | None = None,
    ) -> T:
        """:meth:`query_cells`, handed to ``into(load)`` as soon as the answer is read; its result.

        ``load()`` decodes the answer and checks it (what :meth:`query_cells` returns, or a
        :class:`RapiError`), when ``into`` calls it or later. For a caller asking many
        backends at once for large answers that it keeps a small part of: it decodes each
        answer when it can use it and lets it go, instead of holding every backend's decoded
        answer that came in meanwhile (a decoded instance is ~2.5 KB of small objects, its
        answer ~310 bytes: the reconciler's pass of 100,000 instances held 250 MB more, a
        second of page faults; docs/benchmarks.md)."""
        path = self._query_path(what)
        body: dict[str, Any] = {"fields": _fields(fields, "query_cells")}
        if qfilter is not None:
            body["qfilter"] = qfilter
            body["filter"] = qfilter
        width = len(body["fields"])

        def answered(payload: bytes) -> T:
            def load() -> list[list[list[Any]]]:
                try:
                    answer = _transport.decode_json(payload)  # (the module's: benchmarks count the bytes)
                except ValueError:
                    raise RapiError(
                        f"{self.where}: PUT {path} answered a body that is not JSON ({payload[:80]!r})",
                        url=self.url,
                    ) from None
                data = answer.get("data") if isinstance(answer, dict) else None
                if not isinstance(data, list) or any(type(i) is not list or len(i) != width for i in data):
                    raise self._shape_error(what, width)
                return data

            return into(load)

        return await self._retrying(
            lambda: self._transport.request(
                "PUT", path, query=query_args(reason=reason), body=body, decode=answered
            ),
            is_transient,
        )

    def _shape_error(self, what: str, width: int) -> RapiError:
        return RapiError(
            f"{self.where}: PUT {self._query_path(what)} answered data of an unexpected shape (not "
            f"{width} [status, value] cells per item); report this with the Ganeti version",
            url=self.url,
        )

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
