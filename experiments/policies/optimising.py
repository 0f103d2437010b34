"""apportion's own policy: every round is :func:`apportion.round.run_round`.

The cell formulation with its solver chain (HiGHS, CP-SAT, greedy fallback)
under ``time_budget_s``; estimates come from the analytic estimator, never
from the simulator's ground truth, so estimation error shows in the results.
Two things make it usable in a long replay:

* the estimator is memoised per (model, batch, GPU type, GPUs, stages) — a
  cell's estimate does not depend on the job's identity;
* it re-solves only on events (arrivals, completions, a runtime failure) and
  at least every ``resolve_every`` rounds, as Crius's algorithm 1 is triggered
  by arrivals and departures; in quiet rounds every job keeps its place;
* runtime feedback: a cell on which a job made no progress for a whole round
  (the job ran out of memory at runtime although the estimator said it fits)
  is removed from that job's candidates, as a real scheduler would after a
  crash report.

Ablations (Crius figure 20): ``no_scaling`` keeps every job at its requested
GPU count (``scales=(1.0,)``), ``no_hetero`` pins every job to its requested
GPU type.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from apportion.estimation.analytic import AnalyticEstimator
from apportion.experiments.policies.base import Choice, build_decision
from apportion.formulations.candidates import CandidateOptions

from apportion.view import View
from apportion.decision import Decision, Reason
from apportion.jobs import JobSpec, RunningState
from apportion.plans import Cell
from apportion.round import RoundConfig, run_round


class CachedEstimator(AnalyticEstimator):
    """The analytic estimator with a per-cell memo and a per-job blacklist of cells."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._memo: dict[tuple[Any, ...], Any] = {}
        self.blacklist: set[tuple[str, str, int]] = set()
        self.allowed_types: dict[str, str] = {}  # job -> the only type (no-hetero ablation)

    def best_in_cell(self, job: JobSpec, cell: Cell, cluster: Any) -> Any:
        if (job.id, cell.gpu_type, cell.gpus) in self.blacklist:
            return None
        only = self.allowed_types.get(job.id)
        if only is not None and cell.gpu_type != only:
            return None
        k = (job.model, job.global_batch_size, cell.gpu_type, cell.gpus, cell.stages)
        if k not in self._memo:
            self._memo[k] = super().best_in_cell(job, cell, cluster)
        return self._memo[k]


class Optimising:
    """Calls the spine's round loop every round."""

    def __init__(self, backend: str = "auto", time_budget_s: float = 5.0, search_depth: int = 3,
                 no_scaling: bool = False, no_hetero: bool = False, max_changes: int | None = None,
                 name: str | None = None, resolve_every: int = 12,
                 stage_counts: str = "powers") -> None:
        self.stage_counts = stage_counts
        self.backend = backend
        self.time_budget_s = time_budget_s
        self.search_depth = search_depth
        self.no_scaling = no_scaling
        self.no_hetero = no_hetero
        self.max_changes = max_changes
        self.resolve_every = resolve_every
        self.last_solve_round = -10**9
        self.est = CachedEstimator()
        suffix = "-na" if no_scaling else "-nh" if no_hetero else ""
        self.name = name or (f"apportion{suffix}" if backend != "greedy" else f"crius-greedy{suffix}")

    def _spec(self, js: Any) -> JobSpec:
        a = js.alloc
        running = None
        if a is not None:
            running = RunningState(a.gpu_type, a.gpus, a.stages, dict(a.placement), a.plan.tp)
        return replace(js.spec, iterations_done=min(js.spec.iterations - 1, int(js.done)),
                       running=running)

    def _quiet(self, state: Any) -> bool:
        """Nothing happened since the last solve: no arrival, completion or runtime failure."""
        return (not state.arrived_recent and not state.finished_recent
                and state.round_index - self.last_solve_round < self.resolve_every
                and not any(js.stalled for js in state.jobs)
                and any(js.alloc is not None for js in state.jobs))

    def decide(self, state: View) -> Decision:
        now = state.now
        t0 = time.perf_counter()
        if self._quiet(state):  # Crius re-schedules on arrivals and departures only
            keep = {js.id: Choice(js.alloc.gpu_type, js.alloc.gpus, dict(js.alloc.placement),
                                  js.est_rate, js.alloc.plan, js.plan_code)
                    for js in state.jobs if js.alloc is not None}
            return build_decision(state, keep, self.name, t0,
                                  {js.id: (Reason.NO_CAPACITY, "waiting for the next event")
                                   for js in state.jobs if js.alloc is None}, formulation="cells")
        self.last_solve_round = state.round_index
        for js in state.jobs:  # runtime feedback: a cell that made no progress is out
            a = js.alloc
            if a is not None and js.stalled:
                self.est.blacklist.add((js.id, a.gpu_type, a.gpus))
            if self.no_hetero and js.spec.requested_gpu_type:
                self.est.allowed_types[js.id] = js.spec.requested_gpu_type
        specs = [self._spec(js) for js in state.jobs]
        opts = (CandidateOptions(scales=(1.0,), stage_counts=self.stage_counts) if self.no_scaling
                else CandidateOptions(stage_counts=self.stage_counts))
        cfg = RoundConfig(backend=self.backend, time_budget_s=self.time_budget_s,
                          search_depth=self.search_depth, max_changes=self.max_changes,
                          candidates=opts)
        res = run_round(state.cluster, specs, now, cfg, estimator=self.est)
        dec = res.decision
        dec.meta = {**(dec.meta or {}), "plan_codes": {}, "policy_s": time.perf_counter() - t0}
        return dec
