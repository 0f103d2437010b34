"""Optional Alpa adapter: compile a JAX train step with Alpa's auto-parallelisation.

Alpa (Zheng et al., OSDI'22; Crius builds its cells on it) searches intra- and
inter-operator parallel plans for a JAX function. It pins old jax/jaxlib and
CUDA builds, so it is optional: when ``alpa`` is importable this module maps
an :class:`~apportion.plans.ExecutionPlan` to Alpa's parallel methods
(``ShardParallel`` for one stage, ``PipeshardParallel`` with the plan's stage
and micro-batch counts otherwise); when it is not, every entry point raises
:class:`AlpaUnavailable` naming the missing package, never falling back to a
different plan silently.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

from apportion.plans import ExecutionPlan

log = logging.getLogger(__name__)


class AlpaUnavailable(ImportError):
    """The optional ``alpa`` package is not installed (or does not import)."""


def require_alpa() -> Any:
    """The ``alpa`` module, or a clear error naming the missing package."""
    try:
        return importlib.import_module("alpa")
    except ImportError as exc:
        raise AlpaUnavailable(
            "the Alpa adapter needs the 'alpa' package, which is not importable here "
            f"({exc}); install alpa with its matching jaxlib build (see alpa-projects.github.io) "
            "or use runtime.workers.jax_worker for DP/TP sharding without Alpa") from exc


def parallel_method(plan: ExecutionPlan) -> Any:
    """Alpa's parallel method for ``plan``: its stage count and micro-batches, unchanged."""
    alpa = require_alpa()
    if plan.pp <= 1:
        return alpa.ShardParallel(num_micro_batches=max(1, plan.accumulation_steps))
    return alpa.PipeshardParallel(num_micro_batches=max(1, plan.micro_batches),
                                  layer_option=alpa.AutoLayerOption(layer_num=plan.pp),
                                  stage_option="auto")


def parallelize(train_step: Callable[..., Any], plan: ExecutionPlan) -> Callable[..., Any]:
    """``alpa.parallelize`` applied to ``train_step`` with the plan's method."""
    alpa = require_alpa()
    if not getattr(alpa, "_apportion_initialized", False):
        alpa.init(cluster="local")
        alpa._apportion_initialized = True
    return alpa.parallelize(train_step, method=parallel_method(plan))
