"""The three solver libraries load together and each solves (highspy < 1.15 beside ortools 9.15)."""

from __future__ import annotations

import numpy as np
import pytest


def test_highspy_ortools_cvxpy_coexist_and_solve() -> None:
    import cvxpy as cp
    import highspy
    from ortools.sat.python import cp_model

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    x = h.addVariable(0, 4)
    h.maximize(x)
    assert h.getInfo().objective_function_value == pytest.approx(4.0)

    m = cp_model.CpModel()
    y = m.NewIntVar(0, 7, "y")
    m.Maximize(y)
    s = cp_model.CpSolver()
    assert s.Solve(m) == cp_model.OPTIMAL and s.Value(y) == 7

    z = cp.Variable(2)
    prob = cp.Problem(cp.Maximize(z.sum()), [z <= np.array([1.0, 2.0])])
    prob.solve()
    assert prob.value == pytest.approx(3.0, abs=1e-6)
