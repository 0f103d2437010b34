"""One config builder for a round from the command line: ``solve-round`` with and without
``--state``, ``run`` and ``serve`` turn the same flags into the same
:class:`~apportion.policies.RoundConfig`, refusing by name (and in the same words) what
cannot apply.

A one-off round's budget counts from the command's start (``started``): reading the
files, the store, the candidates and the solvers all spend it; a loop's rounds
(``started=None``) each have the whole budget from their candidates stage. A round
written for operators carries the workloads' plan filter, so every decision
``solve-round`` writes can be exported and run by apportion's workers (``export k8s``,
``run``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from apportion.cli.common import check_budget
from apportion.config import load_tenants
from apportion.errors import InputError
from apportion.policies import (
    RoundConfig,
    check_round_flags,
    checked_config,
    estimator_from,
    with_objective_preset,
)
from apportion.runtime.plan_filter import workload_plan_filter

ENGINES = ("local", "ray")


@dataclass
class RoundFlags:
    """The round's command-line flags, as given."""

    backend: str = "auto"
    formulation: str = "cells"
    policy: str | None = None
    estimator: str = "analytic"
    time_budget: float = 10.0
    mip_gap: float = 1e-3
    search_depth: int = 3
    max_changes: int | None = None
    isolate: bool = True
    tenants: Path | None = None
    tables: Path | None = None
    partitions: int = 1
    engine: str = "local"
    ray_address: str | None = None
    deterministic: bool = False
    objective_preset: str | None = None  # ObjectiveOptions.preset: apportion's policies


def round_config(flags: RoundFlags, started: float | None,
                 device: str | None = "cuda") -> RoundConfig:
    """The :class:`RoundConfig` the flags ask for; an :class:`InputError` naming the flag for
    a bad value or a combination that cannot apply. ``started``: the command's start
    (``time.perf_counter()``), from which a one-off round's budget counts; None for a loop's
    rounds. ``device``: where the workers run (the plan filter's; None: this host's)."""
    f = flags
    check_budget(f.time_budget)
    if f.engine not in ENGINES:
        raise InputError("--engine", "engine", f"{f.engine!r} is not one of {', '.join(ENGINES)}")
    check_round_flags(formulation=f.formulation, policy=f.policy, estimator=f.estimator,
                      tables=f.tables, tenants=f.tenants, engine=f.engine,
                      ray_address=f.ray_address)
    if f.deterministic and f.isolate and f.partitions <= 1 and f.engine == "local":
        # a work budget is counted where the chain runs: here, or in each part's worker
        raise InputError("--isolate", "isolate", "--deterministic solves the chain in this "
                         "process; leave --isolate out (or drop --deterministic)")
    quotas = load_tenants(f.tenants) if f.tenants else None
    cfg = checked_config(f.backend, f.formulation, f.policy, f.estimator,
                         time_budget_s=f.time_budget, search_depth=f.search_depth,
                         max_changes=f.max_changes, quotas=quotas, isolate=f.isolate,
                         partitions=f.partitions, engine=f.engine, ray_address=f.ray_address,
                         mip_gap=f.mip_gap, deterministic=f.deterministic)
    cfg.estimator = estimator_from(f.estimator, f.tables)
    with_objective_preset(cfg, f.objective_preset, f.policy)
    cfg.deadline_s = None if started is None else started + f.time_budget
    cfg.plan_filter = workload_plan_filter(device)
    return cfg
