"""The 3-node testbed's fixture: ``testbed3``, the real 3-node cluster of ``scripts/ganeti-testbed up --nodes 3``."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

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
