r"""Gavel's heterogeneity-aware allocation LPs (Narayanan et al., OSDI'20), in cvxpy.

An allocation ``X[m, j]`` is the fraction of time job ``m`` spends on GPU type
``j``, given throughputs ``T[m, j]`` (steps/s of job m on its ``sf_m`` GPUs of
type j; 0 where it cannot run), scale factors ``sf`` (GPUs a job uses) and
capacities ``cap[j]``:

    X >= 0,   sum_j X[m, j] <= 1,   sum_m sf_m X[m, j] <= cap_j

* max-sum-throughput:   max sum_{m,j} T[m, j] X[m, j]
* max-min fairness (heterogeneity-aware, Gavel's ``MaxMinFairness_Perf``): with
  ``X_iso`` the heterogeneity-agnostic max-min allocation (all throughputs 1),
  max min_m (sf_m / w_m) T[m]·X[m] / (T[m]·X_iso[m]).

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


def isolated_max_min(sf: np.ndarray, cap: np.ndarray, w: np.ndarray, shape: tuple[int, int]
                     ) -> tuple[cp.Problem, cp.Variable]:
    """The heterogeneity-agnostic max-min allocation (every throughput 1)."""
    m, n = shape
    sfa = np.tile(sf.reshape(m, 1), (1, n))
    inv_w = (1.0 / w).reshape(m, 1)
    x = cp.Variable(shape)
    obj = cp.Maximize(cp.min(cp.sum(cp.multiply(sfa * inv_w, x), axis=1)))
    return cp.Problem(obj, _constraints(x, sf, cap)), x


def _fairness_coef(T: np.ndarray, sf: np.ndarray, w: np.ndarray, x_iso: np.ndarray
                   ) -> np.ndarray:
    """``(sf_m / w_m) T[m, j] / (T[m]·X_iso[m])``: job m's normalised share per unit of X."""
    m, n = T.shape
    sfa = np.tile(sf.reshape(m, 1), (1, n))
    inv_w = (1.0 / w).reshape(m, 1)
    iso = np.sum(T * x_iso, axis=1).reshape(m, 1)
    iso = np.where(iso > 0, iso, 1.0)
    return T * inv_w / iso * sfa


def max_min_fairness(T: np.ndarray, sf: np.ndarray, cap: np.ndarray, w: np.ndarray,
                     x_iso: np.ndarray) -> tuple[cp.Problem, cp.Variable]:
    coef = _fairness_coef(T, sf, w, x_iso)
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


def max_min_value(T: np.ndarray, sf: np.ndarray, w: np.ndarray, x_iso: np.ndarray,
                  X: np.ndarray) -> float:
    """``min_m (sf_m / w_m) T[m]·X[m] / (T[m]·X_iso[m])`` (max-min fairness's objective)."""
    if not len(T):
        return 0.0
    return float(np.min(np.sum(_fairness_coef(T, sf, w, x_iso) * X, axis=1)))


def check_allocation(X: np.ndarray, sf: np.ndarray, cap: np.ndarray, tol: float = 1e-6) -> bool:
    """The LP's constraints, checked independently on a numeric allocation."""
    return bool(np.all(X >= -tol) and np.all(X.sum(axis=1) <= 1 + tol)
                and np.all((sf.reshape(-1, 1) * X).sum(axis=0) <= cap + tol))
