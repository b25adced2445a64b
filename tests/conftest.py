from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

import pytest

IN_CI = bool(os.environ.get("CI"))


@dataclass(frozen=True)
class Testbed:
    url: str
    username: str
    password: str
    ca_file: str
    node: str


def _testbed_problem(url: str, ca_file: str) -> str | None:
    host_port = url.split("//", 1)[1].split("/", 1)[0]
    host, _, port = host_port.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            pass
    except OSError as exc:
        return f"no Ganeti RAPI at {url} ({exc}); run 'sudo scripts/ganeti-testbed up' first"
    if not os.access(ca_file, os.R_OK):
        return f"cannot read the cluster CA file {ca_file}; run the tests as root"
    return None


@pytest.fixture(scope="session")
def testbed() -> Testbed:
    """The real Ganeti cluster of scripts/ganeti-testbed; skipped without it, failed in CI."""
    bed = Testbed(
        url=os.environ.get("SYNNEFO_GANETI_TEST_RAPI_URL", "https://127.0.0.1:5080"),
        username=os.environ.get("SYNNEFO_GANETI_TEST_RAPI_USER", "ci"),
        password=os.environ.get("SYNNEFO_GANETI_TEST_RAPI_PASSWORD", "ci"),
        ca_file=os.environ.get("SYNNEFO_GANETI_TEST_RAPI_CA", "/var/lib/ganeti/rapi.pem"),
        node=os.environ.get("SYNNEFO_GANETI_TEST_NODE", "node1.ganeti.test"),
    )
    problem = _testbed_problem(bed.url, bed.ca_file)
    if problem is not None:
        if IN_CI:
            pytest.fail(f"CI must run the real-Ganeti tests: {problem}")
        pytest.skip(problem)
    return bed


@pytest.fixture
def project_root() -> Path:
    return Path(__file__).parent.parent
