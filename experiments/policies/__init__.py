"""Scheduling policies behind one interface: ``decide(view) -> Decision``.

``make_policy(name, **options)`` builds one by name; ``POLICIES`` lists them.
Every policy returns the spine's :class:`apportion.decision.Decision`, which
the simulator checks with the spine's validator every round.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from apportion.view import Policy

_FACTORIES: dict[str, Callable[..., Any]] = {}


def register(name: str, factory: Callable[..., Any], doc: str) -> None:
    _FACTORIES[name] = factory
    POLICIES[name] = doc


POLICIES: dict[str, str] = {}


def _lazy(module: str, attr: str, **fixed: Any) -> Callable[..., Any]:
    """A baseline's factory; the driver's ``config`` (a RoundConfig) is not a baseline's."""
    def build(config: Any = None, **kw: Any) -> Any:
        import importlib

        cls = getattr(importlib.import_module(f"apportion.experiments.policies.{module}"), attr)
        return cls(**{**fixed, **kw})
    return build


def _formulation(**fixed: Any) -> Callable[..., Any]:
    """apportion's own policies take the driver's ``config`` (flags, estimator, budget)."""
    def build(config: Any = None, **kw: Any) -> Any:
        from apportion.experiments.policies.optimising import Optimising

        return Optimising(config, **{**fixed, **kw})
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
register("gandiva-migrate", _lazy("gandiva", "GandivaIntrospective"),
         "Gandiva: introspective packing and migration, heterogeneity-blind")
register("elasticflow", _lazy("elasticflow", "ElasticFlow"), "ElasticFlow, deadline-aware scaling")
register("elasticflow-ls", _lazy("elasticflow", "ElasticFlow", loosened=True),
         "ElasticFlow with loosened deadlines (throughput mode)")
register("sia", _lazy("sia", "SiaLike"), "Sia-like: goodput across types, DP-only scaling")
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
register("crius-greedy", _formulation(backend="greedy"),
         "Crius algorithm 1: GreedyCells with search depth on the candidate graph")
register("morphling", _lazy("morphling", "MorphlingSlope"), "Morphling's slope algorithm")
register("apportion", _formulation(), "apportion: the cell formulation + solver chain")
register("apportion-plans", _formulation(formulation="plans"),
         "apportion: Morphling's plans x multi-resource formulation (tenants, quotas, SLAs)")
register("apportion-deadline", _formulation(formulation="deadline"),
         "apportion: deadline-aware admission (Crius-DDL / ElasticFlow) + solver chain")
register("apportion-na", _formulation(no_scaling=True), "ablation: no GPU-count scaling")
register("apportion-nh", _formulation(no_hetero=True), "ablation: no heterogeneity scaling")


def make_policy(name: str, config: Any = None, **options: Any) -> Any:
    """Build the policy registered as ``name``; ``config`` is the driver's
    :class:`apportion.round.RoundConfig` (apportion's policies read it), ``options`` go to
    its constructor."""
    if name not in _FACTORIES:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(sorted(_FACTORIES))}")
    return _FACTORIES[name](config, **options)


__all__ = ["POLICIES", "Policy", "make_policy", "register"]
