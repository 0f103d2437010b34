"""The formulations apportion's policy can solve, one recipe each: how a round's candidate
graph is built, which heuristic is the hint and the fallback, and what the decision adds.

A recipe is the whole difference between ``cells`` (Crius's cells), ``plans``
(Morphling's execution plans x GPUs, CPUs and memory) and ``deadline`` (Crius-DDL /
ElasticFlow admission): the pipeline, the solver chain, validation and decoding are
shared. A researcher adds a formulation with :func:`apportion.policies.registry.
register_formulation` (one recipe, one call); it is then reachable from
``solve-round --formulation``, ``--policy``, ``simulate`` and ``compare``.

The candidate builders take the policy object that runs the recipe (its estimator, its
candidate cache across rounds, the jobs ranked so far): :class:`CandidateContext`
says what they may read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import networkx as nx

from apportion.estimation.models.analytic import AnalyticEstimator
from apportion.formulations.candidates import (
    asks_beyond_capacity,
    build_candidates,
    problem_dump,
    requests_beyond,
)
from apportion.formulations.cells import build_cells_model
from apportion.formulations.deadline import DeadlineOptions, apply_deadlines, deadline_projection
from apportion.formulations.plans import (
    CalibratedPlans,
    EstimatedPlans,
    PlanOptions,
    build_plan_candidates,
)
from apportion.formulations.plans_master import plans_model
from apportion.formulations.sla import SlaOptions, apply_slas
from apportion.jobs import JobSpec
from apportion.solvers.greedy import GreedyCells
from apportion.solvers.slope import SlopeGreedy
from apportion.view import View


class CandidateContext(Protocol):
    """What a candidate builder reads of the policy running it."""

    cfg: Any  # the RoundConfig
    recipe: Any  # the Recipe it runs
    rounds_made: int  # rounds this policy has built candidates for before this one
    seen_jct: dict[str, float]  # every job ranked so far, with its last projected JCT

    def base_estimator(self) -> Any:
        """The configured estimator (plans and memory)."""
        ...

    def measured_rate(self) -> Callable[[JobSpec, str, int], float] | None:
        """A replay's measured rates (the view's), or None on a real cluster."""
        ...

    def view_rate(self) -> Callable[[JobSpec, str, int], float]:
        """The view's rate source, whatever it is (measured, or a real cluster's estimator):
        what a job whose model the catalog lacks is scheduled from."""
        ...

    def cached_candidates(self, view: View, specs: list[JobSpec], est: Any,
                          scale_up: bool = True) -> nx.DiGraph:
        """The cell candidates, re-estimating only new or changed jobs (``scale_up``:
        :func:`~apportion.formulations.candidates.build_candidates`')."""
        ...


CandidateBuilder = Callable[[CandidateContext, View, list[JobSpec], Any], nx.DiGraph]


@dataclass(frozen=True)
class Recipe:
    """One formulation as a policy.

    ``candidates(ctx, view, specs, est)``: the candidate graph (the schema of
    :mod:`apportion.formulations.schema`); ``model(g, cfg)``: the neutral model;
    ``heuristic(depth)``: the hint and fallback (``.solve(g) -> (choices, objective,
    wall)``, ``.name``); ``annotate(g, placed)``: what the decision's ``meta`` adds;
    ``partitions``: a POP-partitioned solve applies, each part's model built by
    ``part_model`` (a module-level function: the parts run in other processes);
    ``trim_scale_up``: a full round offers no job more than it asked for; ``quotas``: the
    formulation keeps tenants' quotas and guaranteed jobs' SLAs (``--tenants``);
    ``judges_plans``: the candidate builder applies the executor's plan filter to every cell
    but a running job's present one (the cell builder does), so the round judges only
    those again (a recipe that does not say so has every candidate judged after it)."""

    name: str
    policy: str  # the registry name of the policy that solves it with apportion's defaults
    doc: str
    candidates: CandidateBuilder
    model: Callable[[nx.DiGraph, Any], Any]
    heuristic: Callable[[int], Any]
    annotate: Callable[[nx.DiGraph, set[str]], dict[str, Any]] | None = None
    partitions: bool = True
    part_model: Callable[[nx.DiGraph], Any] = build_cells_model
    trim_scale_up: bool = True
    quotas: bool = False
    problem: Callable[[nx.DiGraph], dict[str, Any]] = problem_dump
    judges_plans: bool = False


def cell_candidates(ctx: CandidateContext, view: View, specs: list[JobSpec],
                    est: Any) -> nx.DiGraph:
    """Crius's cells; one round (``solve-round``) has no cache to fill. A round the recipe
    trims (its jobs ask for more GPUs than the cluster has:
    :func:`~apportion.formulations.candidates.trim_scale_up`) is built without the elastic
    scale-up the trim would drop (never estimated), unless jobs that fit nowhere bring the
    asks within the cluster (then it is built again with it)."""
    cfg = ctx.cfg
    trims = ctx.recipe.trim_scale_up and not cfg.candidates.scale_up_when_full
    scale_up = not (trims and requests_beyond(view.cluster, specs))

    def build(scale_up: bool) -> nx.DiGraph:
        if ctx.rounds_made == 0:
            return build_candidates(view.cluster, specs, view.now, est, cfg.candidates,
                                    ctx.seen_jct, accept=cfg.plan_filter, scale_up=scale_up)
        return ctx.cached_candidates(view, specs, est, scale_up)

    g = build(scale_up)
    if not scale_up and not asks_beyond_capacity(g):
        g = build(True)
    return g


def sla_cell_candidates(ctx: CandidateContext, view: View, specs: list[JobSpec],
                        est: Any) -> nx.DiGraph:
    """Crius's cells with guaranteed jobs' SLAs and tenants' quotas (the plans formulation's
    rule, :mod:`apportion.formulations.sla`), judged on the built graph each round: the
    cells are cached across rounds, a verdict depends on the clock and the other jobs. A
    round without guaranteed jobs or quotas is exactly the plain cells'."""
    g = cell_candidates(ctx, view, specs, est)
    cfg = ctx.cfg
    apply_slas(g, specs, view.now, cfg.quotas,
               cfg.sla_options or SlaOptions.of(cfg.candidates))
    return g


def _deadline_options(ctx: CandidateContext, drop: bool) -> DeadlineOptions:
    """The deadline rule with the restart a move costs: the objective's (the round's,
    FormulationPolicy)."""
    return DeadlineOptions(restart_s=ctx.cfg.candidates.objective.restart_s_value, drop=drop)


def honour_deadlines(ctx: CandidateContext, view: View, specs: list[JobSpec],
                     g: nx.DiGraph) -> nx.DiGraph:
    """apportion's default honours deadlines whenever jobs carry them: admission by each
    job's minimum satisfactory share, earliest deadline first, then spare GPUs to the jobs
    that gain most (:mod:`apportion.formulations.deadline`); a job no allocation meets runs
    best effort, never dropped (``apportion-deadline`` drops it, as ElasticFlow does). A
    round without deadlines is untouched."""
    if any(s.deadline_s is not None for s in specs):
        apply_deadlines(g, specs, view.now, _deadline_options(ctx, drop=False))
    return g


def default_cell_candidates(ctx: CandidateContext, view: View, specs: list[JobSpec],
                            est: Any) -> nx.DiGraph:
    """The ``cells`` recipe's (apportion's default): :func:`sla_cell_candidates` with the
    jobs' deadlines honoured (:func:`honour_deadlines`)."""
    return honour_deadlines(ctx, view, specs, sla_cell_candidates(ctx, view, specs, est))


def plan_candidates(ctx: CandidateContext, view: View, specs: list[JobSpec],
                    est: Any) -> nx.DiGraph:
    """Morphling's plans; in a replay the view's measured rates set the times, and a job
    whose model the catalog lacks gets the data-parallel plan its rate stands for (on a
    real cluster too). The plan families' relative costs are the analytic model's: an
    estimator that does not cost plan families (measured tables, Crius's cells, Morphling's
    fit) sets each size's speed through the view's rates, as a replay's measurements do.
    One objective for both formulations: the plans take the cells' objective knobs."""
    cfg = ctx.cfg
    base = ctx.base_estimator()
    analytic = isinstance(base, AnalyticEstimator)
    source = cfg.plan_source or EstimatedPlans(base if analytic else AnalyticEstimator())
    rate = ctx.measured_rate()
    source = CalibratedPlans(source, rate) if rate is not None else \
        CalibratedPlans(source, ctx.view_rate(), calibrate=not analytic
                        and cfg.plan_source is None)
    g = build_plan_candidates(view.cluster, specs, view.now, source, cfg.quotas,
                              cfg.plan_options or PlanOptions.like(cfg.candidates),
                              accept=cfg.plan_filter)
    return honour_deadlines(ctx, view, specs, g)


def deadline_candidates(ctx: CandidateContext, view: View, specs: list[JobSpec],
                        est: Any) -> nx.DiGraph:
    """Cells with guaranteed jobs' SLAs and tenants' quotas (as the cells formulation keeps
    them), each kept only where it finishes its job by the deadline."""
    g = sla_cell_candidates(ctx, view, specs, est)
    apply_deadlines(g, specs, view.now, _deadline_options(ctx, drop=True))
    g.graph["formulation"] = "deadline"
    return g


def cells_model(g: nx.DiGraph, cfg: Any) -> Any:
    return build_cells_model(g, max_changes=cfg.max_changes)


def plans_master_model(g: nx.DiGraph, cfg: Any) -> Any:
    """The plans round's model by size: the exact cell model, or past
    ``plans_master.EXACT_PLACEMENT_LIMIT`` placement columns the master over options
    (GPU types aggregated, placed on nodes after), solved by column generation."""
    return plans_model(g, max_changes=cfg.max_changes)


def deadline_meta(g: nx.DiGraph, placed: set[str]) -> dict[str, Any]:
    return deadline_projection(g, placed)


def deadline_meta_if_any(g: nx.DiGraph, placed: set[str]) -> dict[str, Any]:
    """The projected deadline ratio where the round's jobs carry deadlines (else nothing)."""
    return deadline_projection(g, placed) if "deadlines" in g.graph else {}


def _plans_heuristic(depth: int) -> Any:
    return SlopeGreedy()


RECIPES: dict[str, Recipe] = {}


def add_recipe(recipe: Recipe) -> None:
    RECIPES[recipe.name] = recipe


add_recipe(Recipe("cells", "apportion", "apportion: the cell formulation + solver chain "
                  "(elastic counts, tenants, quotas, SLAs, deadlines)", default_cell_candidates,
                  cells_model, GreedyCells, annotate=deadline_meta_if_any, quotas=True,
                  judges_plans=True))
add_recipe(Recipe("plans", "apportion-plans",
                  "apportion: Morphling's plans x multi-resource formulation (elastic counts, "
                  "tenants, quotas, SLAs, deadlines)", plan_candidates, plans_master_model,
                  _plans_heuristic, annotate=deadline_meta_if_any, partitions=False,
                  trim_scale_up=False, quotas=True))
add_recipe(Recipe("deadline", "apportion-deadline",
                  "apportion: deadline-aware admission (Crius-DDL / ElasticFlow) + solver chain "
                  "(tenants, quotas, SLAs)",
                  deadline_candidates, cells_model, GreedyCells, annotate=deadline_meta,
                  judges_plans=True, quotas=True))

__all__ = [
    "RECIPES",
    "CandidateContext",
    "Recipe",
    "add_recipe",
    "cell_candidates",
    "cells_model",
    "deadline_candidates",
    "default_cell_candidates",
    "honour_deadlines",
    "plan_candidates",
    "sla_cell_candidates",
]
