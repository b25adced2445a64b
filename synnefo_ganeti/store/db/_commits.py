"""What the store's writer reports: each commit of job versions to its listeners
(:class:`CommitInfo`, ``Store.on_commit``), and its counts since it started (:class:`WriterStats`)."""

from __future__ import annotations

from dataclasses import dataclass

from synnefo_ganeti.jobs import JobSummary

__all__ = ["BatchResult", "CommitInfo", "WriterStats"]

#: what writing one batch did: (applied (backend, summary), skipped, older, events, ended
#: before: the final versions it carried of jobs whose end another process had stored already)
BatchResult = tuple[list[tuple[str, JobSummary]], int, int, int, list[tuple[str, JobSummary]]]


@dataclass(frozen=True, slots=True)
class CommitInfo:
    """What one writer transaction did; given to :attr:`Store.on_commit` listeners."""

    versions: int
    applied: tuple[tuple[str, JobSummary], ...]
    skipped: int
    events: int
    committed_at: float
    oldest_read_at: float
    #: the final versions this batch carried of jobs whose end was stored already, by another
    #: process (several dispatchers: the follow lease's holder): skipped, not in ``applied``,
    #: but a submitter waiting on one of them learns its end here
    ended_before: tuple[tuple[str, JobSummary], ...] = ()


@dataclass(slots=True)
class WriterStats:
    versions: int = 0
    applied: int = 0
    skipped: int = 0
    older: int = 0
    events: int = 0
    batches: int = 0
    retries: int = 0
    #: callers' writes committed together with others' (one transaction, a savepoint each)
    grouped: int = 0
    #: the transactions of those groups (``grouped / groups``: callers a transaction)
    groups: int = 0
    #: the times the writer waited for more calls before a transaction (``Writer.linger``)
    lingers: int = 0
