"""apportion's own policy: a formulation (a recipe of :mod:`apportion.policies.recipes`)
solved by the solver chain under the round's budget, as the pipeline's staged policy.

Each round: candidates from the estimator (the rate source's estimator on a real
cluster; the view's rates through the configured estimator where the view measures
them), the recipe's model, the solver chain warm-started from the recipe's heuristic
(Crius's algorithm 1, or Morphling's slope heuristic for plans), the best validated
answer decoded. :func:`Optimising` builds one from a driver's config and the registry's
fixed options.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

import networkx as nx
import numpy as np

from apportion.assembly import Choice, build_decision
from apportion.cluster import Cluster
from apportion.decision import Decision, Reason, SolveReport
from apportion.estimation.rate_estimator import RateEstimator
from apportion.estimation.rates import EstimatorRates
from apportion.estimation.registry import estimator_name, make_estimator, source_of
from apportion.formulations.candidates import CandidateOptions, trim_scale_up
from apportion.formulations.cells import (
    CellChoice,
    DecodeError,
    describe,
    hint_from_choices,
    objective_of,
)
from apportion.formulations.decode import to_decision
from apportion.formulations.graph_bulk import drop_cached_views
from apportion.formulations.incremental import CandidateCache
from apportion.formulations.objectives import (
    FromRound,
    ObjectiveOptions,
    apply_objective,
    from_round,
)
from apportion.formulations.plan_filter import drop_refused_plans
from apportion.formulations.schema import current_cells, name_of
from apportion.formulations.siblings import (
    apply_sibling_options,
    fold_member_values,
    sibling_keys,
)
from apportion.jobs import JobSpec, RunningState
from apportion.plans import Cell
from apportion.policies.base import requested_type
from apportion.policies.config import (
    DETERMINISTIC_SAFETY,
    RoundConfig,
    answer_reserve,
    check_deterministic,
    greedy_reserve,
)
from apportion.policies.recipes import RECIPES, Recipe, cells_model
from apportion.policies.siblings import Siblings
from apportion.solvers.base import SolveResult, Status, objective_gap, proven_gap
from apportion.solvers.chain import LARGE_MODEL_COLUMNS, backends_for, chain_names, solve_chain
from apportion.solvers.chain_rules import tighter
from apportion.solvers.isolation import ChainChild
from apportion.solvers.partition import EngineUnavailable, make_engine, solve_partitioned
from apportion.solvers.persistent import HighsSession
from apportion.validator import validate
from apportion.view import JobView, View

log = logging.getLogger(__name__)


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
    # what the heuristic's answer breaks of the model (a researcher's added row, say): an
    # answer that breaks a row is never the round's, neither as floor nor as fallback
    breaks: list[str] = field(default_factory=list)

    def take(self, other: Formulated) -> None:
        """Adopt ``other``'s heuristic answer (the same model)."""
        self.heuristic, self.greedy_choices = other.heuristic, other.greedy_choices
        self.greedy_obj, self.greedy_wall, self.depth = other.greedy_obj, other.greedy_wall, \
            other.depth
        self.breaks = other.breaks


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
        # per job (per-job memos only): its memo keys, so a measured cell or a job gone is
        # forgotten without a pass over every job's entries (a 14-day replay's memo holds
        # 13,000 jobs' cells; one pass a round was 4 % of its CPU)
        self.keys_of: dict[str, list[tuple[Any, ...]]] = {}
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
            self.keys_of.clear()
            self.fitted = now

    def forget(self, cells: set[tuple[str, str, int]]) -> None:
        """Drop the memoised answers of these (job, GPU type, count) of a per-job memo."""
        for jid in {c[0] for c in cells}:
            keys = self.keys_of.get(jid, [])
            gone = [k for k in keys if (jid, k[2], k[3]) in cells]
            for k in gone:
                del self.memo[k]
            if gone:
                self.keys_of[jid] = [k for k in keys if (jid, k[2], k[3]) not in cells]

    def forget_jobs(self, ids: list[str]) -> None:
        """Drop every memoised answer of these jobs (gone from the view)."""
        for jid in ids:
            for k in self.keys_of.pop(jid, ()):
                del self.memo[k]

    def shape_of(self, job: JobSpec) -> tuple[str, int] | None:
        """What this memo's answers read of a job (its model and batch), or None where they
        are the job's own: rates measured per job, a blacklisted cell or a pinned type."""
        if self.per_job or job.id in self.only_type:
            return None
        if self.blacklist and any(b[0] == job.id for b in self.blacklist):
            return None
        if job.batch_range is not None:  # its cells read its range and statistics too
            return (job.model, job.global_batch_size, job.batch_range, job.grad_stats)
        return (job.model, job.global_batch_size)

    def best_in_cell(self, job: JobSpec, cell: Any, cluster: Cluster) -> Any:
        if (job.id, cell.gpu_type, cell.gpus) in self.blacklist:
            return None
        only = self.only_type.get(job.id)
        if only is not None and cell.gpu_type != only:
            return None
        k = (job.id if self.per_job else job.model, job.global_batch_size, cell.gpu_type,
             cell.gpus, cell.stages, cluster.fingerprint_hash, job.grad_stats)
        got = self.memo.get(k, self)
        if got is self:
            got = self.memo[k] = self.inner.best_in_cell(job, cell, cluster)
            if self.per_job:
                self.keys_of.setdefault(job.id, []).append(k)
        return got

    @property
    def rates_batches(self) -> bool:
        return bool(getattr(self.inner, "rates_batches", False))

    def best_at_batch(self, job: JobSpec, cell: Any, cluster: Cluster, batch: int) -> Any:
        """The inner estimator's estimate at a global batch the job lets the scheduler
        choose (formulations/batch_options.py), memoised and fed back like
        :meth:`best_in_cell`."""
        if (job.id, cell.gpu_type, cell.gpus) in self.blacklist:
            return None
        only = self.only_type.get(job.id)
        if only is not None and cell.gpu_type != only:
            return None
        k = (job.id if self.per_job else job.model, ("batch", int(batch), job.global_batch_size),
             cell.gpu_type, cell.gpus, cell.stages, cluster.fingerprint_hash, job.grad_stats)
        got = self.memo.get(k, self)
        if got is self:
            got = self.memo[k] = self.inner.best_at_batch(job, cell, cluster, batch)
            if self.per_job:
                self.keys_of.setdefault(job.id, []).append(k)
        return got

    def predict(self, *args: Any, **kw: Any) -> Any:
        return self.inner.predict(*args, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _spec_of(js: JobView) -> JobSpec:
    """The job as a formulation sees it: iterations done, where it runs now, and whether it
    was admitted (a job that started once was: a deadline round keeps its guarantee)."""
    a = js.alloc
    running = None if a is None else RunningState(a.gpu_type, a.gpus, a.stages, dict(a.placement),
                                                  a.plan.tp)
    done = min(js.spec.iterations - 1, int(js.done)) if js.done else js.spec.iterations_done
    return replace(js.spec, iterations_done=max(0, done), running=running,
                   admitted=js.spec.admitted or js.first_start is not None)


class FormulationPolicy:
    """apportion's policies: a formulation (a :class:`~apportion.policies.recipes.Recipe`:
    cells, plans, deadline, or one a researcher registered) solved exactly.

    Each round: candidates from the estimator (the rate source's estimator on a
    real cluster; the view's rates through the configured estimator where the
    view measures them), the formulation's model, the solver chain under the
    budget warm-started from the greedy (Crius's algorithm 1, or Morphling's
    slope heuristic for plans), the best validated answer decoded. With
    ``resolve_every`` (replays) it re-solves only on events — arrivals,
    completions, a stalled job — and at least every ``resolve_every`` rounds,
    as Crius's algorithm 1 is triggered by arrivals and departures.
    """

    def __init__(self, config: RoundConfig | None = None, name: str | None = None,
                 resolve_every: int | None = None, no_hetero: bool = False,
                 gains: str = "rates", siblings: bool = True) -> None:
        self.cfg = config or RoundConfig()
        recipe = RECIPES.get(self.cfg.formulation)
        if recipe is None:
            raise ValueError(f"unknown formulation {self.cfg.formulation!r}; choose "
                             f"{', '.join(RECIPES)} (gavel is the Gavel policy)")
        self.recipe: Recipe = recipe
        if self.cfg.deterministic:
            check_deterministic(self.cfg)
        self.name = name or recipe.policy
        self.resolve_every = resolve_every
        self.no_hetero = no_hetero
        self.last_solve_round = -10**9
        est = self.cfg.estimator
        self.estimator = _Memo(make_estimator(est) if isinstance(est, str) else est)
        self._viewed: _Memo | None = None  # the view's measured rates (a replay)
        self._view_rate = _ViewRate(None, {})
        self._rates_moved = False  # this round's measurements corrected a rate
        self._stats_seen: dict[str, tuple[float, float]] = {}  # reported gradient statistics
        self.rounds_made = 0
        self.cache = CandidateCache()  # per-job candidate fragments across rounds
        # every job ranked so far with its latest projected JCT (a finished job's last):
        # the trace's tail for ``tail_quantile`` (formulations/objectives.py)
        self.seen_jct: dict[str, float] = {}
        self._cache_owner: Any = None
        self._last_est: Any = None  # the estimator this round's candidates read
        self._child: Any = None  # an isolated chain's child process, started early
        self._engine: Any = None  # a partitioned solve's engine (local processes or Ray)
        self._engine_note = ""  # why the engine asked for is not the one in use
        # the round's LP kept alive across rounds (an in-process chain; RoundConfig.persistent)
        self.session: HighsSession | None = None
        # fine-tuning siblings: transfer options and merged cells in the cell model
        # (policies.siblings); a recipe whose model is not the cell model gets none, nor
        # does a partitioned solve (a merged cell's column spans two jobs' parts)
        self.siblings: Siblings | None = Siblings(gains=gains) if (
            siblings and self.recipe.model is cells_model and self.cfg.partitions <= 1) \
            else None

    # -- the stages ----------------------------------------------------------------------
    def shortcut(self, view: View) -> Decision | None:
        """In a replay's quiet round (no arrival, completion or stall since the last solve),
        every running job keeps its place; None: solve. A round whose measured rates moved
        (a job found off its estimate, :class:`_ViewRate`) is not quiet."""
        if self.siblings is not None:  # finished siblings and new jobs, every round
            self.siblings.observe(view)
        measured = False
        if not isinstance(view.rates, EstimatorRates):  # a replay: measure every round
            self._estimator_for(view)  # (_ViewRate.observe, through the view's rates)
            measured = self._rates_moved
        if self.resolve_every is None or measured or not self._quiet(view):
            return None
        t0 = time.perf_counter()
        keep = {js.id: Choice(js.alloc.gpu_type, js.alloc.gpus, dict(js.alloc.placement),
                              js.est_rate, js.alloc.plan, js.plan_code,
                              global_batch_size=js.alloc.global_batch_size)
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
        fresh = self._view_rate.rates is not view.rates
        if fresh:  # (the view's rate function also serves models the catalog lacks)
            self._view_rate = _ViewRate(view.rates, {})
        if isinstance(view.rates, EstimatorRates):
            self._view_rate.jobs = {js.id: js for js in view.jobs}
            if view.rates.estimator is not self.estimator.inner:
                self.estimator = _Memo(view.rates.estimator)
            return self.estimator
        if self._viewed is None or fresh:
            # a rate source that rates any global batch (a replay on Pollux's truth) rates a
            # job's batch options too (formulations/batch_options.py)
            batches = self._view_rate.batch_rate if getattr(view.rates, "rates_batches",
                                                            False) else None
            self._viewed = _Memo(RateEstimator(self._view_rate.rate, inner=self.estimator.inner,
                                               batch_rate_fn=batches), per_job=True)
        self._view_rate.jobs = {js.id: js for js in view.jobs}
        changed, gone = self._view_rate.observe(view)
        for jid, t, g in changed:  # measured rates: re-estimate there
            self._viewed.inner.forget(jid, t, g)
        self._viewed.forget(set(changed))
        # a job whose reported gradient statistics moved (a new epoch) is rated anew: its
        # memoised answers at the old ones are never asked again
        moved = [js.id for js in view.jobs if js.spec.grad_stats is not None
                 and self._stats_seen.get(js.id) != js.spec.grad_stats]
        for js in view.jobs:
            if js.spec.grad_stats is not None:
                self._stats_seen[js.id] = js.spec.grad_stats
        for jid in gone:
            self._stats_seen.pop(jid, None)
        self._viewed.forget_jobs(gone + moved)
        self._rates_moved = bool(changed)
        return self._viewed

    # -- what a recipe's candidate builder reads (recipes.CandidateContext) -------------
    def base_estimator(self) -> Any:
        return self.estimator.inner

    def measured_rate(self) -> Callable[[JobSpec, str, int], float] | None:
        return self._view_rate.rate if self._viewed is not None and \
            self._last_est is self._viewed else None

    def view_rate(self) -> Callable[[JobSpec, str, int], float]:
        return self._view_rate.rate

    def cached_candidates(self, view: View, specs: list[JobSpec], est: Any,
                          scale_up: bool = True) -> nx.DiGraph:
        """Later rounds: only new or changed jobs are estimated again."""
        if self._cache_owner is not est:
            self.cache.clear()
            self._cache_owner = est
        stalls: dict[str, list[tuple[str, int]]] = {}
        for jid, t, n in est.blacklist:
            stalls.setdefault(jid, []).append((t, n))
        return self.cache.build(view.cluster, specs, view.now, est, self.cfg.candidates,
                                lambda j: (tuple(sorted(stalls.get(j.id, ()))),
                                           est.only_type.get(j.id), est.fitted,
                                           tuple(sorted(self._view_rate.factors.get(j.id, {})
                                                        .items()))),
                                self.seen_jct, accept=self.cfg.plan_filter,
                                scale_up=scale_up)

    def problem(self, g: nx.DiGraph) -> dict[str, Any]:
        """The ``--dump-problem`` JSON of a round's candidate graph."""
        dump = self.recipe.problem(g)
        return sibling_keys(g, dump) if g.graph.get("siblings") else dump

    def candidates(self, view: View) -> nx.DiGraph:
        t0 = time.perf_counter()
        if self.cfg.isolate and self.cfg.backend != "greedy" and self._child is None \
                and not self.partitioned:
            self._child = ChainChild().start()  # its imports overlap the candidates
        if self.partitioned and self._engine is None and self.recipe.partitions:
            self._engine = self._start_engine()  # starts now
        self.last_solve_round = view.round_index
        self.cfg = round_figures(self.cfg, view)  # the round's length and restart cost
        est = self._last_est = self._estimator_for(view)
        est.refresh()
        for js in view.jobs:  # runtime feedback: a cell that made no progress is out
            est.blacklist.update((js.id, t, g) for t, g in js.stalled_on)
            if self.no_hetero and js.spec.requested_gpu_type:
                # pinned to its requested type, or (the cluster lacks that type, or the job
                # cannot run there) to the type the baselines give it (policies.base)
                pin = requested_type(view, js)[0]
                if pin is not None:
                    est.only_type[js.id] = pin
        specs = [_spec_of(js) for js in view.jobs]
        cfg = self.cfg
        g = self.recipe.candidates(self, view, specs, est)
        self.rounds_made += 1
        if self.recipe.trim_scale_up and not cfg.candidates.scale_up_when_full:
            trim_scale_up(g)  # a full round: no job is offered more than it asked for
        if cfg.plan_filter is not None:  # an executor's workloads run only some plans
            drop_refused_plans(g, specs, cfg.plan_filter,
                               current_cells(g) if self.recipe.judges_plans else None)
        self._sibling_options(view, g, specs, est)
        g.graph.update(specs=specs, estimator=est, t0=t0,
                       candidates_s=round(time.perf_counter() - t0, 4))
        return g

    def _sibling_options(self, view: View, g: nx.DiGraph, specs: list[JobSpec],
                         est: Any) -> None:
        """Fine-tuning siblings' options in the round's graph (transfer cells, merged cells,
        the modes fixed at a start), then the objective over the whole graph again (the
        options change each job's fastest cell) and each member's share folded into its
        merged cell. A round without siblings is left exactly as it was."""
        sib = self.siblings
        if sib is None or not sib.relevant(view):
            return
        opts = sib.options(view)
        if not opts:
            return
        by_id = {j.id: j for j in specs}

        def merged_plan(lead: str, member: str, gpu_type: str, gpus: int) -> Any:
            """The merged job's plan: the lead's model at both batches (its memory)."""
            a, b = by_id[lead], by_id[member]
            job = replace(a, global_batch_size=a.global_batch_size + b.global_batch_size,
                          running=None)
            e = est.best_in_cell(job, Cell(lead, gpu_type, gpus, 1), view.cluster)
            accept = self.cfg.plan_filter  # what the workload runs, at the merged batch
            if e is None or (accept is not None and accept(job, e.plan) is not None):
                return None
            return e.plan

        apply_sibling_options(g, opts, view.cluster, merged_plan)
        apply_objective(g, specs, view.now, self.cfg.candidates.objective_options(),
                        self.seen_jct)
        fold_member_values(g)

    def formulate(self, view: View, g: nx.DiGraph, full: bool = False) -> Formulated:
        """The model and the heuristic's answer as its hint: the greedy's first pass
        (running jobs kept, queued ones placed where they fit: last round's answer extended);
        its local search runs only if the round falls back to it (``full``) or the greedy is
        the chosen backend, so a round the solver answers does not pay for it.

        Where the chain answers from LP rounding first, which needs no hint (a large model;
        or the cell model over GPUs at the default tolerance, whose rounded answer ends the
        chain: ``lp_rounding_final``), the greedy runs while an isolated chain solves, or
        after the chain (:meth:`decode`) if its answer is not proved within the tolerance or
        the round falls back to it: an answer within the tolerance is final, and the
        greedy's floor, made every round before, was 8 % of a 14-day replay's CPU (in the
        densest day's 193 rounds answered within the tolerance it never beat the answer)."""
        cfg = self.cfg
        model = self.recipe.model(g, cfg)
        if cfg.backend == "auto" and not full and (
                model.num_vars > LARGE_MODEL_COLUMNS or (
                    model.meta.get("lp_rounding_final")
                    and chain_names(cfg.backend, model.num_vars, cfg.mip_gap,
                                    model.meta.get("solve_first"))[:1] == ("lp-round",))):
            return Formulated(model, None, None, 0.0, 0.0, g.graph["specs"], g.graph["estimator"])
        f = self._heuristic(g, model, full)
        assert f.greedy_choices is not None
        if not f.breaks:
            model.set_hint(hint_from_choices(model, f.greedy_choices))
        return f

    def _heuristic(self, g: nx.DiGraph, model: Any, full: bool) -> Formulated:
        cfg = self.cfg
        depth = cfg.search_depth if (full or cfg.backend == "greedy") else 0
        heuristic = self.recipe.heuristic(depth)
        choices, obj, wall = heuristic.solve(g)
        breaks = model.violations(choice_vector(model, choices)) if model is not None else []
        if breaks:
            log.warning("the %s's answer breaks the model (%s): it is neither hint, floor nor "
                        "fallback", heuristic.name, "; ".join(breaks))
        return Formulated(model, heuristic, choices, obj, wall, g.graph["specs"],
                          g.graph["estimator"], depth, breaks)

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
            packed = bool(model.meta.get("master")) and "choices" not in res.extra
            if packed:  # a master's answer is what its packer placed (formulations.plans_master)
                res.x = choice_vector(model, choices)
                got = objective_of(g, choices)
                if res.objective is not None and abs(got - res.objective) > 1e-9:
                    res.message += f" (placed on nodes: {got:.6g})"
                res.objective = got
            broken = model.violations(choice_vector(model, choices) if "choices" in res.extra
                                      else res.x)
            if broken:  # the model's own rows: a researcher's constraint holds for every answer
                log.error("%s answer breaks the model: %s", res.backend, "; ".join(broken))
                res.message += f" (breaks the model: {'; '.join(broken)})"
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
        if self.partitioned and self.recipe.partitions:
            return self._solve_partitioned(g, f, left, accept, accepted, t0, work_s)
        backends = backends_for(cfg.backend, cfg.isolate, model.num_vars, cfg.mip_gap,
                                first=model.meta.get("solve_first"))
        child, self._child = self._child, None

        def greedy_meanwhile() -> None:  # the fallback, made while the child solves
            f.take(self._heuristic(g, model, full=False))

        later = f.greedy_choices is None and cfg.isolate and bool(backends)
        best, attempts = solve_chain(model, backends, left, accept, gap=cfg.mip_gap, child=child,
                                     meanwhile=greedy_meanwhile if later else None,
                                     work_s=work_s, session=self._session())
        return Solved(best, attempts, time.perf_counter() - t0, accepted)

    def _session(self) -> HighsSession | None:
        """The LP kept across rounds, where this round's chain runs in this process."""
        if not self.cfg.persistent or self.cfg.isolate:
            return None
        if self.session is None:
            self.session = HighsSession()
        return self.session

    @property
    def partitioned(self) -> bool:
        return self.cfg.partitions > 1 or self.cfg.engine != "local"

    def _solve_partitioned(self, g: nx.DiGraph, f: Formulated, left: float,
                           accept: Callable[[SolveResult], bool],
                           accepted: dict[int, tuple[list[CellChoice], Decision]],
                           t0: float, work_s: float | None = None) -> Solved:
        """POP-k (:mod:`apportion.solvers.partition`) on the round, its parts on the engine;
        ``work_s``: a deterministic budget, shared by the parts (the clock, ``left``, is
        then a safety stop)."""
        cfg = self.cfg
        if self._engine is None:
            self._engine = self._start_engine()
        best, attempts = solve_partitioned(g, f.model, cfg.partitions, self.recipe.part_model,
                                           self._engine, left, accept, gap=cfg.mip_gap,
                                           work_s=work_s)
        if self._engine_note:  # the engine asked for is not the one that solved: say so
            attempts.insert(0, SolveResult(f"{cfg.engine}-engine", Status.ERROR,
                                           message=self._engine_note))
        return Solved(best, attempts, time.perf_counter() - t0, accepted)

    def _start_engine(self) -> Any:
        """The partitioned solve's engine. Ray's workers get half the round's budget
        to take their first task; a cluster whose workers cannot start is left for the local
        engine (the round then solves within its budget, and its report says why)."""
        cfg = self.cfg
        self._engine_note = ""
        try:
            return make_engine(cfg.engine, cfg.ray_address,
                               ready_timeout_s=max(1.0, 0.5 * cfg.time_budget_s))
        except EngineUnavailable as exc:
            self._engine_note = f"not used: {exc}; the parts ran on the local engine"
            log.warning("the %s engine is unavailable (%s): the parts run on the local engine",
                        cfg.engine, exc)
            return make_engine("local")

    def close(self) -> None:
        """Stop what the policy started (an early child, a Ray instance of its own)."""
        if self._child is not None:
            self._child.close()
            self._child = None
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        if self.session is not None:
            self.session.close()

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
            # the chain ran without the greedy's hint (LP rounding first needs none);
            # when LP rounding failed, HiGHS alone may end on an early incumbent that stops
            # nearly every running job (Philly day 1's burst under load: 3 of 657 placed).
            # The greedy's first pass (every running job kept) costs well under a second:
            # an answer not proved within the tolerance must beat it
            f.take(self._heuristic(g, model, full=False))
        # a backend's answer worse than the greedy's (an LP rounding the clock stopped HiGHS
        # from improving): the greedy's is the round's answer, never the worse one
        beaten = (answered and f.greedy_choices is not None and not f.breaks
                  and s.best is not None
                  and s.best.objective is not None
                  and (f.greedy_obj > s.best.objective + 1e-9 if model.sense == "max"
                       else f.greedy_obj < s.best.objective - 1e-9))
        if beaten:
            answered = False
        if not answered and (f.greedy_choices is None or f.depth < cfg.search_depth):
            f = self._heuristic(g, model, full=True)  # falling back: the whole greedy now
        if f.greedy_choices is not None:
            what = (f"search depth {f.depth}" if f.heuristic.name == "greedy"
                    else "Morphling's slope heuristic")
            # an answer that breaks the model's rows (a researcher's added row) is none: the
            # report says so, not "feasible"
            attempt_dicts.append({"backend": f.heuristic.name,
                                  "status": "error" if f.breaks else "feasible",
                                  "objective": f.greedy_obj, "bound": None, "gap": None,
                                  "wall_s": round(f.greedy_wall, 6),
                                  "message": what if not f.breaks else
                                  f"{what}; its answer breaks the model "
                                  f"({'; '.join(f.breaks)}): not used"})
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
            choices = f.greedy_choices if not f.breaks else self._within_rows(g, model)
            explicit = (cfg.backend == "greedy" or beaten) and not f.breaks
            why = "" if explicit else "; ".join(f"{a.backend}: {a.status.value} ({a.message})"
                                                for a in s.attempts) or "no backend ran"
            # the heuristic answers the same model: any bound a backend proved on it (an LP
            # relaxation's, say) bounds its answer too, and measures its gap
            report = SolveReport(f.heuristic.name,
                                 Status.FEASIBLE.value if explicit else Status.FALLBACK.value,
                                 f.greedy_obj, bound, objective_gap(f.greedy_obj, bound,
                                                                    model.sense),
                                 wall, fallback=not explicit,
                                 fallback_reason=why, attempts=attempt_dicts)
            if beaten:
                report.fallback_reason = (f"the backends' best ({s.best.backend}: "
                                          f"{s.best.objective:.6g}) is worse than the greedy's")
            if f.breaks:
                report.objective = objective_of(g, choices)
                report.fallback_reason = (f"{why + '; ' if why else ''}the {f.heuristic.name}'s "
                                          f"answer breaks the model ({'; '.join(f.breaks)}): "
                                          "the running jobs kept instead, where the rows allow")
            if not explicit:
                log.warning("no backend answered in time; greedy fallback used: %s", why)
        report.model_size = {**model.summary(), **describe(g),
                             "candidates_s": g.graph.get("candidates_s"),
                             "node_classes": model.meta.get("node_classes")}
        if decision is None:
            decision = to_decision(g, choices, view.cluster, f.specs, report, f.estimator)
        decision.report = report
        if not answered and f.breaks:
            _unplaced_by_rows(decision, f)
        self._annotate(decision, g, choices, f, view.cluster)
        self._annotate_siblings(view, decision, g, choices)
        decision.meta["validated"] = validated
        # the graph's views hold it in a cycle: without them the round's graph is freed
        # when the round lets go of it, not when the cyclic collector finds it
        drop_cached_views(g)
        return decision

    def fallback(self, view: View, g: nx.DiGraph | None, reason: str) -> Decision:
        """The greedy's decision (the validator rejected the solver's), or the running jobs
        kept where the greedy's answer breaks the model."""
        assert g is not None
        model = self.recipe.model(g, self.cfg)
        f = self._heuristic(g, model, full=True)
        choices = f.greedy_choices if not f.breaks else self._within_rows(g, model)
        report = SolveReport(f.heuristic.name, Status.FALLBACK.value, objective_of(g, choices),
                             None, None, _elapsed(g), fallback=True, fallback_reason=reason)
        decision = to_decision(g, choices, view.cluster, f.specs, report)
        if f.breaks:
            _unplaced_by_rows(decision, f)
        self._annotate(decision, g, choices, f, view.cluster)
        self._annotate_siblings(view, decision, g, choices)
        return decision

    def _within_rows(self, g: nx.DiGraph, model: Any) -> list[CellChoice]:
        """The answer for a round whose heuristic broke the model and no backend answered:
        every running job kept where it runs, else nothing started; the first of the two
        the model's rows allow (an empty schedule when neither does)."""
        keep = [CellChoice(g.nodes[cn]["job"], cn, {name_of(nn): int(ea["max_gpus"])
                                                    for nn, ea in g.succ[cn].items()})
                for cn in current_cells(g)]
        for choices in (keep, []):
            if not model.violations(choice_vector(model, choices)):
                return choices
        log.error("neither the running jobs kept nor an empty schedule satisfies the model")
        return []

    def _annotate_siblings(self, view: View, decision: Decision, g: nx.DiGraph,
                           choices: list[CellChoice]) -> None:
        """Fine-tuning modes in the decision (``meta["transfer"]``, ``meta["merged"]``, each
        member's reason ``merged``), fixed for the jobs this decision starts."""
        if self.siblings is not None and (g.graph.get("siblings") or self.siblings.members):
            self.siblings.annotate(view, decision, {c.job: g.nodes[c.cell] for c in choices})

    def _annotate(self, decision: Decision, g: nx.DiGraph, choices: list[CellChoice],
                  f: Formulated, cluster: Cluster) -> None:
        est = f.estimator.inner if isinstance(f.estimator, _Memo) else f.estimator
        per_job = {j.id: estimator_name(est, j) for j in f.specs}
        specs = {j.id: j for j in f.specs}
        for a in decision.allocations:
            a.estimator = per_job.get(a.job)
            if a.job in specs:  # where the placed cell's figures came from (memoised)
                spec = specs[a.job]
                a.source = source_of(f.estimator.best_in_cell(
                    spec, Cell(a.job, a.gpu_type, a.gpus, a.stages), cluster),
                    est, spec)
        decision.meta.update({"now_s": g.graph.get("now_s"), "policy": self.name,
                              "objective_recomputed": objective_of(g, choices),
                              "estimator": {"name": estimator_name(est, f.specs[0])
                                            .split(":")[0] if f.specs else "", "per_job": per_job},
                              "plan_codes": {}})
        if self.recipe.annotate is not None:
            decision.meta.update(self.recipe.annotate(g, {c.job for c in choices}))

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


def _unplaced_by_rows(decision: Decision, f: Formulated) -> None:
    """A round that kept only its running jobs because the heuristic's answer broke the
    model's rows (and no backend answered) says so in each job it left waiting: the
    capacity did not go to higher-value jobs, it went unused."""
    why = (f"not placed: no backend answered and the {f.heuristic.name}'s answer breaks the "
           f"model ({'; '.join(f.breaks)}), so the round kept only the running jobs")
    for p in decision.pending:
        if p.reason is Reason.NO_CAPACITY and p.action is None:
            p.detail = why


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
        self.seen: set[str] = set()  # the jobs of the last view observed

    def observe(self, view: View) -> tuple[list[tuple[str, str, int]], list[str]]:
        """The (job, GPU type, count) whose correction changed since the last round, and
        the jobs gone from the view since then."""
        changed = []
        for js in view.jobs:
            seen = self.factors.get(js.id, {})
            if js.rate_factor == seen:
                continue
            changed += [(js.id, t, g) for t, g in sorted(set(seen) | set(js.rate_factor))
                        if seen.get((t, g)) != js.rate_factor.get((t, g))]
            self.factors[js.id] = dict(js.rate_factor)
        ids = {js.id for js in view.jobs}
        gone = [j for j in self.seen if j not in ids]
        for jid in gone:
            self.factors.pop(jid, None)
        self.seen = ids
        return changed, gone

    def rate(self, spec: JobSpec, gpu_type: str, gpus: int) -> float:
        js = self.jobs.get(spec.id)
        if js is None:
            return 0.0
        f = js.rate_factor.get((gpu_type, gpus), 1.0)
        return f * float(self.rates.rate(js, gpu_type, gpus))

    def batch_rate(self, spec: JobSpec, gpu_type: str, gpus: int, batch: int) -> float:
        """The job's progress per second at global ``batch`` (a rate source that rates
        batches), with the same measured correction."""
        js = self.jobs.get(spec.id)
        if js is None:
            return 0.0
        f = js.rate_factor.get((gpu_type, gpus), 1.0)
        return f * float(self.rates.rate(js, gpu_type, gpus, batch=int(batch)))


def round_figures(cfg: RoundConfig, view: View) -> RoundConfig:
    """``cfg`` with the objective's round length and restart cost the round's (the view's
    ``interval_s`` and ``restart_s``) wherever the user did not set them
    (:class:`~apportion.formulations.objectives.FromRound`): the candidates' objective, the
    plans' and the SLA rule's grace; ``cfg`` itself when nothing changes. A view that knows
    no restart cost (``restart_s`` None) leaves the objective's own (60 s)."""
    rs, rc = view.interval_s, view.restart_s
    change: dict[str, Any] = {}
    for name in ("candidates", "plan_options"):
        opts = getattr(cfg, name)
        obj = getattr(opts, "objective", None)
        if isinstance(obj, ObjectiveOptions):
            now = obj.for_round(rs, rc)
            if now is not obj:
                change[name] = replace(opts, objective=now)
    sla = cfg.sla_options
    if sla is not None and from_round(sla.round_s) and sla.round_s != rs:
        change["sla_options"] = replace(sla, round_s=FromRound(rs))
    return replace(cfg, **change) if change else cfg


def _elapsed(g: nx.DiGraph) -> float:
    """Seconds since the round's candidates stage began (the budget's clock)."""
    return time.perf_counter() - float(g.graph["t0"])


def _placeholder() -> SolveReport:
    return SolveReport("-", "-", None, None, None, 0.0, False)


# Crius's objective (normalised throughput, a queue bonus, Gavel's normalisation) and its
# counts (N/2, N, 2N for every job): what the crius-greedy baseline optimises whatever
# apportion's defaults become. Its round
# figures stay the 300 s and 60 s it was measured with (experiments/results/quality): a
# baseline's behaviour changes only with its own replays; apportion's objective (and the
# ``crius`` preset, ObjectiveOptions.preset) reads them from the round
CRIUS_OBJECTIVE: dict[str, Any] = {"objective": "normalized", "place_bonus": 0.0,
                                   "normalize": "requested", "keep_bonus": 0.3,
                                   "queue_weight": 0.25, "scales": (0.5, 1.0, 2.0),
                                   "counts": "scales",
                                   "amortize_s": None, "scale_up_when_full": True,
                                   "round_s": 300.0, "restart_s": 60.0}


def Optimising(config: RoundConfig | None = None, formulation: str = "cells",  # noqa: N802
               backend: str | None = None, time_budget_s: float | None = None,
               search_depth: int | None = None, max_changes: int | None = None,
               no_scaling: bool = False, no_hetero: bool = False,
               stage_counts: str | None = None, resolve_every: int | None = 12,
               estimator: Any = None, name: str | None = None,
               mip_gap: float | None = None, deterministic: bool | None = None,
               quotas: dict[str, int] | None = None, persistent: bool | None = None,
               gains: str = "rates", siblings: bool = True,
               **objective: Any) -> FormulationPolicy:
    """A formulation policy from a driver's config and the registry's fixed options.

    ``objective``: :class:`CandidateOptions` fields (``objective``, ``place_bonus``,
    ``remaining_exponent``, ``weight_bounds``, ``normalize``, ``keep_bonus``, ...) over the
    config's; the plans formulation takes the same (``PlanOptions.like``). Crius's greedy
    (``backend="greedy"``, the ``crius-greedy`` baseline) keeps Crius's objective
    (:data:`CRIUS_OBJECTIVE`) unless told otherwise.
    """
    cfg = replace(config) if config is not None else RoundConfig(time_budget_s=5.0)
    cfg.formulation = formulation
    if backend is not None:
        cfg.backend = backend
    if time_budget_s is not None:
        cfg.time_budget_s = time_budget_s
    if search_depth is not None:
        cfg.search_depth = search_depth
    if mip_gap is not None:
        cfg.mip_gap = mip_gap
    if deterministic is not None:
        cfg.deterministic = deterministic
    if persistent is not None:
        cfg.persistent = persistent
    if max_changes is not None:
        cfg.max_changes = max_changes
    if estimator is not None:
        cfg.estimator = estimator
    if quotas is not None:  # tenants' GPU quotas (a formulation whose recipe keeps them)
        cfg.quotas = dict(quotas)
    opts = cfg.candidates
    if stage_counts is not None:
        opts = replace(opts, stage_counts=stage_counts)
    if no_scaling:  # the request alone, elastic or not (an ablation)
        opts = replace(opts, scales=(1.0,), counts="scales")
    opts = opts if isinstance(opts, CandidateOptions) else CandidateOptions()
    unknown = set(objective) - {f.name for f in fields(CandidateOptions)} \
        - set(CandidateOptions.OBJECTIVE_KEYWORDS)
    if unknown:
        raise TypeError(f"unknown option(s) {', '.join(sorted(unknown))}")
    if cfg.backend == "greedy" and formulation == "cells":
        opts = opts.updated(**CRIUS_OBJECTIVE)
    cfg.candidates = opts.updated(**objective)
    suffix = "-na" if no_scaling else "-nh" if no_hetero else ""
    base = RECIPES[formulation].policy if formulation in RECIPES else formulation
    if cfg.backend == "greedy" and formulation == "cells":
        base = "crius-greedy"
    if gains != "rates":
        suffix += f"-{'task2vec' if gains == 'task2vec' else gains}"
    return FormulationPolicy(cfg, name=name or f"{base}{suffix}", resolve_every=resolve_every,
                             no_hetero=no_hetero, gains=gains,
                             siblings=siblings and cfg.backend != "greedy")


def choice_vector(model: Any, choices: list[CellChoice]) -> np.ndarray:
    """A decoded answer (cells with placements) as the model's solution vector."""
    x = np.zeros(model.num_vars)
    for i, v in hint_from_choices(model, choices).items():
        x[i] = v
    return x
