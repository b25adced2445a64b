"""Repair by policy: what is wrong on a backend and what may be done about it (pure code).

The dispatcher's repair task (``dispatch/_repair.py``) reads a backend (Ganeti's instances,
nodes, node groups and cluster tags; the store's rows and open incidents; the dispatcher's own
node reads), builds a :class:`BackendFacts` and asks :func:`plan_repairs` what to do: the
incidents to open, the repairs to send, the nodes to fence, the incidents to close. Nothing
here does I/O.

**Problems** (each an incident, one open per kind, node and instance):

* ``node-down``: a node the dispatcher reads down (its live figures gone) for at least
  ``node_down_after`` seconds, not marked offline. Its repair, when ``failover`` is allowed on
  the backend and ``fence_command`` is set: ``fence`` (the command makes the node safe, then
  the node is marked offline: its instances can fail over). Closed ``resolved`` when the node is
  up again, ``repaired`` once it is offline (fenced, or marked by an operator).
* ``instance-error``: an instance of ours that should run (its row STARTED) whose primary node
  is offline (Ganeti ``ERROR_nodeoffline``), or down for ``node_down_after``
  (``ERROR_nodedown``). Its repair: ``failover`` (``ignore_consistency``: the node is dead),
  only once the node is **offline**: a node merely down may still run the instance.
* ``instance-stopped``: an instance of ours that should run (its row STARTED: the last action
  that ended made it run; a user's stop makes it STOPPED) which Ganeti reads not running on a
  primary node that is up (``ERROR_down``: Ganeti's admin state up, nothing runs; ``USER_down``:
  it shut itself down). Its repair: ``start``.
* ``migration-stopped``: the same, after a migration of it failed (its row's last error is a
  migrate). Its repair: ``start``, and only while every node of the backend is up (Ganeti then
  looked on all of them: it runs nowhere; a node down could still run the copy the migration
  left, Ganeti issue #382). An instance Ganeti reads ``ERROR_wrongnode`` (running on a node
  other than its primary: the migration half done) gets ``migrate`` with ``cleanup``, Ganeti's
  own mend for a migration that failed half-way.

An instance busy with another action (its row's ``task``) is left alone; it is looked at again
at the next pass. A repair whose job failed closes its incident ``failed``; the problem, still
there, opens a new incident at the next pass, report only while the failure is recent
(``BackendFacts.failed``): as harep, which stops at a failed repair, a failing repair is not
sent again and again. What the **policy** allows: a repair is sent only when the backend's
``[repair] allow`` (or its ``repair_allow``) names it **and** the instance's harep tags allow
it (:func:`harep_allows`). Otherwise the incident stays open, report only, and closes when the
problem goes away.

**harep's tags** (Ganeti's ``src/Ganeti/HTools/Loader.hs`` ``getArPolicy`` and
``setArPolicy``, ``src/Ganeti/HTools/Program/Harep.hs`` ``doRepair``): at each level (the
instance, its primary node's group, the cluster), ``ganeti:watcher:autorepair:suspend:`` (or
``...:suspend:<epoch>`` still in the future) suspends repairs; otherwise the tags
``ganeti:watcher:autorepair:<type>`` enable repairs up to the *least* of the types named, in
harep's order ``fix-storage`` < ``migrate`` < ``failover`` < ``reinstall``; a level without such
a tag takes the level above (none at the cluster: not enabled). Our repairs need: ``start`` any
enabled level (``fix-storage`` or more: a start is the mildest repair), ``migrate`` at least
``migrate``, ``failover`` at least ``failover``. The bare tag ``ganeti:watcher:autorepair:suspend``
(no colon; harep ignores it) is taken as a suspension too: a mistyped suspension must not repair.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "HAREP_LEVELS",
    "HAREP_PREFIX",
    "BackendFacts",
    "Close",
    "InstanceFacts",
    "NodeFacts",
    "OpenFacts",
    "Problem",
    "RepairPlan",
    "harep_allows",
    "harep_policy",
    "plan_repairs",
]

HAREP_PREFIX: Final = "ganeti:watcher:autorepair:"
#: harep's repair types, in its order (``AutoRepairType``'s ``Ord``)
HAREP_LEVELS: Final = ("fix-storage", "migrate", "failover", "reinstall")
#: the least harep level each of our repairs needs
NEEDS: Final = {"start": "fix-storage", "migrate": "migrate", "failover": "failover"}
_SUSPEND = HAREP_PREFIX + "suspend"
#: Ganeti's instance statuses this module reads
_NOT_RUNNING = frozenset({"ERROR_down", "USER_down"})
_NODE_LOST = frozenset({"ERROR_nodedown", "ERROR_nodeoffline"})
#: disk templates Ganeti cannot fail over (``constants.DTS_MIRRORED`` lacks them)
NO_FAILOVER: Final = frozenset({"plain", "file"})

#: a harep policy at one level: None (no tag there), "suspended", or the greatest type allowed
Policy = str | None


def harep_policy(tags: Iterable[str], now: float) -> Policy:
    """One level's harep policy from its tags (``getArPolicy``): "suspended", the least type
    enabled, or None when no autorepair tag is there."""
    enabled: list[int] = []
    for tag in tags:
        if tag == _SUSPEND or tag == _SUSPEND + ":":
            return "suspended"
        if tag.startswith(_SUSPEND + ":"):
            try:
                until = float(tag[len(_SUSPEND) + 1 :])
            except ValueError:
                continue  # harep's tryRead fails: not a suspension
            if until > now:
                return "suspended"
            continue
        if tag.startswith(HAREP_PREFIX):
            rest = tag[len(HAREP_PREFIX) :]
            if rest in HAREP_LEVELS:
                enabled.append(HAREP_LEVELS.index(rest))
    return HAREP_LEVELS[min(enabled)] if enabled else None


def harep_allows(
    repair: str,
    *,
    instance_tags: Iterable[str],
    group_tags: Iterable[str],
    cluster_tags: Iterable[str],
    now: float,
) -> bool:
    """Whether harep's tags allow ``repair`` ("start", "migrate", "failover") on an instance:
    the instance's own policy, else its group's, else the cluster's (``setArPolicy``)."""
    policy = harep_policy(instance_tags, now)
    if policy is None:
        policy = harep_policy(group_tags, now)
    if policy is None:
        policy = harep_policy(cluster_tags, now)
    if policy is None or policy == "suspended":
        return False
    return HAREP_LEVELS.index(policy) >= HAREP_LEVELS.index(NEEDS[repair])


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """A node of the backend: ``offline`` in Ganeti; ``down_since`` (epoch seconds) while the
    dispatcher reads it down, else None; its group's tags."""

    name: str
    offline: bool = False
    down_since: float | None = None
    group_tags: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class InstanceFacts:
    """An instance of ours as Ganeti reads it, with what its row says."""

    name: str
    #: Ganeti's status ("running", "ERROR_down", "ERROR_nodeoffline", ...)
    status: str | None
    pnode: str | None
    disk_template: str | None = None
    tags: tuple[str, ...] = ()
    #: the row's status: "STARTED" = the last action that ended made it run
    row_status: str = "STARTED"
    #: an action in progress on it (the row's task)
    busy: bool = False
    #: its last failed action was a migrate
    migration_failed: bool = False


@dataclass(frozen=True, slots=True)
class OpenFacts:
    """An open incident, and the end of its repair's job (None: no job, or not ended)."""

    id: int
    kind: str
    node: str | None
    instance: str | None
    action: str | None = None
    job_id: int | None = None
    #: "success", "error", "canceled" once the repair's job ended
    job_status: str | None = None


@dataclass(frozen=True, slots=True)
class BackendFacts:
    """Everything :func:`plan_repairs` reads of one backend at one moment."""

    backend: str
    now: float
    node_down_after: float
    #: the repairs ``[repair]`` allows on this backend
    allowed: tuple[str, ...] = ()
    #: whether ``fence_command`` is set
    can_fence: bool = False
    cluster_tags: tuple[str, ...] = ()
    nodes: Mapping[str, NodeFacts] = field(default_factory=dict)
    instances: tuple[InstanceFacts, ...] = ()
    open: tuple[OpenFacts, ...] = ()
    #: the keys (kind, node, instance) of incidents whose repair failed lately: not repeated
    failed: frozenset[tuple[str, str | None, str | None]] = frozenset()


@dataclass(frozen=True, slots=True)
class Problem:
    """Something wrong now: its incident's key (kind, node, instance), what it is, and the
    repair to send now (None: none allowed, or not yet: ``detail`` says why)."""

    kind: str
    node: str | None
    instance: str | None
    detail: str
    action: str | None = None

    @property
    def key(self) -> tuple[str, str | None, str | None]:
        return (self.kind, self.node, self.instance)


@dataclass(frozen=True, slots=True)
class Close:
    """An open incident to close: its id, ``outcome`` and why."""

    id: int
    outcome: str
    detail: str


@dataclass(frozen=True, slots=True)
class RepairPlan:
    """What a pass does: ``problems`` (each opened if not open yet; a repair sent when its
    ``action`` is set and its incident has none running), and ``closes``."""

    problems: tuple[Problem, ...] = ()
    closes: tuple[Close, ...] = ()

    def __repr__(self) -> str:
        sends = sum(1 for p in self.problems if p.action)
        return f"<RepairPlan {len(self.problems)} problems, {sends} repairs, {len(self.closes)} closes>"


def _down_long(node: NodeFacts | None, facts: BackendFacts) -> bool:
    return (
        node is not None
        and node.down_since is not None
        and facts.now - node.down_since >= facts.node_down_after
    )


def _allowed(repair: str, instance: InstanceFacts, facts: BackendFacts) -> str | None:
    """None when ``repair`` may be sent on ``instance``, else why not."""
    if repair not in facts.allowed:
        return f"report only: [repair] allow does not name {repair!r} on {facts.backend}"
    node = facts.nodes.get(instance.pnode or "")
    if not harep_allows(
        repair,
        instance_tags=instance.tags,
        group_tags=node.group_tags if node is not None else (),
        cluster_tags=facts.cluster_tags,
        now=facts.now,
    ):
        return f"report only: harep's tags do not allow {repair!r} (ganeti:watcher:autorepair:{NEEDS[repair]} or more)"
    return None


def _node_problems(facts: BackendFacts) -> list[Problem]:
    problems = []
    for node in facts.nodes.values():
        if node.offline or not _down_long(node, facts):
            continue
        detail = f"node {node.name} down for {facts.now - (node.down_since or facts.now):.0f} s"
        action = None
        if "failover" not in facts.allowed:
            detail += "; report only: [repair] allow does not name 'failover'"
        elif not facts.can_fence:
            detail += "; no [repair] fence_command: an operator marks it offline (nodes failover)"
        else:
            action = "fence"
        problems.append(Problem("node-down", node.name, None, detail, action))
    return problems


def _instance_problem(instance: InstanceFacts, facts: BackendFacts) -> Problem | None:
    if instance.row_status != "STARTED" or instance.status in (None, "running"):
        return None
    node = facts.nodes.get(instance.pnode or "")
    where = f"{instance.name} on {instance.pnode or '?'}"
    if instance.status in _NODE_LOST:
        offline = instance.status == "ERROR_nodeoffline" or (node is not None and node.offline)
        if not offline and not _down_long(node, facts):
            return None  # not yet: a node read, a reboot, node_down_after
        state = "offline" if offline else "down"
        detail = f"{where}: should run, its node is {state} ({instance.status})"
        if not offline:
            return Problem(
                "instance-error",
                instance.pnode,
                instance.name,
                detail + "; waiting for the node to be offline (fenced)",
            )
        if instance.disk_template in NO_FAILOVER:
            return Problem(
                "instance-error",
                instance.pnode,
                instance.name,
                detail + f"; {instance.disk_template} cannot fail over",
            )
        why = _allowed("failover", instance, facts)
        if why is not None:
            return Problem("instance-error", instance.pnode, instance.name, f"{detail}; {why}")
        return Problem("instance-error", instance.pnode, instance.name, detail, "failover")
    if instance.status == "ERROR_wrongnode":
        detail = f"{where}: runs on a node other than its primary (a migration half done)"
        why = _allowed("migrate", instance, facts)
        kind = "migration-stopped"
        if why is not None:
            return Problem(kind, instance.pnode, instance.name, f"{detail}; {why}")
        return Problem(kind, instance.pnode, instance.name, detail, "migrate")
    if instance.status not in _NOT_RUNNING:
        return None
    if node is None or node.offline or node.down_since is not None:
        return None  # its node is not up: the node's rules, not a start
    kind = "migration-stopped" if instance.migration_failed else "instance-stopped"
    detail = f"{where}: should run, Ganeti reads it {instance.status}"
    if kind == "migration-stopped":
        detail += " after a failed migration"
        lost = sorted(n.name for n in facts.nodes.values() if n.offline or n.down_since is not None)
        if lost:
            return Problem(
                kind,
                instance.pnode,
                instance.name,
                f"{detail}; not started while {', '.join(lost)} may run it",
            )
    why = _allowed("start", instance, facts)
    if why is not None:
        return Problem(kind, instance.pnode, instance.name, f"{detail}; {why}")
    return Problem(kind, instance.pnode, instance.name, detail, "start")


def plan_repairs(facts: BackendFacts) -> RepairPlan:
    """What to do on one backend now (see the module)."""
    problems = _node_problems(facts)
    for instance in facts.instances:
        if instance.busy:
            continue
        problem = _instance_problem(instance, facts)
        if problem is not None:
            problems.append(problem)
    now_keys = {p.key: p for p in problems}
    busy = {i.name for i in facts.instances if i.busy}
    closes: list[Close] = []
    held: set[tuple[str, str | None, str | None]] = set()
    for incident in facts.open:
        key = (incident.kind, incident.node, incident.instance)
        if incident.job_id is not None and incident.job_status is None:
            held.add(key)  # its repair runs: nothing else until it ends
            continue
        if incident.job_id is not None:
            outcome = "repaired" if incident.job_status == "success" else "failed"
            closes.append(
                Close(
                    incident.id,
                    outcome,
                    f"{incident.action} job {incident.job_id} ended {incident.job_status}",
                )
            )
            held.add(key)  # closed now; found again next pass if still wrong
            continue
        if incident.kind == "node-down":
            node = facts.nodes.get(incident.node or "")
            if node is not None and node.offline:
                outcome = "repaired" if incident.action == "fence" else "resolved"
                closes.append(Close(incident.id, outcome, f"node {incident.node} is offline"))
                held.add(key)
                continue
        if key not in now_keys and incident.instance not in busy:
            closes.append(Close(incident.id, "resolved", "the problem went away"))
            continue
        if incident.action == "fence":
            held.add(key)  # fenced, waiting for the offline mark: not fenced twice
    planned = []
    for p in problems:
        if p.action is not None and p.key in facts.failed:
            p = Problem(p.kind, p.node, p.instance, f"{p.detail}; its {p.action} failed lately: not repeated")
        elif p.key in held:
            p = Problem(p.kind, p.node, p.instance, p.detail, None)
        planned.append(p)
    return RepairPlan(tuple(planned), tuple(closes))
