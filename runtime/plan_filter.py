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

from apportion.formulations.plan_filter import PlanFilter, cell_plan, drop_refused_plans
from apportion.runtime.workload import cuda_present, plan_supported

from apportion.jobs import JobSpec
from apportion.plans import ExecutionPlan

log = logging.getLogger(__name__)

__all__ = ["PlanFilter", "cell_plan", "drop_refused_plans", "workload_plan_filter"]


def workload_plan_filter(device: str | None = None) -> PlanFilter:
    """The predicate for real workers: a job gets only plans its ``workload.kind`` runs;
    ``device`` (cpu | cuda) defaults to this host's."""
    dev = device or ("cuda" if cuda_present() else "cpu")
    # a verdict reads only the workload's kind, the global batch and the plan: a round asks
    # it of every option of every job (a 1,000-job plans round: 181,000 times), so once each
    memo: dict[tuple[str, int, ExecutionPlan], str | None] = {}

    def job_key(job: JobSpec) -> tuple[str, int]:
        """What a verdict reads of a job: jobs of one key get the same verdicts (the
        candidate builder shares their cells)."""
        return (job.workload.kind if job.workload else "builtin", job.global_batch_size)

    def accept(job: JobSpec, plan: ExecutionPlan) -> str | None:
        kind = job.workload.kind if job.workload else "builtin"
        try:
            key = (kind, job.global_batch_size, plan)
            if key in memo:
                return memo[key]
        except TypeError:  # an unhashable plan: judged afresh
            return _verdict(kind, job, plan)
        if len(memo) > 100_000:
            memo.clear()
        memo[key] = got = _verdict(kind, job, plan)
        return got

    def _verdict(kind: str, job: JobSpec, plan: ExecutionPlan) -> str | None:
        why = plan_supported(kind, plan, dev)
        if why is not None:
            return why
        parts = plan.dp * plan.accumulation  # the global batch never changes: it must split
        if job.global_batch_size % parts:
            return f"global batch {job.global_batch_size} does not split over dp*accumulation"
        if kind == "builtin" and plan.pp > 1 and (job.global_batch_size // parts) % max(
                1, plan.micro_batches):
            return "the per-rank batch does not split into the pipeline's micro-batches"
        return None

    accept.job_key = job_key  # type: ignore[attr-defined]
    return accept
