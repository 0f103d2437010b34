"""What a conformance suite discovers: everything registered now, plug-ins included."""

from __future__ import annotations

from apportion.estimation.registry import ESTIMATORS
from apportion.experiments.traces import formats
from apportion.policies import RECIPES, policy_names


def registered() -> dict[str, list[str]]:
    """Every registered policy, formulation, estimator and trace format, by name."""
    return {"policies": policy_names(), "formulations": list(RECIPES),
            "estimators": list(ESTIMATORS), "trace_formats": sorted(formats())}


__all__ = ["registered"]
