"""Decision assembly, written once: choices -> allocations with actions, and typed pending.

Every policy ends the same way: for each job it chose a GPU type, a GPU count,
a placement and a plan; everyone else is pending. :func:`allocation` builds
one :class:`~apportion.decision.Allocation` (CPUs and host memory as the
GPUs' share of their nodes unless the policy sized them, the action from the
one rule :func:`~apportion.decision.derive_action`), :func:`left_out` one
:class:`~apportion.decision.Pending` (a running job left out is preempted).
The formulations' decoder and :func:`build_decision`, which baselines use,
both call these two.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from apportion.cluster import Cluster
from apportion.decision import (Action, Allocation, Decision, Pending, Reason, SolveReport,
                                derive_action)
from apportion.plans import ExecutionPlan


@dataclass
class Choice:
    """What a heuristic policy picked for one job."""

    gpu_type: str
    gpus: int
    placement: dict[str, int]
    est_rate: float = 0.0  # iterations/s as the policy sees it
    plan: ExecutionPlan | None = None
    code: str | None = None  # a ground-truth plan code (Morphling's exec_plan)
    cpus: int | None = None
    global_batch_size: int | None = None  # a batch the policy chose (None: the job's own)


def node_share(cluster: Cluster, placement: dict[str, int]) -> tuple[int, float]:
    """CPUs and host memory (GiB) that go with ``placement``: its GPUs' share of each node."""
    cpus = sum(cluster.nodes[n].cpus * k // cluster.nodes[n].gpus for n, k in placement.items())
    mem = sum(cluster.nodes[n].host_memory_gib * k / cluster.nodes[n].gpus
              for n, k in placement.items())
    return int(cpus), round(mem, 3)


def allocation(job: str, gpu_type: str, gpus: int, plan: ExecutionPlan,
               placement: dict[str, int], est_throughput: float, prev: Any, cluster: Cluster,
               cpus: int | None = None, host_memory_gib: float | None = None,
               **extra: Any) -> Allocation:
    """One allocation with its action (``prev``: where the job runs now, or None)."""
    share_cpus, share_mem = node_share(cluster, placement)
    a = Allocation(job=job, gpu_type=gpu_type, gpus=gpus, stages=plan.pp, plan=plan,
                   placement=dict(placement), est_throughput=est_throughput,
                   cpus=share_cpus if cpus is None else int(cpus),
                   host_memory_gib=share_mem if host_memory_gib is None else host_memory_gib,
                   **extra)
    a.action = derive_action(prev, gpu_type, gpus, plan.pp, a.placement, plan.tp)
    return a


def left_out(job: str, running: bool, reason: Reason, detail: str, stage: str = "solve",
             preempted_detail: str = "a higher-value allocation took its GPUs") -> Pending:
    """A job not placed: a running one is preempted, a queued one waits for ``reason``."""
    if running:
        return Pending(job, Reason.PREEMPTED, preempted_detail, Action.PREEMPT, stage=stage)
    return Pending(job, reason, detail, stage=stage)


def build_decision(view: Any, chosen: dict[str, Choice], name: str, t0: float | None = None,
                   reasons: dict[str, tuple[Reason, str]] | None = None,
                   report: SolveReport | None = None, formulation: str = "baseline") -> Decision:
    """A heuristic's decision: allocations for ``chosen``, typed pending reasons for the rest."""
    allocs: list[Allocation] = []
    codes: dict[str, str] = {}
    by_id = {js.id: js for js in view.jobs}
    # a rate source that says where its rates come from (an estimator's, on a real cluster)
    describe = getattr(view.rates, "describe", None)
    for jid, c in chosen.items():
        js = by_id[jid]
        plan = c.plan or ExecutionPlan(dp=c.gpus)
        allocs.append(allocation(jid, c.gpu_type, c.gpus, plan, c.placement,
                                 c.est_rate * max(1, js.spec.global_batch_size), js.alloc,
                                 view.cluster, cpus=c.cpus,
                                 iter_time_s=(1.0 / c.est_rate) if c.est_rate > 0 else None,
                                 source=describe(js, c.gpu_type, c.gpus, c.placement)
                                 if describe is not None else None,
                                 global_batch_size=c.global_batch_size))
        if c.code:
            codes[jid] = c.code
    reasons = reasons or {}
    pending = [left_out(js.id, js.alloc is not None,
                        *reasons.get(js.id, (Reason.NO_CAPACITY, f"{name}: not enough free GPUs")),
                        preempted_detail=f"{name} gave its GPUs to others")
               for js in view.jobs if js.id not in chosen]
    wall = time.perf_counter() - t0 if t0 is not None else 0.0
    rep = report or SolveReport(name, "feasible", None, None, None, wall, False)
    return Decision(allocs, pending, rep, formulation=formulation,
                    meta={"now_s": view.now, "plan_codes": codes})
