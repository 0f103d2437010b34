"""Offer a round only the plans the executor's workloads run.

Each workload kind runs some execution plans and refuses others
(``runtime.workload.plan_supported``: the torch worker does not combine
pipeline and tensor parallelism, a user's torchrun script runs one stage, ...).
:func:`workload_plan_filter` is the predicate a round for real workers carries
(``RoundConfig.plan_filter``); the graph step that applies it is
:func:`apportion.formulations.plan_filter.drop_refused_plans`.
"""

from __future__ import annotations

import logging
from dataclasses import fields
from operator import attrgetter
from typing import Any

from apportion.formulations.plan_filter import PlanFilter, cell_plan, drop_refused_plans
from apportion.runtime.workload import cuda_present, plan_supported

from apportion.jobs import JobSpec
from apportion.plans import ExecutionPlan

log = logging.getLogger(__name__)

#: an execution plan's fields as one tuple (read in C): a memo key that hashes and compares
#: as a plain tuple, where the frozen dataclass builds a tuple per hash and two per compare
_plan_fields = attrgetter(*(f.name for f in fields(ExecutionPlan)))

__all__ = ["PlanFilter", "WorkloadPlanFilter", "cell_plan", "drop_refused_plans",
           "workload_plan_filter"]


class WorkloadPlanFilter:
    """The predicate for real workers (a :data:`PlanFilter`): ``filter(job, plan)`` is None
    where the job's ``workload.kind`` runs the plan on ``device``, else the reason.

    :meth:`job_key` says what a verdict reads of a job, so the candidate builder shares
    cells between jobs of one key (``formulations.candidates.shape_key``); a filter
    without one is asked job by job."""

    def __init__(self, device: str) -> None:
        self.device = device
        # a verdict reads only the workload's kind, the global batch and the plan: a round
        # asks it of every option of every job (a 1,000-job plans round: 181,000 times), so
        # once each
        self._memo: dict[tuple[str, int, Any], str | None] = {}

    @staticmethod
    def job_key(job: JobSpec) -> tuple[str, int]:
        """What a verdict reads of a job: jobs of one key get the same verdicts."""
        return (job.workload.kind if job.workload else "builtin", job.global_batch_size)

    def __call__(self, job: JobSpec, plan: ExecutionPlan) -> str | None:
        kind = job.workload.kind if job.workload else "builtin"
        memo = self._memo
        try:
            key = (kind, job.global_batch_size,
                   _plan_fields(plan) if type(plan) is ExecutionPlan else plan)
            if key in memo:
                return memo[key]
        except TypeError:  # an unhashable plan: judged afresh
            return self._verdict(kind, job, plan)
        if len(memo) > 100_000:
            memo.clear()
        memo[key] = got = self._verdict(kind, job, plan)
        return got

    def _verdict(self, kind: str, job: JobSpec, plan: ExecutionPlan) -> str | None:
        why = plan_supported(kind, plan, self.device)
        if why is not None:
            return why
        # the global batch never changes: it must split over the ranks and their
        # accumulation steps (a one-stage plan's micro-batches among them)
        parts = plan.dp * plan.accumulation_steps
        if job.global_batch_size % parts:
            return f"global batch {job.global_batch_size} does not split over dp*accumulation"
        if kind == "builtin" and plan.pp > 1 and (job.global_batch_size // parts) % max(
                1, plan.micro_batches):
            return "the per-rank batch does not split into the pipeline's micro-batches"
        return None


def workload_plan_filter(device: str | None = None) -> WorkloadPlanFilter:
    """The predicate for real workers; ``device`` (cpu | cuda) defaults to this host's."""
    return WorkloadPlanFilter(device or ("cuda" if cuda_present() else "cpu"))
