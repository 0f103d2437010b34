"""A round's configuration: which policy, solver chain, budget and estimator, and the checks
that refuse a bad choice by the flag that made it.

:class:`RoundConfig` is what every driver hands a policy (``solve-round``'s flags,
``run``'s, the simulator's); apportion's formulation policies read all of it, a baseline
what its algorithm has (Sia's integer program: the budget; :mod:`apportion.policies.registry`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from apportion.errors import InputError
from apportion.formulations.candidates import CandidateOptions
from apportion.formulations.sla import SlaOptions
from apportion.solvers.chain import MIP_REL_GAP

BACKENDS = ("auto", "cp-sat", "highs", "lp-round", "scip", "greedy")
GAVEL_POLICIES = {"max-min-fairness": "gavel-max-min-fairness",
                  "max-sum-throughput": "gavel-max-sum-throughput"}


@dataclass
class RoundConfig:
    """What a driver asks of a round: the policy (``policy``, else the formulation's own),
    the solver chain and its budget, the estimator, and the executor's plan filter."""

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
    quotas: dict[str, int] | None = None  # tenant -> GPUs for guaranteed jobs (cells, plans)
    # the cells formulation's SLA knobs (formulations.sla; None: SlaOptions at the candidates'
    # round length); the plans formulation reads its own from ``plan_options``
    sla_options: SlaOptions | None = None
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
    # a policy that lives across rounds (a replay's, ``run``'s, ``serve``'s) keeps its LP
    # relaxation alive in HiGHS between them and re-solves it from the last basis
    # (solvers.persistent); an isolated chain's child starts afresh, and a one-off round's
    # first LP is built afresh either way (the same answer). On by default: with LP
    # rounding's answer final on the cell model the LP is a replay's largest solver cost,
    # and the 14-day replay takes 0.84x the CPU at the same average JCT (+0.01 %; six
    # held-out days -0.07 % to +0.13 %: experiments/results/bench/speed.md)
    persistent: bool = True


def answer_reserve(variables: int) -> float:
    """Seconds kept back from the solvers for what follows them: decoding and validating
    the answer, the report, writing the decision (measured on the cell model: about 15 µs
    per variable on this project's 2-core machine, plus a fixed 50 ms)."""
    return 0.05 + 15e-6 * variables


def check_deterministic(cfg: RoundConfig) -> None:
    """Refuse a deterministic budget where the chain would leave this process (an isolated
    chain: its child runs on the clock). A partitioned solve takes one (its parts' chains
    count work in their own processes, each with a fixed share:
    :mod:`apportion.solvers.partition`)."""
    if cfg.isolate and cfg.partitions <= 1 and cfg.engine == "local":
        raise ValueError("a deterministic budget solves the chain in this process: it "
                         "cannot be combined with isolate")


# a deterministic round's safety stop, in multiples of its budget: the work budget is a
# nominal rate's seconds (solvers.base.WORK_PER_S), so a slower machine or a loaded one
# needs the clock's room to spend it
DETERMINISTIC_SAFETY = 4.0


def greedy_reserve(jobs: int) -> float:
    """Seconds kept back for the greedy's first pass after the chain, on a large round that
    skipped it before (measured on this project's 2-core machine: 0.03 s at 1,000 jobs,
    0.27 s at 5,000, 0.92 s at 10,000: about 0.1 ms per job)."""
    return 1e-4 * jobs


def check_mip_gap(value: float) -> None:
    """``--mip-gap`` must be a finite number in [0, 1)."""
    if not (math.isfinite(value) and 0.0 <= value < 1.0):
        raise InputError("--mip-gap", "mip_gap", f"must be a number in [0, 1), got {value}")
