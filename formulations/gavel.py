r"""Gavel's heterogeneity-aware allocation LPs (Narayanan et al., OSDI'20), in cvxpy.

An allocation ``X[m, j]`` is the fraction of time job ``m`` spends on GPU type
``j``, given throughputs ``T[m, j]`` (steps/s of job m on its ``sf_m`` GPUs of
type j; 0 where it cannot run), scale factors ``sf`` (GPUs a job uses) and
capacities ``cap[j]``:

    X >= 0,   sum_j X[m, j] <= 1,   sum_m sf_m X[m, j] <= cap_j

* max-sum-throughput:   max sum_{m,j} T[m, j] X[m, j]
* max-min fairness (heterogeneity-aware, Gavel's ``MaxMinFairnessPolicyWithPerf``):
  max min_m (sf_m / w_m) T[m]·X[m] / (T[m]·X_eq[m]), where ``X_eq`` is the equal
  share: every job gets each type in proportion to that type's GPUs,
  ``X_eq[m, j] = cap_j / sum(cap)`` (Gavel's ``ProportionalPolicy``, whose rows it
  scales to sum to 1). ``T[m]·X_eq[m]`` is the throughput job m would see on an
  equal, heterogeneity-blind share of the cluster.

These builders return cvxpy problems (the model); ``apportion.solvers.cvx``
solves them. The round mechanism that turns X into integral allocations lives
with its users: the Gavel baseline policy (priorities = allocation / rounds
received); ``solve-round --formulation gavel`` runs that same policy for one round.
"""

from __future__ import annotations

from typing import Any

import cvxpy as cp
import numpy as np


def _constraints(x: cp.Variable, sf: np.ndarray, cap: np.ndarray) -> list[Any]:
    m, n = x.shape
    return [x >= 0, cp.sum(x, axis=1) <= 1,
            cp.sum(cp.multiply(np.tile(sf.reshape(m, 1), (1, n)), x), axis=0) <= cap]


def max_sum_throughput(T: np.ndarray, sf: np.ndarray, cap: np.ndarray
                       ) -> tuple[cp.Problem, cp.Variable]:
    x = cp.Variable(T.shape)
    return cp.Problem(cp.Maximize(cp.sum(cp.multiply(T, x))), _constraints(x, sf, cap)), x


def equal_share(cap: np.ndarray, m: int) -> np.ndarray:
    """``X_eq``: every one of ``m`` jobs gets each type in proportion to its GPUs, rows
    summing to 1 (Gavel's ``ProportionalPolicy``: ``cap_j / m`` per job, divided by the
    row sum ``sum(cap) / m``)."""
    total = float(np.sum(cap))
    row = cap / total if total > 0 else np.zeros_like(cap, dtype=float)
    return np.tile(np.asarray(row, dtype=float).reshape(1, -1), (m, 1))


def _fairness_coef(T: np.ndarray, sf: np.ndarray, w: np.ndarray, x_norm: np.ndarray
                   ) -> np.ndarray:
    """``(sf_m / w_m) T[m, j] / (T[m]·X_norm[m])``: job m's normalised share per unit of X."""
    m, n = T.shape
    sfa = np.tile(sf.reshape(m, 1), (1, n))
    inv_w = (1.0 / w).reshape(m, 1)
    base = np.sum(T * x_norm, axis=1).reshape(m, 1)
    base = np.where(base > 0, base, 1.0)
    return T * inv_w / base * sfa


def max_min_fairness(T: np.ndarray, sf: np.ndarray, cap: np.ndarray, w: np.ndarray,
                     x_norm: np.ndarray) -> tuple[cp.Problem, cp.Variable]:
    """``x_norm``: the allocation whose throughput normalises each job's (Gavel's: the equal
    share, :func:`equal_share`)."""
    coef = _fairness_coef(T, sf, w, x_norm)
    x = cp.Variable(T.shape)
    obj = cp.Maximize(cp.min(cp.sum(cp.multiply(coef, x), axis=1)))
    return cp.Problem(obj, _constraints(x, sf, cap)), x


# The LPs' objectives evaluated at a numeric allocation (the LP's own answer, or the time
# shares the round mechanism realised): a realised allocation is a convex combination of
# rounds' integral allocations, each feasible for the LP, so the LP's optimum bounds it and
# the difference is the round mechanism's rounding loss.
def sum_throughput_value(T: np.ndarray, X: np.ndarray) -> float:
    """``sum_{m,j} T[m, j] X[m, j]`` (max-sum-throughput's objective)."""
    return float(np.sum(T * X))


def max_min_value(T: np.ndarray, sf: np.ndarray, w: np.ndarray, x_norm: np.ndarray,
                  X: np.ndarray) -> float:
    """``min_m (sf_m / w_m) T[m]·X[m] / (T[m]·X_norm[m])`` (max-min fairness's objective)."""
    if not len(T):
        return 0.0
    return float(np.min(np.sum(_fairness_coef(T, sf, w, x_norm) * X, axis=1)))


def check_allocation(X: np.ndarray, sf: np.ndarray, cap: np.ndarray, tol: float = 1e-6) -> bool:
    """The LP's constraints, checked independently on a numeric allocation."""
    return bool(np.all(X >= -tol) and np.all(X.sum(axis=1) <= 1 + tol)
                and np.all((sf.reshape(-1, 1) * X).sum(axis=0) <= cap + tol))
