"""What a round decides, and how the solver got there.

The JSON written by ``solve-round --json`` is a contract: ``solver`` {backend,
status, objective, bound, gap, wall_s, fallback}, ``allocations`` [{job,
gpu_type, gpus, stages, plan {dp, tp, pp}, placement, est_throughput, estimator, source,
and ``global_batch_size`` where the policy chose the job's batch}] and
``pending`` [{job, reason}]. Fields may be added, never renamed or dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from apportion.plans import ExecutionPlan


class Action(str, Enum):
    START = "start"
    KEEP = "keep"
    RESIZE = "resize"
    MIGRATE = "migrate"
    PREEMPT = "preempt"
    DROP = "drop"


class Reason(str, Enum):
    """Why a job is not placed (a typed reason, stored per round)."""

    NO_FIT_MEMORY = "no-fit-memory"  # no cell of any type fits the model in memory
    NO_GPU_TYPE = "no-gpu-type"  # the requested GPU type is not in the cluster
    NO_CAPACITY = "no-capacity"  # feasible cells exist but the capacity went elsewhere
    QUOTA = "quota"
    DEADLINE_UNMEETABLE = "deadline-unmeetable"
    PREEMPTED = "preempted"
    SEARCH_DEPTH = "search-depth"  # the round's change budget was used up
    CATALOG = "catalog"  # its model or GPU type is not in the catalog
    TOO_LARGE = "too-large"  # it asks for more GPUs than the cluster has
    MERGED = "merged"  # it trains inside another job's allocation (YMIR's spatial merging)
    # it waits for a running fine-tuning sibling's weights: started from them once that
    # sibling ends, it finishes sooner than started now (YMIR's temporal mode A->B)
    AWAITS_SOURCE = "awaits-source"
    NO_PLAN = "no-supported-plan"  # the job's workload runs none of its candidate plans
    NO_FIT_HOST = "no-fit-host"  # every plan needs more CPUs or host memory than a node has
    NO_ESTIMATE = "no-estimate"  # the estimator has nothing for it (no measured times)


# Reasons no later round can change on this cluster (Kubernetes' UnschedulableAndUnresolvable);
# the others may clear when capacity frees up.
UNRESOLVABLE = frozenset({Reason.NO_FIT_MEMORY, Reason.NO_GPU_TYPE, Reason.CATALOG,
                          Reason.TOO_LARGE, Reason.DEADLINE_UNMEETABLE,
                          Reason.NO_PLAN, Reason.NO_FIT_HOST, Reason.NO_ESTIMATE})


def derive_action(prev: Any, gpu_type: str, gpus: int, stages: int,
                  placement: dict[str, int], tp: int | None = None) -> Action:
    """The one action rule: what moving from ``prev`` to a new allocation means.

    ``prev`` is where the job runs now (a :class:`~apportion.jobs.RunningState`
    or an :class:`Allocation`), or None. Another GPU type is a migration;
    another GPU count, stage count or tensor-parallel degree is a resize (the
    workers relaunch with a new plan); the same cell on other nodes is a
    migration; otherwise the job keeps running as it is. An unknown previous
    placement (empty) counts as the same.
    """
    if prev is None:
        return Action.START
    if prev.gpu_type != gpu_type:
        return Action.MIGRATE
    prev_tp = getattr(prev, "tp", None)
    if prev_tp is None and getattr(prev, "plan", None) is not None:
        prev_tp = prev.plan.tp
    if prev.gpus != gpus or prev.stages != stages or (
            tp is not None and prev_tp is not None and prev_tp != tp):
        return Action.RESIZE
    if prev.placement and dict(prev.placement) != dict(placement):
        return Action.MIGRATE
    return Action.KEEP


@dataclass
class Allocation:
    job: str
    gpu_type: str
    gpus: int
    stages: int
    plan: ExecutionPlan
    placement: dict[str, int]
    est_throughput: float
    action: Action = Action.START
    iter_time_s: float | None = None
    normalized_throughput: float | None = None
    mem_per_gpu_gib: float | None = None
    cpus: int = 0
    host_memory_gib: float = 0.0
    estimator: str | None = None  # which estimator the allocation's figures came from
    # where its figures came from: {kind: measured | fitted | profiled | analytic, detail,
    # and where known samples, age_s, device, backend, heldout_error, refused}
    source: dict[str, Any] | None = None
    # the global batch it runs at, where the policy chose it (a job with a ``batch_range``:
    # Pollux's goodput); None: the job's own ``global_batch_size``
    global_batch_size: int | None = None

    def as_dict(self) -> dict[str, Any]:
        out = self._fields()
        if self.global_batch_size is not None:  # only where chosen: older decisions' bytes
            out["global_batch_size"] = self.global_batch_size
        return out

    def _fields(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "gpu_type": self.gpu_type,
            "gpus": self.gpus,
            "stages": self.stages,
            "plan": self.plan.as_dict(),
            "placement": dict(sorted(self.placement.items())),
            "est_throughput": self.est_throughput,
            "action": self.action.value,
            "iter_time_s": self.iter_time_s,
            "normalized_throughput": self.normalized_throughput,
            "mem_per_gpu_gib": self.mem_per_gpu_gib,
            "cpus": self.cpus,
            "host_memory_gib": self.host_memory_gib,
            "estimator": self.estimator,
            "source": self.source,
        }


@dataclass
class Pending:
    """A job not placed this round: why, which stage of the round said so, and whether it
    can ever fit on this cluster (False: no later round will place it as it is)."""

    job: str
    reason: Reason
    detail: str = ""
    action: Action | None = None  # PREEMPT when a running job lost its place
    stage: str = "solve"  # admit | candidates | solve (the round stage that left it out)
    can_ever_fit: bool | None = None  # None: derived from the reason

    def __post_init__(self) -> None:
        if self.can_ever_fit is None:
            self.can_ever_fit = self.reason not in UNRESOLVABLE

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"job": self.job, "reason": self.reason.value, "detail": self.detail,
                               "stage": self.stage, "can_ever_fit": self.can_ever_fit}
        if self.action is not None:
            out["action"] = self.action.value
        return out


@dataclass
class SolveReport:
    """Canonical status of the round's solve, with every backend tried."""

    backend: str
    status: str
    objective: float | None
    bound: float | None
    gap: float | None
    wall_s: float
    fallback: bool
    fallback_reason: str = ""
    attempts: list[dict[str, Any]] = field(default_factory=list)
    model_size: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "status": self.status,
            "objective": self.objective,
            "bound": self.bound,
            "gap": self.gap,
            "wall_s": round(self.wall_s, 6),
            "fallback": self.fallback,
            "fallback_reason": self.fallback_reason,
            "attempts": self.attempts,
            "model_size": self.model_size,
        }


@dataclass
class Decision:
    allocations: list[Allocation]
    pending: list[Pending]
    report: SolveReport
    formulation: str = "cells"
    meta: dict[str, Any] = field(default_factory=dict)

    def allocation(self, job: str) -> Allocation | None:
        for a in self.allocations:
            if a.job == job:
                return a
        return None

    def as_dict(self) -> dict[str, Any]:
        return {
            "formulation": self.formulation,
            "solver": self.report.as_dict(),
            "allocations": [a.as_dict() for a in sorted(self.allocations, key=lambda a: a.job)],
            "pending": [p.as_dict() for p in sorted(self.pending, key=lambda p: p.job)],
            "meta": self.meta,
        }
