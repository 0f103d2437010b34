"""What a policy sees in one round: the view, its jobs, and where rates come from.

Every policy — apportion's formulations and every baseline — is one call,
``decide(view) -> Decision`` (:class:`Policy`). The view is made of core types
only, so the same policy runs wherever a round is made: ``solve-round`` on an
operator's queue, ``apportion run`` against a state store, and the simulator
replaying a trace. What differs between those drivers is only what fills the
view:

* the jobs (:class:`JobView`): the job as submitted (:class:`JobSpec`, with
  its running state and iterations done) plus what a scheduler observes over
  time — attained service, time per GPU type, restarts, whether it made
  progress last round — and a per-job scratch dict that survives rounds;
* the rate source (:class:`RateSource`): iterations/s of a job on a number of
  GPUs of a type. It is what makes comparisons fair: in the simulator every
  policy gets the same source for an information mode (measured truth in
  ``oracle``, estimates with the same profiling budget in ``estimated``); on a
  real cluster it is an estimator.

A policy never mutates the view's jobs except their ``memo`` scratch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from apportion.cluster import Cluster
from apportion.decision import Allocation, Decision
from apportion.jobs import JobSpec
from apportion.plans import ExecutionPlan

INFORMATION_MODES = ("oracle", "estimated")


@runtime_checkable
class RateSource(Protocol):
    """Iterations/s of ``job`` on ``gpus`` GPUs of ``gpu_type`` (0: it cannot run there)."""

    name: str

    def rate(self, job: JobView, gpu_type: str, gpus: int,
             placement: Mapping[str, int] | None = None, plan: str | None = None,
             **kw: Any) -> float: ...


@dataclass(eq=False)
class JobView:
    """One job as every policy sees it (mutable bookkeeping kept by the driver)."""

    spec: JobSpec
    alloc: Allocation | None = None  # what it holds now (None: queued or checkpointed)
    done: float = 0.0  # iterations done (fractional in a replay)
    plan_code: str | None = None  # a measured table's plan code for ``alloc`` (Morphling's)
    est_rate: float = 0.0  # iterations/s the deciding policy expected of ``alloc``
    gpu_seconds: float = 0.0  # attained service, GPUs x seconds
    run_seconds: float = 0.0
    time_on_type: dict[str, float] = field(default_factory=dict)
    first_start: float | None = None
    restarts: int = 0
    preemptions: int = 0
    rounds_run: int = 0
    stalled_rounds: int = 0  # rounds it held GPUs and made no progress (observed)
    stalled: bool = False  # it held GPUs last round and made no progress
    # (GPU type, GPU count) it held and made no progress on: the driver records them, and
    # :meth:`View.rate` says 0 there for every policy (the same runtime feedback for all)
    stalled_on: set[tuple[str, int]] = field(default_factory=set)
    # (GPU type, GPU count) -> measured rate / the rate source's there: the driver's
    # runtime feedback (:mod:`apportion.measured_rates`), applied by :meth:`View.rate`
    rate_factor: dict[tuple[str, int], float] = field(default_factory=dict)
    memo: dict[str, Any] = field(default_factory=dict)  # a policy's per-job scratch
    trace: Any = None  # what a rate source is keyed by in a replay (the trace's job record)

    @classmethod
    def from_spec(cls, spec: JobSpec) -> JobView:
        """A job as an operator's files or store describe it: its running state becomes
        its allocation (a DP/TP/PP plan of that shape), with no history."""
        alloc = None
        r = spec.running
        if r is not None:
            tp, pp = max(1, r.tp), max(1, r.stages)
            plan = ExecutionPlan(dp=max(1, r.gpus // (tp * pp)), tp=tp, pp=pp)
            alloc = Allocation(spec.id, r.gpu_type, r.gpus, pp, plan, dict(r.placement), 0.0)
        return cls(spec, alloc, done=float(spec.iterations_done))

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def remaining(self) -> float:
        return max(0.0, float(self.spec.iterations) - self.done)

    @property
    def running(self) -> bool:
        return self.alloc is not None

    @property
    def plan_hint(self) -> str | None:
        """The plan the job was submitted with, where its trace records one (Morphling's)."""
        return getattr(self.trace, "plan", None)

    @property
    def key(self) -> str:
        """The ground-truth key of the job's workload (its trace job type, else its model)."""
        return str(getattr(self.trace, "job_type", None) or self.spec.model)


@dataclass
class View:
    """Everything a policy may know at one round."""

    now: float
    cluster: Cluster
    jobs: list[JobView]
    rates: RateSource
    round_index: int = 0
    interval_s: float = 300.0
    seed: int = 0
    information: str = "estimated"  # oracle | estimated (what ``rates`` is)
    finished_recent: list[str] = field(default_factory=list)
    arrived_recent: list[str] = field(default_factory=list)
    capacity: dict[str, int] = field(default_factory=dict)
    # False where the rate source knows jobs by their trace records, not catalog models
    needs_catalog: bool = True
    # (job, plan) -> None | reason: what the executor's workloads run (None: every plan)
    plan_filter: Any = None
    # seconds a restarted job makes no progress, as the driver charges it (the simulator's
    # ``restart_cost_s``; ``run``'s and ``serve``'s median decision-to-first-iteration over
    # the executor's launches, runtime.loop.RestartMeter); None: the driver knows none, and a policy keeps its own figure (apportion's
    # objective: 60 s). ``interval_s`` and this are the round's figures apportion's
    # objective reads (formulations.objectives.FromRound)
    restart_s: float | None = None
    # fine-tuning jobs that finished and whose weights remain, as an operator's files or
    # store list them (a queued sibling may start from them); a replay's policies learn
    # them from ``finished_recent`` instead
    finished: list[JobView] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.capacity:
            self.capacity = self.cluster.capacity_by_type()

    def rate(self, js: JobView, gpu_type: str, gpus: int,
             placement: Mapping[str, int] | None = None, plan: str | None = None,
             **kw: Any) -> float:
        """The rate source's iterations/s for ``js`` (what this policy is allowed to know);
        0 where the job was seen to make no progress (``JobView.stalled_on``), corrected by
        what it was measured to do there (``JobView.rate_factor``)."""
        if (gpu_type, gpus) in js.stalled_on:
            return 0.0
        return js.rate_factor.get((gpu_type, gpus), 1.0) * float(
            self.rates.rate(js, gpu_type, gpus, placement, plan, **kw))

    @property
    def rng(self) -> np.random.Generator:
        """Randomness a policy may use: seeded by the run and the round."""
        return np.random.default_rng([self.seed, self.round_index])

    def job(self, job_id: str) -> JobView:
        for js in self.jobs:
            if js.id == job_id:
                return js
        raise KeyError(job_id)


@runtime_checkable
class Policy(Protocol):
    """One scheduling round: ``decide(view) -> Decision``."""

    name: str

    def decide(self, view: View) -> Decision: ...


def view_of(cluster: Cluster, jobs: list[JobSpec], now_s: float, rates: Any,
            information: str = "estimated", **kw: Any) -> View:
    """A view of a queue as an operator's files or store describe it (no history)."""
    return View(now_s, cluster, [JobView.from_spec(j) for j in jobs], rates,
                information=information, **kw)
