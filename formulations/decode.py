"""The cell formulation's decoder: decoded choices -> a :class:`Decision`.

A formulation's answer (cell choices with placements) becomes allocations with
plans, CPUs and host memory, the action each implies (the one rule,
:func:`apportion.decision.derive_action`), and a typed pending reason for
every job left out (stage ``candidates`` when no cell of it was feasible,
``solve`` when the capacity went elsewhere). Reads only the candidate graph's
schema (vertex attributes), never a builder.
"""

from __future__ import annotations

from typing import Any

import networkx as nx

from apportion.assembly import allocation, left_out
from apportion.cluster import Cluster
from apportion.decision import Action, Allocation, Decision, Pending, Reason, SolveReport
from apportion.estimation.models.analytic import nominal_placement
from apportion.formulations.cells import CellChoice
from apportion.formulations.schema import job_node
from apportion.jobs import JobSpec
from apportion.plans import ExecutionPlan

REASON_DETAIL = {
    Reason.NO_FIT_MEMORY.value: "no cell of any GPU type fits its memory",
    Reason.NO_GPU_TYPE.value: "its requested GPU type is not in the cluster",
    Reason.DEADLINE_UNMEETABLE.value: "no allocation finishes it before its deadline",
    Reason.NO_CAPACITY.value: "no GPU type has as many GPUs as any of its candidate sizes",
    Reason.NO_FIT_HOST.value: "every plan needs more CPUs or host memory per node than any "
                              "node of its GPU type has",
    Reason.NO_ESTIMATE.value: "the estimator has no iteration time for it",
}


def to_decision(g: nx.DiGraph, choices: list[CellChoice], cluster: Cluster,
                jobs: list[JobSpec], report: SolveReport,
                estimator: Any = None) -> Decision:
    """Turn decoded cell choices into allocations, actions and typed pending reasons.

    With an ``estimator``, an allocation spread over more nodes than the
    nominal (most consolidated) placement its candidate was estimated on is
    re-estimated on its real placement: the bottleneck bandwidth feeds back
    into the reported throughput.
    """
    by_id = {j.id: j for j in jobs}
    allocs: list[Allocation] = []
    placed = set()
    for ch in choices:
        d = g.nodes[ch.cell]
        job = by_id[ch.job]
        cpus: int | None = None
        mem: float | None = None
        if "cpus_per_gpu" in d:  # plans: the option says what it needs
            cpus = int(round(float(d["cpus_per_gpu"]) * int(d["gpus"])))
            mem = round(float(d["host_mem_gib_per_gpu"]) * int(d["gpus"]), 3)
        plan = d.get("plan") or ExecutionPlan(dp=int(d["dp"]), tp=int(d["tp"]), pp=int(d["stages"]),
                                              micro_batches=int(d["micro_batches"]))
        thr = float(d["est_throughput"])
        nominal = nominal_placement(cluster, d["gpu_type"], int(d["gpus"]))
        if estimator is not None and nominal is not None and len(ch.placement) > len(nominal):
            re = estimator.predict(job, plan, ch.placement, cluster)
            if re.feasible:
                thr = min(thr, re.throughput)
        allocs.append(allocation(
            ch.job, d["gpu_type"], int(d["gpus"]), plan, ch.placement, thr, job.running, cluster,
            cpus=cpus, host_memory_gib=mem, iter_time_s=float(d["iter_time_s"]),
            normalized_throughput=float(d["normalized"]),
            mem_per_gpu_gib=float(d["mem_per_gpu"]) / 2**30,
            global_batch_size=d.get("global_batch_size")))
        placed.add(ch.job)
    pending = []
    for job in jobs:
        if job.id in placed:
            continue
        jd = g.nodes[job_node(job.id)]
        reason = jd["reason"]
        if reason == Reason.DEADLINE_UNMEETABLE.value:
            # no allocation meets its deadline: refused for good, dropped, running or not
            # (ElasticFlow's admission control; formulations.deadline)
            pending.append(Pending(job.id, Reason(reason), jd.get("reason_detail") or
                                   REASON_DETAIL[reason], action=Action.DROP,
                                   stage="candidates"))
        elif job.running is not None:
            pending.append(left_out(job.id, True, Reason.PREEMPTED, ""))
        elif jd.get("over_quota"):
            pending.append(Pending(job.id, Reason.QUOTA,
                                   f"tenant {job.tenant}'s quota is used by earlier guaranteed jobs"))
        elif reason is not None:
            pending.append(Pending(job.id, Reason(reason),
                                   jd.get("reason_detail") or REASON_DETAIL.get(reason, ""),
                                   stage="candidates"))
        else:
            pending.append(left_out(job.id, False, Reason.NO_CAPACITY,
                                    "feasible cells exist; the capacity went to higher-value jobs"))
    return Decision(allocs, pending, report, formulation=g.graph.get("formulation", "cells"))
