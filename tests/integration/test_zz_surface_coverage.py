"""Every RapiClient method of ``docs/rapi-client.md``'s table that the testbed's Ganeti serves was
called against it by the real-Ganeti tests (issue 29 item 2): the record of ``rapi_calls``
(tests/integration/conftest.py) checked after all the others ran (this module sorts last).

It checks only when the whole ``ganeti`` selection of tests/integration ran in this session, one
process (``-m "ganeti and not ganeti3"`` on 3.1, ``-m "ganeti or ganeti3"`` on 3.0); a part of it
(one module, ``-k``, xdist workers) skips with the reason. A test that failed half-way may have left
calls out: the failure names them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Testbed
from tests.integration.conftest import (
    DESELECTED,
    RAPI_31_ONLY,
    RAPI_CALLED,
    RAPI_CALLED_BY,
    documented_methods,
)

pytestmark = [pytest.mark.ganeti]

#: methods that need several nodes, not checked on a one-node cluster: none (the moves are called
#: on one node by test_one_node_moves_real.py, and answered with Ganeti's refusals)
NEEDS_NODES: set[str] = set()
#: the table's one method that sends nothing (it builds a multi-alloc entry): no cluster serves it
SENDS_NOTHING = {"instance_allocation"}


def _partial_run(request: pytest.FixtureRequest) -> str | None:
    """Why this session is not the whole ``ganeti`` selection of tests/integration, or None."""
    if hasattr(request.config, "workerinput"):
        return "an xdist worker sees only its own tests' calls"
    items = [*request.session.items, *DESELECTED]
    here = Path(__file__).parent
    collected = {Path(str(item.path)).name for item in items if Path(str(item.path)).parent == here}
    left_out = sorted({p.name for p in here.glob("test_*.py")} - collected)
    if left_out:
        return f"the modules {', '.join(left_out)} were not collected"
    deselected = [item.nodeid for item in DESELECTED if item.get_closest_marker("ganeti") is not None]
    if deselected:
        return f"{len(deselected)} ganeti test(s) were deselected, e.g. {deselected[0]}"
    return None


def test_every_rapi_method_the_cluster_serves_was_called_on_it(
    request: pytest.FixtureRequest, testbed: Testbed, rapi_calls: dict[str, set[str]]
) -> None:
    partial = _partial_run(request)
    if partial is not None:
        pytest.skip(f"not the whole ganeti selection of tests/integration ({partial}): no coverage check")
    served = set(documented_methods().values()) - SENDS_NOTHING
    if testbed.series == "3.0":
        served -= RAPI_31_ONLY
    called = RAPI_CALLED.get(testbed.url.rstrip("/"), set())
    missing = sorted(served - called - NEEDS_NODES)
    by = RAPI_CALLED_BY.get(testbed.url.rstrip("/"), {})
    alone: dict[str, list[str]] = {}
    for method in sorted(served & called):
        if len(by[method]) == 1:
            alone.setdefault(next(iter(by[method])), []).append(method)
    for module, methods in sorted(alone.items()):
        print(f"called only by {module}: {', '.join(methods)}")
    print(f"\nRAPI coverage on Ganeti {testbed.version} at {testbed.url}: {len(served & called)} of "
          f"{len(served)} methods called; missing: {', '.join(missing) or 'none'}")  # fmt: skip
    assert not missing, (
        f"{len(missing)} RapiClient method(s) that Ganeti {testbed.version} serves were never called "
        f"on {testbed.url} by the real-Ganeti tests: {', '.join(missing)}"
    )
