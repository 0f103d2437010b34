"""Gavel's allocation LPs as a formulation and as a round: constraints, known optima, validator."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.cluster import Cluster, NodeGroup
from apportion.formulations.gavel import (check_allocation, isolated_max_min, max_min_fairness,
                                          max_sum_throughput)
from apportion.jobs import JobSpec
from apportion.policies import RoundConfig, run_round
from apportion.solvers.cvx import solve_cvxpy
from apportion.validator import validate


def test_max_sum_throughput_known_optimum() -> None:
    T = np.array([[2.0, 1.0], [1.0, 3.0]])
    sf, cap = np.array([1.0, 1.0]), np.array([1.0, 1.0])
    X, _ = solve_cvxpy(*max_sum_throughput(T, sf, cap))
    assert np.sum(T * X) == pytest.approx(5.0, abs=1e-6)  # job 0 on type 0, job 1 on type 1
    assert check_allocation(X, sf, cap)


def test_max_min_fairness_equalises_normalised_throughput() -> None:
    # two identical jobs on one GPU: each gets half
    T, sf, cap, w = np.array([[1.0], [1.0]]), np.ones(2), np.array([1.0]), np.ones(2)
    x_iso, _ = solve_cvxpy(*isolated_max_min(sf, cap, w, T.shape))
    X, _ = solve_cvxpy(*max_min_fairness(T, sf, cap, w, x_iso))
    assert X[:, 0] == pytest.approx([0.5, 0.5], abs=1e-5)


@settings(max_examples=25)
@given(m=st.integers(1, 6), n=st.integers(1, 3), data=st.data())
def test_lp_allocations_respect_their_constraints(m: int, n: int, data: st.DataObject) -> None:
    T = np.array(data.draw(st.lists(st.lists(st.floats(0.0, 10.0), min_size=n, max_size=n),
                                    min_size=m, max_size=m)))
    sf = np.array(data.draw(st.lists(st.sampled_from([1.0, 2.0, 4.0]), min_size=m, max_size=m)))
    cap = np.array(data.draw(st.lists(st.sampled_from([1.0, 4.0, 8.0]), min_size=n, max_size=n)))
    X, _ = solve_cvxpy(*max_sum_throughput(T, sf, cap))
    assert check_allocation(X, sf, cap, tol=1e-5)
    x_iso, _ = solve_cvxpy(*isolated_max_min(sf, cap, np.ones(m), T.shape))
    assert check_allocation(x_iso, sf, cap, tol=1e-5)


@pytest.mark.parametrize("variant", ["max-sum-throughput", "max-min-fairness"])
def test_gavel_round_validates(variant: str) -> None:
    cluster = Cluster("h", [NodeGroup("v", 2, "V100-32GB", 4), NodeGroup("a", 1, "A100-40GB", 4)])
    jobs = [JobSpec(f"j{i}", ["bert-336m", "wresnet-0.5b", "moe-0.69b"][i % 3], 64, 1000,
                    [1, 2, 4][i % 3], submit_time_s=float(i)) for i in range(7)]
    r = run_round(cluster, jobs, 100.0, RoundConfig(formulation="gavel", gavel_variant=variant))
    assert validate(r.decision, cluster, jobs).ok
    assert r.decision.formulation == "gavel" and r.decision.allocations
    assert r.decision.report.backend.startswith("cvxpy/")
