"""Execution plans and cells.

A :class:`Cell` (Crius) fixes a job's GPU type, GPU count and pipeline-stage
count and leaves the DP/TP split inside each stage to the tuner. An
:class:`ExecutionPlan` (Morphling) is the full recipe: parallel degrees,
micro-batches, ZeRO stage, offload, accumulation and checkpointing. The global
batch size is never part of a plan: it never changes across reconfigurations.

A *spilled* plan (Hydra) trains a model larger than the device shard by shard,
each shard's parameters and optimizer state moved between host and device
memory: ``spill_shards`` is the number of shards the estimator cut the model
into (0: the model is held whole, every plan before spilling) and
``spill_budget_mib`` the device memory the shards were sized for (the
worker's pilot run cuts the real model under it). Spilled plans run on one
GPU, one stage, without ZeRO, offload or accumulation.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class ExecutionPlan:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    micro_batches: int = 1
    zero_stage: int = 0
    offload: bool = False
    accumulation: int = 1
    checkpointing: bool = False
    spill_shards: int = 0  # Hydra's spilling: shards the model is cut into (0: held whole)
    spill_budget_mib: int = 0  # ... and the device memory each shard was sized for

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def spilled(self) -> bool:
        return self.spill_shards > 0

    @property
    def accumulation_steps(self) -> int:
        """Forward-backward passes a data-parallel rank makes per iteration before its
        optimiser step. Without a pipeline (``pp == 1``) a plan's ``micro_batches`` are
        accumulation steps too: the estimator, the memory check and the plans formulation
        size a memory-bound one-stage plan that way (``dp4 micro_batches=8`` holds an
        eighth of a rank's batch at a time), so the workers must run it that way; with a
        pipeline they are the pipeline's micro-batches, inside each accumulation step."""
        return self.accumulation * (max(1, self.micro_batches) if self.pp == 1 else 1)

    def as_dict(self) -> dict[str, Any]:
        """The plan's fields; the spill fields only on a spilled plan, so every plan written
        before spilling existed keeps its JSON byte for byte (readers default them)."""
        d = {name: getattr(self, name) for name in _PLAN_FIELDS}  # scalars: no deep copy
        if not self.spilled:
            del d["spill_shards"], d["spill_budget_mib"]
        return d

    def label(self) -> str:
        parts = [f"dp{self.dp}", f"tp{self.tp}", f"pp{self.pp}"]
        if self.pp > 1:
            parts.append(f"mb{self.micro_batches}")
        if self.zero_stage:
            parts.append(f"zero{self.zero_stage}")
        if self.offload:
            parts.append("offload")
        if self.accumulation > 1:
            parts.append(f"ga{self.accumulation}")
        if self.checkpointing:
            parts.append("gc")
        if self.spilled:
            parts.append(f"spill{self.spill_shards}")
        return "-".join(parts)


#: every field of a plan holds a scalar, so its dict is read field by field (a decision of
#: 10,000 jobs writes as many plans; ``dataclasses.asdict`` deep-copies each value)
_PLAN_FIELDS = tuple(f.name for f in fields(ExecutionPlan))


@dataclass(frozen=True)
class Cell:
    """Job x GPU type x GPU count x pipeline-stage count."""

    job: str
    gpu_type: str
    gpus: int
    stages: int

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.gpu_type, self.gpus, self.stages)

    @property
    def node_id(self) -> str:
        return f"cell:{self.job}:{self.gpu_type}:{self.gpus}:{self.stages}"


# Morphling's measured plan codes (its artifact's names): the data-parallel family
DP_FAMILY = ("ga", "gc", "zero-dp", "zero-offload")


def is_dp_plan(plan: str) -> bool:
    """A Morphling plan code Sia's DP-only scaling can express: DP with ZeRO/GA/GC/offload,
    or a 3-digit code with pp = tp = 1."""
    return plan in DP_FAMILY or (plan.isdigit() and len(plan) == 3 and plan[:2] == "11")
