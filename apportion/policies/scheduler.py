"""One scheduler behind every driver: the policy built once, a view per round, the pipeline
with the store's commit and the driver's apply hook.

``solve-round`` (with and without ``--state``), ``apportion run`` and ``serve``, the
simulator and ``compare`` each hold a :class:`Scheduler`; :func:`~apportion.policies.
rounds.run_round` is a one-shot use of it. The scheduler

* builds the policy the config names, once, with the config: apportion's formulations
  read all of it, every baseline what its algorithm has (Sia's integer program the
  round's budget: :mod:`apportion.policies.registry`); a policy that lives across rounds
  (a run's, a replay's) keeps its memory there;
* builds each round's :class:`~apportion.view.View` from the jobs as a store or the
  operator's files describe them (their attained service from the store's history), with
  the configured estimator as every policy's rate source;
* runs the pipeline (:func:`apportion.round.run_pipeline`) with the store's commit
  (:meth:`RoundStore.record_round <apportion.round_store.RoundStore.record_round>`) and the
  driver's apply hook (an executor's launches, the simulator's advance).

A driver that keeps its own jobs' state (the simulator: its views carry what a store
would give) hands the scheduler its view (:meth:`Scheduler.decide`); the others hand it
their store (:meth:`Scheduler.step`) or the round's inputs (:meth:`Scheduler.round`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Self

from apportion.cluster import Cluster
from apportion.decision import Decision
from apportion.errors import InputError
from apportion.estimation.rates import EstimatorRates
from apportion.estimation.registry import make_estimator
from apportion.jobs import JobSpec
from apportion.policies.config import GAVEL_POLICIES, RoundConfig
from apportion.policies.formulation import FormulationPolicy, _Memo
from apportion.policies.recipes import RECIPES
from apportion.policies.registry import load_plugins, make_policy
from apportion.round import RoundResult, run_pipeline
from apportion.round_store import RoundStore
from apportion.view import JobView, Policy, View, view_of

__all__ = ["Scheduler", "formulation_names", "policy_for"]


def formulation_names() -> list[str]:
    """``--formulation``'s choices: every recipe (plug-ins included) and ``gavel`` (Gavel's
    policy, whose LP is a formulation of its own)."""
    load_plugins()
    return [*RECIPES, "gavel"]


def policy_for(config: RoundConfig, estimator: Any = None) -> Policy:
    """The policy ``config`` names, built with ``config``: a registered one, Gavel's for
    ``formulation=gavel``, or the formulation's own."""
    name = config.policy
    if name is None and config.formulation == "gavel":
        name = GAVEL_POLICIES.get(config.gavel_variant)
        if name is None:
            raise ValueError(f"unknown Gavel variant {config.gavel_variant!r}; choose "
                             f"{', '.join(GAVEL_POLICIES)}")
    if name is not None:
        return make_policy(name, config=config)
    if estimator is not None:
        config = replace(config, estimator=estimator)
    return FormulationPolicy(config)


def check_guarantees(config: RoundConfig, jobs: list[JobSpec]) -> None:
    """Refuse, naming the jobs, a round whose formulation cannot keep its guaranteed jobs'
    SLAs: ``--formulation gavel`` is Gavel's allocation LP and round mechanism, which has no
    notion of a promised speed, so guaranteed jobs would silently run best-effort (the
    cells, plans and deadline formulations keep them: :mod:`apportion.formulations.sla`).
    A policy named with ``--policy`` runs its own algorithm, guarantees or not."""
    if config.policy is not None or config.formulation != "gavel":
        return
    held = sorted(j.id for j in jobs if j.guaranteed)
    if held:
        shown = ", ".join(held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
        raise InputError("--formulation", "formulation", f"gavel keeps no SLA: Gavel's "
                         f"allocation would run the guaranteed jobs ({shown}) best-effort; give "
                         "--formulation cells, plans or deadline (they keep guaranteed jobs' "
                         "SLAs), or --policy gavel-max-min-fairness to run Gavel's policy as a "
                         "baseline")



class Scheduler:
    """A driver's rounds: ``Scheduler(config, store, apply)``.

    ``store`` (a :class:`~apportion.round_store.RoundStore`, or None for a round nobody
    commits) gives :meth:`step` its queue, cluster and history and commits each round;
    ``apply(decision)`` acts on a committed round. ``policy`` is a policy already built
    (a replay's, a conformance check's) in place of the one ``config`` names; ``estimator``
    is the rate source's estimator object (``run``'s, which the online refit corrects) in
    place of the one ``config`` names. A scheduler that built its policy closes it
    (:meth:`close`: an isolated chain's child, a Ray engine)."""

    def __init__(self, config: RoundConfig | None = None, store: RoundStore | None = None,
                 apply: Callable[[Decision], Any] | None = None, *,
                 policy: Policy | None = None, estimator: Any = None) -> None:
        self.config = config or RoundConfig()
        if policy is None and self.config.formulation not in formulation_names():
            raise ValueError(f"unknown formulation {self.config.formulation!r}; choose "
                             f"{', '.join(formulation_names())}")
        self.store = store
        self.apply = apply
        self.estimator = estimator
        self.policy: Any = policy if policy is not None else policy_for(self.config, estimator)
        self._owned = policy is None
        self._remembered = False  # the store's finished jobs handed to the policy
        self.rounds = 0  # rounds made so far
        self.last: RoundResult | None = None

    # -- one round ------------------------------------------------------------------
    def view(self, cluster: Cluster, jobs: list[JobSpec], now_s: float, *,
             history: Mapping[str, Any] | None = None,
             seen_jct: Mapping[str, float] | None = None,
             interval_s: float | None = None, restart_s: float | None = None,
             finished: list[JobSpec] | None = None) -> View:
        """The round's view of jobs as a store or an operator's files describe them:
        ``history`` (job id -> :class:`~apportion.store_history.JobHistory`) gives
        history-aware policies the attained service a replay would; ``seen_jct`` (job id ->
        JCT s) the jobs apportion's policies rank the tail against, as a long-lived policy
        remembers them (``tail_quantile``); ``interval_s`` and ``restart_s`` the round's
        figures (a one-off round has none: 300 s and the objective's 60 s); ``finished``
        the fine-tuning jobs whose weights remain (a sibling may start from them)."""
        cfg, pol = self.config, self.policy
        est = self.estimator
        if est is None:
            inner = getattr(pol, "estimator", None)
            est = inner.inner if isinstance(inner, _Memo) else (
                make_estimator(cfg.estimator) if isinstance(cfg.estimator, str)
                else cfg.estimator)
        # an operator's round: a model no GPU holds whole is rated spilled on one GPU, as the
        # formulations spill it, so a baseline may place it there too
        rates = EstimatorRates(est, cluster, spill=True)
        if isinstance(pol, FormulationPolicy) and pol.estimator.inner is not est:
            pol.estimator = _Memo(est)
        if isinstance(pol, FormulationPolicy) and seen_jct:
            pol.seen_jct.update({j: v for j, v in seen_jct.items() if j not in pol.seen_jct})
        view = view_of(cluster, jobs, now_s, rates)
        view.plan_filter = cfg.plan_filter
        if interval_s is not None:
            view.interval_s = float(interval_s)
        view.restart_s = restart_s
        view.finished = [JobView.from_spec(j) for j in finished or ()]
        for js in view.jobs if history else ():
            h = history.get(js.id) if history else None
            if h is not None:
                js.gpu_seconds, js.run_seconds = h.gpu_seconds, h.run_seconds
                js.time_on_type = dict(h.time_on_type)
                js.first_start, js.restarts = h.first_start, h.restarts
                js.preemptions, js.rounds_run = h.preemptions, h.rounds_run
        return view

    def decide(self, view: View, commit: Callable[[Decision], Any] | None = None) -> RoundResult:
        """The pipeline on ``view`` with this scheduler's policy, ``commit`` and apply hook."""
        result = run_pipeline(view, self.policy, commit, self.apply)
        self.rounds += 1
        self.last = result
        return result

    def round(self, cluster: Cluster, jobs: list[JobSpec], now_s: float, *,
              commit: Callable[[Decision], Any] | None = None, **figures: Any) -> RoundResult:
        """One round on jobs given by the caller (``figures``: :meth:`view`'s keywords)."""
        if self._owned:
            check_guarantees(self.config, jobs)
        return self.decide(self.view(cluster, jobs, now_s, **figures), commit)

    def step(self, cluster: Cluster, now_s: float, index: int | None = None, *,
             jobs: list[JobSpec] | None = None, interval_s: float | None = None,
             restart_s: float | None = None) -> RoundResult:
        """One round on the store: its jobs (``jobs``: those the driver just listed), the
        cluster it may plan on now, its history; committed through it as round ``index``
        (default: this scheduler's count). The store's finished jobs reach the policy
        with its first round; afterwards it remembers what it ranked itself."""
        store = self.store
        if store is None:
            raise ValueError("Scheduler.step needs a store (Scheduler(config, store, apply))")
        idx = self.rounds if index is None else index
        if jobs is None:
            jobs = store.list_jobs(now_s)
        cl = store.cluster_now(cluster, now_s)
        seen = None
        if not self._remembered:
            self._remembered = True
            seen = store.finished_jcts()
        return self.round(cl, jobs, now_s, history=store.history(now_s), seen_jct=seen,
                          interval_s=interval_s, restart_s=restart_s,
                          commit=lambda d: store.record_round(idx, now_s, d, []))

    # -- lifetime ---------------------------------------------------------------------
    def close(self) -> None:
        """Close the policy this scheduler built (its isolated child or Ray instance)."""
        if self._owned and isinstance(self.policy, FormulationPolicy):
            self.policy.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
