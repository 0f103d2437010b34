"""LP relaxation and rounding: a fast answer and a bound for very large rounds.

The cell model is a multiple-choice knapsack with one capacity row per node
class; a basic optimal solution of its LP relaxation has at most about two
fractional variables per capacity row, so rounding them down (dropping those
few jobs, and any cell whose placement came out fractional) loses almost
nothing. The relaxation's optimum is a valid bound, so the answer comes with
an honest gap. Rounding down keeps every ``<=`` row and every homogeneous
equality (GPUs placed = GPUs of the cell) satisfied; the result is checked
against the model anyway and refused (status ``error``) if a row of another
shape broke, so the chain moves on.
"""

from __future__ import annotations

import copy
import time

import numpy as np

from apportion.formulations.model import LinearModel
from apportion.solvers.base import SolveResult, Status
from apportion.solvers.highs import HighsBackend


class LpRoundBackend:
    name = "lp-round"

    def __init__(self, tol: float = 1e-6) -> None:
        self.tol = tol

    def available(self) -> bool:
        return HighsBackend().available()

    def solve(self, model: LinearModel, time_limit_s: float) -> SolveResult:
        start = time.perf_counter()
        relaxed = copy.copy(model)
        relaxed.integer = [False] * model.num_vars
        relaxed.hint = {}
        lp = HighsBackend().solve(relaxed, time_limit_s)
        wall = time.perf_counter() - start
        if lp.x is None or lp.status is not Status.OPTIMAL:
            return SolveResult(self.name, Status.ERROR, wall_s=wall,
                               message=f"LP relaxation: {lp.status.value} ({lp.message})")
        x = np.asarray(lp.x, float).copy()
        ints = np.asarray(model.integer, bool)
        frac = ints & (np.abs(x - np.round(x)) > self.tol)
        x[ints] = np.floor(x[ints] + self.tol)
        # a chosen cell (binary at 1) whose placement columns were fractional lost GPUs:
        # drop every cell whose size row no longer balances
        for row in model.rows:
            if row.lb == row.ub == 0.0 and row.coeffs:
                act = sum(v * x[c] for c, v in row.coeffs.items())
                if abs(act) > self.tol:
                    for c in row.coeffs:
                        x[c] = 0.0
        if not model.is_feasible(x):
            return SolveResult(self.name, Status.ERROR, wall_s=time.perf_counter() - start,
                               message="rounded LP point violates the model")
        obj = model.objective_value(x)
        return SolveResult(self.name, Status.FEASIBLE, x, obj, lp.objective,
                           time.perf_counter() - start,
                           message=f"LP bound {lp.objective:.6g}; {int(frac.sum())} fractional "
                                   "columns rounded down")
