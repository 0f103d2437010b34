"""What baselines share: the core's packer and decision assembly, and type choice by rate.

Policies think in (job, GPU type, GPU count); the decision format wants node
placements, a plan, an action and a typed reason for every job left out. The
packing rule (:class:`apportion.placement.Packer`) and the assembly
(:func:`apportion.assembly.build_decision`) are the core's, written once for
every policy; this module re-exports them and adds the type choices baselines
make from the view's rates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from apportion.assembly import Choice, build_decision
from apportion.placement import Packer, type_order

__all__ = ["Choice", "Packer", "Running", "best_type", "build_decision", "requested_type",
           "type_order"]


def best_type(state: Any, js: Any, gpus: int, types: list[str] | None = None) -> tuple[str | None, float]:
    """The GPU type with the highest viewed rate at ``gpus`` GPUs (None if it runs nowhere)."""
    best, rate = None, 0.0
    for t in types or type_order(state.cluster):
        r = state.rate(js, t, gpus)
        if r > rate:
            best, rate = t, r
    return best, rate


def requested_type(state: Any, js: Any) -> tuple[str | None, float]:
    """The job's requested type when the cluster has it and it runs there, else its best type."""
    t = js.spec.requested_gpu_type
    if t and t in state.capacity:
        r = state.rate(js, t, js.spec.requested_gpus)
        if r > 0:
            return t, r
    return best_type(state, js, js.spec.requested_gpus)


@dataclass
class Running:
    """Bookkeeping many baselines share: what each job held last round."""

    prev: dict[str, Choice] = field(default_factory=dict)
