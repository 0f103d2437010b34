"""Column generation: a model's LP solved over the columns it needs, priced by its duals.

For a model whose binary columns are grouped by *choice rows* (``sum_{c in G} x_c <= 1``:
one option per job, as every allocation model here has), most columns are options no LP
optimum uses. The **restricted master** holds a few per group (the best of each *family*
``model.meta["column_family"]`` names, e.g. a job's best plan per GPU type and count, or
the most valuable few), the columns no choice row holds, and the hint's. Each round:

1. solve the restricted master's LP with HiGHS (warm: columns are added to the same LP,
   its basis kept);
2. price every column with the row duals ``y``: reduced cost ``c_j - a_j . y``;
3. add, per group, the ``ADD_PER_GROUP`` columns of largest positive reduced cost;

until no column prices out (the restricted LP's optimum is then the whole LP's) or the
budget or ``max_rounds`` ends it. Every round also gives a **Lagrangian bound**, valid
whether or not it converged: with ``y`` on every row but the choice rows (sign-corrected),

    L(y) = sum_r y_r b_r + sum_G max(0, max_{c in G} (c_c - a_c . y)) + (free columns' best)

bounds the LP, so the MIP; the best of them is the bound reported (at convergence it is
the LP optimum). The integer answer is LP rounding (:mod:`apportion.solvers.lpround`: the
rounded LP, filled, and the MIP over its support and neighbours) on the restricted master,
then :func:`~apportion.solvers.lpround.fill` on the whole model.

A column's price needs only its coefficients, so a formulation may hand the master a
model of every option (cheap to hold: one column each) and the LP never sees most of
them. On the plans master of a 1,000-job round on Crius's 1,280 GPUs (about 27,000
columns, 870 rows) the restricted master stays at a few thousand columns.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
from apportion.formulations.model import LinearModel, Row
from apportion.solvers.base import Backend, SolveResult, Status, empty_model_result
from apportion.solvers.lpround import LpRoundBackend, fill

ADD_PER_GROUP = 2  # columns added per choice row and round (the largest reduced costs)
INITIAL_PER_GROUP = 2  # without families: the most valuable few of each group start
MAX_ROUNDS = 60
TOL = 1e-7
_INF = 1e30


def choice_rows(model: LinearModel) -> np.ndarray:
    """Per column, the choice row holding it (-1: none). A choice row is ``sum x <= 1`` over
    binary columns (coefficients 1, no lower bound), and no column is in two."""
    lens, cols, data = model.entries()
    rlb, rub = model.row_bounds()
    ints = np.asarray(model.integer, bool)
    ub = np.asarray(model.ub, float)
    lb = np.asarray(model.lb, float)
    binary = ints & (lb == 0.0) & (ub <= 1.0)
    row_of = np.repeat(np.arange(len(lens)), lens)
    ones = np.ones(len(lens), bool)
    np.logical_and.at(ones, row_of, (data == 1.0) & binary[cols])
    ones &= (rub == 1.0) & (rlb <= 0.0) & (lens > 0)
    out = np.full(model.num_vars, -1, np.int64)
    pick = ones[row_of]
    counts = np.bincount(cols[pick], minlength=model.num_vars)
    out[cols[pick]] = row_of[pick]
    out[counts > 1] = -1  # a column in two choice rows: treated as free (always present)
    return out


def restrict(model: LinearModel, cols: np.ndarray) -> LinearModel:
    """The model over ``cols`` only (every row kept, coefficients of the others dropped)."""
    sub = LinearModel(model.name + "-restricted", model.sense)
    lb, ub, obj = (np.asarray(v, float) for v in (model.lb, model.ub, model.obj))
    for i, j in enumerate(cols):
        sub.add_var(model.var_keys[j], lb[j], ub[j], model.integer[j], obj[j])
    sub.obj_constant = model.obj_constant
    csr = model.matrix()[:, cols].tocsr()
    for r, row in enumerate(model.rows):
        a, b = csr.indptr[r], csr.indptr[r + 1]
        sub.rows.append(Row(row.name, dict(zip(csr.indices[a:b].tolist(),
                                               csr.data[a:b].tolist())), row.lb, row.ub))
    if model.hint:
        sub.hint = {i: float(model.hint.get(int(j), 0.0)) for i, j in enumerate(cols)}
    return sub


class ColGenBackend(Backend):
    """The model's LP by column generation, then LP rounding on the columns it generated
    (see the module docstring). ``max_rounds``: a cap on pricing rounds (a work limit:
    tests and a deterministic budget use it, never the clock)."""

    name = "colgen"
    counts_work = True

    def __init__(self, mip_rel_gap: float | None = None, max_rounds: int = MAX_ROUNDS,
                 add_per_group: int = ADD_PER_GROUP) -> None:
        self.mip_rel_gap = mip_rel_gap
        self.max_rounds = max_rounds
        self.add_per_group = add_per_group
        self.work_s: float | None = None  # a deterministic budget: passed to LP rounding
        self.last: dict[str, Any] = {}  # the last solve's rounds, columns and bounds

    def join_chain(self, gap: float, stall_share: float | None) -> None:
        self.mip_rel_gap = gap

    def available(self) -> bool:
        return LpRoundBackend().available()

    def solve(self, model: LinearModel, time_limit_s: float) -> SolveResult:
        start = time.perf_counter()
        if model.num_vars == 0:
            return empty_model_result(self.name, model, start)
        deadline = start + float(time_limit_s)
        lp = self.relaxation(model, deadline)
        if lp["x"] is None:
            return SolveResult(self.name, Status.ERROR, wall_s=time.perf_counter() - start,
                               message=f"restricted master: {lp['message']}")
        cols = lp["columns"]
        sub = restrict(model, cols)
        rounding = LpRoundBackend(mip_rel_gap=self.mip_rel_gap)
        rounding.work_s = self.work_s
        left = deadline - time.perf_counter()
        res = rounding.solve(sub, max(0.05, left))
        bound = lp["bound"]
        extra: dict[str, Any] = {"columns": int(len(cols)), "rounds": lp["rounds"],
                                 "converged": lp["converged"]}
        if self.work_s is not None:
            extra["work_s"] = float(res.extra.get("work_s", 0.0))
            extra["time_limited"] = bool(res.extra.get("time_limited"))
        if res.x is None:
            return SolveResult(self.name, Status.ERROR, bound=bound,
                               wall_s=time.perf_counter() - start,
                               message=f"LP bound {bound:.6g}; rounding: {res.message}",
                               extra={**extra, "relaxation": True})
        x = np.zeros(model.num_vars)
        x[cols] = res.x
        x, added = fill(model, x)
        if not model.is_feasible(x):
            return SolveResult(self.name, Status.ERROR, bound=bound,
                               wall_s=time.perf_counter() - start,
                               message="the restricted answer breaks the model",
                               extra={**extra, "relaxation": True})
        obj = model.objective_value(x)
        sign = 1.0 if model.sense == "max" else -1.0
        proven = sign * (bound - obj) <= 1e-9 * max(1.0, abs(obj))
        how = (f"column generation: {lp['rounds']} rounds, {len(cols)} of {model.num_vars} "
               f"columns{'' if lp['converged'] else ' (stopped before it converged)'}; "
               f"LP bound {bound:.6g}; {res.message}" + (f"; {added} filled" if added else ""))
        self.last = {**extra, "bound": bound, "lp": lp["lp_objective"]}
        return SolveResult(self.name, Status.OPTIMAL if proven else Status.FEASIBLE, x, obj,
                           bound, time.perf_counter() - start, message=how, extra=extra)

    def relaxation(self, model: LinearModel, deadline: float) -> dict[str, Any]:
        """Column generation on the LP: {x (on ``columns``), columns, bound, lp_objective,
        rounds, converged, message}."""
        import highspy

        group = choice_rows(model)
        c = np.asarray(model.obj, float)
        lb = np.asarray(model.lb, float)
        ub = np.asarray(model.ub, float)
        rlb, rub = model.row_bounds()
        csc = model.matrix().tocsc()
        sign = 1.0 if model.sense == "max" else -1.0
        grouped = group >= 0
        start_cols = _starting_columns(model, group, c, sign)
        cols = list(np.flatnonzero(start_cols))
        inside = start_cols.copy()
        h = _restricted_lp(model, csc, c, lb, ub, rlb, rub, cols)

        choice = np.zeros(model.num_rows, bool)
        choice[group[grouped]] = True
        best_bound = math.inf if sign > 0 else -math.inf
        rounds, converged, message = 0, False, ""
        x_sub = None
        lp_obj = None
        while True:
            left = deadline - time.perf_counter()
            if left <= 0.005:
                message = "time limit"
                break
            h.setOptionValue("time_limit", max(0.005, left))
            h.run()
            if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
                message = h.modelStatusToString(h.getModelStatus())
                break
            sol = h.getSolution()
            x_sub = np.asarray(sol.col_value, float)
            lp_obj = float(h.getInfo().objective_function_value)
            y = np.asarray(sol.row_dual, float)
            rounds += 1
            reduced = c - csc.T @ y
            bound = self._lagrangian(model, csc, c, lb, ub, rlb, rub, y, choice, group, sign)
            best_bound = min(best_bound, bound) if sign > 0 else max(best_bound, bound)
            gain = sign * reduced
            gain[inside] = 0.0
            cand = np.flatnonzero(gain > TOL)
            if len(cand) == 0:
                converged = True
                break
            if rounds >= self.max_rounds:
                message = f"stopped after {rounds} pricing rounds"
                break
            add = self._pick(cand, gain, group)
            new = csc[:, add]
            h.addCols(len(add), c[add], np.clip(lb[add], -_INF, _INF),
                      np.clip(ub[add], -_INF, _INF), int(new.nnz),
                      new.indptr[:-1].astype(np.int32), new.indices.astype(np.int32),
                      new.data.astype(float))
            cols.extend(int(j) for j in add)
            inside[add] = True
        if converged and lp_obj is not None:  # the LP's optimum, exactly
            best_bound = min(best_bound, lp_obj) if sign > 0 else max(best_bound, lp_obj)
        if x_sub is not None and len(x_sub) < len(cols):  # the last columns never solved
            x_sub = np.concatenate([x_sub, np.zeros(len(cols) - len(x_sub))])
        return {"x": x_sub, "columns": np.asarray(cols, np.int64), "bound": best_bound,
                "lp_objective": lp_obj, "rounds": rounds, "converged": converged,
                "message": message}

    def _pick(self, cand: np.ndarray, gain: np.ndarray, group: np.ndarray) -> np.ndarray:
        """Per choice row the ``add_per_group`` columns of largest gain; every free one."""
        order = cand[np.lexsort((cand, -gain[cand]))]
        taken: dict[int, int] = {}
        out = []
        for j in order:
            gr = int(group[j])
            if gr < 0:
                out.append(j)
                continue
            if taken.get(gr, 0) < self.add_per_group:
                taken[gr] = taken.get(gr, 0) + 1
                out.append(j)
        return np.asarray(sorted(out), np.int64)

    @staticmethod
    def _lagrangian(model: LinearModel, csc: Any, c: np.ndarray, lb: np.ndarray,
                    ub: np.ndarray, rlb: np.ndarray, rub: np.ndarray, y: np.ndarray,
                    choice: np.ndarray, group: np.ndarray, sign: float) -> float:
        """The Lagrangian bound with the duals ``y`` on every row but the choice rows (see
        the module docstring); a dual of the wrong sign for its row's finite side is 0."""
        y = np.where(choice, 0.0, y)
        # for a max problem a dual > 0 prices the upper side, < 0 the lower (HiGHS's sign);
        # a min problem the other way round
        up = sign * y > 0
        side = np.where(up, rub, rlb)
        y = np.where(np.isfinite(side), y, 0.0)
        side = np.where(np.isfinite(side), side, 0.0)
        total = float(np.dot(y, side)) + model.obj_constant
        reduced = sign * (c - csc.T @ y)  # the gain of one unit of each column
        grouped = group >= 0
        if grouped.any():
            best = np.full(model.num_rows, 0.0)
            np.maximum.at(best, group[grouped], reduced[grouped])
            total += sign * float(best.sum())
        free = ~grouped
        if free.any():
            r = reduced[free]
            hi = np.where(r > 0, ub[free], lb[free])
            if not np.all(np.isfinite(hi[r != 0])):
                return math.inf * sign
            total += sign * float(np.dot(r[r != 0], hi[r != 0]))
        return total


__all__ = ["ColGenBackend", "choice_rows", "restrict"]


def _starting_columns(model: LinearModel, group: np.ndarray, c: np.ndarray,
                      sign: float) -> np.ndarray:
    """The restricted LP's first columns (a mask): every column outside a choice row, and
    per choice row the most valuable ones (the best of each ``column_family`` when the
    model names them, else ``INITIAL_PER_GROUP``) and the hint's chosen columns: the
    first LP starts near the answer, so pricing has few rounds to run."""
    n = model.num_vars
    grouped = group >= 0
    start_cols = np.zeros(n, bool)
    start_cols[~grouped] = True
    fam = model.meta.get("column_family")
    key = np.asarray(fam, np.int64) if fam is not None and len(fam) == n else None
    order = np.lexsort((np.arange(n), -sign * c))  # most valuable first, stable
    if key is not None:  # the best of each family
        seen: set[int] = set()
        for j in order:
            if grouped[j] and key[j] not in seen:
                seen.add(int(key[j]))
                start_cols[j] = True
    else:
        taken: dict[int, int] = {}
        for j in order:
            if grouped[j] and taken.get(int(group[j]), 0) < INITIAL_PER_GROUP:
                taken[int(group[j])] = taken.get(int(group[j]), 0) + 1
                start_cols[j] = True
    if model.hint:
        for j, v in model.hint.items():
            if v > 0.5:
                start_cols[int(j)] = True
    return start_cols


def _restricted_lp(model: LinearModel, csc: Any, c: np.ndarray, lb: np.ndarray,
                   ub: np.ndarray, rlb: np.ndarray, rub: np.ndarray, cols: list[int]) -> Any:
    """HiGHS over ``cols`` of the model only (every row), single-threaded and silent; the
    pricing loop adds columns to it."""
    import highspy

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    lp = highspy.HighsLp()
    lp.num_col_ = len(cols)
    lp.num_row_ = model.num_rows
    lp.col_cost_ = c[cols]
    lp.col_lower_ = np.clip(lb[cols], -_INF, _INF)
    lp.col_upper_ = np.clip(ub[cols], -_INF, _INF)
    lp.row_lower_ = np.clip(rlb, -_INF, _INF)
    lp.row_upper_ = np.clip(rub, -_INF, _INF)
    lp.offset_ = model.obj_constant
    lp.sense_ = highspy.ObjSense.kMaximize if model.sense == "max" else \
        highspy.ObjSense.kMinimize
    sub = csc[:, cols]
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = sub.indptr.astype(np.int32)
    lp.a_matrix_.index_ = sub.indices.astype(np.int32)
    lp.a_matrix_.value_ = sub.data.astype(float)
    h.passModel(lp)
    return h
