"""Solving cvxpy models: HiGHS through cvxpy where installed, then the open fallbacks."""

from __future__ import annotations

import logging
from typing import Any

import cvxpy as cp
import numpy as np

log = logging.getLogger(__name__)

PREFERENCE = ("HIGHS", "CLARABEL", "ECOS", "SCS")


def solve_cvxpy(problem: cp.Problem, variable: cp.Variable,
                preference: tuple[str, ...] = PREFERENCE) -> tuple[np.ndarray, str]:
    """Solve with the first installed solver of ``preference`` that succeeds; returns
    (clipped value, solver)."""
    last: Any = None
    for name in preference:
        if name not in cp.installed_solvers():
            continue
        try:
            problem.solve(solver=name)
        except cp.error.SolverError as exc:  # try the next one
            last = exc
            continue
        if variable.value is not None and problem.status in ("optimal", "optimal_inaccurate"):
            return np.clip(np.asarray(variable.value, float), 0.0, 1.0), name
    log.warning("no cvxpy solver solved the problem (%s)", last or problem.status)
    return np.zeros(variable.shape), "none"
