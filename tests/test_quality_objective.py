"""The JCT-aware objective, the per-placed-job bonus and the normalisations."""

from __future__ import annotations

import pytest
from apportion.experiments.groundtruth import AnalyticTruth
from apportion.experiments.policies import make_policy
from apportion.experiments.simulator import SimConfig, Simulator
from apportion.formulations.candidates import CandidateOptions, build_candidates, cells_of, job_node
from apportion.formulations.objectives import jct_weights
from apportion.solvers.validator import validate
from hypothesis import given
from hypothesis import strategies as st
from test_policies_all import trace
from test_sim_properties import small_cluster

from apportion.cluster import Cluster, NodeGroup
from apportion.decision import SolveReport
from apportion.jobs import JobSpec
from apportion.round import RoundConfig, run_round

REPORT = SolveReport("t", "optimal", None, None, None, 0.0, False)


@given(rem=st.dictionaries(st.text("abc", min_size=1, max_size=3), st.floats(60.0, 1e6), min_size=1),
       alpha=st.floats(0.0, 1.0))
def test_jct_weights_are_bounded_and_favour_short_work(rem: dict[str, float], alpha: float) -> None:
    w = jct_weights(rem, alpha, (0.25, 4.0))
    assert all(0.25 <= v <= 4.0 for v in w.values())
    for a in rem:
        for b in rem:
            if rem[a] < rem[b]:
                assert w[a] >= w[b]  # less remaining work never weighs less
    if alpha == 0.0:
        assert set(w.values()) == {1.0}


def _two_jobs_one_slot() -> tuple[Cluster, list[JobSpec]]:
    cl = Cluster("one", [NodeGroup("a", 1, "A100-40GB", 4)])
    short = JobSpec("short", "bert-336m", 64, 200, 4, submit_time_s=0.0)
    long = JobSpec("long", "bert-336m", 64, 200_000, 4, submit_time_s=0.0)
    return cl, [short, long]


def test_jct_aware_runs_the_shorter_job_first_and_normalized_is_indifferent() -> None:
    cl, jobs = _two_jobs_one_slot()
    picks = {}
    for kind in ("jct-aware", "normalized"):
        opts = CandidateOptions(objective=kind, place_bonus=1.0, scales=(1.0,))
        res = run_round(cl, jobs, 0.0, RoundConfig(time_budget_s=5.0, candidates=opts))
        assert validate(res.decision, cl, jobs).ok
        assert res.decision.report.backend in ("highs", "cp-sat")
        picks[kind] = [a.job for a in res.decision.allocations]
        vals = {j.id: max(res.graph.nodes[c]["value"] for c in cells_of(res.graph, j.id)) for j in jobs}
        if kind == "normalized":
            assert vals["short"] == pytest.approx(vals["long"])
        else:
            assert vals["short"] > vals["long"]
    assert picks["jct-aware"] == ["short"]


def test_place_bonus_places_a_second_job_before_scaling_one_up() -> None:
    """8 GPUs, two 4-GPU jobs: without a bonus one job at 8 may win; with it both run."""
    cl = Cluster("two", [NodeGroup("a", 2, "A100-40GB", 4)])
    jobs = [JobSpec(f"j{i}", "bert-336m", 256, 5000, 4, submit_time_s=0.0) for i in range(2)]
    opts = CandidateOptions(place_bonus=1.0)
    res = run_round(cl, jobs, 0.0, RoundConfig(time_budget_s=5.0, candidates=opts))
    assert validate(res.decision, cl, jobs).ok
    assert sorted(a.job for a in res.decision.allocations) == ["j0", "j1"]
    g = res.graph
    for cn in cells_of(g, "j0"):
        d = g.nodes[cn]
        assert d["value"] == pytest.approx(d["term"] + 1.0 + g.nodes[job_node("j0")]["queue_bonus"])


def test_crius_greedy_keeps_crius_objective() -> None:
    from apportion.experiments.policies.optimising import CRIUS_OBJECTIVE

    opts = make_policy("crius-greedy").cfg.candidates
    assert {k: getattr(opts, k) for k in CRIUS_OBJECTIVE} == CRIUS_OBJECTIVE
    assert make_policy("apportion", place_bonus=2.0).cfg.candidates.place_bonus == 2.0
    with pytest.raises(TypeError):
        make_policy("apportion", no_such_option=1)


def test_apportion_defaults_in_a_replay_validate_every_round() -> None:
    cl = small_cluster()
    pol = make_policy("apportion", time_budget_s=1.0)
    res = Simulator(cl, trace(), pol, AnalyticTruth(cl), SimConfig(seed=0)).run()  # validates
    assert res.summary["finished"] == 10
    assert set(res.rounds["backend"]) & {"highs", "cp-sat"}


@pytest.mark.parametrize("normalize", ["requested", "slowest", "best", "least-efficient"])
def test_normalisations(normalize: str) -> None:
    cl = Cluster("h", [NodeGroup("a", 2, "A100-40GB", 4), NodeGroup("b", 4, "A10", 2)])
    jobs = [JobSpec("j", "bert-336m", 64, 1000, 2, requested_gpu_type="A10")]
    g = build_candidates(cl, jobs, 0.0, options=CandidateOptions(normalize=normalize))
    at_n = {g.nodes[c]["gpu_type"]: g.nodes[c]["est_throughput"] for c in cells_of(g, "j")
            if g.nodes[c]["gpus"] == 2}
    ref = g.nodes[job_node("j")]["ref_throughput"]
    per_gpu = min(g.nodes[c]["est_throughput"] / g.nodes[c]["gpus"] for c in cells_of(g, "j"))
    want = {"requested": at_n["A10"], "slowest": min(at_n.values()), "best": max(at_n.values()),
            "least-efficient": 2 * per_gpu}
    assert ref == pytest.approx(want[normalize])
    with pytest.raises(ValueError):
        build_candidates(cl, jobs, 0.0, options=CandidateOptions(normalize="nope"))
