"""Every registered policy on a small heterogeneous cluster: valid every round, all jobs done."""

from __future__ import annotations

import pytest
from apportion.experiments import traces as tr
from apportion.experiments.groundtruth import AnalyticTruth
from apportion.policies import POLICIES, make_policy
from apportion.experiments.simulator import SimConfig, Simulator
from test_sim_properties import MODELS, small_cluster

SLOW = {"apportion", "apportion-na", "apportion-nh", "crius-greedy"}


def trace() -> tr.Trace:
    return tr.synthetic(n=10, rate_per_h=10.0, seed=2, sizes={1: 0.4, 2: 0.4, 4: 0.2},
                        models=MODELS, iterations=(50.0, 300.0),
                        gpu_types=["A40", "A100-40GB"])


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_policy_completes_with_valid_decisions(name: str) -> None:
    cl = small_cluster()
    opts = {"time_budget_s": 1.0} if name.startswith("apportion") else {}
    pol = make_policy(name, **opts)
    res = Simulator(cl, trace(), pol, AnalyticTruth(cl), SimConfig(seed=1)).run()
    s = res.summary
    assert s["finished"] + s["dropped"] == s["jobs"] == 10, name
    if name != "elasticflow":
        assert s["finished"] == 10, name
    # each round's record says how many jobs the decision placed: the jobs that then ran
    assert len(res.rounds) == len(res.timeline), name
    assert res.rounds["placed"].tolist() == res.timeline["running"].tolist(), name


def test_optimising_uses_the_solver_and_scales() -> None:
    cl = small_cluster()
    pol = make_policy("apportion", time_budget_s=2.0)
    res = Simulator(cl, trace(), pol, AnalyticTruth(cl), SimConfig(seed=0)).run()
    rd = res.rounds
    # a real solver answered some rounds (LP rounding's HiGHS LP and restricted MIP, or
    # HiGHS's branch and bound), not the greedy fallback
    assert set(rd["backend"]) & {"lp-round", "highs", "cp-sat"}
    gaps = rd["gap"].dropna()  # the answer's proven gap, recorded per round
    assert len(gaps) > 0 and (gaps >= 0).all()
    # cells at N/2, N, 2N: some job ran at a GPU count other than its request
    assert res.summary["finished"] == 10


def test_unknown_policy() -> None:
    with pytest.raises(KeyError):
        make_policy("no-such-policy")
