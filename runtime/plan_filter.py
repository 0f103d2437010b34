"""Offer a round only the plans the executor's workloads run.

Each workload kind runs some execution plans and refuses others
(``runtime.workload.plan_supported``: the torch worker does not combine
pipeline and tensor parallelism, a user's torchrun script runs one stage, ...).
A round for an executor carries a predicate (``RoundConfig.plan_filter``:
``(job, plan) -> None | reason``) and :func:`drop_refused_plans` removes every
candidate whose plan the job's workload refuses before the model is built, so
the solver never picks a plan the workers would fail on. A job left without
candidates is pending with reason ``no-supported-plan``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from apportion.formulations.schema import job_node
from apportion.runtime.workload import cuda_present, plan_supported

from apportion.decision import Reason
from apportion.jobs import JobSpec
from apportion.plans import ExecutionPlan

log = logging.getLogger(__name__)

PlanFilter = Callable[[JobSpec, ExecutionPlan], "str | None"]


def workload_plan_filter(device: str | None = None) -> PlanFilter:
    """The predicate for real workers: a job gets only plans its ``workload.kind`` runs;
    ``device`` (cpu | cuda) defaults to this host's."""
    dev = device or ("cuda" if cuda_present() else "cpu")

    def accept(job: JobSpec, plan: ExecutionPlan) -> str | None:
        kind = job.workload.kind if job.workload else "builtin"
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

    return accept


def cell_plan(d: dict[str, Any]) -> ExecutionPlan:
    """The plan a candidate stands for (what ``round.to_decision`` will allocate)."""
    plan = d.get("plan")
    if isinstance(plan, ExecutionPlan):
        return plan
    return ExecutionPlan(dp=int(d["dp"]), tp=int(d["tp"]), pp=int(d["stages"]),
                         micro_batches=int(d.get("micro_batches", 1)))


def drop_refused_plans(g: Any, jobs: list[JobSpec], accept: PlanFilter) -> int:
    """Remove the candidates of ``g`` whose plan ``accept`` refuses; returns how many."""
    by_id = {j.id: j for j in jobs}
    refused: dict[str, list[str]] = {}
    for n, d in list(g.nodes(data=True)):
        if d.get("kind") != "cell" or d.get("job") not in by_id:
            continue
        why = accept(by_id[d["job"]], cell_plan(d))
        if why is not None:
            refused.setdefault(d["job"], []).append(why)
            g.remove_node(n)
    for job_id, whys in refused.items():
        jn = job_node(job_id)
        if jn in g and not any(g.nodes[c].get("kind") == "cell" for c in g.successors(jn)):
            g.nodes[jn]["reason"] = Reason.NO_PLAN.value
            g.nodes[jn]["reason_detail"] = whys[0]
        log.info("job %s: %d candidate plan(s) refused by its workload (%s)", job_id, len(whys),
                 whys[0])
    return sum(len(w) for w in refused.values())
