"""The candidate graph's plan filter: drop every candidate whose plan a predicate refuses.

A round for an executor carries a predicate (``RoundConfig.plan_filter``:
``(job, plan) -> None | reason``; the runtime's ``workload_plan_filter`` says which
plans each workload kind runs) and :func:`drop_refused_plans` removes the refused
candidates before the model is built, so the solver never picks a plan the workers
would fail on. A job left without candidates is pending with reason
``no-supported-plan``. Graph work, so it lives with the formulations; the predicate is
the runtime's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from apportion.formulations.schema import job_node

from apportion.decision import Reason
from apportion.jobs import JobSpec
from apportion.plans import ExecutionPlan

log = logging.getLogger(__name__)

PlanFilter = Callable[[JobSpec, ExecutionPlan], "str | None"]


def cell_plan(d: dict[str, Any]) -> ExecutionPlan:
    """The plan a candidate stands for (what ``round.to_decision`` will allocate)."""
    plan = d.get("plan")
    if isinstance(plan, ExecutionPlan):
        return plan
    return ExecutionPlan(dp=int(d["dp"]), tp=int(d["tp"]), pp=int(d["stages"]),
                         micro_batches=int(d.get("micro_batches", 1)))


def drop_refused_plans(g: Any, jobs: list[JobSpec], accept: PlanFilter,
                       cells: Iterable[str] | None = None) -> int:
    """Remove the candidates of ``g`` whose plan ``accept`` refuses; returns how many.

    ``cells``: judge only these vertices, where the builder has judged the others already
    (the cell builder filters every cell but a running job's present one)."""
    by_id = {j.id: j for j in jobs}
    refused: dict[str, list[str]] = {}
    todo = list(g.nodes(data=True)) if cells is None else [(n, g.nodes[n]) for n in cells]
    for n, d in todo:
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
