"""What a conformance suite discovers: everything registered now, plug-ins included."""

from __future__ import annotations

from apportion.estimation.registry import ESTIMATORS
from apportion.experiments.traces import formats
from apportion.policies import RECIPES, policy_names
from apportion.runtime.executors import executor_names


def registered() -> dict[str, list[str]]:
    """Every registered policy, formulation, estimator, executor and trace format, by name."""
    return {"policies": policy_names(), "formulations": list(RECIPES),
            "estimators": list(ESTIMATORS), "executors": executor_names(),
            "trace_formats": sorted(formats())}


__all__ = ["registered"]
