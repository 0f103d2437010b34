"""The round loop, written once, in order.

admission -> candidates -> formulate -> solve (chain, greedy hint and fallback)
-> validate -> (commit) -> (apply). State goes in, a :class:`RoundResult` comes
out; nothing here mutates the inputs. This module and ``cli.py`` are the only
core modules that sit on top of the areas.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from apportion.cluster import Cluster
from apportion.decision import Action, Allocation, Decision, Pending, Reason, SolveReport
from apportion.estimation.analytic import AnalyticEstimator, nominal_placement
from apportion.formulations.candidates import (CandidateOptions, build_candidates, job_node,
                                               problem_dump)
from apportion.formulations.cells import (CellChoice, build_cells_model, describe,
                                          hint_from_choices, objective_of)
from apportion.jobs import JobSpec
from apportion.plans import ExecutionPlan
from apportion.solvers.base import SolveResult, Status
from apportion.solvers.chain import backends_for, solve_chain
from apportion.solvers.greedy import GreedyCells
from apportion.solvers.slope import SlopeGreedy
from apportion.solvers.validator import validate

log = logging.getLogger(__name__)


FORMULATIONS = ("cells", "plans", "deadline", "gavel")
REASON_DETAIL = {
    Reason.NO_FIT_MEMORY.value: "no cell of any GPU type fits its memory",
    Reason.NO_GPU_TYPE.value: "its requested GPU type is not in the cluster",
    Reason.DEADLINE_UNMEETABLE.value: "no allocation finishes it before its deadline",
}


@dataclass
class RoundConfig:
    backend: str = "auto"  # auto | cp-sat | highs | greedy
    time_budget_s: float = 10.0
    search_depth: int = 3
    max_changes: int | None = None  # bound on running jobs changed per round
    candidates: CandidateOptions = field(default_factory=CandidateOptions)
    formulation: str = "cells"  # cells | plans
    plan_source: Any = None  # a formulations.plans.PlanSource (default: EstimatedPlans)
    plan_options: Any = None  # formulations.plans.PlanOptions
    quotas: dict[str, int] | None = None  # tenant -> GPUs for guaranteed jobs (plans)
    isolate: bool = False  # each backend in a child process (operators: a crash costs one answer)
    gavel_variant: str = "max-min-fairness"  # or max-sum-throughput (formulation gavel)
    plan_filter: Any = None  # (job, plan) -> None | reason: drop plans the job's workers refuse


@dataclass
class RoundResult:
    decision: Decision
    graph: nx.DiGraph
    problem: dict[str, Any]


def _action(job: JobSpec, a: Allocation) -> Action:
    r = job.running
    if r is None:
        return Action.START
    if (r.gpu_type, r.gpus, r.stages) == (a.gpu_type, a.gpus, a.stages):
        return Action.KEEP if (not r.placement or r.placement == a.placement) else Action.MIGRATE
    if r.gpu_type != a.gpu_type:
        return Action.MIGRATE
    return Action.RESIZE


def to_decision(g: nx.DiGraph, choices: list[CellChoice], cluster: Cluster,
                jobs: list[JobSpec], report: SolveReport,
                estimator: AnalyticEstimator | None = None) -> Decision:
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
        if "cpus_per_gpu" in d:  # plans: the option says what it needs
            cpus = int(round(float(d["cpus_per_gpu"]) * int(d["gpus"])))
            mem = float(d["host_mem_gib_per_gpu"]) * int(d["gpus"])
        else:  # cells: the GPUs' share of their nodes
            cpus = sum(cluster.nodes[n].cpus * k // cluster.nodes[n].gpus
                       for n, k in ch.placement.items())
            mem = sum(cluster.nodes[n].host_memory_gib * k / cluster.nodes[n].gpus
                      for n, k in ch.placement.items())
        plan = d.get("plan") or ExecutionPlan(dp=int(d["dp"]), tp=int(d["tp"]), pp=int(d["stages"]),
                                              micro_batches=int(d["micro_batches"]))
        thr = float(d["est_throughput"])
        nominal = nominal_placement(cluster, d["gpu_type"], int(d["gpus"]))
        if estimator is not None and nominal is not None and len(ch.placement) > len(nominal):
            re = estimator.predict(job, plan, ch.placement, cluster)
            if re.feasible:
                thr = min(thr, re.throughput)
        a = Allocation(
            job=ch.job, gpu_type=d["gpu_type"], gpus=int(d["gpus"]), stages=int(d["stages"]),
            plan=plan,
            placement=dict(ch.placement), est_throughput=thr,
            iter_time_s=float(d["iter_time_s"]), normalized_throughput=float(d["normalized"]),
            mem_per_gpu_gib=float(d["mem_per_gpu"]) / 2**30, cpus=int(cpus),
            host_memory_gib=round(mem, 3))
        a.action = _action(job, a)
        allocs.append(a)
        placed.add(ch.job)
    pending = []
    for job in jobs:
        if job.id in placed:
            continue
        reason = g.nodes[job_node(job.id)]["reason"]
        if job.running is not None:
            pending.append(Pending(job.id, Reason.PREEMPTED, "a higher-value allocation took its GPUs",
                                   Action.PREEMPT))
        elif g.nodes[job_node(job.id)].get("over_quota"):
            pending.append(Pending(job.id, Reason.QUOTA,
                                   f"tenant {job.tenant}'s quota is used by earlier guaranteed jobs"))
        elif reason is not None:
            pending.append(Pending(job.id, Reason(reason), REASON_DETAIL.get(reason, "")))
        else:
            pending.append(Pending(job.id, Reason.NO_CAPACITY,
                                   "feasible cells exist; the capacity went to higher-value jobs"))
    return Decision(allocs, pending, report, formulation=g.graph.get("formulation", "cells"))


def run_round(cluster: Cluster, jobs: list[JobSpec], now_s: float,
              config: RoundConfig | None = None,
              estimator: AnalyticEstimator | None = None) -> RoundResult:
    """One scheduling round on the cell formulation."""
    cfg = config or RoundConfig()
    if cfg.formulation not in FORMULATIONS:
        raise ValueError(f"unknown formulation {cfg.formulation!r}; choose {', '.join(FORMULATIONS)}")
    t0 = time.perf_counter()
    est = estimator or AnalyticEstimator()
    if cfg.formulation == "plans":
        from apportion.formulations.plans import EstimatedPlans, build_plan_candidates

        source = cfg.plan_source or EstimatedPlans(est)
        g = build_plan_candidates(cluster, jobs, now_s, source, cfg.quotas, cfg.plan_options)
    else:
        g = build_candidates(cluster, jobs, now_s, est, cfg.candidates)
    if cfg.plan_filter is not None:  # an executor's workloads run only some plans
        from apportion.runtime.plan_filter import drop_refused_plans
        drop_refused_plans(g, jobs, cfg.plan_filter)
    if cfg.formulation == "deadline":
        from apportion.formulations.deadline import DeadlineOptions, apply_deadlines

        apply_deadlines(g, jobs, now_s, DeadlineOptions(restart_s=cfg.candidates.restart_s))
        g.graph["formulation"] = "deadline"
    t_cand = time.perf_counter() - t0
    if cfg.formulation == "gavel":
        return _gavel_round(g, cluster, jobs, now_s, cfg, est, t0)
    model = build_cells_model(g, max_changes=cfg.max_changes)

    heuristic = (SlopeGreedy() if cfg.formulation == "plans" else GreedyCells(cfg.search_depth))
    greedy_choices, greedy_obj, greedy_wall = heuristic.solve(g)
    if cfg.max_changes is None or _changes(g, greedy_choices) <= cfg.max_changes:
        model.set_hint(hint_from_choices(model, greedy_choices))

    def accept(res: SolveResult) -> bool:
        assert res.x is not None and model.decode is not None
        dec = to_decision(g, model.decode(res.x), cluster, jobs, _placeholder())
        check = validate(dec, cluster, jobs)
        if not check.ok:
            log.error("%s answer rejected by the validator: %s", res.backend, check.violations)
        return check.ok

    left = max(0.05, cfg.time_budget_s - (time.perf_counter() - t0))
    backends = backends_for(cfg.backend, cfg.isolate, model.num_vars)
    best, attempts = solve_chain(model, backends, left, accept)
    attempt_dicts = [a.as_dict() for a in attempts]
    attempt_dicts.append({"backend": heuristic.name, "status": "feasible", "objective": greedy_obj,
                          "bound": None, "gap": None, "wall_s": round(greedy_wall, 6),
                          "message": f"search depth {cfg.search_depth}"
                          if heuristic.name == "greedy" else "Morphling's slope heuristic"})
    wall = time.perf_counter() - t0
    if best is not None and best.x is not None and model.decode is not None:
        choices = model.decode(best.x)
        # the tightest bound any backend proved (an LP relaxation's, say) measures the gap
        bounds = [a.bound for a in attempts if a.bound is not None and a.x is not None]
        bound = min(bounds) if bounds else best.bound
        gap = None
        if bound is not None and best.objective is not None:
            gap = max(0.0, bound - best.objective) / max(1.0, abs(best.objective))
        report = SolveReport(best.backend, best.status.value, best.objective, bound, gap,
                             wall, fallback=False, attempts=attempt_dicts)
    else:
        choices = greedy_choices
        explicit = cfg.backend == "greedy"
        why = "" if explicit else "; ".join(f"{a.backend}: {a.status.value} ({a.message})"
                                            for a in attempts) or "no backend ran"
        report = SolveReport(heuristic.name, Status.FEASIBLE.value if explicit else Status.FALLBACK.value,
                             greedy_obj, None, None, wall, fallback=not explicit,
                             fallback_reason=why, attempts=attempt_dicts)
        if not explicit:
            log.warning("no backend answered in time; greedy fallback used: %s", why)
    report.model_size = {**model.summary(), **describe(g), "candidates_s": round(t_cand, 4),
                         "node_classes": model.meta.get("node_classes")}
    decision = to_decision(g, choices, cluster, jobs, report, est)
    decision.meta = {"now_s": now_s, "objective_recomputed": objective_of(g, choices)}
    if cfg.formulation == "deadline":
        from apportion.formulations.deadline import deadline_projection

        decision.meta.update(deadline_projection(g, {c.job for c in choices}))
    final = validate(decision, cluster, jobs)
    if not final.ok:  # never act on an invalid decision: fall back to the (validated) greedy
        log.error("decision rejected by the validator: %s", final.violations)
        report.fallback, report.backend, report.status = True, heuristic.name, Status.FALLBACK.value
        report.fallback_reason = "validator rejected: " + "; ".join(final.violations)
        decision = to_decision(g, greedy_choices, cluster, jobs, report)
        if not validate(decision, cluster, jobs).ok:
            raise RuntimeError("greedy decision failed validation: " + str(final.violations))
    return RoundResult(decision, g, problem_dump(g))


def _gavel_round(g: nx.DiGraph, cluster: Cluster, jobs: list[JobSpec], now_s: float,
                 cfg: RoundConfig, est: AnalyticEstimator, t0: float) -> RoundResult:
    """Gavel's LP on the same candidates, rounded to whole GPUs for this round."""
    from apportion.solvers.gavel_round import gavel_round

    g.graph["formulation"] = "gavel"
    choices, info = gavel_round(g, cfg.gavel_variant)
    report = SolveReport(f"cvxpy/{info['solver']}", Status.OPTIMAL.value if info.get("lp_feasible")
                         else Status.FEASIBLE.value, info.get("objective"), info.get("objective"),
                         0.0, time.perf_counter() - t0, fallback=False,
                         attempts=[{"backend": f"cvxpy/{info['solver']}", "status": "optimal",
                                    "objective": info.get("objective"), "bound": None, "gap": None,
                                    "wall_s": round(info["wall_s"], 6),
                                    "message": f"Gavel {info['variant']} LP, rounded for one round"}])
    decision = to_decision(g, choices, cluster, jobs, report, est)
    decision.meta = {"now_s": now_s, "gavel_allocation": info.get("allocation", {})}
    check = validate(decision, cluster, jobs)
    if not check.ok:
        raise RuntimeError("Gavel rounding produced an invalid decision: " + str(check.violations))
    return RoundResult(decision, g, problem_dump(g))


def _changes(g: nx.DiGraph, choices: list[CellChoice]) -> int:
    chosen = {c.cell for c in choices}
    return sum(1 for n, d in g.nodes(data=True)
               if d.get("kind") == "cell" and d.get("current") and n not in chosen)


def _placeholder() -> SolveReport:
    return SolveReport("-", "-", None, None, None, 0.0, False)
