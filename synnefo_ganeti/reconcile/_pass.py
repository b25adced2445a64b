"""One reconcile pass's reads, and the cells of a row that settles.

A pass takes one database snapshot for every backend (:meth:`Store.pinned_read`), then asks
every backend at once, and reads each backend's rows in that snapshot while the backends
answer (:class:`PassReads`). A backend's rows are the snapshot's: taken before Ganeti's,
as :func:`~._plan.plan` needs (a job that ended after the snapshot is left alone).

Most instances agree with their rows on most passes. For each STARTED or STOPPED row the
read also makes the ``[status, value]`` cells Ganeti answers for an instance that settles
with it (:func:`expected_cells`, in :data:`~._fetch.INSTANCE_FIELDS` order, :data:`ANY`
where the row does not say); an item of Ganeti's answer equal to them, compared whole
(:func:`settle`), is settled without being converted, modelled or planned. The others go
through :func:`~._plan.plan` as before. ``expected == cells`` implies
``QueriedInstance.settles(row)``: tests/unit/test_reconcile_pass.py checks it both ways on
rows and answers that differ in each field. A row whose node is not up (``node_state``,
read apart: :func:`~._fetch.marked_rows`) never settles by its cells, and Ganeti's status
cell is expected as it is for a STARTED or STOPPED instance on a node that is up, so that
an instance Ganeti reads ``ERROR_nodedown`` never does either.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, Final

import orjson
from sqlalchemy import Connection

from synnefo_ganeti._gc import gc_paused
from synnefo_ganeti.errors import RapiError
from synnefo_ganeti.jobs import JobStatus
from synnefo_ganeti.rapi import cell_values
from synnefo_ganeti.reconcile._fetch import (
    BE_INDEX,
    I_DISK_UUIDS,
    I_IPS,
    I_MACS,
    I_NAME,
    I_OS,
    I_PNODE,
    I_TAGS,
    INSTANCE_FIELDS,
    QueriedInstance,
    SnapshotRow,
    decoded_row,
    live_rows_plain,
    marked_rows,
    read_db,
    read_rows,
    snapshot_row,
)
from synnefo_ganeti.store import InstanceStatus, Store, StoredJob
from synnefo_ganeti.store._pinned import PinnedRead
from synnefo_ganeti.store.jobs._jobs import read_jobs
from synnefo_ganeti.store.networks._networks import StoredNetwork, read_networks

__all__ = ["ANY", "PassReads", "PassRows", "expected_cells", "read_pass_parts", "read_pass_rows", "settle"]

_NOT_FINAL = [status for status in JobStatus if not status.is_final]


class _Any:
    """A cell the row does not say: equal to any cell."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return True

    def __ne__(self, other: object) -> bool:
        return False

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return "ANY"


ANY: Final = _Any()

#: admin_state, oper_state and status of a settled STARTED / STOPPED row (the usual three; an
#: instance running on an offline node, oper_state unknown, goes the long way)
_STATES: Final = {
    InstanceStatus.STARTED.value: ([0, "up"], [0, True], [0, "running"]),
    InstanceStatus.STOPPED.value: ([0, "down"], [0, False], [0, "ADMIN_down"]),
}
_NIC_KEYS: Final = frozenset(("mac", "ip", "network", "mode", "link"))
_DISK_KEYS: Final = frozenset(("size", "uuid"))
_WIDTH: Final = len(INSTANCE_FIELDS)
_MAXMEM, _VCPUS = BE_INDEX["maxmem"], BE_INDEX["vcpus"]


def expected_cells(row: Sequence[Any], made: dict[Any, list[Any]] | None = None) -> list[Any] | None:
    """The cells of an instance that settles with ``row`` (a :func:`~._fetch.live_rows`
    tuple), or None when the row cannot settle this way (not STARTED or STOPPED, not owned,
    NICs or disks not as the observer records them): such a row goes the long way.

    ``made``: the cells already made, shared by the rows of one read (equal values, one
    cell: the comparisons are by equality): most rows' cells are the same few (one OS, a
    few nodes and sizes, one tag), made once and held once (~0.5 KB a row, not ~2.5)."""
    name, status, owned, _job, _updated, os_, be, nics, disks, tags, memory, vcpus, pnode = row
    if type(nics) is not list or type(disks) is not list:
        return None
    cache = {} if made is None else made
    common = _common_cells(status, owned, os_, be, tags, memory, vcpus, pnode, cache)
    return None if common is None else _with_devices(common, name, nics, disks, cache)


def _common_cells(
    status: Any, owned: Any, os_: Any, be: Any, tags: Any, memory: Any, vcpus: Any, pnode: Any,
    cache: dict[Any, list[Any]],
) -> list[Any] | None:  # fmt: skip
    """The cells that do not depend on the row's name, NICs or disks (None at those places),
    or None when the row cannot settle by its cells."""
    states = _STATES.get(status)
    if states is None or not owned:
        return None
    get = cache.get
    expected = [None, states[0], states[1], states[2], None, None, ANY, ANY, ANY, ANY, ANY, ANY]
    for index, value in ((I_OS, os_), (I_PNODE, pnode), (_MAXMEM, memory), (_VCPUS, vcpus)):
        cell = get(value)
        expected[index] = cell if cell is not None else cache.setdefault(value, [0, value])
    if be:
        if type(be) is not dict:
            return None
        for key, want in be.items():
            be_index = BE_INDEX.get(key)
            if be_index is None:
                if want is not None:
                    return None  # settles() needs Ganeti's value None for a key it has no field of
                continue
            current: Any = expected[be_index]
            if current is not ANY:
                if current[1] != want:
                    return None  # the row contradicts itself (memory against maxmem): never settles
                continue
            try:
                shared = get(want)
            except TypeError:  # not a scalar: Ganeti's beparams are
                return None
            expected[be_index] = shared if shared is not None else cache.setdefault(want, [0, want])
    expected.extend([None] * (I_TAGS - I_MACS))  # the NICs' and disks' cells
    expected.append(ANY if tags is None else _shared(cache, tags))
    return expected


def _with_devices(
    common: list[Any], name: Any, nics: list[Any], disks: list[Any], cache: dict[Any, list[Any]]
) -> list[Any] | None:
    """``common`` with the name's, the NICs' and the disks' cells, or None when the NICs or
    disks are not as the observer records them (Ganeti's values, every key)."""
    try:
        macs, others = [], []
        for nic in nics:
            if nic.keys() != _NIC_KEYS:
                return None
            macs.append(nic["mac"])
            others.append((nic["ip"], nic["network"], nic["mode"], nic["link"]))
        sizes, uuids = [], []
        for disk in disks:
            if disk.keys() != _DISK_KEYS:
                return None
            sizes.append(disk["size"])
            uuids.append(disk["uuid"])
    except AttributeError:  # a NIC or disk not a dict
        return None
    expected = common.copy()
    expected[I_NAME] = [0, name]
    expected[I_MACS] = [0, macs]  # a MAC is one instance's: not shared
    expected[I_IPS:I_DISK_UUIDS] = _nic_and_size_cells(cache, others, sizes)
    expected[I_DISK_UUIDS] = [0, uuids]
    return expected


def _nic_and_size_cells(cache: dict[Any, Any], others: list[tuple[Any, ...]], sizes: list[Any]) -> Any:
    """The ips, networks, modes, links and sizes cells, one list of them for equal values."""
    try:
        key = (_Any, _NIC_KEYS, *others, _DISK_KEYS, *sizes)
        found = cache.get(key)
    except TypeError:  # an unhashable value: cells of their own
        key, found = None, None
    if found is None:
        found = [[0, list(values)] for values in zip(*others, strict=True)] if others else [[0, []]] * 4
        found.append([0, sizes])
        if key is not None:
            cache[key] = found
    return found


def _shared(cache: dict[Any, list[Any]], values: list[Any]) -> list[Any]:
    """The cell ``[0, values]``, one for equal lists (keyed apart from scalars by a marker)."""
    try:
        key = (_Any, *values)
        cell = cache.get(key)
    except TypeError:  # an unhashable value: a cell of its own
        return [0, values]
    return cell if cell is not None else cache.setdefault(key, [0, values])


class _TextRows:
    """:func:`expected_cells` of rows whose JSON columns are texts (as both databases give
    them, :data:`~._fetch._COLUMNS`): the cells that do not depend on the row's name, NICs or
    disks are made once per distinct (status, owned, OS, node, memory, vCPUs, beparams text,
    tags text), which most rows share; the NICs and disks are decoded in one call. The result
    is :func:`expected_cells`' of the decoded row (tests/unit/test_reconcile_pass.py checks it)."""

    __slots__ = ("cache", "common")

    def __init__(self, cache: dict[Any, Any]) -> None:
        self.cache = cache
        self.common: dict[tuple[Any, ...], list[Any] | None] = {}

    @staticmethod
    def texts(row: Sequence[Any]) -> bool:
        """Whether the row's four JSON columns are texts (else decode it: :func:`expected_cells`)."""
        return str is type(row[6]) is type(row[7]) is type(row[8]) is type(row[9])

    def cells(self, row: Sequence[Any]) -> list[Any] | None:
        """The row's cells (:meth:`texts` rows), None when it cannot settle by them."""
        name, status, owned, _job, _updated, os_, be, nics, disks, tags, memory, vcpus, pnode = row
        key = (status, owned, os_, pnode, memory, vcpus, be, tags)
        if key in self.common:
            common = self.common[key]
        else:
            common = self.common[key] = _common_cells(
                status, owned, os_, orjson.loads(be), orjson.loads(tags), memory, vcpus, pnode, self.cache
            )
        if common is None:
            return None
        devices = orjson.loads(f"[{nics},{disks}]")
        if type(devices[0]) is not list or type(devices[1]) is not list:
            return None
        return _with_devices(common, name, devices[0], devices[1], self.cache)


class PassRows:
    """One backend's rows in the pass's snapshot: the :func:`~._fetch.live_rows` tuples (those
    with cells as the database gave them: ``process`` then :func:`~._fetch.decoded_row` make
    them such a tuple), the cells each settles with (:func:`expected_cells`), and the jobs not
    final; ``marked``: the rows whose node is not up (:func:`~._fetch.marked_rows`)."""

    __slots__ = ("expected", "jobs", "marked", "process", "rows", "taken_at")

    def __init__(
        self,
        rows: dict[str, Sequence[Any]],
        expected: dict[str, list[Any]],
        jobs: dict[int, StoredJob],
        taken_at: float,
        process: Callable[[Any], Any] | None = None,
        marked: dict[str, str] | None = None,
    ) -> None:
        self.rows, self.expected, self.jobs, self.taken_at = rows, expected, jobs, taken_at
        self.process = process
        self.marked = marked or {}

    def row(self, name: str) -> tuple[Any, ...]:
        """The :func:`~._fetch.live_rows` tuple of ``name``'s row."""
        row = self.rows[name]
        if name not in self.expected:
            return tuple(row)  # a list as read on SQLite; a tuple (returned as is) elsewhere
        return decoded_row(row if self.process is None else self.process(row))


def read_pass_rows(conn: Connection, backend: str, taken_at: float) -> PassRows:
    """One backend's :class:`PassRows` (run in the pinned snapshot taken at ``taken_at``)."""
    return read_pass_parts(conn, backend, taken_at)()


def read_pass_parts(conn: Connection, backend: str, taken_at: float) -> Callable[[], PassRows]:
    """The statements of :func:`read_pass_rows` (run in the snapshot), and what makes their
    rows the backend's :class:`PassRows`, which may be called in another thread: the pass's
    reader runs the statements in its thread, the event loop makes the rows (on SQLite
    Python's lock is then taken once a backend in the reader's thread, not once a row:
    :func:`~._fetch.live_rows_plain`)."""
    plain, process = live_rows_plain(conn, backend)
    jobs = read_jobs(conn, backend=backend, status=_NOT_FINAL)
    marked = marked_rows(conn, backend)
    return functools.partial(_pass_rows, plain, process, {job.job_id: job for job in jobs}, taken_at, marked)


def _pass_rows(
    plain: Callable[[], Sequence[Sequence[Any]]],
    process: Callable[[Any], Any],
    jobs: dict[int, StoredJob],
    taken_at: float,
    marked: dict[str, str] | None = None,
) -> PassRows:
    """A row that can settle by its cells is kept as the database gave it (its JSON columns
    texts; on SQLite a list of a few objects, not a few dozen), made a full row again only if
    it does not settle (:meth:`PassRows.row`)."""
    rows: dict[str, Sequence[Any]] = {}
    expected = {}
    made: dict[Any, list[Any]] = {}
    texts = _TextRows(made)
    with gc_paused():
        for raw in plain():
            if texts.texts(raw):
                cells = texts.cells(raw)
                if cells is None:
                    rows[raw[0]] = decoded_row(process(raw))
                    continue
            else:  # a NULL column: no text
                row = decoded_row(process(raw))
                cells = expected_cells(row, made)
                if cells is None:
                    rows[row[0]] = row
                    continue
            rows[raw[0]] = raw  # as read (on SQLite a list): row() makes its full tuple if needed
            expected[raw[0]] = cells
    for name in marked or ():  # its node not up: the long way (a node_down drift, or clearing it)
        if expected.pop(name, None) is not None:
            rows[name] = decoded_row(process(rows[name]))
    return PassRows(rows, expected, jobs, taken_at, process, marked)


def settle(
    backend: str, read: PassRows, items: list[list[Any]], where: str
) -> tuple[dict[str, SnapshotRow], dict[str, QueriedInstance], int]:
    """Ganeti's answer (:meth:`RapiClient.query_cells` of :data:`INSTANCE_FIELDS`) against the
    rows: (the rows left, Ganeti's instances left, how many settled). A row and an instance
    that settle are in neither; the others go to :func:`~._plan.plan`."""
    expected = read.expected.get
    settled: set[str] = set()
    left: dict[str, QueriedInstance] = {}
    with gc_paused():
        for cells in items:
            want = expected(cells[I_NAME][1]) if type(cells[I_NAME]) is list else None
            if want is not None and want == cells:
                settled.add(want[I_NAME][1])
                continue
            try:
                values = cell_values(cells)
            except ValueError:
                raise RapiError(
                    f"{where}: PUT /2/query/instance answered an item of an unexpected shape "
                    f"(not {_WIDTH} [status, value] cells); report this with the Ganeti version"
                ) from None
            left[str(values[I_NAME])] = QueriedInstance(values)
        marked = read.marked.get
        rows = {
            name: snapshot_row(backend, read.row(name), marked(name))
            for name in read.rows
            if name not in settled
        }
    return rows, left, len(settled)


class PassReads:
    """Every backend's :class:`PassRows` of one pass, read in turn in one pinned snapshot.

    ``async with PassReads(store, names) as reads``: the snapshot is taken on entering
    (:meth:`pinned` then returns, and a backend may be asked); the stored networks are read
    first, once (:meth:`networks`, for each backend's network check), then each backend's rows
    (``await reads.rows(name)`` waits for one backend's). The snapshot is held until the pass
    leaves, for the orphans' DESTROYED rows (:meth:`destroyed`).
    ``pinned`` False (an in-memory database, see :mod:`synnefo_ganeti.store._pinned`): ask
    a backend only after its rows are read.
    """

    def __init__(self, store: Store, names: Sequence[str]) -> None:
        self._store = store
        self._names = list(names)
        loop = asyncio.get_running_loop()
        self._pin: asyncio.Future[bool] = loop.create_future()
        self._networks: asyncio.Future[list[StoredNetwork]] = loop.create_future()
        self._rows: dict[str, asyncio.Future[PassRows]] = {name: loop.create_future() for name in self._names}
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self._read: PinnedRead | None = None  # while the snapshot is held
        self._done: asyncio.Future[PassRows] = loop.create_future()
        self._done.set_exception(RuntimeError("this backend's rows of the pass were handed over already"))

    async def __aenter__(self) -> PassReads:
        self._task = asyncio.ensure_future(self._read_all())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._task is not None
        self._stopped = True  # (a read running in its thread stops at the next backend)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        for future in self._futures():
            if future.done() and not future.cancelled():
                future.exception()  # retrieved: an unread failure is not logged as lost
            else:
                future.cancel()

    def _futures(self) -> list[asyncio.Future[Any]]:
        return [self._pin, self._networks, self._done, *self._rows.values()]

    async def pinned(self) -> bool:
        """Wait until the snapshot is taken; False when none is held (read first, then ask)."""
        return await asyncio.shield(self._pin)

    async def networks(self) -> list[StoredNetwork]:
        """Every stored network, read once in the pass's snapshot (each backend's network check)."""
        return await asyncio.shield(self._networks)

    async def rows(self, backend: str) -> PassRows:
        """That backend's rows, once (handed over: a pass's rows are not kept past their check)."""
        rows = await asyncio.shield(self._rows[backend])
        self._rows[backend] = self._done  # another call finds the rows gone (RuntimeError), not stale ones
        return rows

    def ready(self, backend: str) -> PassRows | None:
        """That backend's rows if read already (handed over, as :meth:`rows`), else None."""
        future = self._rows[backend]
        if not future.done() or future.exception() is not None:
            return None
        self._rows[backend] = self._done
        return future.result()

    async def destroyed(self, backend: str, names: Collection[str]) -> dict[str, SnapshotRow]:
        """The newest DESTROYED rows of ``names`` (:func:`~._fetch.read_rows`): in the pass's
        snapshot, after the rows (one statement on the read's connection, not a read of its
        own through the store's pool: 50 of those at once took 0.15 s of a pass), or in a read
        of their own once the snapshot is let go or when none is held."""
        read = self._read
        if read is None or not read.pinned:
            rows, _ = await read_db(self._store, backend, live=False, destroyed=names)
            return rows
        return await read.call(functools.partial(read_rows, backend=backend, live=False, destroyed=names))

    async def _read_all(self) -> None:
        try:
            taken_at = time.time()
            async with self._store.pinned_read() as read:
                self._read = read
                self._pin.set_result(read.pinned)
                self._networks.set_result(await read.call(read_networks))
                if read.pinned:  # in the read's thread (a SQLite file), each handed over when read
                    loop = asyncio.get_running_loop()
                    await read.call(functools.partial(self._read_each, loop=loop, taken_at=taken_at))
                    # held until the pass ends (leaving cancels this), for what comes after
                    # Ganeti answered: the orphans' DESTROYED rows (destroyed())
                    await loop.create_future()
                else:
                    for name in self._names:  # each read its own snapshot: taken now
                        if self._stopped:
                            break
                        taken_at = time.time()
                        self._deliver(
                            name,
                            await read.call(
                                functools.partial(read_pass_rows, backend=name, taken_at=taken_at)
                            ),
                        )
        except Exception as exc:  # each backend reports it (its check fails with it)
            for future in self._futures():
                if not future.done():
                    future.set_exception(exc)
        finally:
            self._read = None

    def _read_each(self, conn: Connection, *, loop: asyncio.AbstractEventLoop, taken_at: float) -> None:
        # the statements here, in the read's thread; the rows made in the loop (read_pass_parts)
        for name in self._names:
            if self._stopped:
                return
            loop.call_soon_threadsafe(self._make, name, read_pass_parts(conn, name, taken_at))

    def _make(self, name: str, make: Callable[[], PassRows]) -> None:
        if self._rows[name].done():
            return
        try:
            rows = make()
        except Exception as exc:  # this backend's check fails with it
            self._rows[name].set_exception(exc)
        else:
            self._deliver(name, rows)

    def _deliver(self, name: str, rows: PassRows) -> None:
        future = self._rows[name]
        if not future.done():
            future.set_result(rows)
