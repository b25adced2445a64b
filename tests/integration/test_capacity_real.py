"""Capacity on the real 3-node Ganeti 3.0 testbed against Ganeti's own ``hspace`` (issue 30, item 4).

For each flavor, :meth:`ControlPlane.capacity` (through RAPI) and ``hspace -L --machine-readable
--disk-template diskless --standard-alloc DISK,MEM,CPU`` run on the master (``scripts/ganeti-testbed
ns``, luxid's socket: hspace's RAPI loader sends no credentials, and the testbed's RAPI wants them)
read the same nodes; "now" is hspace with ``--no-capacity-checks``, "keeping N+1" hspace as it is
(global N+1 on), for diskless flavors and, with the instance, file ones. Both must give the same counts: on the cluster as the test finds it, then with an
8 GiB instance of ours on node1 (removed whatever happens): its memory counts there although the
fake hypervisor reports it free, and keeping N+1 the new instances move off node1 before it.

The fake hypervisor reports the machine's free memory for every node (~23 GB of 24 on this one),
so the flavors are chosen far from a boundary: the free memory moves by ~100 MB between two reads
on a quiet machine. Beside CI's other tests it moves by gigabytes: a comparison that differs is
made again, up to three times (:func:`agrees`).
"""

from __future__ import annotations

import re

import pytest

from synnefo_ganeti import ControlPlane
from synnefo_ganeti.allocate import Flavor
from tests.integration._testbed import BACKEND, client, name, ns30, spec
from tests.integration.test_control_real import remove_everywhere, run, settings

pytestmark = [pytest.mark.ganeti3, pytest.mark.timeout(600)]

#: how many times :func:`agrees` compares before it gives up (see there)
TRIES = 3
#: (disk, memory, vcpus) as hspace's --standard-alloc takes them
SPECS = [(1024, 4096, 1), (1024, 8192, 1), (1024, 20000, 1), (10240, 4096, 2), (1024, 128, 1)]


async def hspace(disk: int, memory: int, vcpus: int, template: str, *, n_plus_1: bool) -> tuple[int, str]:
    """``HTS_ALLOC_INSTANCES`` and ``HTS_ALLOC_FAIL_REASON`` of hspace on the master."""
    checks = [] if n_plus_1 else ["--no-capacity-checks"]
    argv = ns30("hspace", "-L", *checks, "--machine-readable", "--disk-template", template,
                "--standard-alloc", f"{disk},{memory},{vcpus}")  # fmt: skip
    code, out, err = await run(*argv)
    assert code == 0, f"{' '.join(argv)}: exit {code}\n{out}\n{err}"
    values = dict(re.findall(r"^(HTS_[A-Z_0-9]+)=(.*)$", out, re.MULTILINE))
    assert values.get("HTS_OK") == "1", out
    return int(values["HTS_ALLOC_INSTANCES"]), values["HTS_ALLOC_FAIL_REASON"]


async def compare(cp: ControlPlane, template: str = "diskless") -> list[str]:
    """Ours and hspace's counts for every flavor; the lines that differ (empty: none)."""
    flavors = [Flavor(memory=m, vcpus=v, disk=d) for d, m, v in SPECS]
    (answer,) = await cp.capacity(flavors, template=template)
    assert answer.error is None and answer.nodes == 3, answer
    differ = []
    for (disk, memory, vcpus), ours in zip(SPECS, answer.flavors, strict=True):
        now, why_now = await hspace(disk, memory, vcpus, template, n_plus_1=False)
        n1, why_n1 = await hspace(disk, memory, vcpus, template, n_plus_1=True)
        line = f"{template} {ours.flavor}: ours {ours.now}/{ours.n_plus_1}, hspace {now} ({why_now})/{n1} ({why_n1})"
        print(line)
        if (ours.now, ours.n_plus_1) != (now, n1):
            differ.append(line)
    return differ


async def agrees(cp: ControlPlane, template: str = "diskless") -> list[str]:
    """:func:`compare` until ours and hspace's counts agree, at most :data:`TRIES` times; the lines
    that still differ. hspace and RAPI read the fake hypervisor's free memory (the machine's
    ``MemFree + Buffers + Cached``) at different moments, and beside CI's other tests (PostgreSQL,
    Chromium, pytest workers) it moves by gigabytes, across a flavor's boundary now and then: a
    count of ours that is wrong differs on every try."""
    differ: list[str] = []
    for attempt in range(1, TRIES + 1):
        differ = await compare(cp, template)
        if not differ:
            return []
        print(f"try {attempt} of {TRIES}: {len(differ)} count(s) differ (the free memory moved?)")
    return differ


async def test_capacity_is_hspaces(testbed3, tmp_path) -> None:
    bed = testbed3.bed
    async with ControlPlane(settings(bed, f"sqlite:///{tmp_path}/db.sqlite")) as cp:
        assert await agrees(cp) == []
        # an instance of ours: it holds memory on node1 and must be able to move keeping N+1
        instance = name("cap")
        async with client(bed) as rapi:
            try:
                job = await rapi.create_instance(spec(bed, instance, memory=8192, pnode=testbed3.nodes[0]))
                await rapi.wait_for_job(job, timeout=120)
                (answer,) = await cp.capacity([Flavor(4096, 1, 1024)], backends=[BACKEND])
                hosted = [n for n in answer.flavors[0].per_node if n == testbed3.nodes[0]]
                assert hosted, answer
                assert await agrees(cp) == []
                # new file instances are re-created by size, after the diskless one moved
                assert await agrees(cp, "file") == []
            finally:
                await remove_everywhere(rapi, [instance])
