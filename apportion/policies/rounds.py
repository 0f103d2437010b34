"""The library's entry point to a round (:func:`run_round`) and the round's choices checked.

``run_round(cluster, jobs, now, RoundConfig(...))`` is what a researcher calls: a one-shot
:class:`~apportion.policies.scheduler.Scheduler` (the pipeline with the policy the config
names, the cell formulation by default, and the configured estimator as every policy's
rate source). :func:`checked_config` is the same choice from command-line flags, refused
by the flag that made it; :func:`check_round_flags` refuses flags a round would ignore.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from apportion.cluster import Cluster
from apportion.decision import Decision
from apportion.errors import InputError
from apportion.estimation.models.measured import TableEstimator
from apportion.estimation.registry import estimator_names, make_estimator
from apportion.jobs import JobSpec
from apportion.policies.config import BACKENDS, GAVEL_POLICIES, RoundConfig, check_mip_gap
from apportion.policies.recipes import RECIPES
from apportion.policies.registry import make_policy, policy_names
from apportion.policies.scheduler import Scheduler, formulation_names
from apportion.round import RoundResult, StagedPolicy
from apportion.view import Policy


def checked_config(backend: str = "auto", formulation: str = "cells", policy: str | None = None,
                   estimator: str = "analytic", **kw: Any) -> RoundConfig:
    """A :class:`RoundConfig` from command-line choices; a bad one is an
    :class:`~apportion.errors.InputError` naming the flag and the choices."""
    if backend not in BACKENDS:
        raise InputError("--backend", "backend", f"{backend!r} is not one of {', '.join(BACKENDS)}")
    if formulation not in formulation_names():
        raise InputError("--formulation", "formulation", f"{formulation!r} is not available; "
                         f"available: {', '.join(formulation_names())}")
    if estimator not in estimator_names():
        raise InputError("--estimator", "estimator", f"{estimator!r} is not one of "
                         f"{', '.join(estimator_names())}")
    if "mip_gap" in kw:
        check_mip_gap(kw["mip_gap"])
    if policy is not None and policy not in policy_names():
        raise InputError("--policy", "policy", f"{policy!r} is not a policy; known: "
                         f"{', '.join(policy_names())}")
    return RoundConfig(backend=backend, formulation=formulation, policy=policy,
                       estimator=estimator, **kw)


def _own_policies(formulation: str) -> set[str]:
    """The policies that solve ``formulation`` (its recipe's, or Gavel's for ``gavel``)."""
    if formulation == "gavel":
        return set(GAVEL_POLICIES.values())
    recipe = RECIPES.get(formulation)
    return {recipe.policy} if recipe is not None else set()


#: the least budget a round that starts its own Ray instance is given: the start counts
#: against the budget, and a solve left with less than the rest is no solve
LOCAL_RAY_MIN_BUDGET_S = 30.0


def check_round_flags(*, formulation: str = "cells", policy: str | None = None,
                      estimator: str = "analytic", tables: Any = None, tenants: Any = None,
                      engine: str = "local", ray_address: str | None = None,
                      state: Any = None, round_key: str | None = None,
                      time_budget: float | None = None,
                      dump_problem: Any = None) -> None:
    """Refuse flags a round would silently ignore, naming both flags.

    An operator who gives ``--tables`` expects the measured times to count; with
    ``--estimator analytic`` they would not be read at all. Likewise ``--tenants``
    (quotas) only bind a formulation whose recipe keeps them (cells and plans, not
    deadline, gavel or a baseline), ``--ray-address`` only ``--engine ray``, a Ray
    instance of its own only a budget it can start within (:data:`LOCAL_RAY_MIN_BUDGET_S`),
    ``--round-key`` only a round committed to ``--state``, and ``--formulation`` only
    the formulation's own policy (``--policy fcfs`` runs FCFS whatever it says). A
    flag that changes nothing is a mistake to report, not to guess around.
    """
    if formulation not in formulation_names() or (policy is not None
                                                  and policy not in policy_names()):
        return  # an unknown name: checked_config names the choices
    if tables is not None and estimator not in ("tables", "auto"):
        raise InputError("--tables", "tables", f"the measured times are read only by "
                         f"--estimator tables or auto, not --estimator {estimator}; give "
                         "--estimator tables (or auto), or leave --tables out")
    if policy is not None and formulation != "cells" and policy not in _own_policies(formulation):
        raise InputError("--formulation", "formulation", f"--policy {policy} runs its own "
                         f"algorithm, so --formulation {formulation} would be ignored; give "
                         f"one of them (the {formulation} formulation's policy is "
                         f"{', '.join(sorted(_own_policies(formulation))) or 'none'})")
    solves = (formulation if policy is None else
              next((f for f in RECIPES if policy in _own_policies(f)), None))
    keeps = [r for r in RECIPES.values() if r.quotas]
    if tenants is not None and (solves not in RECIPES or not RECIPES[solves].quotas):
        raise InputError("--tenants", "tenants", "tenant quotas bind only the "
                         f"{', '.join(r.name for r in keeps)} formulations (--formulation "
                         f"{' | '.join(r.name for r in keeps)} or --policy "
                         f"{' | '.join(r.policy for r in keeps)}); with "
                         f"{'--policy ' + policy if policy else '--formulation ' + formulation} "
                         "they would be ignored")
    if ray_address is not None and engine != "ray":
        raise InputError("--ray-address", "ray_address", f"is used only with --engine ray "
                         f"(--engine is {engine}); give --engine ray or leave --ray-address out")
    if engine == "ray" and ray_address is None and time_budget is not None \
            and time_budget < LOCAL_RAY_MIN_BUDGET_S:
        raise InputError("--engine", "engine", f"--engine ray without --ray-address starts a "
                         "Ray instance of its own for the parts of --partitions, which takes "
                         "seconds (3-20 s measured on a "
                         f"2-core machine), more than --time-budget {time_budget:g} leaves "
                         "the solve: give --ray-address of a running cluster, a budget of at "
                         f"least {LOCAL_RAY_MIN_BUDGET_S:g} s, or --engine local")
    if round_key is not None and state is None:
        raise InputError("--round-key", "round_key", "keys a round committed to a state "
                         "database: it needs --state (without it nothing is committed)")
    if dump_problem is not None and not makes_problem(formulation, policy):
        chosen = f"--policy {policy}" if policy is not None else f"--formulation {formulation}"
        raise InputError("--dump-problem", "dump_problem", f"{chosen} decides by its own "
                         "algorithm, with no problem of apportion's to dump (the dump is a "
                         "formulation's candidates, estimates and limits, enough to re-solve "
                         "the round); give --formulation "
                         f"{' | '.join(r for r in RECIPES)} or one of their policies, or leave "
                         "--dump-problem out")


def makes_problem(formulation: str = "cells", policy: str | None = None) -> bool:
    """Whether the round ``--formulation``/``--policy`` name has a problem to dump: one of
    apportion's formulations (a staged policy, :class:`apportion.round.StagedPolicy`), not a
    baseline's own algorithm (Sia's ILP, Gavel's LPs and round mechanism, FCFS, ...)."""
    if policy is None:
        return formulation in RECIPES
    return isinstance(make_policy(policy), StagedPolicy)


def estimator_from(name: str, tables: Any = None, samples: Any = None,
                   batches: dict[str, int] | None = None) -> Any:
    """The ``--estimator`` choice as what a RoundConfig carries: a name, or for ``tables`` and
    ``auto`` an estimator holding the measurements (a CSV path and/or a store's samples)."""
    if name not in ("tables", "auto"):
        return name
    rows: tuple[Any, ...] = ()
    if tables is not None:
        rows += TableEstimator.from_csv(tables).rows
    if samples is not None:
        rows += TableEstimator.from_store_samples(samples, batches).rows
    return make_estimator(name, tables=TableEstimator(rows))


def run_round(cluster: Cluster, jobs: list[JobSpec], now_s: float,
              config: RoundConfig | None = None, estimator: Any = None,
              policy: Policy | None = None,
              commit: Callable[[Decision], Any] | None = None,
              apply: Callable[[Decision], Any] | None = None,
              history: Mapping[str, Any] | None = None,
              seen_jct: Mapping[str, float] | None = None,
              interval_s: float | None = None,
              restart_s: float | None = None,
              finished: list[JobSpec] | None = None) -> RoundResult:
    """One round on an operator's queue (the library API): a one-shot
    :class:`~apportion.policies.scheduler.Scheduler` — admission, the policy ``config``
    names (the cell formulation by default), validation, then the caller's ``commit`` and
    ``apply`` hooks. ``history`` (job id -> :class:`~apportion.store_history.JobHistory`,
    what ``job_histories`` reads from a store) gives history-aware policies the attained
    service a replay would give them; ``seen_jct`` (job id -> JCT s, what
    ``finished_jcts`` reads) the jobs apportion's policies rank the tail against, as a
    long-lived policy remembers them (``tail_quantile``); ``finished`` the fine-tuning jobs
    whose weights remain (a queued sibling's transfer option may name them)."""
    with Scheduler(config, apply=apply, policy=policy, estimator=estimator) as sched:
        return sched.round(cluster, jobs, now_s, commit=commit, history=history,
                           seen_jct=seen_jct, interval_s=interval_s, restart_s=restart_s,
                           finished=finished)
