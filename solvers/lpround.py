"""LP relaxation and rounding: a near-optimal answer and a bound in a fraction of a MIP's time.

The cell model is a multiple-choice knapsack with one capacity row per node
class; a basic optimal solution of its LP relaxation has at most about two
fractional variables per capacity row. Two roundings, the better one kept:

* **down**: the fractional columns rounded down (dropping those few jobs, and
  any cell whose placement came out fractional). It keeps every ``<=`` row and
  every homogeneous equality (GPUs placed = GPUs of the cell) satisfied.
* **neighbourhood**: the MIP restricted to the LP's support plus the columns
  nearest to entering it (the smallest reduced costs, ``NEIGHBOURS`` times the
  support): a few hundred columns, handed to HiGHS alone (the model over them:
  ``LinearModel.restricted``) and solved from the rounded-down point in a fraction of
  a second. On the Philly replay's busy rounds (4,000-30,000
  columns) it lands within 0.0-1.5 % of the LP bound where rounding down loses
  2-8 % and HiGHS's branch and bound on the whole model, given a second, often
  has not improved on its greedy start at all (20-50 % below the bound;
  experiments/results/bench/speed.md).

Either point is then **filled**: every integer column that still fits, the most
valuable first, goes up by one (:func:`fill`; a column in an equality row never
moves alone, so it is left). Rounding down drops the few jobs the LP split; most
of them fit whole somewhere in what the others left, and the filled point is
usually within 0.1 % of the bound. On the held-out 1,000-job round it moves the
rounded-down answer from 0.55 % to 0.026 % below the bound in a few milliseconds,
where the restricted MIP took 0.4 s to reach 0.0006 %. In a chain
(``mip_rel_gap`` set, as :func:`~apportion.solvers.chain.for_chain` does) a
filled point within that tolerance is the answer: the chain would stop at it
anyway, so the restricted MIP is not run.

With a **session** (:class:`~apportion.solvers.persistent.HighsSession`, set by a chain
whose caller keeps one across rounds: a replay's or ``run``'s policy) the relaxation is
re-solved from the previous round's LP and basis instead of built afresh; everything after
it (rounding, filling, the restricted MIP) is the same.

With a deterministic budget (``work_s``, set by a chain that has one) the relaxation runs
to its optimum and the restricted MIP gets the backend's work (``highs.HighsBackend``), so
the answer does not depend on the clock; the time limit is only a safety stop.

The relaxation's optimum is a valid bound, so the answer comes with an honest
gap. The result is checked against the model anyway and refused (status
``error``) if a row of another shape broke, so the chain moves on.
"""

from __future__ import annotations

import copy
import time

import numpy as np
from apportion.formulations.model import LinearModel
from apportion.solvers.base import Backend, SolveResult, Status, proven_gap
from apportion.solvers.chain_rules import LARGE_MODEL_COLUMNS
from apportion.solvers.highs import HighsBackend
from apportion.solvers.persistent import HighsSession

NEIGHBOURS = 3  # columns added to the restricted MIP per support column (at least MIN_EXTRA)
MIN_EXTRA = 150


class LpRoundBackend(Backend):
    name = "lp-round"
    counts_work = True

    def __init__(self, tol: float = 1e-6, neighbourhood: bool = True,
                 mip_rel_gap: float | None = None) -> None:
        self.tol = tol
        self.neighbourhood = neighbourhood  # False: round down only
        # within this of the LP bound the filled point is final (None: always the MIP)
        self.mip_rel_gap = mip_rel_gap
        self.work_s: float | None = None  # a deterministic budget (see the module docstring)
        self.session: HighsSession | None = None  # the relaxation kept across rounds

    def join_chain(self, gap: float, stall_share: float | None) -> None:
        self.mip_rel_gap = gap  # its restricted MIP keeps HiGHS's own stall rule (none)

    def keep_relaxation(self, session: HighsSession | None) -> None:
        self.session = session

    def available(self) -> bool:
        return HighsBackend().available()

    def solve(self, model: LinearModel, time_limit_s: float) -> SolveResult:
        start = time.perf_counter()
        if self.session is not None:
            lp = self.session.relaxation(model, time_limit_s, reduced_costs=self.neighbourhood)
        else:
            relaxed = copy.copy(model)
            relaxed.integer = [False] * model.num_vars
            relaxed.hint = {}
            lp = HighsBackend(reduced_costs=self.neighbourhood).solve(relaxed, time_limit_s)
        work: dict[str, float | bool] = {} if self.work_s is None else \
            {"work_s": 0.0, "time_limited": lp.message == "Time limit reached"}
        if lp.x is None or lp.status is not Status.OPTIMAL:
            return SolveResult(self.name, Status.ERROR, wall_s=time.perf_counter() - start,
                               message=f"LP relaxation: {lp.status.value} ({lp.message})",
                               extra=dict(work))
        x_lp = np.asarray(lp.x, float)
        ints = np.asarray(model.integer, bool)
        frac = ints & (np.abs(x_lp - np.round(x_lp)) > self.tol)
        x = self._round_down(model, x_lp, ints)
        how = f"{int(frac.sum())} fractional columns rounded down"
        if x is not None:
            x, added = fill(model, x, self.tol)
            how += f", {added} columns filled" if added else ""
        left = time_limit_s - (time.perf_counter() - start)
        if self.neighbourhood and frac.any() and left > 0.01 and not self._close(model, x, lp):
            res = self._neighbourhood(model, x_lp, ints, lp.extra.get("reduced_costs"), x, left,
                                      work)
            if res is not None and (x is None or _gain(model, res, x) > 1e-9):
                x, added = fill(model, res, self.tol)
                how = f"{int(frac.sum())} fractional columns; restricted MIP" + \
                    (f", {added} columns filled" if added else "")
        if x is None:  # no answer; the relaxation's optimum is still a proven bound
            return SolveResult(self.name, Status.ERROR, bound=lp.objective,
                               wall_s=time.perf_counter() - start,
                               message=f"LP bound {lp.objective:.6g}; rounded LP point "
                               "violates the model", extra={**work, "relaxation": True})
        obj = model.objective_value(x)
        # an integer answer as good as the relaxation is proven optimal
        proven = abs(lp.objective - obj) <= 1e-9 * max(1.0, abs(obj))
        return SolveResult(self.name, Status.OPTIMAL if proven else Status.FEASIBLE, x, obj,
                           lp.objective,
                           time.perf_counter() - start,
                           message=f"LP bound {lp.objective:.6g}; {how}", extra=dict(work))

    def _close(self, model: LinearModel, x: np.ndarray | None, lp: SolveResult) -> bool:
        """Whether ``x`` is within ``mip_rel_gap`` of the LP bound (a chain's final answer)."""
        if self.mip_rel_gap is None or x is None or lp.objective is None:
            return False
        answer = SolveResult(self.name, Status.FEASIBLE, x, model.objective_value(x))
        gap = proven_gap(answer, lp.objective, model.sense)
        return gap is not None and gap <= self.mip_rel_gap

    def _round_down(self, model: LinearModel, x_lp: np.ndarray, ints: np.ndarray
                    ) -> np.ndarray | None:
        x = x_lp.copy()
        x[ints] = np.floor(x[ints] + self.tol)
        # a chosen cell (binary at 1) whose placement columns were fractional lost GPUs:
        # drop every cell whose size row no longer balances (every column of every
        # homogeneous equality row that does not balance goes to 0, until all balance:
        # a column only ever goes to 0, so this ends)
        if model.rows:
            lens, cols, _ = model.entries()
            rlb, rub = model.row_bounds()
            homogeneous = (rlb == 0.0) & (rub == 0.0) & (lens > 0)
            row_of = np.repeat(np.arange(len(lens)), lens)
            while True:
                bad = homogeneous & (np.abs(model.activity(x)) > self.tol)
                if not bad.any():
                    break
                x[cols[bad[row_of]]] = 0.0
        return x if model.is_feasible(x) else None

    def _neighbourhood(self, model: LinearModel, x_lp: np.ndarray, ints: np.ndarray,
                       reduced: np.ndarray | None, start_x: np.ndarray | None, limit_s: float,
                       work: dict[str, float | bool]) -> np.ndarray | None:
        """The MIP over the LP's support and its nearest columns (None: no better answer);
        with a deterministic budget it adds what it used to ``work``."""
        keep = ints & (x_lp > self.tol)
        rest = np.flatnonzero(ints & ~keep)
        if reduced is not None and len(rest):
            extra = max(MIN_EXTRA, NEIGHBOURS * int(keep.sum()))
            keep[rest[np.argsort(np.abs(reduced[rest]), kind="stable")[:extra]]] = True
        # every continuous column stays, and any a researcher's bounds keep off zero
        lb, ub = model.vector("lb"), model.vector("ub")
        cols = np.flatnonzero(keep | ~ints | (lb > 0.0) | (ub < 0.0))
        sub = model.restricted(cols)
        sub.hint = {} if start_x is None else dict(enumerate(start_x[cols].tolist()))
        # HiGHS's presolve does not watch the clock on very large models (solvers.chain)
        mip = HighsBackend(presolve="off" if sub.num_vars > LARGE_MODEL_COLUMNS else "choose")
        mip.work_s = self.work_s
        # charged as the round's model: the work budget buys the search it bought when the
        # MIP was handed every column with the others' bounds at zero, in a quarter of the
        # time (speed.md)
        mip.work_columns = model.num_vars
        res = mip.solve(sub, limit_s)
        if self.work_s is not None:
            work["work_s"] = float(work["work_s"]) + float(res.extra.get("work_s", 0.0))
            work["time_limited"] = bool(work["time_limited"]) or \
                bool(res.extra.get("time_limited"))
        if res.x is None or not res.status.has_solution:
            return None
        x = np.zeros(model.num_vars)
        x[cols] = res.x
        return x if model.is_feasible(x) else None


def fill(model: LinearModel, x: np.ndarray, tol: float = 1e-6) -> tuple[np.ndarray, int]:
    """``x`` with every integer column of positive gain that still fits raised by one, the
    largest gain first (a greedy completion of a feasible point; each step re-checks the
    rows the column touches, so the point stays feasible). Returns it and how many moved.

    Where a column's coefficients are positive, adding to others only uses room, so a
    column that does not fit now never will: only the columns that fit at the start are
    tried (screened in numpy; each is still re-checked when its turn comes)."""
    x = np.asarray(x, float).copy()
    sign = 1.0 if model.sense == "max" else -1.0
    gain = sign * np.asarray(model.obj, float)
    ints = np.asarray(model.integer, bool)
    free = ints & (gain > 0) & (x + 1.0 <= np.asarray(model.ub, float) + tol)
    if not free.any():
        return x, 0
    csc = model.columns()
    act = model.activity(x)
    lo, hi = model.row_bounds()
    new = act[csc.indices] + csc.data
    ok = (new <= hi[csc.indices] + tol) & (new >= lo[csc.indices] - tol)
    nnz = np.diff(csc.indptr)
    per_col = np.bincount(np.repeat(np.arange(model.num_vars), nnz), weights=ok,
                          minlength=model.num_vars)
    free &= (per_col == nnz) & (nnz > 0)  # an empty column held by no row is left as it is
    added = 0
    for j in np.flatnonzero(free)[np.argsort(-gain[free], kind="stable")]:
        a, b = csc.indptr[j], csc.indptr[j + 1]
        rows = csc.indices[a:b]
        new = act[rows] + csc.data[a:b]
        if (new <= hi[rows] + tol).all() and (new >= lo[rows] - tol).all():
            x[j] += 1.0
            act[rows] = new
            added += 1
    return x, added


def _gain(model: LinearModel, x: np.ndarray, than: np.ndarray) -> float:
    """How much better ``x`` is than ``than`` in the model's sense."""
    d = model.objective_value(x) - model.objective_value(than)
    return d if model.sense == "max" else -d
