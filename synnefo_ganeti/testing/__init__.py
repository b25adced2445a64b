"""The fake Ganeti: a faithful RAPI and job queue for tests, demos and benchmarks.

``async with FakeGaneti() as fake:`` gives ``fake.url``, ``fake.username``,
``fake.password`` and ``fake.ca_file``, ready for :class:`~synnefo_ganeti.RapiClient`.
Never imported by the runtime code.
"""

from __future__ import annotations

from synnefo_ganeti.testing._cluster import FakeInstance, FakeNode
from synnefo_ganeti.testing._engine import DEFAULT_OP_TIMES, FakeCluster
from synnefo_ganeti.testing._fake import FakeGaneti
from synnefo_ganeti.testing._jobs import FakeJob
from synnefo_ganeti.testing._proxy import PROXY_MODES, ChaosProxy
from synnefo_ganeti.testing._server import FAULT_KINDS, Fault
from synnefo_ganeti.testing._slow import SlowSubmit
from synnefo_ganeti.testing._structure import shape_of, structure_diff
from synnefo_ganeti.testing._versions import DEFAULT_VERSION, VERSIONS, VersionProfile

__all__ = [
    "DEFAULT_OP_TIMES",
    "DEFAULT_VERSION",
    "FAULT_KINDS",
    "PROXY_MODES",
    "VERSIONS",
    "ChaosProxy",
    "FakeCluster",
    "FakeGaneti",
    "FakeInstance",
    "FakeJob",
    "FakeNode",
    "Fault",
    "SlowSubmit",
    "VersionProfile",
    "shape_of",
    "structure_diff",
]
