"""The round, written once, in order: admit -> candidates -> formulate -> solve -> decode
-> validate -> commit -> apply.

Every driver makes its rounds here: ``solve-round`` (with or without a state
store), ``apportion run``, the simulator and ``compare``. A round takes a
:class:`~apportion.view.View` and a :class:`~apportion.view.Policy` and
returns a :class:`RoundResult`; nothing here mutates the inputs.

* **admit** (:mod:`apportion.admission`): jobs that can never be planned get a
  typed pending reason at stage ``admit``;
* **candidates, formulate, solve, decode**: a *staged* policy — apportion's
  formulations, :class:`FormulationPolicy` — exposes each stage, and they run
  here in order (the solver chain under the budget, the greedy as hint and
  fallback, every accepted answer checked by the validator once as it is
  accepted). A baseline is one ``decide(view)`` call in place of the four;
* **validate**: the independent validator checks every decision not already
  checked when it was accepted; an invalid decision is never used (a staged
  policy falls back to its greedy, a baseline's bug raises);
* **commit** and **apply**: hooks the caller passes (the state store's
  transaction; an executor or the simulator).

``run_round(cluster, jobs, now, config)`` is the library entry point: the
same pipeline with the policy :class:`RoundConfig` names (the cell
formulation by default) and the configured estimator as every policy's rate
source.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import networkx as nx

from apportion.admission import admit
from apportion.assembly import left_out
from apportion.cluster import Cluster
from apportion.decision import Decision, Reason, SolveReport
from apportion.estimation.rates import EstimatorRates
from apportion.estimation.registry import estimator_name, make_estimator
from apportion.formulations.candidates import (CandidateOptions, build_candidates, problem_dump,
                                                trim_scale_up)
from apportion.formulations.cells import (CellChoice, DecodeError, build_cells_model, describe,
                                          hint_from_choices, objective_of)
from apportion.formulations.decode import REASON_DETAIL, to_decision
from apportion.formulations.incremental import CandidateCache
from apportion.formulations.schema import current_cells
from apportion.jobs import JobSpec, RunningState
from apportion.solvers.base import SolveResult, Status, proven_gap
from apportion.solvers.chain import (LARGE_MODEL_COLUMNS, MIP_REL_GAP, backends_for, solve_chain,
                                     tighter)
from apportion.solvers.greedy import GreedyCells
from apportion.solvers.slope import SlopeGreedy
from apportion.solvers.validator import validate
from apportion.view import JobView, Policy, View

log = logging.getLogger(__name__)

FORMULATIONS = ("cells", "plans", "deadline", "gavel")
BACKENDS = ("auto", "cp-sat", "highs", "lp-round", "scip", "greedy")
STAGES = ("admit", "candidates", "formulate", "solve", "decode", "validate", "commit", "apply")
GAVEL_POLICIES = {"max-min-fairness": "gavel-max-min-fairness",
                  "max-sum-throughput": "gavel-max-sum-throughput"}
__all__ = ["BACKENDS", "FORMULATIONS", "FormulationPolicy", "InvalidDecision", "REASON_DETAIL", "RoundConfig",
           "RoundResult", "STAGES", "policy_for", "run_pipeline", "run_round", "to_decision",
           "view_of"]


class InvalidDecision(RuntimeError):
    """A policy returned a decision the validator rejects (a bug: never acted on)."""


@dataclass
class RoundConfig:
    backend: str = "auto"  # auto | cp-sat | highs | lp-round | greedy
    time_budget_s: float = 10.0
    # an answer this close to the best proven bound is final (every backend's tolerance);
    # from 1e-3 the chain tries LP rounding first (solvers.chain): replays trade the last
    # 0.1 % for time
    mip_gap: float = MIP_REL_GAP
    search_depth: int = 3
    max_changes: int | None = None  # bound on running jobs changed per round
    candidates: CandidateOptions = field(default_factory=CandidateOptions)
    formulation: str = "cells"  # cells | plans | deadline | gavel
    plan_source: Any = None  # a formulations.plans.PlanSource (default: EstimatedPlans)
    plan_options: Any = None  # formulations.plans.PlanOptions
    quotas: dict[str, int] | None = None  # tenant -> GPUs for guaranteed jobs (plans)
    isolate: bool = False  # each backend in a child process (operators: a crash costs one answer)
    gavel_variant: str = "max-min-fairness"  # or max-sum-throughput (formulation gavel)
    estimator: Any = "analytic"  # a name (estimation.registry.ESTIMATORS) or an estimator
    policy: str | None = None  # a registered policy name; None: the formulation's own
    plan_filter: Any = None  # (job, plan) -> None | reason: drop plans the job's workers refuse
    # when the round must have answered (a time.perf_counter() instant; solve-round sets it
    # from the command's start): None, the budget runs from the candidates stage
    deadline_s: float | None = None
    partitions: int = 1  # > 1: POP-style partitioned solve (solvers.partition)
    engine: str = "local"  # where a partitioned solve's tasks run: local | ray
    ray_address: str | None = None  # engine ray: an existing cluster (None: a local one)
    # the solver chain's budget counted in work, not seconds (solvers.chain): a replay then
    # repeats exactly on any machine under any load; ``time_budget_s`` stays a safety stop
    # (DETERMINISTIC_SAFETY times it), and a round it cut short says so in its attempts
    deterministic: bool = False


@dataclass
class RoundResult:
    """A round's decision, its candidate graph and per-stage seconds; ``problem`` (the
    ``--dump-problem`` JSON) is made from the graph when first read, so a replay that
    never reads it never pays for it."""

    decision: Decision
    graph: nx.DiGraph | None
    _problem: dict[str, Any] | None = field(default=None, repr=False)
    timing: dict[str, float] = field(default_factory=dict)  # seconds per stage, commit included

    @property
    def problem(self) -> dict[str, Any]:
        if self._problem is None:
            assert self.graph is not None
            self._problem = problem_dump(self.graph)
        return self._problem


# ---------------------------------------------------------------------------------------
# the pipeline
# ---------------------------------------------------------------------------------------
def run_pipeline(view: View, policy: Policy,
                 commit: Callable[[Decision], Any] | None = None,
                 apply: Callable[[Decision], Any] | None = None) -> RoundResult:
    """One round of ``policy`` on ``view`` through every stage, in order."""
    t0 = time.perf_counter()
    timing: dict[str, float] = {}

    def lap(stage: str, since: float) -> float:
        now = time.perf_counter()
        timing[stage] = round(timing.get(stage, 0.0) + now - since, 6)
        return now

    adm = admit(view.cluster, [js.spec for js in view.jobs], catalog=view.needs_catalog)
    ok = {j.id: j for j in adm.admitted}
    # a job whose nodes are gone no longer runs anywhere: it is planned as queued
    sub = replace(view, jobs=[replace(js, spec=ok[js.id], alloc=None) if js.id in adm.requeued
                              else js for js in view.jobs if js.id in ok])
    t = lap("admit", t0)
    graph: nx.DiGraph | None = None
    problem: dict[str, Any] | None = None
    staged = getattr(policy, "staged", False)
    decision = policy.shortcut(sub) if staged else None  # type: ignore[attr-defined]
    if decision is None and staged:
        graph = policy.candidates(sub)  # type: ignore[attr-defined]
        t = lap("candidates", t)
        form = policy.formulate(sub, graph)  # type: ignore[attr-defined]
        t = lap("formulate", t)
        solved = policy.solve(sub, graph, form)  # type: ignore[attr-defined]
        t = lap("solve", t)
        decision = policy.decode(sub, graph, form, solved)  # type: ignore[attr-defined]
        t = lap("decode", t)
    elif decision is None:
        decision = policy.decide(sub)
        t = lap("decide", t)
    if view.plan_filter is not None:  # the executor's workers run only some plans
        _refuse_plans(decision, sub, view.plan_filter)
    decision.pending.extend(adm.refused)
    specs = [js.spec for js in sub.jobs]
    if not decision.meta.get("validated"):
        check = validate(decision, view.cluster, specs)
        if not check.ok:
            if not staged:
                raise InvalidDecision(f"policy {getattr(policy, 'name', policy)} returned an "
                                      f"invalid decision: {'; '.join(check.violations[:5])}")
            log.error("decision rejected by the validator: %s", check.violations)
            decision = policy.fallback(sub, graph, "validator rejected: "  # type: ignore[attr-defined]
                                       + "; ".join(check.violations))
            decision.pending.extend(adm.refused)
            if not validate(decision, view.cluster, specs).ok:
                raise InvalidDecision("the greedy fallback failed validation too: "
                                      + "; ".join(check.violations))
    decision.meta.pop("validated", None)
    t = lap("validate", t)
    # the decision is complete before it is committed: what is stored is what is reported
    decision.meta["stages"] = dict(timing)
    decision.meta.setdefault("policy", getattr(policy, "name", type(policy).__name__))
    decision.meta.setdefault("now_s", view.now)
    if commit is not None:
        commit(decision)
        t = lap("commit", t)
    if apply is not None:
        apply(decision)
        t = lap("apply", t)
    if graph is None:
        problem = {"now_s": view.now, "policy": decision.meta["policy"],
                   "jobs": [{"job": js.id, "requested_gpus": js.spec.requested_gpus,
                             "requested_gpu_type": js.spec.requested_gpu_type}
                            for js in sub.jobs]}
    return RoundResult(decision, graph, problem, timing)


def _refuse_plans(decision: Decision, view: View, accept: Any) -> None:
    """Allocations whose plan the job's workload refuses become pending (``no-supported-plan``):
    a heuristic policy picks plans without asking the executor; a formulation never offers
    them (its candidates are filtered), so this only catches what a policy chose itself."""
    by_id = {js.id: js for js in view.jobs}
    kept = []
    for a in decision.allocations:
        js = by_id.get(a.job)
        why = accept(js.spec, a.plan) if js is not None else None
        if why is None:
            kept.append(a)
            continue
        log.warning("job %s: policy chose plan %s, which its workload refuses (%s)", a.job,
                    a.plan.label(), why)
        decision.pending.append(left_out(a.job, js.alloc is not None, Reason.NO_PLAN,
                                         f"plan {a.plan.label()}: {why}", stage="validate"))
    decision.allocations[:] = kept


# ---------------------------------------------------------------------------------------
# apportion's formulations as a staged policy
# ---------------------------------------------------------------------------------------
@dataclass
class Formulated:
    model: Any
    heuristic: Any
    greedy_choices: list[CellChoice] | None  # None: not run yet (a large round runs it later)
    greedy_obj: float
    greedy_wall: float
    specs: list[JobSpec]
    estimator: Any
    depth: int = 0  # the greedy's search depth used for the hint (the fallback may go deeper)

    def take(self, other: Formulated) -> None:
        """Adopt ``other``'s heuristic answer (the same model)."""
        self.heuristic, self.greedy_choices = other.heuristic, other.greedy_choices
        self.greedy_obj, self.greedy_wall, self.depth = other.greedy_obj, other.greedy_wall, \
            other.depth


@dataclass
class Solved:
    best: SolveResult | None
    attempts: list[SolveResult]
    wall_s: float
    # per accepted answer (by id): its decoded choices and decision, validated once
    accepted: dict[int, tuple[list[CellChoice], Decision]] = field(default_factory=dict)


class _Memo:
    """An estimator's ``best_in_cell`` memoised per (model, batch, cell), with runtime
    feedback: a cell a job made no progress on (it ran out of memory at runtime although
    the estimate said it fits) is removed from that job's candidates, as a real scheduler
    would after a crash report; ``only_type`` pins jobs to one type (an ablation)."""

    def __init__(self, inner: Any, per_job: bool = False) -> None:
        self.inner = inner
        self.per_job = per_job  # rates measured per job (a replay's view): memo by job, not model
        self.memo: dict[tuple[Any, ...], Any] = {}
        self.blacklist: set[tuple[str, str, int]] = set()
        self.only_type: dict[str, str] = {}
        self.fitted: str = self._fitted()

    def _fitted(self) -> str:
        """The inner estimator's fitted state (attributes ending in ``_``, scikit-learn's
        convention), so a refit between rounds empties the memo."""
        return repr(sorted((k, v) for k, v in vars(self.inner).items()
                           if k.endswith("_") and not k.startswith("_")
                           and isinstance(v, (dict, float, int, tuple, str))))

    def refresh(self) -> None:
        now = self._fitted()
        if now != self.fitted:
            self.memo.clear()
            self.fitted = now

    def best_in_cell(self, job: JobSpec, cell: Any, cluster: Cluster) -> Any:
        if (job.id, cell.gpu_type, cell.gpus) in self.blacklist:
            return None
        only = self.only_type.get(job.id)
        if only is not None and cell.gpu_type != only:
            return None
        k = (job.id if self.per_job else job.model, job.global_batch_size, cell.gpu_type,
             cell.gpus, cell.stages, cluster.fingerprint_hash)
        if k not in self.memo:
            self.memo[k] = self.inner.best_in_cell(job, cell, cluster)
        return self.memo[k]

    def predict(self, *args: Any, **kw: Any) -> Any:
        return self.inner.predict(*args, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _spec_of(js: JobView) -> JobSpec:
    """The job as a formulation sees it: iterations done and where it runs now."""
    a = js.alloc
    running = None if a is None else RunningState(a.gpu_type, a.gpus, a.stages, dict(a.placement),
                                                  a.plan.tp)
    done = min(js.spec.iterations - 1, int(js.done)) if js.done else js.spec.iterations_done
    return replace(js.spec, iterations_done=max(0, done), running=running)


class FormulationPolicy:
    """apportion's policies: a formulation (cells, plans, deadline) solved exactly.

    Each round: candidates from the estimator (the rate source's estimator on a
    real cluster; the view's rates through the configured estimator where the
    view measures them), the formulation's model, the solver chain under the
    budget warm-started from the greedy (Crius's algorithm 1, or Morphling's
    slope heuristic for plans), the best validated answer decoded. With
    ``resolve_every`` (replays) it re-solves only on events — arrivals,
    completions, a stalled job — and at least every ``resolve_every`` rounds,
    as Crius's algorithm 1 is triggered by arrivals and departures.
    """

    staged = True

    def __init__(self, config: RoundConfig | None = None, name: str | None = None,
                 resolve_every: int | None = None, no_hetero: bool = False) -> None:
        self.cfg = config or RoundConfig()
        if self.cfg.formulation not in ("cells", "plans", "deadline"):
            raise ValueError(f"unknown formulation {self.cfg.formulation!r}; choose cells, plans "
                             "or deadline (gavel is the Gavel policy)")
        if self.cfg.deterministic:
            check_deterministic(self.cfg)
        default = {"cells": "apportion", "plans": "apportion-plans",
                   "deadline": "apportion-deadline"}[self.cfg.formulation]
        if self.cfg.backend == "greedy" and self.cfg.formulation == "cells":
            default = "crius-greedy"
        self.name = name or default
        self.resolve_every = resolve_every
        self.no_hetero = no_hetero
        self.last_solve_round = -10**9
        est = self.cfg.estimator
        self.estimator = _Memo(make_estimator(est) if isinstance(est, str) else est)
        self._viewed: _Memo | None = None  # the view's measured rates (a replay)
        self._view_rate = _ViewRate(None, {})
        self._rates_moved = False  # this round's measurements corrected a rate
        self.rounds_made = 0
        self.cache = CandidateCache()  # per-job candidate fragments across rounds
        # every job ranked so far with its latest projected JCT (a finished job's last):
        # the trace's tail for ``tail_quantile`` (formulations/objectives.py)
        self.seen_jct: dict[str, float] = {}
        self._cache_owner: Any = None
        self._child: Any = None  # an isolated chain's child process, started early
        self._engine: Any = None  # a partitioned solve's engine (local processes or Ray)

    # -- the stages ----------------------------------------------------------------------
    def shortcut(self, view: View) -> Decision | None:
        """In a replay's quiet round (no arrival, completion or stall since the last solve),
        every running job keeps its place; None: solve. A round whose measured rates moved
        (a job found off its estimate, :class:`_ViewRate`) is not quiet."""
        measured = False
        if not isinstance(view.rates, EstimatorRates):  # a replay: measure every round
            self._estimator_for(view)  # (_ViewRate.observe, through the view's rates)
            measured = self._rates_moved
        if self.resolve_every is None or measured or not self._quiet(view):
            return None
        from apportion.assembly import Choice, build_decision

        t0 = time.perf_counter()
        keep = {js.id: Choice(js.alloc.gpu_type, js.alloc.gpus, dict(js.alloc.placement),
                              js.est_rate, js.alloc.plan, js.plan_code)
                for js in view.jobs if js.alloc is not None}
        return build_decision(view, keep, self.name, t0,
                              {js.id: (Reason.NO_CAPACITY, "waiting for the next event")
                               for js in view.jobs if js.alloc is None},
                              formulation=self.cfg.formulation)

    def _quiet(self, view: View) -> bool:
        return (not view.arrived_recent and not view.finished_recent
                and view.round_index - self.last_solve_round < (self.resolve_every or 0)
                and not any(js.stalled for js in view.jobs)
                and any(js.alloc is not None for js in view.jobs))

    def _estimator_for(self, view: View) -> Any:
        """On a real cluster the rate source is an estimator: use it directly (plans, memory
        and times). In a replay the view's rates are measurements every policy shares: read
        them through a :class:`RateEstimator` (times from the view, plans and memory from
        the configured estimator), so apportion knows what the baselines know."""
        if isinstance(view.rates, EstimatorRates):
            if view.rates.estimator is not self.estimator.inner:
                self.estimator = _Memo(view.rates.estimator)
            return self.estimator
        if self._viewed is None or self._view_rate.rates is not view.rates:
            from apportion.estimation.rate_estimator import RateEstimator

            self._view_rate = _ViewRate(view.rates, {})
            self._viewed = _Memo(RateEstimator(self._view_rate.rate, inner=self.estimator.inner),
                                 per_job=True)
        self._view_rate.jobs = {js.id: js for js in view.jobs}
        changed = self._view_rate.observe(view)
        for jid, t, g in changed:  # measured rates: re-estimate there
            self._viewed.inner.forget(jid, t, g)
            for k in [k for k in self._viewed.memo if k[0] == jid and k[2:4] == (t, g)]:
                del self._viewed.memo[k]
        self._rates_moved = bool(changed)
        return self._viewed

    def candidates(self, view: View) -> nx.DiGraph:
        t0 = time.perf_counter()
        if self.cfg.isolate and self.cfg.backend != "greedy" and self._child is None \
                and not self.partitioned:
            from apportion.solvers.isolation import ChainChild

            self._child = ChainChild().start()  # its imports overlap the candidates
        if self.partitioned and self._engine is None and self.cfg.formulation != "plans":
            from apportion.solvers.partition import make_engine

            self._engine = make_engine(self.cfg.engine, self.cfg.ray_address)  # starts now
        self.last_solve_round = view.round_index
        est = self._estimator_for(view)
        est.refresh()
        for js in view.jobs:  # runtime feedback: a cell that made no progress is out
            est.blacklist.update((js.id, t, g) for t, g in js.stalled_on)
            if self.no_hetero and js.spec.requested_gpu_type:
                est.only_type[js.id] = js.spec.requested_gpu_type
        specs = [_spec_of(js) for js in view.jobs]
        cfg = self.cfg
        if cfg.formulation == "plans":
            from apportion.formulations.plans import EstimatedPlans, PlanOptions, build_plan_candidates

            source = cfg.plan_source or EstimatedPlans(self.estimator.inner)
            if est is self._viewed:  # a replay: the view's measured rates set the times
                from apportion.formulations.plans import CalibratedPlans

                source = CalibratedPlans(source, self._view_rate.rate)
            # one objective for both formulations: the plans take the cells' objective knobs
            g = build_plan_candidates(view.cluster, specs, view.now, source, cfg.quotas,
                                      cfg.plan_options or PlanOptions.like(cfg.candidates))
        elif self.rounds_made == 0:  # one round (solve-round): no cache to fill
            g = build_candidates(view.cluster, specs, view.now, est, cfg.candidates,
                                 self.seen_jct)
        else:  # later rounds: only new or changed jobs are estimated again
            if self._cache_owner is not est:
                self.cache.clear()
                self._cache_owner = est
            stalls: dict[str, list[tuple[str, int]]] = {}
            for jid, t, n in est.blacklist:
                stalls.setdefault(jid, []).append((t, n))
            g = self.cache.build(view.cluster, specs, view.now, est, cfg.candidates,
                                 lambda j: (tuple(sorted(stalls.get(j.id, ()))),
                                            est.only_type.get(j.id), est.fitted,
                                            tuple(sorted(self._view_rate.factors.get(j.id, {})
                                                         .items()))),
                                 self.seen_jct)
        self.rounds_made += 1
        if cfg.formulation != "plans" and not cfg.candidates.scale_up_when_full:
            trim_scale_up(g)  # a full round: no job is offered more than it asked for
        if cfg.plan_filter is not None:  # an executor's workloads run only some plans
            from apportion.runtime.plan_filter import drop_refused_plans

            drop_refused_plans(g, specs, cfg.plan_filter)
        if cfg.formulation == "deadline":
            from apportion.formulations.deadline import DeadlineOptions, apply_deadlines

            apply_deadlines(g, specs, view.now, DeadlineOptions(restart_s=cfg.candidates.restart_s))
            g.graph["formulation"] = "deadline"
        g.graph.update(specs=specs, estimator=est, t0=t0,
                       candidates_s=round(time.perf_counter() - t0, 4))
        return g

    def formulate(self, view: View, g: nx.DiGraph, full: bool = False) -> Formulated:
        """The model and the heuristic's answer as its hint: the greedy's first pass
        (running jobs kept, queued ones placed where they fit: last round's answer extended);
        its local search runs only if the round falls back to it (``full``) or the greedy is
        the chosen backend, so a round the solver answers does not pay for it. On a large
        model (the chain answers from LP rounding first, which needs no hint) the greedy runs
        while an isolated chain solves, or after the chain (:meth:`decode`) if its answer is
        not proved within the tolerance or the round falls back to it."""
        cfg = self.cfg
        model = build_cells_model(g, max_changes=cfg.max_changes)
        if model.num_vars > LARGE_MODEL_COLUMNS and cfg.backend == "auto" and not full:
            return Formulated(model, None, None, 0.0, 0.0, g.graph["specs"], g.graph["estimator"])
        f = self._heuristic(g, model, full)
        assert f.greedy_choices is not None
        if cfg.max_changes is None or _changes(g, f.greedy_choices) <= cfg.max_changes:
            model.set_hint(hint_from_choices(model, f.greedy_choices))
        return f

    def _heuristic(self, g: nx.DiGraph, model: Any, full: bool) -> Formulated:
        cfg = self.cfg
        depth = cfg.search_depth if (full or cfg.backend == "greedy") else 0
        heuristic = SlopeGreedy() if cfg.formulation == "plans" else GreedyCells(depth)
        choices, obj, wall = heuristic.solve(g)
        return Formulated(model, heuristic, choices, obj, wall, g.graph["specs"],
                          g.graph["estimator"], depth)

    def solve(self, view: View, g: nx.DiGraph, f: Formulated) -> Solved:
        cfg = self.cfg
        t0 = time.perf_counter()
        model = f.model

        accepted: dict[int, tuple[list[CellChoice], Decision]] = {}

        def accept(res: SolveResult) -> bool:  # each accepted answer is validated once
            assert res.x is not None and model.decode is not None
            # a partitioned answer carries its own placements; a backend's is decoded
            try:
                choices = res.extra["choices"] if "choices" in res.extra else model.decode(res.x)
            except DecodeError as exc:  # an answer with no placements: the chain moves on
                log.error("%s answer could not be decoded: %s", res.backend, exc)
                return False
            if model.meta.get("residual_mode") and "choices" not in res.extra:
                got = objective_of(g, choices)  # a cell the freed nodes could not hold is out
                if res.objective is not None and got < res.objective - 1e-9:
                    res.message += f" (decoded {got:.6g}: a cell did not fit the freed nodes)"
                    res.objective = got
            dec = to_decision(g, choices, view.cluster, f.specs, _placeholder(), f.estimator)
            check = validate(dec, view.cluster, f.specs)
            if not check.ok:
                log.error("%s answer rejected by the validator: %s", res.backend, check.violations)
            else:
                accepted[id(res)] = (choices, dec)
            return check.ok

        # the budget covers the whole round: what is left after the stages so far, less a
        # reserve for decoding and writing the answer
        deadline = cfg.deadline_s if cfg.deadline_s is not None else \
            float(g.graph["t0"]) + cfg.time_budget_s
        reserve = answer_reserve(model.num_vars)
        if f.greedy_choices is None and not cfg.isolate:
            # the greedy floor may run after the chain (decode); an isolated chain makes
            # it meanwhile, in this process, while the child solves
            reserve += greedy_reserve(len(f.specs))
        left = max(0.05, deadline - time.perf_counter() - reserve)
        work_s: float | None = None
        if cfg.deterministic:  # the budget in work: the stages before it spend none of it
            work_s = cfg.time_budget_s
            left = max(left, DETERMINISTIC_SAFETY * cfg.time_budget_s)
        if self.partitioned and cfg.formulation != "plans":
            return self._solve_partitioned(g, f, left, accept, accepted, t0)
        backends = backends_for(cfg.backend, cfg.isolate, model.num_vars, cfg.mip_gap)
        child, self._child = self._child, None

        def greedy_meanwhile() -> None:  # the fallback, made while the child solves
            f.take(self._heuristic(g, model, full=False))

        later = f.greedy_choices is None and cfg.isolate and bool(backends)
        best, attempts = solve_chain(model, backends, left, accept, gap=cfg.mip_gap, child=child,
                                     meanwhile=greedy_meanwhile if later else None,
                                     work_s=work_s)
        return Solved(best, attempts, time.perf_counter() - t0, accepted)

    @property
    def partitioned(self) -> bool:
        return self.cfg.partitions > 1 or self.cfg.engine != "local"

    def _solve_partitioned(self, g: nx.DiGraph, f: Formulated, left: float,
                           accept: Callable[[SolveResult], bool],
                           accepted: dict[int, tuple[list[CellChoice], Decision]],
                           t0: float) -> Solved:
        """POP-k (:mod:`apportion.solvers.partition`) on the round, its parts on the engine."""
        from apportion.solvers.partition import make_engine, solve_partitioned

        cfg = self.cfg
        if self._engine is None:
            self._engine = make_engine(cfg.engine, cfg.ray_address)
        best, attempts = solve_partitioned(g, f.model, cfg.partitions, build_cells_model,
                                           self._engine, left, accept, gap=cfg.mip_gap)
        return Solved(best, attempts, time.perf_counter() - t0, accepted)

    def close(self) -> None:
        """Stop what the policy started (an early child, a Ray instance of its own)."""
        if self._child is not None:
            self._child.close()
            self._child = None
        if self._engine is not None:
            self._engine.close()
            self._engine = None

    def decode(self, view: View, g: nx.DiGraph, f: Formulated, s: Solved) -> Decision:
        cfg = self.cfg
        model = f.model
        attempt_dicts = [a.as_dict() for a in s.attempts]
        answered = s.best is not None and s.best.x is not None and model.decode is not None
        # the tightest bound any backend proved (an LP relaxation's, say) measures the gap
        bound = s.best.bound if s.best is not None else None
        for a in s.attempts:
            bound = tighter(bound, a, model.sense)
        gap = proven_gap(s.best, bound, model.sense) if answered else None
        if answered and f.greedy_choices is None and (gap is None or gap > cfg.mip_gap):
            # a large round's chain ran without the greedy's hint (LP rounding needs none);
            # when LP rounding failed, HiGHS alone may end on an early incumbent that stops
            # nearly every running job (Philly day 1's burst under load: 3 of 657 placed).
            # The greedy's first pass (every running job kept) costs well under a second:
            # an answer not proved within the tolerance must beat it
            f.take(self._heuristic(g, model, full=False))
        # a backend's answer worse than the greedy's (an LP rounding the clock stopped HiGHS
        # from improving): the greedy's is the round's answer, never the worse one
        beaten = (answered and f.greedy_choices is not None and s.best is not None
                  and s.best.objective is not None
                  and (f.greedy_obj > s.best.objective + 1e-9 if model.sense == "max"
                       else f.greedy_obj < s.best.objective - 1e-9))
        if beaten:
            answered = False
        if not answered and (f.greedy_choices is None or f.depth < cfg.search_depth):
            f = self._heuristic(g, model, full=True)  # falling back: the whole greedy now
        if f.greedy_choices is not None:
            attempt_dicts.append({"backend": f.heuristic.name, "status": "feasible",
                                  "objective": f.greedy_obj, "bound": None, "gap": None,
                                  "wall_s": round(f.greedy_wall, 6),
                                  "message": f"search depth {f.depth}" if f.heuristic.name ==
                                  "greedy" else "Morphling's slope heuristic"})
        wall = _elapsed(g)
        validated = False
        decision: Decision | None = None
        if answered:
            assert s.best is not None and s.best.x is not None and model.decode is not None
            if id(s.best) in s.accepted:
                choices, decision = s.accepted[id(s.best)]
            else:
                choices = model.decode(s.best.x)
            report = SolveReport(s.best.backend, s.best.status.value, s.best.objective, bound,
                                 gap, wall, fallback=False, attempts=attempt_dicts)
            validated = True  # accepted by the chain's validation
        else:
            assert f.greedy_choices is not None
            choices = f.greedy_choices
            explicit = cfg.backend == "greedy" or beaten
            why = "" if explicit else "; ".join(f"{a.backend}: {a.status.value} ({a.message})"
                                                for a in s.attempts) or "no backend ran"
            report = SolveReport(f.heuristic.name,
                                 Status.FEASIBLE.value if explicit else Status.FALLBACK.value,
                                 f.greedy_obj, None, None, wall, fallback=not explicit,
                                 fallback_reason=why, attempts=attempt_dicts)
            if beaten:
                report.fallback_reason = (f"the backends' best ({s.best.backend}: "
                                          f"{s.best.objective:.6g}) is worse than the greedy's")
            if not explicit:
                log.warning("no backend answered in time; greedy fallback used: %s", why)
        report.model_size = {**model.summary(), **describe(g),
                             "candidates_s": g.graph.get("candidates_s"),
                             "node_classes": model.meta.get("node_classes")}
        if decision is None:
            decision = to_decision(g, choices, view.cluster, f.specs, report, f.estimator)
        decision.report = report
        self._annotate(decision, g, choices, f)
        decision.meta["validated"] = validated
        return decision

    def fallback(self, view: View, g: nx.DiGraph | None, reason: str) -> Decision:
        """The greedy's decision (the validator rejected the solver's)."""
        assert g is not None
        f = self._heuristic(g, None, full=True)
        report = SolveReport(f.heuristic.name, Status.FALLBACK.value, f.greedy_obj, None, None,
                             _elapsed(g), fallback=True, fallback_reason=reason)
        decision = to_decision(g, f.greedy_choices, view.cluster, f.specs, report)
        self._annotate(decision, g, f.greedy_choices, f)
        return decision

    def _annotate(self, decision: Decision, g: nx.DiGraph, choices: list[CellChoice],
                  f: Formulated) -> None:
        est = f.estimator.inner if isinstance(f.estimator, _Memo) else f.estimator
        per_job = {j.id: estimator_name(est, j) for j in f.specs}
        for a in decision.allocations:
            a.estimator = per_job.get(a.job)
        decision.meta.update({"now_s": g.graph.get("now_s"), "policy": self.name,
                              "objective_recomputed": objective_of(g, choices),
                              "estimator": {"name": estimator_name(est, f.specs[0])
                                            .split(":")[0] if f.specs else "", "per_job": per_job},
                              "plan_codes": {}})
        if self.cfg.formulation == "deadline":
            from apportion.formulations.deadline import deadline_projection

            decision.meta.update(deadline_projection(g, {c.job for c in choices}))

    def decide(self, view: View) -> Decision:
        """The four middle stages in one call (no admission, no final validation: use
        :func:`run_pipeline` for a whole round)."""
        d = self.shortcut(view)
        if d is not None:
            return d
        g = self.candidates(view)
        f = self.formulate(view, g)
        d = self.decode(view, g, f, self.solve(view, g, f))
        d.meta.pop("validated", None)
        return d


class _ViewRate:
    """``rate_fn`` for a RateEstimator: a job spec's rate as the view gives it — the rate
    source corrected by the driver's measured-rate feedback (``JobView.rate_factor``,
    :mod:`apportion.measured_rates`; every policy gets the same correction through
    :meth:`View.rate`). It remembers the factors its estimates were made with, so that a
    job whose correction moved is estimated again there (:meth:`observe`). Stalled cells
    are not zeroed here: they reach the estimator as its blacklist."""

    def __init__(self, rates: Any, jobs: dict[str, JobView]) -> None:
        self.rates = rates
        self.jobs = jobs
        self.factors: dict[str, dict[tuple[str, int], float]] = {}  # job -> cell -> factor

    def observe(self, view: View) -> list[tuple[str, str, int]]:
        """The (job, GPU type, count) whose correction changed since the last round."""
        changed = []
        for js in view.jobs:
            seen = self.factors.get(js.id, {})
            if js.rate_factor == seen:
                continue
            changed += [(js.id, t, g) for t, g in sorted(set(seen) | set(js.rate_factor))
                        if seen.get((t, g)) != js.rate_factor.get((t, g))]
            self.factors[js.id] = dict(js.rate_factor)
        ids = {js.id for js in view.jobs}
        for jid in [j for j in self.factors if j not in ids]:  # jobs gone
            del self.factors[jid]
        return changed

    def rate(self, spec: JobSpec, gpu_type: str, gpus: int) -> float:
        js = self.jobs.get(spec.id)
        if js is None:
            return 0.0
        f = js.rate_factor.get((gpu_type, gpus), 1.0)
        return f * float(self.rates.rate(js, gpu_type, gpus))


def answer_reserve(variables: int) -> float:
    """Seconds kept back from the solvers for what follows them: decoding and validating
    the answer, the report, writing the decision (measured on the cell model: about 15 µs
    per variable on this project's 2-core machine, plus a fixed 50 ms)."""
    return 0.05 + 15e-6 * variables


def check_deterministic(cfg: RoundConfig) -> None:
    """Refuse a deterministic budget where the solve leaves this process (an isolated
    chain, a partitioned solve, an engine): their children run on the clock."""
    if cfg.isolate or cfg.partitions > 1 or cfg.engine != "local":
        raise ValueError("a deterministic budget solves in this process: it cannot be "
                         "combined with isolate, partitions or an engine")


# a deterministic round's safety stop, in multiples of its budget: the work budget is a
# nominal rate's seconds (solvers.base.WORK_PER_S), so a slower machine or a loaded one
# needs the clock's room to spend it
DETERMINISTIC_SAFETY = 4.0


def greedy_reserve(jobs: int) -> float:
    """Seconds kept back for the greedy's first pass after the chain, on a large round that
    skipped it before (measured on this project's 2-core machine: 0.03 s at 1,000 jobs,
    0.27 s at 5,000, 0.92 s at 10,000: about 0.1 ms per job)."""
    return 1e-4 * jobs


def _elapsed(g: nx.DiGraph) -> float:
    """Seconds since the round's candidates stage began (the budget's clock)."""
    return time.perf_counter() - float(g.graph["t0"])


def _changes(g: nx.DiGraph, choices: list[CellChoice]) -> int:
    chosen = {c.cell for c in choices}
    return sum(1 for n in current_cells(g) if n not in chosen)


def _placeholder() -> SolveReport:
    return SolveReport("-", "-", None, None, None, 0.0, False)


# ---------------------------------------------------------------------------------------
# views, policies and the library entry point
# ---------------------------------------------------------------------------------------
def view_of(cluster: Cluster, jobs: list[JobSpec], now_s: float, rates: Any,
            information: str = "estimated", **kw: Any) -> View:
    """A view of a queue as an operator's files or store describe it (no history)."""
    return View(now_s, cluster, [JobView.from_spec(j) for j in jobs], rates,
                information=information, **kw)


def check_mip_gap(value: float) -> None:
    """``--mip-gap`` must be a finite number in [0, 1)."""
    from apportion.errors import InputError

    if not (math.isfinite(value) and 0.0 <= value < 1.0):
        raise InputError("--mip-gap", "mip_gap", f"must be a number in [0, 1), got {value}")


def checked_config(backend: str = "auto", formulation: str = "cells", policy: str | None = None,
                   estimator: str = "analytic", **kw: Any) -> RoundConfig:
    """A :class:`RoundConfig` from command-line choices; a bad one is an
    :class:`~apportion.errors.InputError` naming the flag and the choices."""
    from apportion.errors import InputError
    from apportion.estimation.registry import ESTIMATORS

    if backend not in BACKENDS:
        raise InputError("--backend", "backend", f"{backend!r} is not one of {', '.join(BACKENDS)}")
    if formulation not in FORMULATIONS:
        raise InputError("--formulation", "formulation", f"{formulation!r} is not available; "
                         f"available: {', '.join(FORMULATIONS)}")
    if estimator not in ESTIMATORS:
        raise InputError("--estimator", "estimator", f"{estimator!r} is not one of "
                         f"{', '.join(ESTIMATORS)}")
    if "mip_gap" in kw:
        check_mip_gap(kw["mip_gap"])
    if policy is not None:
        from apportion.experiments.policies import POLICIES

        if policy not in POLICIES:
            raise InputError("--policy", "policy", f"{policy!r} is not a policy; known: "
                             f"{', '.join(sorted(POLICIES))}")
    return RoundConfig(backend=backend, formulation=formulation, policy=policy,
                       estimator=estimator, **kw)


def estimator_from(name: str, tables: Any = None, samples: Any = None,
                   batches: dict[str, int] | None = None) -> Any:
    """The ``--estimator`` choice as what a RoundConfig carries: a name, or for ``tables`` and
    ``auto`` an estimator holding the measurements (a CSV path and/or a store's samples)."""
    from apportion.estimation.models.measured import TableEstimator

    if name not in ("tables", "auto"):
        return name
    rows: tuple[Any, ...] = ()
    if tables is not None:
        rows += TableEstimator.from_csv(tables).rows
    if samples is not None:
        rows += TableEstimator.from_store_samples(samples, batches).rows
    return make_estimator(name, tables=TableEstimator(rows))


def policy_for(config: RoundConfig, estimator: Any = None) -> Policy:
    """The policy ``config`` names: a registered one, Gavel's for ``formulation=gavel``, or
    the formulation's own."""
    name = config.policy
    if name is None and config.formulation == "gavel":
        name = GAVEL_POLICIES.get(config.gavel_variant)
        if name is None:
            raise ValueError(f"unknown Gavel variant {config.gavel_variant!r}; choose "
                             f"{', '.join(GAVEL_POLICIES)}")
    if name is not None:
        from apportion.experiments.policies import make_policy

        return make_policy(name, config=config)
    if estimator is not None:
        config = replace(config, estimator=estimator)
    return FormulationPolicy(config)


def run_round(cluster: Cluster, jobs: list[JobSpec], now_s: float,
              config: RoundConfig | None = None, estimator: Any = None,
              policy: Policy | None = None,
              commit: Callable[[Decision], Any] | None = None,
              apply: Callable[[Decision], Any] | None = None,
              history: Mapping[str, Any] | None = None,
              seen_jct: Mapping[str, float] | None = None) -> RoundResult:
    """One round on an operator's queue (the library API): admission, the policy
    ``config`` names (the cell formulation by default), validation, then the caller's
    ``commit`` and ``apply`` hooks. ``history`` (job id -> :class:`~apportion.store_history.
    JobHistory`, what ``job_histories`` reads from a store) gives history-aware policies
    the attained service a replay would give them; ``seen_jct`` (job id -> JCT s, what
    ``finished_jcts`` reads) the jobs apportion's policies rank the tail against, as a
    long-lived policy remembers them (``tail_quantile``)."""
    cfg = config or RoundConfig()
    if cfg.formulation not in FORMULATIONS:
        raise ValueError(f"unknown formulation {cfg.formulation!r}; choose {', '.join(FORMULATIONS)}")
    pol = policy or policy_for(cfg, estimator)
    est = estimator
    if est is None:
        inner = getattr(pol, "estimator", None)
        est = inner.inner if isinstance(inner, _Memo) else (
            make_estimator(cfg.estimator) if isinstance(cfg.estimator, str) else cfg.estimator)
    rates = EstimatorRates(est, cluster)
    if isinstance(pol, FormulationPolicy) and pol.estimator.inner is not est:
        pol.estimator = _Memo(est)
    if isinstance(pol, FormulationPolicy) and seen_jct:
        pol.seen_jct.update({j: v for j, v in seen_jct.items() if j not in pol.seen_jct})
    view = view_of(cluster, jobs, now_s, rates)
    view.plan_filter = cfg.plan_filter
    for js in view.jobs if history else ():
        h = history.get(js.id)
        if h is not None:
            js.gpu_seconds, js.run_seconds = h.gpu_seconds, h.run_seconds
            js.time_on_type = dict(h.time_on_type)
            js.first_start, js.restarts = h.first_start, h.restarts
            js.preemptions, js.rounds_run = h.preemptions, h.rounds_run
    try:
        return run_pipeline(view, pol, commit, apply)
    finally:
        if policy is None and isinstance(pol, FormulationPolicy):
            pol.close()  # this round's own policy: its child or Ray instance goes with it
