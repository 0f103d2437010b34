"""A HiGHS LP kept alive across rounds: a round's LP relaxation re-solved from the last one's basis.

A replay (or ``apportion run``, ``apportion serve``) solves a round every few minutes, and
consecutive rounds' models differ by a few jobs: the columns of jobs that arrived, those
of jobs that finished, new costs (the queue bonus and the remaining work move with the
clock) and a few changed bounds and coefficients. Building the LP afresh each round
costs a model pass and a presolve, and the simplex starts from nothing; here one
``highspy.Highs`` holds the previous round's LP and its optimal basis, and
:meth:`HighsSession.relaxation` brings it to this round's model with HiGHS's incremental
calls (``deleteCols``/``deleteRows`` for what is gone, ``addRows``/``addCols`` for what
is new, ``changeColsCost``/``changeColsBounds``/``changeRowsBounds`` for the rest and
``changeCoeff`` for each coefficient that moved), then re-solves from the basis HiGHS
kept (a hot start: no presolve, usually a few hundred simplex iterations).

Columns are matched by the model's variable keys and rows by their names, so the
session needs both unique (a model whose row names repeat is solved afresh each
round). HiGHS keeps its own column and row order (what survives, then what was added),
so the session keeps the map between the two and hands back ``x`` and the reduced
costs in the model's order. A round that changes most of the model is built afresh
(:data:`REBUILD_SHARE`), and so is one the hot start cannot solve (a numerical failure
of the warm basis): the answer never depends on whether the session was warm.

Only the LP relaxation persists. HiGHS's branch and bound ignores a starting basis (its
root LP runs after its own presolve, on a reduced model: measured on the replays'
models, the root took as many simplex iterations after a hot-started LP as without), so a
MIP backend gains nothing from a model kept alive beyond the model pass; its start comes
from the chain's hint (the greedy's answer, which keeps every running job: the last
round's incumbent extended).

The LP's optimum is the same whichever basis it starts from, but a degenerate LP has
many optimal vertices, and a hot start may end on another one than a fresh solve: the
rounded answers then differ, each within the chain's tolerance of the bound the chain
proves (``tests/test_persistent.py`` checks both paths on random sequences of rounds).

**Measured, and why it is on by default** (``RoundConfig.persistent``): on 148
consecutive solved rounds of the densest Philly day (1,000-26,000 columns) the kept LP
solved the relaxations in 0.65-0.73x a fresh solve's time (same optima), but the cell
model's LP is highly degenerate and HiGHS's presolve is what steers a fresh solve to a
near-integral vertex: without it (a hot start never presolves, and neither does a fresh
solve with presolve off) the vertices had 678 fractional columns against 501, and LP
rounding's filled point missed the 0.1 % tolerance in 71 rounds against 48. While HiGHS's
branch and bound followed LP rounding, those rounds cost more than the LP saved. Since LP
rounding's answer is final on the cell model (``chain_rules.lp_rounding_final``) and its
restricted MIP is handed only its own columns, a missed tolerance costs a restricted MIP
of a few hundred columns, and the LP is the replay's largest solver cost: the 14-day
replay took 343 CPU-s kept against 411 afresh (0.84x) at the same average JCT (7,541.7
against 7,540.7 s), and six held-out one-day windows 0.91x at -0.07 % to +0.13 %
(experiments/results/bench/speed.md).
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from apportion.formulations.model import Columns, LinearModel
from apportion.solvers.base import SolveResult, Status, empty_model_result
from apportion.solvers.highs import highs_lp

_INF = 1e30  # HiGHS's infinity
# a round that adds and deletes more columns than this share of its own (all of them
# replaced: nothing of the kept LP is left to start from), or changes more than this share of
# the kept coefficients, is built afresh. Measured on 148 consecutive solved rounds of the
# densest Philly day (1,000-26,000 columns; a busy round adds and deletes half its columns,
# as nodes move between classes): the LP relaxations took 0.65x a fresh solve's time with
# every round incremental, 0.73x with a rebuild past half the columns replaced
REBUILD_SHARE = 2.0


def _clip(values: Any) -> np.ndarray:
    return np.clip(np.asarray(values, float), -_INF, _INF)


@dataclass
class SessionStats:
    """What the session did over its life (how a replay reads whether it paid)."""

    solves: int = 0
    builds: int = 0  # model passes (the first round, a large change, a failed hot start)
    hot_starts: int = 0
    added_cols: int = 0
    deleted_cols: int = 0
    changed_coeffs: int = 0
    iterations: int = 0  # simplex iterations over every solve
    sync_s: float = 0.0
    solve_s: float = 0.0
    why_built: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in vars(self).items()}


class HighsSession:
    """One LP relaxation kept alive in HiGHS across rounds (see the module docstring).

    ``threads``: HiGHS's, as :class:`~apportion.solvers.highs.HighsBackend` takes them.
    """

    def __init__(self, threads: int = 1) -> None:
        self.threads = threads
        self.stats = SessionStats()
        self._h: Any = None
        self._cols: list[Hashable] = []  # HiGHS column j holds the model variable keyed so
        self._rows: list[str] = []  # HiGHS row i is the model row of this name
        # the matrix HiGHS holds, in its order: scipy CSC, or the model's columns and shape
        # until a next round needs it (a one-off round never imports scipy)
        self._a: Any = None
        # the costs, column bounds and row bounds HiGHS holds, in its order: a round passes
        # only those that moved (most do not: a waiting job's cost moves with the clock)
        self._held: dict[str, np.ndarray] = {}
        self._sense: str | None = None

    def close(self) -> None:
        """Forget the kept LP (the next round is built afresh)."""
        self._h = None
        self._cols, self._rows, self._a, self._sense = [], [], None, None
        self._held = {}

    # -- the round's LP ------------------------------------------------------------------
    def relaxation(self, model: LinearModel, time_limit_s: float,
                   reduced_costs: bool = False) -> SolveResult:
        """The LP relaxation of ``model`` (integrality dropped), solved from the previous
        round's basis where the session holds one; ``x`` (and, with ``reduced_costs``,
        ``extra["reduced_costs"]``) in the model's column order, as
        :class:`~apportion.solvers.highs.HighsBackend` gives them for a fresh LP."""
        start = time.perf_counter()
        if model.num_vars == 0:
            return empty_model_result("highs", model, start)
        names = [r.name for r in model.rows]
        why = self._why_build(model, names)
        colpos = None
        if why is None:
            colpos, why = self._sync(model, names)
        if why is not None or colpos is None:
            colpos = self._build(model, names, why or "")
        hot = why is None
        self.stats.sync_s += time.perf_counter() - start
        res = self._run(model, colpos, time_limit_s - (time.perf_counter() - start),
                        reduced_costs, start, hot)
        if res.status is Status.ERROR and hot and \
                time_limit_s - (time.perf_counter() - start) > 0.01:
            # a warm basis HiGHS could not solve from (numerical trouble): afresh, once
            colpos = self._build(model, names, "hot start failed")
            res = self._run(model, colpos, time_limit_s - (time.perf_counter() - start),
                            reduced_costs, start, False)
        return res

    def _why_build(self, model: LinearModel, names: list[str]) -> str | None:
        """Why this round cannot start from the kept LP (None: it can)."""
        if self._h is None:
            return "first round"
        if model.sense != self._sense:
            return "objective sense changed"
        if len(set(names)) != len(names):
            return "row names repeat"
        return None

    def _build(self, model: LinearModel, names: list[str], why: str) -> np.ndarray:
        """Pass ``model``'s relaxation to a new HiGHS (the fresh path)."""
        import highspy

        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("threads", self.threads)
        h.passModel(highs_lp(model, model.columns()))
        self._h, self._sense = h, model.sense
        self._a = (model.columns(), (model.num_rows, model.num_vars))
        self._cols, self._rows = list(model.var_keys), list(names)
        rlb, rub = model.row_bounds()
        self._held = {"obj": model.vector("obj"), "lb": model.vector("lb"),
                      "ub": model.vector("ub"), "rlb": rlb, "rub": rub}
        self.stats.builds += 1
        self.stats.why_built[why] = self.stats.why_built.get(why, 0) + 1
        return np.arange(model.num_vars)

    def _sync(self, model: LinearModel, names: list[str]) -> tuple[np.ndarray | None, str | None]:
        """Bring the kept LP to ``model`` incrementally: (HiGHS column -> model column,
        None), or (None, why) where building afresh is the better way."""
        from scipy import sparse

        h = self._h
        # where each column and row HiGHS holds sits in this round's model (-1: gone)
        cpos = model.positions(self._cols)
        row_at = {r: i for i, r in enumerate(names)}
        rpos = np.fromiter((row_at.get(r, -1) for r in self._rows), np.int64, len(self._rows))
        keep_c, keep_r = cpos >= 0, rpos >= 0
        colpos_kept, rowpos_kept = cpos[keep_c], rpos[keep_r]
        seen = np.zeros(model.num_vars, bool)
        seen[colpos_kept] = True
        new_cols = np.flatnonzero(~seen)
        gone = int((~keep_c).sum())
        if len(new_cols) + gone > REBUILD_SHARE * max(1, model.num_vars):
            return None, "most columns changed"
        seen_r = np.zeros(model.num_rows, bool)
        seen_r[rowpos_kept] = True
        new_rows = np.flatnonzero(~seen_r)
        rowpos = np.concatenate([rowpos_kept, new_rows])
        a_new = _csc(model)
        a_rows = a_new[rowpos]  # this round's matrix, its rows in the order HiGHS will hold
        # the kept columns' coefficients as HiGHS will hold them after the deletions and
        # the new (empty) rows, against what this round's model says
        if isinstance(self._a, tuple):
            self._a = _as_csc(*self._a)
        old = self._a[np.flatnonzero(keep_r)][:, np.flatnonzero(keep_c)]
        old = sparse.vstack([old, sparse.csc_matrix((len(new_rows), len(colpos_kept)))]).tocsc()
        want = a_rows[:, colpos_kept].tocsc()
        diff = (want - old).tocoo()
        moved = np.flatnonzero(diff.data != 0.0)
        if len(moved) > REBUILD_SHARE * max(1, want.nnz):
            return None, "most coefficients changed"
        # the incremental calls, in an order that keeps every index valid
        if gone:
            idx = np.flatnonzero(~keep_c).astype(np.int32)
            h.deleteCols(len(idx), idx)
        if not keep_r.all():
            idx = np.flatnonzero(~keep_r).astype(np.int32)
            h.deleteRows(len(idx), idx)
        rlb, rub = model.row_bounds()
        if len(new_rows):
            nr = new_rows
            h.addRows(len(nr), _clip(rlb[nr]), _clip(rub[nr]), 0, np.zeros(len(nr), np.int32),
                      np.zeros(0, np.int32), np.zeros(0))
        obj, lb, ub = (model.vector(v) for v in ("obj", "lb", "ub"))
        if len(new_cols):
            nc = new_cols
            inv = np.empty(model.num_rows, np.int64)
            inv[rowpos] = np.arange(len(rowpos))
            sub = a_new[:, nc].tocsc()
            h.addCols(len(nc), obj[nc], _clip(lb[nc]), _clip(ub[nc]), sub.nnz,
                      sub.indptr[:-1].astype(np.int32), inv[sub.indices].astype(np.int32),
                      sub.data.astype(float))
        rs, cs = diff.row[moved], diff.col[moved]
        values = np.asarray(want[rs, cs], float).ravel() if len(moved) else np.zeros(0)
        for r, c, v in zip(rs.tolist(), cs.tolist(), values.tolist()):
            h.changeCoeff(r, c, v)
        colpos = np.concatenate([colpos_kept, new_cols])
        _changed_costs_and_bounds(h, self._held, (obj, lb, ub, rlb, rub), colpos, colpos_kept,
                                  keep_c, rowpos, rowpos_kept, keep_r)
        h.changeObjectiveOffset(float(model.obj_constant))
        self._held = {"obj": obj[colpos], "lb": lb[colpos], "ub": ub[colpos],
                      "rlb": rlb[rowpos], "rub": rub[rowpos]}
        self._cols = list(map(model.var_keys.__getitem__, colpos.tolist()))
        self._rows = list(map(names.__getitem__, rowpos.tolist()))
        self._a = a_rows[:, colpos].tocsc()
        self.stats.hot_starts += 1
        self.stats.added_cols += len(new_cols)
        self.stats.deleted_cols += gone
        self.stats.changed_coeffs += len(moved)
        return colpos, None

    def _run(self, model: LinearModel, colpos: np.ndarray, time_limit_s: float,
             reduced_costs: bool, start: float, hot: bool) -> SolveResult:
        import highspy

        h = self._h
        h.setOptionValue("time_limit", run_limit(h, time_limit_s))
        t = time.perf_counter()
        try:
            h.run()
        except Exception as exc:  # a backend fault must not take the round down
            self.close()
            return SolveResult("highs", Status.ERROR, wall_s=time.perf_counter() - start,
                               message=f"highs raised {exc!r}")
        self.stats.solve_s += time.perf_counter() - t
        self.stats.solves += 1
        ms = h.getModelStatus()
        info = h.getInfo()
        self.stats.iterations += int(info.simplex_iteration_count)
        message = h.modelStatusToString(ms)
        if ms != highspy.HighsModelStatus.kOptimal or info.primal_solution_status != 2:
            status = Status.INFEASIBLE if ms == highspy.HighsModelStatus.kInfeasible else \
                Status.ERROR
            if status is Status.ERROR:
                self.close()  # whatever HiGHS holds now is no start for the next round
            return SolveResult("highs", status, wall_s=time.perf_counter() - start,
                               message=message)
        sol = h.getSolution()
        x = np.zeros(model.num_vars)
        x[colpos] = np.asarray(sol.col_value, float)
        extra: dict[str, Any] = {"hot_start": hot,
                                 "iterations": int(info.simplex_iteration_count)}
        if reduced_costs:
            rc = np.zeros(model.num_vars)
            rc[colpos] = np.asarray(sol.col_dual, float)
            extra["reduced_costs"] = rc
        obj = model.objective_value(x)
        return SolveResult("highs", Status.OPTIMAL, x, obj, obj, time.perf_counter() - start,
                           message=message, extra=extra)


def run_limit(h: Any, seconds: float) -> float:
    """HiGHS's ``time_limit`` for a run of ``h`` that may take ``seconds`` more. HiGHS reads
    its limit against the Highs object's run clock, which adds up over every run of a kept
    LP: a limit set as is cut a round short once the session's LPs had taken that long
    together, and a replay then rebuilt its LP at a moment that depended on the machine's
    speed, and did not repeat."""
    return float(h.getRunTime()) + max(0.01, float(seconds))


def _csc(model: LinearModel) -> Any:
    """The model's matrix as scipy CSC over its cached columns (:meth:`LinearModel.columns`:
    what HiGHS is handed, and what LP rounding's fill reads next), not a CSR built and
    converted again each round."""
    return _as_csc(model.columns(), (model.num_rows, model.num_vars))


def _as_csc(cols: Columns, shape: tuple[int, int]) -> Any:
    """Columns as a scipy CSC matrix of ``shape`` (scipy imported here: its sparse module
    costs a one-off round more than its LP, and only a kept LP's next round needs it)."""
    from scipy import sparse

    a = sparse.csc_matrix((cols.data, cols.indices, cols.indptr), shape=shape, copy=True)
    a.has_sorted_indices = True  # columns() sorts each column's rows
    return a


__all__ = ["REBUILD_SHARE", "HighsSession", "SessionStats", "run_limit"]


def _changed_costs_and_bounds(h: Any, held: dict[str, np.ndarray],
                              vectors: tuple[np.ndarray, ...], colpos: np.ndarray,
                              colpos_kept: np.ndarray, keep_c: np.ndarray,
                              rowpos: np.ndarray, rowpos_kept: np.ndarray,
                              keep_r: np.ndarray) -> None:
    """Tell HiGHS the kept columns' and rows' costs and bounds that moved since the last
    round (``held``); the new ones came with theirs. ``vectors``: this round's obj, lb,
    ub, row lb and row ub."""
    obj, lb, ub, rlb, rub = vectors
    # the kept columns and rows whose cost or bounds moved (new ones came with theirs)
    kept_c = np.arange(len(colpos_kept), dtype=np.int32)
    moved_c = kept_c[obj[colpos_kept] != held["obj"][keep_c]]
    if len(moved_c):
        h.changeColsCost(len(moved_c), moved_c, obj[colpos[moved_c]])
    moved_c = kept_c[(lb[colpos_kept] != held["lb"][keep_c]) |
                     (ub[colpos_kept] != held["ub"][keep_c])]
    if len(moved_c):
        h.changeColsBounds(len(moved_c), moved_c, _clip(lb[colpos[moved_c]]),
                           _clip(ub[colpos[moved_c]]))
    kept_r = np.arange(len(rowpos_kept), dtype=np.int32)
    moved_r = kept_r[(rlb[rowpos_kept] != held["rlb"][keep_r]) |
                     (rub[rowpos_kept] != held["rub"][keep_r])]
    if len(moved_r):
        h.changeRowsBounds(len(moved_r), moved_r, _clip(rlb[rowpos[moved_r]]),
                           _clip(rub[rowpos[moved_r]]))
