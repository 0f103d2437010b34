"""Solver faults, injected for real: a backend that aborts, segfaults, exits, hangs or raises
runs in a child process and the round's process survives with a typed reason.

The fault backends below are real subclasses of the HiGHS backend whose ``solve``
misbehaves; they run in the child exactly as a broken native solver would.
Every answer that does come back is checked against the model (``is_feasible``)
and, for the cell formulation, decoded and checked by the independent validator.
"""

from __future__ import annotations

import ctypes
import math
import os
import sys
import time

import numpy as np
import pytest

# Only light imports at module level: each isolated child imports this module to find the
# fault backends below, and pays for every import here.
from apportion.formulations.model import LinearModel
from apportion.solvers.base import SolveResult, Status
from apportion.solvers.highs import HighsBackend
from apportion.solvers.isolation import IsolatedBackend, numerical_trouble, solve_isolated

CRASH_GRACE_S = 30.0  # a crash returns as soon as the child dies; the grace only bounds a hang


# -- fault-injecting backends (module level: the child imports them by reference) ----------
class AbortBackend(HighsBackend):
    name = "abort"

    def solve(self, model: LinearModel, time_limit_s: float) -> SolveResult:
        os.abort()


class SegfaultBackend(HighsBackend):
    name = "segfault"

    def solve(self, model: LinearModel, time_limit_s: float) -> SolveResult:
        ctypes.string_at(0)  # dereference NULL: a real SIGSEGV
        raise AssertionError("unreachable")


class ExitBackend(HighsBackend):
    name = "exit"

    def solve(self, model: LinearModel, time_limit_s: float) -> SolveResult:
        os._exit(3)


class SleepBackend(HighsBackend):
    """Ignores its budget: sleeps far past it."""

    name = "sleep"

    def solve(self, model: LinearModel, time_limit_s: float) -> SolveResult:
        time.sleep(3600)
        raise AssertionError("unreachable")


class UnprovenBackend(HighsBackend):
    """HiGHS's answer reported as merely feasible, so a chain never stops at it for a proof
    (whether an LP rounding proves its answer depends on the objective's values)."""

    name = "unproven"

    def solve(self, model: LinearModel, time_limit_s: float) -> SolveResult:
        res = super().solve(model, time_limit_s)
        if res.status is Status.OPTIMAL:
            res.status = Status.FEASIBLE
        return res


class SpinBackend(HighsBackend):
    """Holds the GIL in a busy loop: only a kill from outside stops it."""

    name = "spin"

    def solve(self, model: LinearModel, time_limit_s: float) -> SolveResult:
        while True:
            pass


class RaiseBackend(HighsBackend):
    name = "raise"

    def solve(self, model: LinearModel, time_limit_s: float) -> SolveResult:
        raise RuntimeError("injected failure")


class WrongSizeBackend(HighsBackend):
    name = "wrong-size"

    def solve(self, model: LinearModel, time_limit_s: float) -> SolveResult:
        return SolveResult(self.name, Status.OPTIMAL, np.zeros(model.num_vars + 3), 0.0, 0.0)


class UnpicklableAnswerBackend(HighsBackend):
    name = "unpicklable"

    def solve(self, model: LinearModel, time_limit_s: float) -> SolveResult:
        res = super().solve(model, time_limit_s)
        res.extra["callback"] = lambda: None
        return res


class NoisyBackend(HighsBackend):
    """Prints to stdout (the child's answer channel) before answering correctly."""

    name = "noisy"

    def solve(self, model: LinearModel, time_limit_s: float) -> SolveResult:
        print("solver chatter on stdout " * 50)
        sys.stdout.flush()
        os.write(1, b"raw bytes on fd 1\n")
        return super().solve(model, time_limit_s)


class LyingBackend(HighsBackend):
    """Claims optimal for a point that violates the rows."""

    name = "lying"

    def solve(self, model: LinearModel, time_limit_s: float) -> SolveResult:
        x = np.asarray(model.ub, float).clip(max=1e6)
        return SolveResult(self.name, Status.OPTIMAL, x, model.objective_value(x), None)


FAULTS = [
    (AbortBackend(), "killed by SIGABRT"),
    (SegfaultBackend(), "killed by SIGSEGV"),
    (ExitBackend(), "exited with code 3"),
    (SleepBackend(), "timed out"),
    (SpinBackend(), "timed out"),
    (RaiseBackend(), "raised RuntimeError('injected failure')"),
    (WrongSizeBackend(), "values for"),
    (UnpicklableAnswerBackend(), "does not pickle"),
    (LyingBackend(), "violates the model"),
    ("no.such.module:Backend", "No module named"),
]


@pytest.fixture(scope="module")
def cells() -> tuple:
    from apportion.formulations.candidates import build_candidates
    from apportion.formulations.cells import build_cells_model

    from apportion.config import cluster_from_data, jobs_from_data

    cl = cluster_from_data({"node_groups": [
        {"prefix": "a40", "count": 2, "gpu_type": "A40", "gpus_per_node": 4},
        {"prefix": "a10", "count": 2, "gpu_type": "A10", "gpus_per_node": 4}]}, "test")
    jobs, now = jobs_from_data({"jobs": [
        {"id": f"j{i}", "model": m, "global_batch_size": 128, "iterations": 1000,
         "requested_gpus": n, "submit_time_s": 60 * i}
        for i, (m, n) in enumerate([("bert-0.76b", 2), ("bert-1.3b", 4), ("moe-0.69b", 4),
                                    ("wresnet-1b", 4), ("bert-2.6b", 8)])]}, "test")
    g = build_candidates(cl, jobs, now)
    return cl, jobs, g, build_cells_model(g)


def _validated(res: SolveResult, cells: tuple) -> None:
    from apportion.validator import validate

    from apportion.decision import SolveReport
    from apportion.formulations.decode import to_decision

    cl, jobs, g, model = cells
    assert res.x is not None and model.is_feasible(res.x)
    dec = to_decision(g, model.decode(res.x), cl, jobs, SolveReport("-", "-", None, None, None,
                                                                     0.0, False))
    check = validate(dec, cl, jobs)
    assert check.ok, check.violations


@pytest.mark.parametrize("backend,fragment", FAULTS,
                         ids=[b if isinstance(b, str) else b.name for b, _ in FAULTS])
def test_injected_fault_comes_back_as_error(backend: object, fragment: str, cells: tuple) -> None:
    model = cells[3]
    hang = fragment == "timed out"
    res = solve_isolated(backend, model, time_limit_s=0.3, grace_s=1.0 if hang else CRASH_GRACE_S)
    assert res.status is Status.ERROR, res
    assert res.x is None
    assert fragment in res.message, res.message
    assert res.extra.get("isolated") is True


@pytest.mark.parametrize("backend", ["highs", "cp-sat", NoisyBackend()],
                         ids=["highs", "cp-sat", "noisy-stdout"])
def test_isolated_answer_matches_in_process(backend: object, cells: tuple) -> None:
    model = cells[3]
    res = solve_isolated(backend, model, time_limit_s=20, grace_s=CRASH_GRACE_S)
    assert res.status is Status.OPTIMAL, res.message
    _validated(res, cells)
    ref = HighsBackend().solve(model, 20)
    assert ref.objective is not None and res.objective is not None
    assert math.isclose(res.objective, ref.objective, rel_tol=1e-6, abs_tol=1e-6)


def test_chain_falls_back_past_crashing_backends_and_records_why(cells: tuple) -> None:
    from apportion.solvers.chain import solve_chain
    from apportion.validator import validate

    from apportion.decision import SolveReport
    from apportion.formulations.decode import to_decision

    cl, jobs, g, model = cells

    def accept(res: SolveResult) -> bool:
        dec = to_decision(g, model.decode(res.x), cl, jobs,
                          SolveReport("-", "-", None, None, None, 0.0, False))
        return validate(dec, cl, jobs).ok

    chain = [IsolatedBackend(b, grace_s=CRASH_GRACE_S)
             for b in (AbortBackend(), RaiseBackend(), LyingBackend(), "highs")]
    best, attempts = solve_chain(model, chain, 60.0, accept)
    assert [a.backend for a in attempts] == ["abort", "raise", "lying", "highs"]
    assert [a.status for a in attempts[:3]] == [Status.ERROR] * 3
    assert "SIGABRT" in attempts[0].message and "injected" in attempts[1].message
    assert "numerical trouble" in attempts[2].message
    assert best is not None and best.backend == "highs"
    _validated(best, cells)


def test_isolated_backend_availability() -> None:
    assert IsolatedBackend("highs").available()
    assert not IsolatedBackend("no.such.module:Backend").available()


# -- numerically nasty models -------------------------------------------------------------
def _nasty(kind: str) -> LinearModel:
    m = LinearModel(kind, sense="max")
    if kind == "scales":  # coefficients over 18 orders of magnitude
        a = m.add_var("a", 0, 1e9, True, obj=1e-9)
        b = m.add_var("b", 0, 1, True, obj=1e9)
        m.add_row({a: 1e-9, b: 1e9}, ub=1e9)
        m.add_row({a: 1e9, b: -1e-9}, lb=-1, ub=1e12)
    elif kind == "huge-bounds":
        a = m.add_var("a", -1e20, 1e20, True, obj=1.0)
        b = m.add_var("b", 0, math.inf, False, obj=1e-12)
        m.add_row({a: 1, b: 1}, ub=1e15)
    elif kind == "nan-objective":
        a = m.add_var("a", 0, 10, True, obj=float("nan"))
        m.add_row({a: 1}, ub=5)
    elif kind == "inf-coefficient":
        a = m.add_var("a", 0, 10, True, obj=1.0)
        m.add_row({a: math.inf}, ub=5)
    elif kind == "infeasible":
        a = m.add_var("a", 0, 10, True, obj=1.0)
        m.add_row({a: 1}, lb=11)
    elif kind == "unbounded":
        a = m.add_var("a", 0, math.inf, False, obj=1.0)
        m.add_row({a: 1}, lb=1)
    return m


NASTY = ["scales", "huge-bounds", "nan-objective", "inf-coefficient", "infeasible", "unbounded"]


def _check_nasty(kind: str, model: LinearModel, res: SolveResult) -> None:
    if res.status.has_solution:
        assert res.x is not None and model.is_feasible(res.x, 1e-5)
        assert res.objective is not None and math.isfinite(res.objective)
        assert np.all(np.isfinite(model.matrix() @ res.x))
    else:
        assert res.x is None
    if kind in ("nan-objective", "inf-coefficient", "infeasible"):
        assert not res.status.has_solution, (kind, res)
    if kind == "infeasible":
        assert res.status in (Status.INFEASIBLE, Status.ERROR)


@pytest.mark.parametrize("backend", ["highs", "cp-sat"])
@pytest.mark.parametrize("kind", NASTY)
def test_nasty_models_through_the_trouble_check(kind: str, backend: str) -> None:
    """In-process, as the chain would run it: a raise is an error, a bogus answer is caught."""
    from apportion.solvers.isolation import resolve_backend

    model = _nasty(kind)
    try:
        res = resolve_backend(backend).solve(model, 2.0)
    except Exception as exc:  # the chain turns this into an error attempt
        res = SolveResult(backend, Status.ERROR, message=f"raised {exc!r}")
    trouble = numerical_trouble(res, model)
    if trouble:
        res = SolveResult(backend, Status.ERROR, message=trouble)
    _check_nasty(kind, model, res)


@pytest.mark.parametrize("kind,backend", [("nan-objective", "highs"),
                                          ("inf-coefficient", "cp-sat"), ("scales", "highs")])
def test_nasty_models_isolated(kind: str, backend: str) -> None:
    """HiGHS claims 'optimal' with a NaN objective; CP-SAT raises on an infinite coefficient."""
    model = _nasty(kind)
    res = solve_isolated(backend, model, time_limit_s=2.0, grace_s=CRASH_GRACE_S)
    _check_nasty(kind, model, res)
    if kind != "scales":
        assert res.status is Status.ERROR and res.message, res


def test_numerical_trouble_check_is_not_fooled() -> None:
    m = _nasty("scales")
    good = HighsBackend().solve(m, 5)
    assert good.status is Status.OPTIMAL and numerical_trouble(good, m) == ""
    bad = SolveResult("x", Status.OPTIMAL, np.array([np.nan, 0.0]), 0.0)
    assert "non-finite" in numerical_trouble(bad, m)
    over = SolveResult("x", Status.OPTIMAL, np.array([2e9, 1.0]), 1.0)
    assert "violates" in numerical_trouble(over, m)
