"""OR-Tools CP-SAT backend: the neutral model after integer scaling.

CP-SAT needs integer coefficients and finite domains. Each row is multiplied by
the smallest power of ten (up to 10^6) that makes its coefficients integral,
and its bounds are rounded inward (valid because the row's activity is then an
integer). The objective is scaled so its largest coefficient maps to about
``objective_resolution`` and rounded; the objective reported is recomputed from
the solution with the original coefficients, and the bound is unscaled (so it
is exact up to the rounding, ``n * 0.5 / scale``). Models with continuous
variables are refused (status ``error``) so the chain moves on to HiGHS.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import numpy as np

from apportion.formulations.model import LinearModel
from apportion.solvers.base import Backend, SolveResult, Status, empty_model_result

log = logging.getLogger(__name__)

_BIG = 10**12


def _integral_scale(values: list[float], max_power: int = 6) -> int | None:
    """Smallest 10^k (k <= max_power) making all values integral, else None."""
    for k in range(max_power + 1):
        s = 10**k
        if all(abs(v * s - round(v * s)) <= 1e-9 * max(1.0, abs(v * s)) for v in values):
            return s
    return None


def _finite(v: float) -> int:
    if not math.isfinite(v):
        return _BIG if v > 0 else -_BIG
    return int(max(-_BIG, min(_BIG, round(v))))


class CpSatBackend(Backend):
    """Solve a pure-integer neutral model with CP-SAT.

    ``work_s`` (a deterministic budget, set by a chain that has one): CP-SAT's own
    deterministic time limit instead of seconds, on one worker (its parallel portfolio
    does not repeat), the time limit only a safety stop."""

    name = "cp-sat"
    counts_work = True

    def __init__(self, workers: int = 2, objective_resolution: float = 1e6, seed: int = 0) -> None:
        self.workers = workers
        self.objective_resolution = objective_resolution
        self.seed = seed
        self.work_s: float | None = None

    def available(self) -> bool:
        try:
            from ortools.sat.python import cp_model  # noqa: F401
        except ImportError:
            return False
        return True

    def solve(self, model: LinearModel, time_limit_s: float) -> SolveResult:
        from ortools.sat.python import cp_model

        start = time.perf_counter()
        if model.num_vars == 0:
            return empty_model_result(self.name, model, start)
        if not model.is_pure_integer():
            return SolveResult(self.name, Status.ERROR, message="cp-sat needs integer variables only")
        m = cp_model.CpModel()
        xs = [
            m.NewIntVar(_finite(math.ceil(lb - 1e-9)), _finite(math.floor(ub + 1e-9)), str(i))
            for i, (lb, ub) in enumerate(zip(model.lb, model.ub))
        ]
        for row in model.rows:
            if not row.coeffs:
                continue
            s = _integral_scale(list(row.coeffs.values()))
            if s is None:
                return SolveResult(self.name, Status.ERROR,
                                   message=f"row {row.name}: coefficients not integral at 1e-6")
            expr = sum(int(round(v * s)) * xs[c] for c, v in row.coeffs.items())
            if math.isfinite(row.lb):
                m.Add(expr >= math.ceil(row.lb * s - 1e-9))
            if math.isfinite(row.ub):
                m.Add(expr <= math.floor(row.ub * s + 1e-9))
        obj = np.asarray(model.obj, float)
        top = float(np.max(np.abs(obj))) if obj.size else 0.0
        scale = self.objective_resolution / top if top > 0 else 1.0
        iobj = [int(round(v * scale)) for v in obj]
        expr = sum(c * xs[i] for i, c in enumerate(iobj) if c != 0)
        if model.sense == "max":
            m.Maximize(expr)
        else:
            m.Minimize(expr)
        for col, val in model.hint.items():
            m.AddHint(xs[col], int(round(val)))
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(0.01, float(time_limit_s))
        solver.parameters.num_workers = self.workers
        if self.work_s is not None:
            solver.parameters.max_deterministic_time = max(0.01, float(self.work_s))
            solver.parameters.num_workers = 1
        solver.parameters.random_seed = self.seed
        try:
            code = solver.Solve(m)
        except Exception as exc:  # a backend fault must not take the round down
            return SolveResult(self.name, Status.ERROR, wall_s=time.perf_counter() - start,
                               message=f"cp-sat raised {exc!r}")
        wall = time.perf_counter() - start
        x = None
        if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            x = np.array([solver.Value(v) for v in xs], float)
        if code == cp_model.OPTIMAL:
            status = Status.OPTIMAL
        elif code == cp_model.FEASIBLE:
            status = Status.FEASIBLE
        elif code == cp_model.INFEASIBLE:
            status = Status.INFEASIBLE
        else:
            status = Status.ERROR
        objective = model.objective_value(x) if x is not None else None
        bound = None
        if x is not None:
            bound = solver.BestObjectiveBound() / scale + model.obj_constant
            if status is Status.OPTIMAL and objective is not None:
                # The scaled optimum is exact up to rounding; report the true objective.
                bound = objective if abs(bound - objective) <= len(iobj) / scale else bound
        extra: dict[str, Any] = {"objective_scale": scale}
        if self.work_s is not None:
            extra["work_s"] = float(solver.deterministic_time)
            extra["time_limited"] = wall >= float(time_limit_s)
        return SolveResult(self.name, status, x, objective, bound, wall,
                           message=solver.StatusName(code), extra=extra)
