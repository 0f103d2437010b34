"""The policy registry: every policy by one name, built by ``make_policy(name, config)``.

Baselines are built on first use (their modules import what their algorithm needs:
cvxpy for Gavel, scipy's MILP for Sia), with the driver's config: each reads the fields
its algorithm has (Sia's integer program: the round's budget); apportion's own policies
are one per formulation recipe (:mod:`apportion.policies.recipes`) plus the ablations and
Crius's greedy, and read all of it. Plug-ins installed with pip register through the ``apportion.policies``
entry-point group (a factory ``(config=None, **options) -> policy`` or a class) and the
``apportion.formulations`` group (a :class:`~apportion.policies.recipes.Recipe`); both
are read on first listing, so a plug-in appears in ``apportion policies``, ``--policy``
and ``--formulation`` alike.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

from apportion.errors import InputError
from apportion.formulations.objectives import ObjectiveOptions
from apportion.plugins import plugins, takes
from apportion.policies.recipes import RECIPES, Recipe, add_recipe
from apportion.view import Policy

log = logging.getLogger(__name__)

_FACTORIES: dict[str, Callable[..., Any]] = {}


def register(name: str, factory: Callable[..., Any], doc: str) -> None:
    _FACTORIES[name] = factory
    POLICIES[name] = doc


POLICIES: dict[str, str] = {}


def _lazy(module: str, attr: str, reads: dict[str, str] | None = None,
          **fixed: Any) -> Callable[..., Any]:
    """A baseline's factory. The driver's ``config`` (a RoundConfig) reaches it: ``reads``
    maps the config's fields the baseline's algorithm has (Sia's integer program: the
    round's budget) to its constructor's keywords, so ``--time-budget`` bounds it as it
    bounds apportion's solvers; an option given by name wins, and without a config the
    baseline keeps its own defaults."""
    def build(config: Any = None, **kw: Any) -> Any:
        cls = getattr(importlib.import_module(f"apportion.policies.{module}"), attr)
        from_config = {key: getattr(config, field) for field, key in (reads or {}).items()
                       if config is not None}
        return cls(**{**fixed, **from_config, **kw})
    return build


def _formulation(**fixed: Any) -> Callable[..., Any]:
    """apportion's own policies take the driver's ``config`` (flags, estimator, budget)."""
    def build(config: Any = None, **kw: Any) -> Any:
        return importlib.import_module("apportion.policies.formulation").Optimising(
            config, **{**fixed, **kw})
    return build


register("fcfs", _lazy("fifo", "FCFS"), "first come first served, strict, non-preemptive")
register("fcfs-backfill", _lazy("fifo", "FCFS", backfill=True), "FCFS with backfilling")
register("srtf", _lazy("fifo", "SRTF"), "shortest remaining time first, preemptive")
register("fifo", _lazy("gavel", "GavelFIFO"), "Gavel's FIFO through its round mechanism")
register("gavel-max-sum-throughput", _lazy("gavel", "MaxSumThroughput"),
         "Gavel: max total throughput LP, round-based")
register("gavel-max-min-fairness", _lazy("gavel", "MaxMinFairness"),
         "Gavel: heterogeneity-aware max-min fairness LP, round-based")
register("gavel", _lazy("gavel", "MaxSumThroughput"), "alias of gavel-max-sum-throughput")
register("gandiva", _lazy("gavel", "GandivaShare"),
         "Gandiva (Gavel's allocation, no co-location): equal time share, heterogeneity-blind")
register("tiresias", _lazy("tiresias", "Tiresias"), "Tiresias 2D-LAS, discretised queues")
register("tiresias-pollux", _lazy("tiresias", "Tiresias", thresholds_gpu_h=(16.0,),
                                  starvation_factor=float("inf")),
         "Tiresias as Pollux's artifact runs it: one queue threshold at 16 GPU-hours, no "
         "starvation guard")
register("gandiva-migrate", _lazy("gandiva", "GandivaIntrospective"),
         "Gandiva: introspective packing and migration, heterogeneity-blind")
register("elasticflow", _lazy("elasticflow", "ElasticFlow"), "ElasticFlow, deadline-aware scaling")
register("elasticflow-ls", _lazy("elasticflow", "ElasticFlow", loosened=True),
         "ElasticFlow with loosened deadlines (throughput mode)")
register("sia", _lazy("sia", "SiaLike", reads={"time_budget_s": "time_limit_s"}),
         "Sia-like: goodput across types, DP-only scaling")
register("synergy", _lazy("synergy", "Synergy"), "Synergy: CPU/memory-sensitive, fixed GPUs")
register("antman", _lazy("antman", "AntMan"), "AntMan: guaranteed vs opportunistic jobs")
register("ymir", _lazy("ymir", "Ymir"),
         "YMIR: fine-tuning transfer (temporal A->B, spatial merging A||B) + elastic SRTF")
register("ymir-temporal", _lazy("ymir", "Ymir", spatial=False),
         "YMIR without merging: temporal transfer from finished siblings + elastic SRTF")
register("ymir-spatial", _lazy("ymir", "Ymir", temporal=False),
         "YMIR without temporal transfer: spatial merging (A||B) + elastic SRTF")
register("ymir-normal", _lazy("ymir", "Ymir", temporal=False, spatial=False),
         "YMIR's elastic SRTF alone (no transfer): the ablation of its modes")
register("ymir-task2vec", _lazy("ymir", "Ymir", gains="task2vec"),
         "YMIR with Task2Vec-predicted gains (its Alg. 1, --gains auto) from each task's "
         "samples ($APPORTION_TASK_DATA)")
register("crius-greedy", _formulation(backend="greedy"),
         "Crius algorithm 1: GreedyCells with search depth on the candidate graph")
register("morphling", _lazy("morphling", "MorphlingSlope"), "Morphling's slope algorithm")
for _r in RECIPES.values():
    register(_r.policy, _formulation(formulation=_r.name), _r.doc)
register("apportion-task2vec", _formulation(gains="task2vec"),
         "apportion with Task2Vec-predicted fine-tuning gains (--gains auto: YMIR's Alg. 1) "
         "from each task's samples ($APPORTION_TASK_DATA), for its transfer and merge options")
register("apportion-na", _formulation(no_scaling=True), "ablation: no GPU-count scaling")
register("apportion-nh", _formulation(no_hetero=True), "ablation: no heterogeneity scaling")


def register_formulation(recipe: Recipe) -> None:
    """Add a formulation (one recipe) and the policy that solves it (``recipe.policy``)."""
    add_recipe(recipe)
    register(recipe.policy, _formulation(formulation=recipe.name), recipe.doc)


_PLUGINS = {"loaded": False}


def load_plugins() -> list[str]:
    """Register what installed packages offer under the ``apportion.formulations`` and
    ``apportion.policies`` entry-point groups (:mod:`apportion.plugins`; once); returns what
    was added. A plug-in that fails to load is logged and left out."""
    if _PLUGINS["loaded"]:
        return []
    _PLUGINS["loaded"] = True
    added = []
    for name, recipe in plugins("apportion.formulations").items():
        try:
            register_formulation(recipe if isinstance(recipe, Recipe) else recipe())
            added.append(name)
        except Exception as exc:  # noqa: BLE001 - a broken plug-in must not break the CLI
            log.warning("formulation plug-in %s not registered: %s", name, exc)
    for name, factory in plugins("apportion.policies").items():
        doc = ((getattr(factory, "__doc__", None) or "").strip().splitlines() or
               [f"plug-in {name}"])[0]
        register(name, _plugin(factory), doc)
        added.append(name)
    return added


def _plugin(factory: Callable[..., Any]) -> Callable[..., Any]:
    """A plug-in's factory: it receives the driver's config when it takes one; the options
    given by name all reach it (an option it does not take is its TypeError, not dropped)."""
    def build(config: Any = None, **kw: Any) -> Any:
        if takes(factory, "config"):
            return factory(config=config, **kw)
        return factory(**kw)
    return build


#: baselines that keep tenants' quotas, and the option that gives them (apportion's own: a
#: formulation whose recipe keeps quotas, option ``quotas``)
QUOTA_OPTIONS = {"morphling": "quota", "antman": "quota"}


def quota_options(name: str, quotas: dict[str, int]) -> dict[str, Any] | None:
    """The options that give policy ``name`` the tenants' quotas, or None when it keeps no
    quotas (its algorithm has none: it would ignore them)."""
    if name in QUOTA_OPTIONS:
        return {QUOTA_OPTIONS[name]: dict(quotas)}
    for r in RECIPES.values():
        if r.quotas and name == r.policy:
            return {"quotas": dict(quotas)}
    return None


def objective_policies() -> list[str]:
    """The registered policies whose objective is apportion's (``--objective-preset``): one
    per formulation recipe and the ablations; not ``crius-greedy`` (a baseline keeps
    Crius's objective) nor any other baseline (each has its algorithm's own)."""
    return sorted({r.policy for r in RECIPES.values()} | {"apportion-na", "apportion-nh"})


def objective_preset_options(name: str, preset: str) -> dict[str, Any] | None:
    """The options that give policy ``name`` the named objective (``ObjectiveOptions.
    preset``), or None when its objective is not apportion's; a ValueError names an unknown
    preset."""
    objective = ObjectiveOptions.preset(preset)
    return {"objective": objective} if name in objective_policies() else None


def with_objective_preset(config: Any, preset: str | None, policy: str | None = None) -> Any:
    """``config`` (a RoundConfig) with the named objective on its candidates (``--objective-
    preset`` of solve-round, run and serve: one rule for all three); an InputError naming
    the flag for an unknown preset or a ``policy`` whose objective is not apportion's."""
    if preset is None:
        return config
    if policy is not None and policy not in objective_policies():
        raise InputError("--objective-preset", "objective_preset",
                         f"policy {policy} has its own objective (apportion's policies take "
                         f"one: {', '.join(objective_policies())})")
    try:
        objective = ObjectiveOptions.preset(preset)
    except ValueError as exc:
        raise InputError("--objective-preset", "objective_preset", str(exc)) from None
    config.candidates = config.candidates.updated(objective=objective)
    return config


def make_policy(name: str, config: Any = None, **options: Any) -> Any:
    """Build the policy registered as ``name``; ``config`` is the driver's
    :class:`apportion.policies.config.RoundConfig` (apportion's policies read it),
    ``options`` go to its constructor."""
    load_plugins()
    if name not in _FACTORIES:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(sorted(_FACTORIES))}")
    return _FACTORIES[name](config, **options)


def policy_names() -> list[str]:
    """Every registered policy, plug-ins included."""
    load_plugins()
    return sorted(POLICIES)


__all__ = ["POLICIES", "Policy", "QUOTA_OPTIONS", "load_plugins", "make_policy",
           "objective_policies", "objective_preset_options", "policy_names", "quota_options",
           "register", "register_formulation", "with_objective_preset"]
