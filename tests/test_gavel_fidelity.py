"""Gavel's setting: max_min_fairness.trace on an 8:8:8 cluster, Gavel's mechanism."""

from __future__ import annotations

import numpy as np
import pytest
from apportion.experiments import trace_catalog as catalog
from apportion.experiments import traces as tr
from apportion.experiments.harness import run_one

pytestmark = pytest.mark.skipif(not tr.data_root().exists(), reason="shared data not present")

POLICIES = ["fifo", "gavel-max-min-fairness", "gavel-max-sum-throughput", "gandiva"]


@pytest.fixture(scope="module")
def results() -> dict:
    return {p: run_one("gavel-max-min-fairness", "8:8:8", p, profile="gavel") for p in POLICIES}


def test_all_jobs_finish_with_gavel_rounds(results: dict) -> None:
    for p, r in results.items():
        s = r.summary
        assert s["jobs"] == 96 and s["finished"] == 96, p
        assert s["interval_s"] == 360.0 and s["restart_cost_s"] == 0.0
        assert 0.0 < s["utilization"] <= 1.0
        # progress only at Gavel's measured steps/s: JCT >= isolated time on the fastest type
        j = r.jobs
        assert (j["jct_s"] >= j["isolated_s"] * 0.999).all(), p


def test_heterogeneity_aware_beats_fifo(results: dict) -> None:
    fifo = results["fifo"].summary["avg_jct_s"]
    assert results["gavel-max-min-fairness"].summary["avg_jct_s"] < fifo
    assert results["gavel-max-sum-throughput"].summary["avg_jct_s"] < fifo


def test_lp_allocations_are_feasible() -> None:
    from apportion.experiments.groundtruth import GavelTruth, NoisyView
    from apportion.experiments.harness import gavel_cluster
    from apportion.experiments.simulator import JobState, _spec

    from apportion.policies.gavel import MaxMinFairness, MaxSumThroughput
    from apportion.view import View

    cl = gavel_cluster(8, 8, 8)
    t = catalog.load_trace("gavel-max-min-fairness")
    jobs = [JobState(_spec(j), trace=j) for j in t.jobs]
    state = View(0.0, cl, jobs, NoisyView(GavelTruth()), interval_s=360.0)
    types = ["V100-32GB", "P100", "K80"]
    T = np.array([[state.rate(js, ty, js.spec.requested_gpus) for ty in types] for js in jobs])
    sf = np.array([js.spec.requested_gpus for js in jobs], dtype=float)
    w = np.ones(len(jobs))
    for pol in (MaxMinFairness(), MaxSumThroughput()):
        X = pol.allocation(state, jobs, types, T, sf, w)
        assert (X >= -1e-7).all() and (X.sum(axis=1) <= 1 + 1e-6).all()
        assert ((sf[:, None] * X).sum(axis=0) <= 8 + 1e-5).all()


@pytest.fixture(scope="module")
def oracle_results() -> dict:
    """Gavel's setting: its simulator hands the policy the measured throughputs."""
    return {p: run_one("gavel-max-min-fairness", "8:8:8", p, profile="gavel",
                       sim_options={"information": "oracle"}).summary for p in POLICIES}


def test_within_ten_percent_of_gavels_own_simulator(oracle_results: dict) -> None:
    """Against Gavel's own figures (``gavel_reference``): the LP policies within 10 % of
    Gavel as it is; FIFO and Gandiva within 10 % of Gavel with the deviation that
    GAVEL_FIDELITY.md measures switched off in Gavel too (its FIFO uses the type it draws;
    its Gandiva does not co-locate)."""
    from apportion.experiments.gavel_reference import GAVEL, VARIANTS

    ref = {p: g["avg_jct_s"] for p, g in GAVEL.items()}
    ref["fifo"] = VARIANTS["fifo-drawn-type"]["avg_jct_s"]
    ref["gandiva"] = VARIANTS["gandiva-no-packing"]["avg_jct_s"]
    for p, s in oracle_results.items():
        assert s["finished"] == 96, p
        assert 0.9 <= s["avg_jct_s"] / ref[p] <= 1.1, (p, s["avg_jct_s"], ref[p])
    # the LP policies also end when Gavel's do (makespan within 5 %)
    for p in ("gavel-max-min-fairness", "gavel-max-sum-throughput"):
        assert oracle_results[p]["makespan_s"] == pytest.approx(GAVEL[p]["makespan_s"], rel=0.05)
