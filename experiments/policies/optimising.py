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
from dataclasses import dataclass, fields, replace
from typing import Any

from apportion.estimation.analytic import AnalyticEstimator
from apportion.estimation.base import Sample
from apportion.estimation.rate_estimator import RateEstimator
from apportion.experiments.policies.base import Choice, build_decision
from apportion.formulations.candidates import CandidateOptions
from apportion.formulations.cells import CellChoice
from apportion.solvers.greedy import restore_placements
from apportion.solvers.validator import validate

from apportion.decision import Decision, Reason
from apportion.jobs import JobSpec, RunningState
from apportion.plans import Cell
from apportion.round import RoundConfig, run_round, to_decision


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
                 stage_counts: str = "powers", **quality: Any) -> None:
        self.stage_counts = stage_counts
        self.quality = QualityOptions.for_backend(backend, **quality)
        self.measured = MeasuredRates()
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
        if self.quality.resolve_when_queued and any(js.alloc is None for js in state.jobs):
            return False
        return (not state.arrived_recent and not state.finished_recent
                and state.round_index - self.last_solve_round < self.resolve_every
                and all(js.alloc is None or js.rate > 0 for js in state.jobs)
                and any(js.alloc is not None for js in state.jobs))

    def decide(self, state: Any, now: float) -> Decision:
        t0 = time.perf_counter()
        if self.quality.feedback:
            self.measured.observe(state)
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
            if a is not None and js.rate <= 0 and js.stalled_rounds > 0:
                self.est.blacklist.add((js.id, a.gpu_type, a.gpus))
            if self.no_hetero and js.job.gpu_type:
                self.est.allowed_types[js.id] = js.job.gpu_type
        specs = [self._spec(js) for js in state.jobs]
        opts = (CandidateOptions(scales=(1.0,), stage_counts=self.stage_counts) if self.no_scaling
                else CandidateOptions(stage_counts=self.stage_counts))
        opts = self.quality.candidate_options(opts)
        cfg = RoundConfig(backend=self.backend, time_budget_s=self.time_budget_s,
                          search_depth=self.search_depth, max_changes=self.max_changes,
                          candidates=opts)
        if self.quality.oracle:
            est: Any = oracle_estimator(state, self.est)
        elif self.quality.feedback:
            est = self.measured.estimator(state.cluster, self.est)
        else:
            est = self.est
        res = run_round(state.cluster, specs, now, cfg, estimator=est)
        dec = res.decision
        if opts.relocatable_running:
            dec = stable_decision(res, state.cluster, specs, est)
        dec.meta = {**(dec.meta or {}), "plan_codes": {}, "policy_s": time.perf_counter() - t0}
        return dec


# ---------------------------------------------------------------------------------------
# Schedule-quality options (issue 13, item 7): kept in one block so the round pipeline's
# refactor can move it whole. ``QualityOptions`` says which objective, bonuses and
# capacity accounting a policy's rounds use; ``oracle_estimator`` feeds the simulator's
# viewed rates through :class:`RateEstimator`; ``stable_decision`` puts kept jobs back
# where they run after a relocatable solve.
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class QualityOptions:
    """What apportion's own rounds optimise (Crius's greedy keeps Crius's objective).

    ``objective``/``place_bonus``/``remaining_exponent``/``weight_bounds``/
    ``keep_bonus``/``queue_weight``: see :mod:`apportion.formulations.objectives`;
    ``relocatable``: running jobs' present cells are attached to node groups, so a
    solve counts the GPUs a running job frees (by shrinking, moving or stopping) in
    the same round, then kept jobs are put back where they run;
    ``resolve_when_queued``: a round with a job waiting is never quiet (the model
    re-decides instead of leaving it for the next arrival or completion);
    ``oracle``: rates come from the simulator's view (``state.rate``) through
    :class:`apportion.estimation.rate_estimator.RateEstimator` instead of the
    analytic estimator (plans and memory stay analytic);
    ``feedback``: (estimated mode) throughputs measured while jobs ran replace the
    analytic estimate of that configuration and calibrate the others of the same
    model and batch (:class:`MeasuredRates`), as ``apportion run`` refits from
    measured iteration times.
    """

    objective: str = "normalized"
    place_bonus: float = 0.0
    remaining_exponent: float = 0.5
    weight_bounds: tuple[float, float] = (0.25, 4.0)
    keep_bonus: float = 0.3
    queue_weight: float = 0.25
    relocatable: bool = False
    resolve_when_queued: bool = False
    oracle: bool = False
    scales: tuple[float, ...] | None = None  # GPU counts as multiples of the request (None: Crius's)
    feedback: bool = False
    normalize: str = "requested"

    @classmethod
    def for_backend(cls, backend: str, **kw: Any) -> QualityOptions:
        """The defaults: Crius's (today's) for the greedy baseline, JCT-aware for the solver."""
        unknown = set(kw) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"unknown option(s) {', '.join(sorted(unknown))}")
        base = cls() if backend == "greedy" else SOLVER_DEFAULTS
        return replace(base, **kw)

    def candidate_options(self, opts: CandidateOptions) -> CandidateOptions:
        if self.scales is not None and opts.scales != (1.0,):  # the no-scaling ablation stays
            opts = replace(opts, scales=tuple(self.scales))
        return replace(opts, objective=self.objective, place_bonus=self.place_bonus,
                       remaining_exponent=self.remaining_exponent,
                       weight_bounds=self.weight_bounds, keep_bonus=self.keep_bonus,
                       queue_weight=self.queue_weight, relocatable_running=self.relocatable,
                       normalize=self.normalize)


# apportion's own rounds (measured on Crius's Venus trace and Philly days; see
# experiments/results/quality_crius.md): runs of the solver that count freed GPUs, place
# one more job before growing one, weigh short remaining work higher (tempered), judge
# speed against each job's slowest type, and keep little stickiness (a restart costs
# about a quarter of a round)
SOLVER_DEFAULTS = QualityOptions(objective="jct-aware", place_bonus=1.0, remaining_exponent=0.25,
                                 keep_bonus=0.1, relocatable=True, normalize="slowest",
                                 feedback=True)


def oracle_estimator(state: Any, inner: CachedEstimator) -> RateEstimator:
    """Rates as the simulator's view gives them (measured truth when its noise is 0).

    Cells the runtime saw fail (``inner.blacklist``) and types outside a no-hetero
    ablation's allowance rate 0, as with the analytic estimator.
    """
    by_id = {js.id: js for js in state.jobs}

    def rate(job: JobSpec, gpu_type: str, gpus: int) -> float:
        js = by_id.get(job.id)
        if js is None or (job.id, gpu_type, gpus) in inner.blacklist:
            return 0.0
        only = inner.allowed_types.get(job.id)
        if only is not None and gpu_type != only:
            return 0.0
        return state.rate(js, gpu_type, gpus)

    return RateEstimator(rate, inner=inner)


class MeasuredRates:
    """Iterations/s measured on configurations jobs really ran, by (model, batch, type, GPUs).

    A job's progress over a round it held its allocation for is what an executor
    reports (``apportion run`` turns it into measured iteration times); the
    simulator's ``JobState.rate`` is that measurement. Jobs of the same model and
    global batch share what was measured.
    """

    def __init__(self) -> None:
        self.samples: dict[tuple[str, int, str, int], Sample] = {}

    def observe(self, state: Any) -> None:
        for js in state.jobs:
            a = js.alloc
            if a is None or js.rate <= 0 or js.rounds_run <= 0:
                continue
            key = (js.spec.model, js.spec.global_batch_size, a.gpu_type, a.gpus)
            self.samples[key] = Sample(js.spec, a.plan, dict(a.placement), a.gpu_type, 1.0 / js.rate)

    def estimator(self, cluster: Any, inner: CachedEstimator) -> RateEstimator:
        """The analytic rate (best stage count of a size), corrected by what was measured."""

        def analytic_rate(job: JobSpec, gpu_type: str, gpus: int) -> float:
            best = 0.0
            s = 1
            while s <= min(gpus, 16):
                if gpus % s == 0:
                    e = inner.best_in_cell(job, Cell(job.id, gpu_type, gpus, s), cluster)
                    if e is not None and e.iter_time_s > 0:
                        best = max(best, 1.0 / e.iter_time_s)
                s *= 2
            return best

        return RateEstimator(analytic_rate, inner=inner, calibrate=True).fit(self.samples.values())


def stable_decision(res: Any, cluster: Any, jobs: list[JobSpec], est: Any) -> Decision:
    """The round's decision with kept jobs on their present placements (validated), or as is."""
    dec = res.decision
    g = res.graph
    choices = []
    for a in dec.allocations:
        cn = Cell(a.job, a.gpu_type, a.gpus, a.stages).node_id
        if cn not in g:
            return dec
        choices.append(CellChoice(a.job, cn, dict(a.placement)))
    moved = restore_placements(g, choices)
    out = to_decision(g, moved, cluster, jobs, dec.report, est)
    out.meta = dec.meta
    if not validate(out, cluster, jobs).ok:  # never act on an invalid answer: keep the original
        return dec
    return out
