"""Job filter rules applied to the queue, as Ganeti 3.0's luxid applies them.

Followed: ``Ganeti.JQScheduler.Filtering`` (``matchPredicate``, ``applyingFilter``,
``jobFiltering``, ``queueRateLimitSlotMap``) and ``Ganeti.JQScheduler`` (``cancelRejectedJobs``,
``scheduleSomeJobs``, ``configChangeNeedsRescheduling``); ``doc/design-optables.rst``.

* Rules are taken in order of priority, then UUID (``filterRuleOrder``). The rule that
  *applies* to a job is the first whose predicates all match it and whose action is not
  ``CONTINUE``; no such rule: the job is accepted.
* Predicates: ``["jobid", F]`` (``F`` compares the field ``id`` with a number or with the string
  ``"watermark"``, the highest job id when the rule was added); ``["opcode", F]`` (``F`` reads
  an op's fields, dotted for nested ones, ``OP_ID`` among them; true if some op of the job
  matches); ``["reason", F]`` (fields ``source``, ``reason``, ``timestamp`` of some reason
  trail entry). In ``jobid`` and ``reason`` filters only comparisons count (anything else makes
  the predicate false); ``opcode`` filters are the whole query language.
* Actions: ``ACCEPT`` runs the job, ``PAUSE`` leaves it queued, ``REJECT`` cancels it while it
  is queued, ``["RATE_LIMIT", n]`` runs at most ``n`` jobs the rule applies to at once (the
  running ones counted first). Jobs already running are not touched. A change of the rules
  makes the queue look again (its jobs may now run, or be rejected).
"""

from __future__ import annotations

import functools
import operator
import re
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from synnefo_ganeti.testing._jobs import FakeJob
from synnefo_ganeti.testing._model import FakeFilter

__all__ = ["applying_filter", "select_jobs"]

_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq, "==": operator.eq, "!=": operator.ne,
    "<": operator.lt, ">": operator.gt, "<=": operator.le, ">=": operator.ge,
}  # fmt: skip
_MISSING = object()


class _Invalid(Exception):
    """A filter that cannot be evaluated (a field the job lacks, values that do not compare)."""


def _compare(op: str, left: Any, right: Any) -> bool:
    try:
        return bool(_COMPARE[op](left, right))
    except TypeError:
        raise _Invalid from None


def _evaluate(qfilter: Any, leaf: Callable[[str, list[Any]], bool]) -> bool:
    """``evaluateFilterM``: ``&``, ``|``, ``!`` over the leaves ``leaf(op, args)`` judges; a
    filter that cannot be evaluated (``_Invalid`` anywhere) is false."""

    def run(node: Any) -> bool:
        if not isinstance(node, list) or not node:
            raise _Invalid
        op, *args = node
        if op == "&":
            return all(run(arg) for arg in args)
        if op == "|":
            return any(run(arg) for arg in args)
        if op == "!":
            return not run(args[0])
        return leaf(str(op), args)

    try:
        return run(qfilter)
    except _Invalid:
        return False


def _comparisons(qfilter: Any, field: Callable[[str], Any]) -> bool:
    """``evaluateFilterComparator``: and/or/not over comparisons; anything else is false."""

    def leaf(op: str, args: list[Any]) -> bool:
        if op in _COMPARE and len(args) == 2:
            value = field(str(args[0]))
            if value is _MISSING:
                raise _Invalid
            return _compare(op, value, args[1])
        raise _Invalid

    return _evaluate(qfilter, leaf)


def _dotted(data: Any, name: str) -> Any:
    for key in name.split("."):
        if not isinstance(data, dict) or key not in data:
            return _MISSING
        data = data[key]
    return data


def _json_filter(qfilter: Any, op_input: dict[str, Any]) -> bool:
    """``evaluateFilterJSON`` of a filter whose fields are read from an op (``accessOpCodeField``)."""

    def leaf(op: str, args: list[Any]) -> bool:
        value = _dotted(op_input, str(args[0])) if args else _MISSING
        if value is _MISSING:
            raise _Invalid
        if op == "?":
            return bool(value)
        if op in _COMPARE and len(args) == 2:
            return _compare(op, value, args[1])
        if op == "=~" and len(args) == 2 and isinstance(value, str):
            return re.search(str(args[1]), value) is not None
        if op == "=[]" and len(args) == 2 and isinstance(value, list):
            return args[1] in value
        raise _Invalid

    return _evaluate(qfilter, leaf)


def _matches(job: FakeJob, rule: FakeFilter, predicate: Any) -> bool:
    """``matchPredicate``."""
    if not isinstance(predicate, list) or len(predicate) != 2:
        return False
    kind, qfilter = predicate
    if kind == "jobid":

        def job_id(name: str) -> Any:
            return job.id if name == "id" else _MISSING

        watermark = _with_watermark(qfilter, rule.watermark)
        return _comparisons(watermark, job_id)
    if kind == "opcode":
        return any(_json_filter(qfilter, op.luxid) for op in job.ops)
    if kind == "reason":
        for op in job.ops:
            for entry in op.luxid.get("reason") or []:
                if len(entry) == 3:
                    fields = dict(zip(("source", "reason", "timestamp"), entry, strict=True))
                    if _comparisons(qfilter, functools.partial(_lookup, fields)):
                        return True
        return False
    return False


def _lookup(fields: dict[str, Any], name: str) -> Any:
    return fields.get(name, _MISSING)


def _with_watermark(qfilter: Any, watermark: int) -> Any:
    """A ``jobid`` filter with the string ``"watermark"`` read as the rule's watermark."""
    if not isinstance(qfilter, list) or not qfilter:
        return qfilter
    op, *args = qfilter
    if op in ("&", "|", "!"):
        return [op, *(_with_watermark(arg, watermark) for arg in args)]
    if len(args) == 2 and args[1] == "watermark":
        return [op, args[0], watermark]
    if len(args) == 2 and isinstance(args[1], str):
        return [op, args[0], _MISSING]  # another string: not comparable with a job id
    return qfilter


def _order(filters: Iterable[FakeFilter]) -> list[FakeFilter]:
    return sorted(filters, key=lambda rule: (rule.priority, rule.uuid))


def _action(rule: FakeFilter) -> tuple[str, int]:
    action = rule.action
    if isinstance(action, list) and len(action) == 2 and action[0] == "RATE_LIMIT":
        return "RATE_LIMIT", int(action[1])
    return str(action), 0


def applying_filter(filters: Iterable[FakeFilter], job: FakeJob) -> FakeFilter | None:
    """``applyingFilter``: the first rule (in order) all of whose predicates match ``job`` and
    whose action is not ``CONTINUE``."""
    return _first_applying(_order(filters), job)


def _first_applying(rules: list[FakeFilter], job: FakeJob) -> FakeFilter | None:
    """:func:`applying_filter` over ``rules`` already in order."""
    for rule in rules:
        if _action(rule)[0] == "CONTINUE":
            continue
        if all(_matches(job, rule, predicate) for predicate in rule.predicates):
            return rule
    return None


def select_jobs(
    filters: Iterable[FakeFilter], queued: list[FakeJob], running: Iterable[FakeJob], free: int
) -> tuple[list[FakeJob], list[FakeJob]]:
    """(the queued jobs to cancel as REJECTed, up to ``free`` queued jobs to start now).

    ``cancelRejectedJobs`` then ``selectJobsToRun`` with ``jobFiltering``: a PAUSEd job stays
    queued, a rate-limited one waits for a slot of its rule; neither holds back a later job."""
    rules = _order(filters)
    if not rules:
        return [], queued[: max(0, free)]
    applying = {job.id: _first_applying(rules, job) for job in queued}
    rejected = [
        job for job in queued if (rule := applying[job.id]) is not None and _action(rule)[0] == "REJECT"
    ]
    used: Counter[str] = Counter()
    for job in running:
        rule = _first_applying(rules, job)
        if rule is not None and _action(rule)[0] == "RATE_LIMIT":
            used[rule.uuid] += 1
    chosen: list[FakeJob] = []
    for job in queued:
        if len(chosen) >= free:
            break
        rule = applying[job.id]
        kind, limit = ("ACCEPT", 0) if rule is None else _action(rule)
        if kind in ("PAUSE", "REJECT"):
            continue
        if kind == "RATE_LIMIT":
            assert rule is not None
            if used[rule.uuid] >= limit:
                continue
            used[rule.uuid] += 1
        chosen.append(job)
    return rejected, chosen
