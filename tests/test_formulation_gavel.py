"""Gavel's allocation LPs as a formulation and as a round: constraints, known optima, validator."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.cluster import Cluster, NodeGroup
from apportion.formulations.gavel import (check_allocation, equal_share, max_min_fairness,
                                          max_min_value, max_sum_throughput)
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
    X, _ = solve_cvxpy(*max_min_fairness(T, sf, cap, w, equal_share(cap, 2)))
    assert X[:, 0] == pytest.approx([0.5, 0.5], abs=1e-5)


def test_equal_share_is_gavels_proportional_allocation() -> None:
    # Gavel's ProportionalPolicy: cap_j / m per job, rows scaled to sum to 1, so each job
    # gets every type in proportion to its GPUs, whatever the number of jobs
    cap = np.array([8.0, 8.0, 16.0])
    x = equal_share(cap, 5)
    assert x.shape == (5, 3)
    assert np.allclose(x, [[0.25, 0.25, 0.5]] * 5)
    assert np.allclose(equal_share(np.zeros(2), 3), 0.0)


def test_max_min_normalises_by_the_equal_share_throughput() -> None:
    # job 0 runs 4x faster on type 0, job 1 is indifferent; one GPU of each type. The equal
    # share gives job 0 (4 + 1) / 2 = 2.5 and job 1 1.0; the LP maximises the smaller of
    # T[m].X[m] / (T[m].X_eq[m]). Job 1 can never pass 1.0 (its row sums to at most 1 at
    # rate 1), and job 0 all of type 0 with job 1 all of type 1 reaches it (1.6 and 1.0)
    T, sf, cap, w = np.array([[4.0, 1.0], [1.0, 1.0]]), np.ones(2), np.ones(2), np.ones(2)
    x_eq = equal_share(cap, 2)
    X, _ = solve_cvxpy(*max_min_fairness(T, sf, cap, w, x_eq))
    assert max_min_value(T, sf, w, x_eq, X) == pytest.approx(1.0, abs=1e-5)
    assert check_allocation(X, sf, cap, tol=1e-6)


@settings(max_examples=25)
@given(m=st.integers(1, 6), n=st.integers(1, 3), data=st.data())
def test_lp_allocations_respect_their_constraints(m: int, n: int, data: st.DataObject) -> None:
    T = np.array(data.draw(st.lists(st.lists(st.floats(0.0, 10.0), min_size=n, max_size=n),
                                    min_size=m, max_size=m)))
    sf = np.array(data.draw(st.lists(st.sampled_from([1.0, 2.0, 4.0]), min_size=m, max_size=m)))
    cap = np.array(data.draw(st.lists(st.sampled_from([1.0, 4.0, 8.0]), min_size=n, max_size=n)))
    X, _ = solve_cvxpy(*max_sum_throughput(T, sf, cap))
    assert check_allocation(X, sf, cap, tol=1e-5)
    X, _ = solve_cvxpy(*max_min_fairness(T, sf, cap, np.ones(m), equal_share(cap, m)))
    assert check_allocation(X, sf, cap, tol=1e-5)


@pytest.mark.parametrize("variant", ["max-sum-throughput", "max-min-fairness"])
def test_gavel_round_validates(variant: str) -> None:
    cluster = Cluster("h", [NodeGroup("v", 2, "V100-32GB", 4), NodeGroup("a", 1, "A100-40GB", 4)])
    jobs = [JobSpec(f"j{i}", ["bert-336m", "wresnet-0.5b", "moe-0.69b"][i % 3], 64, 1000,
                    [1, 2, 4][i % 3], submit_time_s=float(i)) for i in range(7)]
    r = run_round(cluster, jobs, 100.0, RoundConfig(formulation="gavel", gavel_variant=variant))
    assert validate(r.decision, cluster, jobs).ok
    assert r.decision.formulation == "gavel" and r.decision.allocations
    assert r.decision.report.backend.startswith("cvxpy/")
