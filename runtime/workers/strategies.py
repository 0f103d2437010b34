"""The torch worker's strategy for a plan: which wrapper runs it exactly.

Kept apart from the strategies themselves so that neither ``parallel`` nor
``pipeline_parallel`` imports the other's user: ``parallel`` (DDP, FSDP, TP
and the ``Strategy`` base) <- ``pipeline_parallel`` <- this module <- the
trainer. No import cycle, no import hidden in a function.
"""

from __future__ import annotations

from apportion.runtime.workers.parallel import FsdpStrategy, Strategy, TensorParallelStrategy
from apportion.runtime.workers.pipeline_parallel import PipelineStrategy
from torch import nn

from apportion.plans import ExecutionPlan


def wrap(module: nn.Module, plan: ExecutionPlan, rank: int, world: int, micro: int) -> Strategy:
    """The strategy that runs ``plan`` exactly; the caller has already run ``check_plan``."""
    if plan.pp > 1:
        return PipelineStrategy(module, plan, rank, world, micro)
    if plan.tp > 1:
        return TensorParallelStrategy(module, plan, rank, world)
    if plan.zero_stage and world > 1:
        return FsdpStrategy(module, plan, rank, world)
    # one rank: sharding over a single rank changes nothing, the plain strategy is exact
    return Strategy(module, plan, rank, world)
