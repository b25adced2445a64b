"""What the reconciler reads of each side, and no more: rows of the compared columns.

Ganeti: ``PUT /2/query/instance`` with :data:`INSTANCE_FIELDS` (``rlib2.R_2_query``; every
field is in Ganeti 3.0's ``query._BuildInstanceFields``), not ``GET /2/instances?bulk=1``,
which always answers ``rlib2.I_FIELDS`` (34 fields, hypervisor parameters and all; Ganeti
3.0's bulk listing takes no field list). Measured on the fake's instances (one NIC, one
disk, benchmarks/reconcile.py): 975 bytes an instance in bulk, 310 by this query (the
query's field definitions, sent once per answer, and the job listing included). Each item
stays the list of its values (:class:`QueriedInstance`): no model per instance, as
validating 100,000 models (7 µs each) cost more than decoding the answers.

The database: one Core select per backend of the columns :func:`~._plan.plan` and
:func:`~._observe.observed_changes` compare (:class:`SnapshotRow`), JSON columns decoded
with orjson; ``updated_at`` only for rows in BUILD (the only ones whose age counts). The
few rows whose node is not up (``node_state``) are read apart (:func:`marked_rows`, by a
partial index): a row's tuple stays the same, and such a row never settles by its cells.
"""

from __future__ import annotations

import functools
import time
import weakref
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

import orjson
from sqlalchemy import Connection, Dialect, Text, case, cast, func, select, text

from synnefo_ganeti._gc import gc_paused
from synnefo_ganeti.rapi import RapiClient
from synnefo_ganeti.store import InstanceStatus, Store
from synnefo_ganeti.store.instances._instances import backends_t, instances_t
from synnefo_ganeti.store.instances._node_state import GANETI_NODE_STATES

if TYPE_CHECKING:
    from synnefo_ganeti.reconcile._observe import RowView

__all__ = [
    "BEPARAM_KEYS",
    "INSTANCE_FIELDS",
    "QueriedInstance",
    "SnapshotRow",
    "decoded_row",
    "live_rows",
    "live_rows_plain",
    "live_rows_raw",
    "marked_rows",
    "query_instances",
    "read_db",
    "read_rows",
    "snapshot_row",
    "snapshot_rows",
]

#: the beparams compared (Ganeti 3.0's ``constants.BES_PARAMETERS``)
BEPARAM_KEYS: Final = ("maxmem", "minmem", "vcpus", "auto_balance", "always_failover", "spindle_use")

#: the instance fields the reconciler asks Ganeti for, in this order (:class:`QueriedInstance`)
INSTANCE_FIELDS: Final = (
    "name", "admin_state", "oper_state", "status", "os", "pnode",
    *(f"be/{key}" for key in BEPARAM_KEYS),
    "nic.macs", "nic.ips", "nic.networks.names", "nic.modes", "nic.links",
    "disk.sizes", "disk.uuids", "tags",
)  # fmt: skip
I_NAME, I_ADMIN, I_OPER, I_STATUS, I_OS, I_PNODE = range(6)
I_BE = 6  # BEPARAM_KEYS[i] is at I_BE + i
I_MACS, I_IPS, I_NETWORKS, I_MODES, I_LINKS, I_SIZES, I_DISK_UUIDS, I_TAGS = range(
    I_BE + len(BEPARAM_KEYS), len(INSTANCE_FIELDS)
)
BE_INDEX: Final = {key: I_BE + index for index, key in enumerate(BEPARAM_KEYS)}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


class QueriedInstance:
    """One instance of the query: its values in :data:`INSTANCE_FIELDS` order (``values``).

    The attributes the plan reads are those of :class:`~synnefo_ganeti.rapi.Instance`, with
    ``beparams`` made of the ``be/`` fields Ganeti filled; made on demand, as the plan reads
    them only for instances that differ.
    """

    __slots__ = ("_settled", "values")

    def __init__(self, values: list[Any]) -> None:
        self.values = values
        self._settled: object = None  # the row it last settled with (the plan, then observed_changes)

    def __repr__(self) -> str:
        return f"<QueriedInstance {self.name} {self.status}>"

    @property
    def name(self) -> str:
        return str(self.values[I_NAME])

    @property
    def admin_state(self) -> str | None:
        value: str | None = self.values[I_ADMIN]
        return value

    @property
    def oper_state(self) -> bool | None:
        value: bool | None = self.values[I_OPER]
        return value

    @property
    def status(self) -> str | None:
        value: str | None = self.values[I_STATUS]
        return value

    @property
    def os(self) -> str | None:
        value: str | None = self.values[I_OS]
        return value

    @property
    def pnode(self) -> str | None:
        value: str | None = self.values[I_PNODE]
        return value

    @property
    def beparams(self) -> dict[str, Any]:
        return {key: self.values[index] for key, index in BE_INDEX.items() if self.values[index] is not None}

    @property
    def nic_macs(self) -> list[str]:
        return _list(self.values[I_MACS])

    @property
    def nic_ips(self) -> list[str | None]:
        return _list(self.values[I_IPS])

    @property
    def nic_network_names(self) -> list[str | None]:
        return _list(self.values[I_NETWORKS])

    @property
    def nic_networks(self) -> list[str | None]:
        """The networks by name too: the query asks ``nic.networks.names``, not their UUIDs
        (the comparisons use names, as a spec gives them)."""
        return _list(self.values[I_NETWORKS])

    @property
    def nic_modes(self) -> list[str | None]:
        return _list(self.values[I_MODES])

    @property
    def nic_links(self) -> list[str | None]:
        return _list(self.values[I_LINKS])

    @property
    def disk_sizes(self) -> list[int]:
        return _list(self.values[I_SIZES])

    @property
    def disk_uuids(self) -> list[str | None]:
        return _list(self.values[I_DISK_UUIDS])

    @property
    def tags(self) -> list[str]:
        return _list(self.values[I_TAGS])

    def settles(self, row: RowView, tag_namespace: str | None = None, *, tags: bool = True) -> bool:
        """True when nothing of ``row`` differs: no drift to report, no observed value to record.

        The fast path of :func:`~._plan.plan` and :func:`~._observe.observed_changes` for a
        STARTED or STOPPED row whose stored NICs and disks are the ones Ganeti made (as the
        dispatcher's observer and every pass record them). False sends the row down the
        full comparison, which says what differs; so False is always safe, True only when
        that comparison would find nothing (tests/unit/test_reconcile_query.py checks both).
        ``tags=False``: the tags are not compared (what :func:`~._observe.observed_changes` needs).
        """
        if self._settled is row:
            return True  # settled with every comparison, tags included: nothing new to check
        v = self.values
        running = v[I_ADMIN] == "up" and v[I_OPER] is not False
        status = row.status
        if status is InstanceStatus.STARTED:
            if not running:
                return False
        elif status is not InstanceStatus.STOPPED or running:
            return False
        if row.os != v[I_OS] or row.pnode != v[I_PNODE]:
            return False
        if row.node_state is not None or v[I_STATUS] in GANETI_NODE_STATES:
            return False  # a node not up: a node_down drift, or the row's mark to clear
        if row.memory != v[I_BE] or row.vcpus != v[I_BE + 2]:  # maxmem, vcpus
            return False
        for key, want in (row.beparams or {}).items():
            index = BE_INDEX.get(key)
            if (None if index is None else v[index]) != want:
                return False
        macs, ips, networks, modes, links = v[I_MACS], v[I_IPS], v[I_NETWORKS], v[I_MODES], v[I_LINKS]
        nics = row.nics
        if not isinstance(macs, list) or nics is None or len(nics) != len(macs):
            return False
        for index, nic in enumerate(nics):
            try:
                ganeti = {"mac": macs[index], "ip": ips[index], "network": networks[index],
                          "mode": modes[index], "link": links[index]}  # fmt: skip
            except (IndexError, TypeError):
                return False
            if nic != ganeti:
                return False
        sizes, uuids, disks = v[I_SIZES], v[I_DISK_UUIDS], row.disks
        if not isinstance(sizes, list) or disks is None or len(disks) != len(sizes):
            return False
        for index, disk in enumerate(disks):
            try:
                if disk != {"size": sizes[index], "uuid": uuids[index]}:
                    return False
            except (IndexError, TypeError):
                return False
        if not tags:
            return True
        if row.tags is not None and row.tags != v[I_TAGS]:
            ours = {tag for tag in _list(v[I_TAGS]) if tag_namespace is None or tag.startswith(tag_namespace)}
            if ours != {tag for tag in row.tags if tag_namespace is None or tag.startswith(tag_namespace)}:
                return False
        self._settled = row
        return True


async def query_instances(
    client: RapiClient, *, qfilter: list[Any] | None = None
) -> dict[str, QueriedInstance]:
    """Ganeti's instances by name (those ``qfilter`` selects), each with only the fields the
    reconciler compares."""
    rows = await client.query_rows("instance", INSTANCE_FIELDS, qfilter=qfilter)
    with gc_paused():
        return {str(values[I_NAME]): QueriedInstance(values) for values in rows}


class SnapshotRow:
    """A database row as the plan reads it: the attributes of
    :class:`~synnefo_ganeti.store.StoredInstance` it compares (``updated_at`` only in BUILD)."""

    __slots__ = (
        "backend",
        "beparams",
        "create_job_id",
        "disks",
        "memory",
        "name",
        "nics",
        "node_state",
        "os",
        "owned",
        "pnode",
        "status",
        "tags",
        "updated_at",
        "vcpus",
    )  # fmt: skip

    def __init__(
        self,
        backend: str,
        name: str,
        status: InstanceStatus,
        owned: bool,
        create_job_id: int | None,
        updated_at: datetime | None,
        os: str | None,
        beparams: dict[str, Any] | None,
        nics: list[dict[str, Any]] | None,
        disks: list[dict[str, Any]] | None,
        tags: list[str] | None,
        memory: int | None,
        vcpus: int | None,
        pnode: str | None,
        node_state: str | None = None,
    ) -> None:
        self.backend, self.name, self.status, self.owned = backend, name, status, owned
        self.create_job_id, self.updated_at, self.os, self.beparams = create_job_id, updated_at, os, beparams
        self.nics, self.disks, self.tags = nics, disks, tags
        self.memory, self.vcpus, self.pnode, self.node_state = memory, vcpus, pnode, node_state

    def __repr__(self) -> str:
        return f"<SnapshotRow {self.backend}/{self.name} {self.status}>"


def _json(value: Any) -> Any:
    """A JSON column's text decoded (None: SQL's NULL)."""
    return orjson.loads(value) if isinstance(value, str | bytes) else value


_c = instances_t.c
_COLUMNS = (
    _c.name, _c.status, _c.owned, _c.create_job_id,
    case((_c.status == InstanceStatus.BUILD.value, _c.updated_at)).label("updated_at"),
    _c.os, cast(_c.beparams, Text).label("beparams"), cast(_c.nics, Text).label("nics"),
    cast(_c.disks, Text).label("disks"), cast(_c.tags, Text).label("tags"),
    _c.memory, _c.vcpus, _c.pnode,
)  # fmt: skip
# (the JSON columns as their texts on both databases: PostgreSQL's ``json`` keeps the text as
# written, which asyncpg's codec would decode; a row that settles by its cells never needs it
# decoded, see :func:`~._pass.read_pass_rows`)
_STATUS = {status.value: status for status in InstanceStatus}


#: the partial unique index's own condition (``uq_instances_backend_id_name_live``), written as
#: it is, so that SQLite and PostgreSQL search that index for one backend's live rows instead of
#: scanning every backend's rows (50 scans of 100,000 rows: 0.84 s; searched: 0.23 s)
_LIVE = text(f"status <> '{InstanceStatus.DESTROYED.value}'")


def _backend_id(backend: str) -> Any:
    return select(backends_t.c.id).where(backends_t.c.name == backend).scalar_subquery()


def live_rows(conn: Connection, backend: str) -> dict[str, tuple[Any, ...]]:
    """The backend's live rows by name, as tuples of :data:`_COLUMNS` with the JSON columns
    decoded (:func:`snapshot_row` makes a :class:`SnapshotRow` of one)."""
    return _decoded(live_rows_raw(conn, backend))


def read_rows(
    conn: Connection, backend: str, *, live: bool = True, destroyed: bool | Collection[str] = True
) -> dict[str, SnapshotRow]:
    """The backend's rows by name: a name's live row, else its newest DESTROYED one.

    ``destroyed``: which DESTROYED rows to read for names with no live row: all (True, a
    second select, which scans), those of the names given, or none (False; the reconciler
    reads them only for the instances Ganeti has and the live rows lack: orphans).
    ``live=False``: the DESTROYED rows only.
    """
    rows: dict[str, SnapshotRow] = {}
    if live:
        rows = snapshot_rows(backend, live_rows(conn, backend), marked_rows(conn, backend))
    if destroyed is False or (destroyed is not True and not destroyed):
        return rows
    query = select(*_COLUMNS).where(
        _c.backend_id == _backend_id(backend), _c.status == InstanceStatus.DESTROYED.value
    )
    if destroyed is not True:
        query = query.where(_c.name.in_(sorted(destroyed)))
    ended = snapshot_rows(backend, _decoded(conn.execute(query.order_by(_c.id))))  # the newest wins
    return {name: row for name, row in ended.items() if name not in rows} | rows


def _decoded(result: Iterable[Any]) -> dict[str, tuple[Any, ...]]:
    """name -> the row's tuple, JSON columns decoded (:func:`decoded_row`)."""
    with gc_paused():
        return {row[0]: decoded_row(row) for row in result}


def live_rows_raw(conn: Connection, backend: str) -> Iterable[Any]:
    """:func:`live_rows` before decoding: each row as the database gave it (its JSON columns
    as texts on both databases, :func:`decoded_row` decodes them)."""
    return conn.execute(_live_select(backend))


def _live_select(backend: str) -> Any:
    return select(*_COLUMNS).where(_c.backend_id == _backend_id(backend), _LIVE)


#: the partial index ``ix_instances_node_state``'s own condition, written as it is (migration 0010)
_MARKED = text("node_state IS NOT NULL")


def marked_rows(conn: Connection, backend: str) -> dict[str, str]:
    """The backend's live rows whose node is not up: name -> ``node_state`` ("down", "offline").

    Few rows, read by their partial index; every other row's ``node_state`` is None."""
    query = select(_c.name, _c.node_state).where(_c.backend_id == _backend_id(backend), _MARKED, _LIVE)
    return {row.name: row.node_state for row in conn.execute(query)}


def live_rows_plain(
    conn: Connection, backend: str
) -> tuple[Callable[[], Sequence[Sequence[Any]]], Callable[[Any], Any]]:
    """:func:`live_rows_raw`'s rows, as ``rows()`` gives them, and ``process``, which makes
    one of them the row :func:`live_rows_raw` gives (SQLAlchemy's result processors: on
    SQLite ``owned`` 0/1 to a bool, ``updated_at`` a text to a datetime; JSON columns stay
    texts either way).

    On SQLite's own driver SQLite makes every row into one JSON text, in one step of the
    statement (``json_group_array`` of each row's ``json_array``: texts, integers and NULLs,
    the only kinds of :data:`_COLUMNS`, come back as the cursor gives them); ``rows()``
    decodes it, each row a list of the values of the cursor's tuple. The statement runs in
    C without Python's lock (the GIL), which a cursor takes back after each row it steps:
    a thread reading 2,000 rows a backend that way while the event loop is busy waited for
    the loop's switch interval at every row (reconcile at 100,000 instances:
    docs/benchmarks.md), and made the loop wait as long when it took the lock back. The
    statement still runs through SQLAlchemy (its events, its transaction); ``rows()`` and
    the rows' work may run in another thread. On any other driver: SQLAlchemy's rows, fetched
    at once."""
    if conn.dialect.driver != "pysqlite":
        fetched = conn.execute(_live_select(backend)).all()
        return lambda: fetched, _unchanged
    packed = conn.execute(
        _live_select(backend).with_only_columns(func.json_group_array(func.json_array(*_COLUMNS)))
    ).scalar_one()
    return functools.partial(orjson.loads, packed), _processor(conn.dialect)


def _unchanged(row: Any) -> Any:
    return row


_PROCESSORS: weakref.WeakKeyDictionary[Dialect, Callable[[Sequence[Any]], tuple[Any, ...]]] = (
    weakref.WeakKeyDictionary()
)


def _processor(dialect: Dialect) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    process = _PROCESSORS.get(dialect)
    if process is None:
        steps = [column.type.dialect_impl(dialect).result_processor(dialect, None) for column in _COLUMNS]

        def process(row: Sequence[Any]) -> tuple[Any, ...]:
            return tuple(
                value if step is None else step(value) for step, value in zip(steps, row, strict=True)
            )

        _PROCESSORS[dialect] = process
    return process


def decoded_row(row: Sequence[Any]) -> tuple[Any, ...]:
    """A row of :data:`_COLUMNS` with its JSON columns decoded (four texts in one orjson call)."""
    name, status, owned, job, updated, os_, be, nics, disks, tags, memory, vcpus, pnode = row
    if str is type(be) is type(nics) is type(disks) is type(tags):  # texts, one decode
        be, nics, disks, tags = orjson.loads(f"[{be},{nics},{disks},{tags}]")
    else:
        be, nics, disks, tags = _json(be), _json(nics), _json(disks), _json(tags)
    return (name, status, owned, job, updated, os_, be, nics, disks, tags, memory, vcpus, pnode)


def snapshot_row(backend: str, row: tuple[Any, ...], node_state: str | None = None) -> SnapshotRow:
    """The :class:`SnapshotRow` of one of :func:`live_rows`' tuples (``node_state``: its
    :func:`marked_rows` value)."""
    name, status, owned, job, updated, os_, be, nics, disks, tags, memory, vcpus, pnode = row
    return SnapshotRow(
        backend, name, _STATUS[status], bool(owned), job, updated, os_, be, nics, disks, tags, memory, vcpus,
        pnode, node_state,
    )  # fmt: skip


def snapshot_rows(
    backend: str, rows: Mapping[str, tuple[Any, ...]], marked: Mapping[str, str] | None = None
) -> dict[str, SnapshotRow]:
    get = (marked or {}).get
    with gc_paused():
        return {name: snapshot_row(backend, row, get(name)) for name, row in rows.items()}


async def read_db(
    store: Store, backend: str, *, live: bool = True, destroyed: bool | Collection[str] = True
) -> tuple[dict[str, SnapshotRow], float]:
    """:func:`read_rows` on a reader connection, and the time just before it."""
    taken_at = time.time()
    rows = await store.call_read(lambda conn: read_rows(conn, backend, live=live, destroyed=destroyed))
    return rows, taken_at
