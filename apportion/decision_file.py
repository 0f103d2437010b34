"""The decision JSON as a file other commands read (``export k8s``, ``export slurm``).

``solve-round --json`` writes it; its keys are a contract (:mod:`apportion.decision`).
:func:`load_decision` reads one back through the bounded reader, naming the file and the
field of anything wrong; :func:`check_decision` asks the independent validator whether it
is a valid decision for the cluster and jobs given with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field

from apportion.cluster import Cluster
from apportion.config import GpuName, _Strict, _validate
from apportion.decision import Action, Allocation, Decision, Pending, Reason, SolveReport
from apportion.errors import InputError
from apportion.inputs import read_json
from apportion.jobs import JobSpec
from apportion.plans import ExecutionPlan
from apportion.validator import validate


class PlanEntry(_Strict):
    dp: int = Field(ge=1)
    tp: int = Field(default=1, ge=1)
    pp: int = Field(default=1, ge=1)
    micro_batches: int = Field(default=1, ge=1)
    zero_stage: int = Field(default=0, ge=0, le=3)
    offload: bool = False
    accumulation: int = Field(default=1, ge=1)
    checkpointing: bool = False
    spill_shards: int = Field(default=0, ge=0)  # a spilled plan (Hydra): ExecutionPlan's fields
    spill_budget_mib: int = Field(default=0, ge=0)


class AllocationEntry(_Strict):
    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True, strict=False)
    job: str = Field(min_length=1)
    gpu_type: GpuName
    gpus: int = Field(gt=0)
    stages: int = Field(default=1, gt=0)
    plan: PlanEntry
    placement: dict[str, int] = Field(min_length=1)
    est_throughput: float = 0.0
    action: Literal["start", "keep", "resize", "migrate"] = "start"
    cpus: int = Field(default=0, ge=0)
    host_memory_gib: float = Field(default=0.0, ge=0)
    iter_time_s: float | None = Field(default=None, ge=0, le=1e9)
    global_batch_size: int | None = Field(default=None, gt=0)  # a batch the round chose


class DecisionFile(_Strict):
    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True, strict=False)
    allocations: list[AllocationEntry]
    pending: list[dict[str, Any]] = Field(default_factory=list)
    formulation: str = "cells"


def load_decision(path: str | Path) -> Decision:
    """A decision JSON (``solve-round --json``); errors name the file and the field."""
    src = str(path)
    data = read_json(path, "decision JSON")
    spec: DecisionFile = _validate(DecisionFile, data, src)
    allocs = [Allocation(a.job, a.gpu_type, a.gpus, a.stages, ExecutionPlan(**a.plan.model_dump()),
                         dict(a.placement), a.est_throughput, Action(a.action),
                         iter_time_s=a.iter_time_s, cpus=a.cpus,
                         host_memory_gib=a.host_memory_gib,
                         global_batch_size=a.global_batch_size) for a in spec.allocations]
    pending = []
    for i, p in enumerate(spec.pending):
        try:
            pending.append(Pending(str(p["job"]), Reason(p["reason"]), str(p.get("detail", ""))))
        except (KeyError, ValueError) as exc:
            raise InputError(src, f"pending[{i}]", f"needs job and a known reason ({exc})") \
                from None
    return Decision(allocs, pending, SolveReport("file", "feasible", None, None, None, 0.0, False),
                    spec.formulation)


def check_decision(decision: Decision, cluster: Cluster, jobs: list[JobSpec], src: str) -> None:
    """The independent validator's verdict on a decision read from a file (exit 2 if invalid)."""
    known = {j.id for j in jobs}
    for i, a in enumerate(decision.allocations):
        if a.job not in known:
            raise InputError(src, f"allocations[{i}].job", f"{a.job!r} is not in the jobs file")
    res = validate(decision, cluster, jobs)
    if not res.ok:
        raise InputError(src, "allocations", "not a valid decision for this cluster and jobs: "
                         + "; ".join(res.violations[:5]))
