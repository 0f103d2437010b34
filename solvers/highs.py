"""HiGHS backend (highspy): MILP/LP straight from the neutral model's arrays."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import numpy as np

from apportion.formulations.model import LinearModel
from apportion.solvers.base import WORK_PER_S, Backend, SolveResult, Status, empty_model_result

log = logging.getLogger(__name__)

_INF = 1e30  # HiGHS's infinity
MIN_STALL_S = 0.2  # a stall shorter than this never stops HiGHS (see ``stall_share``)


def _clip(values: list[float] | np.ndarray) -> np.ndarray:
    arr = np.asarray(values, float)
    return np.clip(arr, -_INF, _INF)


def highs_lp(model: LinearModel, csc: Any) -> Any:
    """``model`` (a :class:`~apportion.formulations.model.LinearModel`) as a ``highspy.HighsLp``
    with its matrix ``csc`` (column-wise), without integrality: what every HiGHS path here
    passes (the MIP backend adds the integrality, the kept LP does not)."""
    import highspy

    lp = highspy.HighsLp()
    lp.num_col_ = model.num_vars
    lp.num_row_ = model.num_rows
    lp.col_cost_ = model.vector("obj")
    lp.col_lower_ = _clip(model.vector("lb"))
    lp.col_upper_ = _clip(model.vector("ub"))
    rlb, rub = model.row_bounds()
    lp.row_lower_ = _clip(rlb)
    lp.row_upper_ = _clip(rub)
    lp.offset_ = model.obj_constant
    lp.sense_ = (highspy.ObjSense.kMaximize if model.sense == "max"
                 else highspy.ObjSense.kMinimize)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = csc.indptr.astype(np.int32)
    lp.a_matrix_.index_ = csc.indices.astype(np.int32)
    lp.a_matrix_.value_ = csc.data.astype(float)
    return lp


class HighsBackend(Backend):
    """Solve with HiGHS; warm-starts from ``model.hint`` when it is complete.

    ``stall_share``: stop the branch and bound once its incumbent (the hint counts) has not
    improved for this share of the time limit (at least ``MIN_STALL_S``): a chain sets it,
    because in a budget-bound round the rest of HiGHS's share rarely buys a better answer
    (``solvers.chain``); None runs to the limit or the gap.

    ``work_s`` (a deterministic budget, set by a chain that has one): the branch and bound
    stops after this much work (``base.WORK_PER_S`` units a second) and its stall is
    measured in work too, so the same model gets the same answer on every run; the time
    limit is then only a safety stop (a run that reaches it says so). An LP has no such
    limit: its simplex runs to its optimum (or the time limit). Each of HiGHS's interrupt
    callbacks counts as the model's columns of work, or as ``work_columns`` when set: a
    restricted MIP is charged as the whole model it restricts (``solvers.lpround``).
    """

    name = "highs"
    counts_work = True

    def __init__(self, mip_rel_gap: float = 1e-4, threads: int = 1, presolve: str = "choose",
                 reduced_costs: bool = False, stall_share: float | None = None) -> None:
        self.mip_rel_gap = mip_rel_gap
        self.threads = threads
        self.presolve = presolve  # "off" works around presolve reductions that lose optima
        self.reduced_costs = reduced_costs  # an LP's column duals in ``extra["reduced_costs"]``
        self.stall_share = stall_share
        self.work_s: float | None = None
        self.work_columns: int | None = None

    def join_chain(self, gap: float, stall_share: float | None) -> None:
        self.mip_rel_gap = gap
        self.stall_share = stall_share

    def available(self) -> bool:
        try:
            import highspy  # noqa: F401
        except ImportError:
            return False
        return True

    def solve(self, model: LinearModel, time_limit_s: float) -> SolveResult:
        import highspy

        start = time.perf_counter()
        if model.num_vars == 0:
            return empty_model_result(self.name, model, start)
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("time_limit", max(0.01, float(time_limit_s)))
        h.setOptionValue("mip_rel_gap", self.mip_rel_gap)
        h.setOptionValue("threads", self.threads)
        h.setOptionValue("presolve", self.presolve)
        n = model.num_vars
        lp = highs_lp(model, model.columns())
        if any(model.integer):
            lp.integrality_ = [
                highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
                for i in model.integer
            ]
        h.passModel(lp)
        if model.hint and len(model.hint) == n:
            sol = highspy.HighsSolution()
            sol.col_value = [model.hint[i] for i in range(n)]
            sol.value_valid = True
            h.setSolution(sol)
        # the limit counts from the call: building the model above spent part of it
        h.setOptionValue("time_limit", max(0.01, float(time_limit_s) - (time.perf_counter() - start)))
        watch = self._watch(h, time_limit_s, self.work_columns or n)
        try:
            h.run()
        except Exception as exc:  # a backend fault must not take the round down
            return SolveResult(self.name, Status.ERROR, wall_s=time.perf_counter() - start,
                               message=f"highs raised {exc!r}")
        wall = time.perf_counter() - start
        ms = h.getModelStatus()
        info = h.getInfo()
        status_name = h.modelStatusToString(ms)
        x = None
        if info.primal_solution_status == 2:  # kSolutionStatusFeasible
            x = np.asarray(h.getSolution().col_value, float)
            ints = np.asarray(model.integer, bool)
            x[ints] = np.round(x[ints])
        extra: dict[str, Any] = {}
        if self.work_s is not None:
            extra["work_s"] = watch["work"] / WORK_PER_S
            extra["time_limited"] = ms == highspy.HighsModelStatus.kTimeLimit
        if self.reduced_costs and x is not None and not any(model.integer):
            extra["reduced_costs"] = np.asarray(h.getSolution().col_dual, float)
        if ms == highspy.HighsModelStatus.kOptimal and x is not None:
            status = Status.OPTIMAL
        elif ms == highspy.HighsModelStatus.kInfeasible:
            status = Status.INFEASIBLE
        elif x is not None:
            status = Status.FEASIBLE
        else:
            status = Status.ERROR
        objective = model.objective_value(x) if x is not None else None
        bound = None
        if any(model.integer):
            b = info.mip_dual_bound
            if b is not None and math.isfinite(b) and abs(b) < 1e29:
                bound = float(b)
        elif status is Status.OPTIMAL:
            bound = objective
        if status is Status.OPTIMAL and bound is None:
            bound = objective
        if watch["stalled"] is not None:
            status_name += f" (stopped: no better answer for {watch['stalled']:.2f} s)"
        elif watch["capped"]:
            status_name += f" (stopped: its work budget of {self.work_s:.2f} s was spent)"
        return SolveResult(self.name, status, x, objective, bound, wall, message=status_name,
                           extra=extra)

    def _watch(self, h: Any, time_limit_s: float, columns: int) -> dict[str, Any]:
        """Interrupt ``h`` once its incumbent stalls (``stall_share``) or, with ``work_s``,
        once its work is spent; the returned dict says how far it got: ``work`` (units),
        ``stalled`` (the stall's length in seconds, nominal ones with ``work_s``; None) and
        ``capped`` (the work budget stopped it)."""
        state: dict[str, Any] = {"work": 0.0, "stalled": None, "capped": False}
        det = self.work_s is not None
        if self.stall_share is None and not det:
            return state
        # the clock of a deterministic budget is its work: both the cap and the stall
        if det:
            assert self.work_s is not None
            cap = self.work_s * WORK_PER_S
            window = math.inf if self.stall_share is None else \
                max(MIN_STALL_S, self.stall_share * self.work_s) * WORK_PER_S
        else:
            cap = math.inf
            window = max(MIN_STALL_S, (self.stall_share or 0.0) * float(time_limit_s))
        last = [0.0 if det else time.perf_counter()]

        def clock() -> float:
            return state["work"] if det else time.perf_counter()

        def improved(_event: Any) -> None:
            last[0] = clock()

        def interrupt(event: Any) -> None:
            state["work"] += columns
            idle = clock() - last[0]
            if state["work"] >= cap:
                event.data_in.user_interrupt = True
                state["capped"] = True
            elif idle > window:
                event.data_in.user_interrupt = True
                if state["stalled"] is None:
                    state["stalled"] = idle / WORK_PER_S if det else idle

        try:
            h.cbMipImprovingSolution.subscribe(improved)
            h.cbMipInterrupt.subscribe(interrupt)
        except AttributeError:  # a highspy without the callback API: run to the limit
            log.info("this highspy has no MIP callbacks: HiGHS runs to its limit")
        return state
