"""Day-two planning at scale (issue 30): the rolling maintenance plan and the capacity count.

    python benchmarks/node_ops.py                       # 6, 12, 24, 48 nodes
    python benchmarks/node_ops.py --nodes 12 --per-node 20 --repeat 5

Both are pure code over what the RAPI reads give (``allocate/_maintenance.py``,
``allocate/_capacity.py``), so this measures them on synthetic clusters of ``--nodes`` nodes
(64 GiB, 16 CPUs each; node1 the master), each the primary of ``--per-node`` instances (2 GiB:
half of them ``drbd`` with a secondary on the next node but one, half ``sharedfile``), seeded.

Figures (one JSON object on stdout), per cluster size:

* ``groups``: the rounds of our rolling maintenance (nodes down together, no two nodes of one
  instance in a group, everything they hold fitting on the others, the master alone and last)
  beside ``serial_rounds`` (one node at a time, what an operator does by hand) and their ratio
  ``rounds_saved_x`` (serial over ours: a maintenance whose round costs R takes that many times
  less time); ``moves``: the migrations the plan counts over all its rounds (an instance
  may move more than once: off its node, then off the node it went to); ``plan_ms``: the plan's time (median of
  ``--repeat``);
* ``capacity_now`` / ``capacity_n1``: how many more 4 GiB, 1-CPU instances fit now and keeping
  N+1; ``count_ms``: the count's time (median).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from typing import Any

import orjson

from synnefo_ganeti.allocate import CapacityNode, Flavor, HostedInstance, count_capacity
from synnefo_ganeti.allocate._maintenance import MaintenanceInstance, MaintenanceNode, plan_maintenance
from synnefo_ganeti.allocate._offers import InstancePolicy

NODE_MEMORY = 65536
INSTANCE_MEMORY = 2048
POLICY = InstancePolicy(
    minmax=(
        {
            "min": {"memory-size": 128, "cpu-count": 1, "disk-size": 0, "disk-count": 0, "nic-count": 0},
            "max": {
                "memory-size": 32768,
                "cpu-count": 8,
                "disk-size": 1048576,
                "disk-count": 16,
                "nic-count": 8,
            },
        },
    ),
    std={"memory-size": 4096, "cpu-count": 1, "disk-size": 1024},
    disk_templates=("diskless", "sharedfile", "drbd", "plain", "file"),
    vcpu_ratio=4.0,
)


def cluster(
    nodes: int, per_node: int, seed: int
) -> tuple[list[str], list[tuple[str, str, str, tuple[str, ...]]]]:
    """Node names and instances (name, primary, template, secondaries)."""
    rng = random.Random(seed)
    names = [f"node{i + 1}" for i in range(nodes)]
    instances = []
    for index, primary in enumerate(names):
        for k in range(per_node):
            if k % 2 == 0 and nodes > 2:
                secondary = names[(index + 2 + rng.randrange(max(1, nodes - 3))) % nodes]
                if secondary == primary:
                    secondary = names[(index + 1) % nodes]
                instances.append((f"i-{primary}-{k}", primary, "drbd", (secondary,)))
            else:
                instances.append((f"i-{primary}-{k}", primary, "sharedfile", ()))
    return names, instances


def measure(nodes: int, per_node: int, repeat: int, seed: int) -> dict[str, Any]:
    names, instances = cluster(nodes, per_node, seed)
    used = {n: sum(INSTANCE_MEMORY for _, p, _, _ in instances if p == n) for n in names}
    m_nodes = [MaintenanceNode(n, NODE_MEMORY - used[n], master=(n == "node1")) for n in names]
    m_instances = [MaintenanceInstance(i, p, INSTANCE_MEMORY, t, s) for i, p, t, s in instances]
    plans, plan_times = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        plans.append(plan_maintenance(m_nodes, m_instances))
        plan_times.append(time.perf_counter() - start)
    plan = plans[0]
    c_nodes = [
        CapacityNode(
            n,
            group="default",
            memory_free=NODE_MEMORY - used[n],
            disk_free=1 << 20,
            cpus=16,
            primaries=tuple(
                HostedInstance(i, p, INSTANCE_MEMORY, 1, 1024, t, s) for i, p, t, s in instances if p == n
            ),
        )
        for n in names
    ]
    flavor = Flavor(memory=4096, vcpus=1, disk=1024)
    counts, count_times = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        counts.append(count_capacity(c_nodes, POLICY, flavor, "sharedfile"))
        count_times.append(time.perf_counter() - start)
    groups = len(plan.groups)
    return {
        "nodes": nodes,
        "instances": len(instances),
        "groups": groups,
        "serial_rounds": nodes,
        "rounds_saved_x": round(nodes / groups, 2) if groups else None,
        "moves": sum(len(g.moves) for g in plan.groups),
        "problems": len(plan.problems),
        "plan_ms": round(1000 * statistics.median(plan_times), 2),
        "capacity_now": counts[0].now,
        "capacity_n1": counts[0].n_plus_1,
        "count_ms": round(1000 * statistics.median(count_times), 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="*", default=[6, 12, 24, 48])
    parser.add_argument("--per-node", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=30)
    args = parser.parse_args(argv)
    sizes = [measure(n, args.per_node, args.repeat, args.seed) for n in args.nodes]
    for size in sizes:
        print(
            f"{size['nodes']} nodes, {size['instances']} instances: {size['groups']} rounds "
            f"(serial {size['serial_rounds']}), plan {size['plan_ms']} ms; capacity {size['capacity_now']}"
            f"/{size['capacity_n1']} in {size['count_ms']} ms",
            file=sys.stderr,
        )
    result = {"benchmark": "node_ops", "per_node": args.per_node, "repeat": args.repeat, "sizes": sizes}
    sys.stdout.write(orjson.dumps(result).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
