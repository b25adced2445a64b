"""The 3-node testbed's fixture: ``testbed3``, the real 3-node cluster of ``scripts/ganeti-testbed up --nodes 3``."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import os
import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from synnefo_ganeti import RapiClient
from tests.conftest import IN_CI, Testbed, _testbed_problem, env_testbed, with_version

UP3 = "run 'sudo scripts/ganeti-testbed down --purge; sudo scripts/ganeti-testbed up --nodes 3' first"


@dataclass(frozen=True)
class Testbed3:
    bed: Testbed
    nodes: tuple[str, ...]  # the cluster's node names, as RAPI lists them


def _default_ca() -> str:
    multi = "/var/lib/ganeti-multi/node1/lib/rapi.pem"
    return multi if os.path.exists(multi) else "/var/lib/ganeti/rapi.pem"


async def _node_names(bed: Testbed) -> tuple[str, ...]:
    async with RapiClient(bed.url, username=bed.username, password=bed.password, ca_file=bed.ca_file) as rapi:
        return tuple(sorted(n.name for n in await rapi.list_nodes()))


@pytest.fixture(scope="session")
def testbed3() -> Testbed3:
    """The real 3-node Ganeti cluster; skipped with a reason without it, failed in CI."""
    bed = env_testbed(_default_ca())
    problem = _testbed_problem(bed.url, bed.ca_file)
    nodes: tuple[str, ...] = ()
    if problem is None:
        nodes = asyncio.run(_node_names(bed))
        if len(nodes) < 3:
            problem = f"the Ganeti testbed at {bed.url} has {len(nodes)} node(s), these tests need 3; {UP3}"
    else:
        problem = f"{problem} (these tests need the 3-node testbed: {UP3})"
    if problem is not None:
        if IN_CI:
            pytest.fail(f"CI must run the real 3-node Ganeti tests: {problem}")
        pytest.skip(problem)
    return Testbed3(bed=with_version(bed), nodes=nodes)


# -- which RapiClient methods the real-Ganeti tests called, per cluster (test_zz_surface_coverage.py) ------

RAPI_DOC = Path(__file__).resolve().parents[2] / "docs" / "rapi-client.md"
#: our methods of the rows of Ganeti 3.1's client that 3.0's lacks (tests/unit/test_rapi_surface_rules.py)
RAPI_31_ONLY = {"rename_network"}


def documented_methods() -> dict[str, str]:
    """``docs/rapi-client.md``'s table, as tests/unit/test_rapi_surface_rules.py reads it: Ganeti's
    name of each method (``GetVersion``) and ours (``version``), the 81 of 3.0's client and 3.1's."""
    section = RAPI_DOC.read_text().split("## Every method of Ganeti's client", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if re.match(r"\|\s*\d+\s*\|", line)]
    cells = [[cell.strip().strip("`") for cell in row.strip().strip("|").split("|")] for row in rows]
    return {row[1]: row[3] for row in cells}


#: base URL -> the names of the RapiClient methods the tests called on a client of that URL
RAPI_CALLED: dict[str, set[str]] = defaultdict(set)
#: base URL -> method -> the test modules that called it (which one alone covers a method)
RAPI_CALLED_BY: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
_RUNNING: list[str] = [""]  # the module of the test being set up, run or torn down
#: the items pytest collected but deselected (``-m``, ``-k``): whether the whole selection ran
DESELECTED: list[pytest.Item] = []
_INSIDE = contextvars.ContextVar("_INSIDE", default=False)  # a call made by one of ours is not the test's


def pytest_deselected(items: list[pytest.Item]) -> None:
    DESELECTED.extend(items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _RUNNING[0] = Path(str(item.path)).name
    try:
        return (yield)
    finally:
        _RUNNING[0] = ""


def _note(client: RapiClient, method_name: str) -> contextvars.Token[bool] | None:
    """Records the call unless one of ours made it; the token to reset once it returned."""
    if _INSIDE.get():
        return None
    RAPI_CALLED[client.url].add(method_name)
    RAPI_CALLED_BY[client.url][method_name].add(_RUNNING[0])
    return _INSIDE.set(True)


def _done(token: contextvars.Token[bool] | None) -> None:
    if token is not None:
        _INSIDE.reset(token)


class _RecordedStatic:
    """A static method (``instance_allocation``, which sends nothing): recorded when called on a
    client, as it is called (``rapi.instance_allocation(...)``); the function itself from the class."""

    def __init__(self, method_name: str, func: Callable[..., Any]) -> None:
        self.method_name, self.func = method_name, func

    def __get__(self, client: RapiClient | None, owner: type | None = None) -> Callable[..., Any]:
        if client is None:
            return self.func
        func, method_name = self.func, self.method_name

        @functools.wraps(func)
        def called(*args: Any, **kwargs: Any) -> Any:
            token = _note(client, method_name)
            try:
                return func(*args, **kwargs)
            finally:
                _done(token)

        return called


def _recording(method_name: str) -> Any:
    static = inspect.getattr_static(RapiClient, method_name)
    if isinstance(static, staticmethod):
        return _RecordedStatic(method_name, static.__func__)
    original = getattr(RapiClient, method_name)

    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def called(self: RapiClient, *args: Any, **kwargs: Any) -> Any:
            token = _note(self, method_name)
            try:
                return await original(self, *args, **kwargs)
            finally:
                _done(token)

        return called

    @functools.wraps(original)
    def called_sync(self: RapiClient, *args: Any, **kwargs: Any) -> Any:
        token = _note(self, method_name)
        try:
            return original(self, *args, **kwargs)
        finally:
            _done(token)

    return called_sync


@pytest.fixture(scope="session", autouse=True)
def rapi_calls() -> Iterator[dict[str, set[str]]]:
    """Records, per base URL, which of the table's RapiClient methods the tests called themselves
    (a call one of them makes inside, e.g. ``wait_for_job`` in ``wait_for_job_completion``, is not
    counted): test_zz_surface_coverage.py checks the testbed's record after all the others ran."""
    patch = pytest.MonkeyPatch()
    for ours in sorted(set(documented_methods().values())):
        patch.setattr(RapiClient, ours, _recording(ours))
    try:
        yield RAPI_CALLED
    finally:
        patch.undo()
