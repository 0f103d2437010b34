"""SCIP backend (bundled with OR-Tools, through its MPSolver wrapper): MILPs and LPs.

Why a second MILP solver beside HiGHS: exactness. On the fine-tuning mode MILP
(:mod:`apportion.formulations.finetune`, big-M rows linking continuous phase lengths
to one-hot GPU counts) HiGHS 1.14 was seen to prove wrong optima both with its
presolve (table 9, one GPU: 50 where 40 runs) and without it (a three-task instance:
88/5 "optimal" with bound 88/5 where 33/2 runs). SCIP agreed with an exhaustive search
on every instance of the sweep that found those. It ships inside the ``ortools`` wheel
the core already needs, so it costs no new dependency.

The hint (``model.hint``, complete) is passed as SCIP's starting solution; the time
limit counts from the call; the bound is SCIP's best bound (the objective for an LP).
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np
from apportion.formulations.model import LinearModel
from apportion.solvers.base import Backend, SolveResult, Status, empty_model_result

log = logging.getLogger(__name__)

_INF = 1e30


class ScipBackend(Backend):
    """Solve a neutral model with SCIP through ``ortools.linear_solver.pywraplp``."""

    name = "scip"

    def __init__(self, mip_rel_gap: float = 1e-4, threads: int = 1,
                 node_limit: int | None = None) -> None:
        self.mip_rel_gap = mip_rel_gap
        self.threads = threads
        # SCIP's branch-and-bound nodes: a budget in work, so a status does not depend on
        # the machine's load (the time limit then only a safety stop)
        self.node_limit = node_limit

    def join_chain(self, gap: float, stall_share: float | None) -> None:
        self.mip_rel_gap = gap  # no stall rule, and no work count: a work budget's share of the clock

    def available(self) -> bool:
        try:
            from ortools.linear_solver import pywraplp
        except ImportError:
            return False
        return pywraplp.Solver.CreateSolver("SCIP") is not None

    def solve(self, model: LinearModel, time_limit_s: float) -> SolveResult:
        from ortools.linear_solver import pywraplp

        start = time.perf_counter()
        if model.num_vars == 0:
            return empty_model_result(self.name, model, start)
        solver = pywraplp.Solver.CreateSolver("SCIP")
        if solver is None:
            return SolveResult(self.name, Status.ERROR, message="this ortools has no SCIP")
        solver.SetNumThreads(self.threads)
        inf = solver.infinity()

        def clip(v: float) -> float:
            return inf if v >= _INF else -inf if v <= -_INF else float(v)

        xs = [(solver.IntVar if integer else solver.NumVar)(clip(lb), clip(ub), f"x{i}")
              for i, (lb, ub, integer) in enumerate(zip(model.lb, model.ub, model.integer))]
        rlb, rub = model.row_bounds()
        for i, row in enumerate(model.rows):
            con = solver.RowConstraint(clip(rlb[i]), clip(rub[i]), "")
            for j, a in row.coeffs.items():
                con.SetCoefficient(xs[j], float(a))
        obj = solver.Objective()
        for j, c in enumerate(model.obj):
            if c:
                obj.SetCoefficient(xs[j], float(c))
        obj.SetOffset(float(model.obj_constant))
        if model.sense == "max":
            obj.SetMaximization()
        else:
            obj.SetMinimization()
        if model.hint and len(model.hint) == model.num_vars:
            solver.SetHint(xs, [float(model.hint[j]) for j in range(model.num_vars)])
        params = pywraplp.MPSolverParameters()
        params.SetDoubleParam(params.RELATIVE_MIP_GAP, self.mip_rel_gap)
        left = float(time_limit_s) - (time.perf_counter() - start)
        solver.SetTimeLimit(max(10, int(1000 * left)))
        if self.node_limit is not None:
            solver.SetSolverSpecificParametersAsString(f"limits/nodes = {int(self.node_limit)}\n")
        try:
            code = solver.Solve(params)
        except Exception as exc:  # noqa: BLE001 - a backend fault must not take the round down
            return SolveResult(self.name, Status.ERROR, wall_s=time.perf_counter() - start,
                               message=f"scip raised {exc!r}")
        wall = time.perf_counter() - start
        has_x = code in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE)
        x = None
        if has_x:
            x = np.fromiter((v.solution_value() for v in xs), float, len(xs))
            ints = np.asarray(model.integer, bool)
            x[ints] = np.round(x[ints])
        if code == pywraplp.Solver.OPTIMAL:
            status = Status.OPTIMAL
        elif code == pywraplp.Solver.INFEASIBLE:
            status = Status.INFEASIBLE
        elif has_x:
            status = Status.FEASIBLE
        else:
            status = Status.ERROR
        objective = model.objective_value(x) if x is not None else None
        bound = None
        if x is not None:
            b = obj.BestBound() if any(model.integer) else objective
            if b is not None and math.isfinite(b) and abs(b) < _INF:
                bound = float(b)
        names = {pywraplp.Solver.OPTIMAL: "optimal", pywraplp.Solver.FEASIBLE: "feasible",
                 pywraplp.Solver.INFEASIBLE: "infeasible", pywraplp.Solver.UNBOUNDED: "unbounded",
                 pywraplp.Solver.ABNORMAL: "abnormal", pywraplp.Solver.NOT_SOLVED: "not solved"}
        return SolveResult(self.name, status, x, objective, bound, wall,
                           message=names.get(code, f"code {code}"))
