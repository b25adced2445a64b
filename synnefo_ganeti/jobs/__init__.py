"""The job and opcode model shared by every part: statuses and status computation."""

from __future__ import annotations

from synnefo_ganeti.jobs._status import FINAL_STATUSES, JobStatus, calc_job_status

__all__ = ["FINAL_STATUSES", "JobStatus", "calc_job_status"]
