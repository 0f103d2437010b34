"""The JCT-aware objective, the per-placed-job bonus and relocatable running cells."""

from __future__ import annotations

import pytest
from apportion.experiments.groundtruth import AnalyticTruth
from apportion.experiments.policies import make_policy
from apportion.experiments.policies.optimising import QualityOptions
from apportion.experiments.simulator import SimConfig, Simulator
from apportion.formulations.candidates import CandidateOptions, build_candidates, cells_of, job_node
from apportion.formulations.cells import build_cells_model
from apportion.formulations.objectives import jct_weights
from apportion.round import RoundConfig, run_round, to_decision
from apportion.solvers.base import Status
from apportion.solvers.greedy import GreedyCells, restore_placements
from apportion.solvers.highs import HighsBackend
from apportion.solvers.validator import validate
from hypothesis import given, settings
from hypothesis import strategies as st
from test_policies_all import trace
from test_sim_properties import small_cluster

from apportion.cluster import Cluster, NodeGroup
from apportion.decision import SolveReport
from apportion.jobs import JobSpec, RunningState

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


def _busy() -> tuple[Cluster, list[JobSpec]]:
    """A running 8-GPU job on two 4-GPU nodes and a waiting job: only shrinking the first frees room."""
    cl = Cluster("busy", [NodeGroup("a", 2, "A100-40GB", 4)])
    big = JobSpec("big", "bert-336m", 256, 50_000, 4, submit_time_s=0.0, iterations_done=10,
                  running=RunningState("A100-40GB", 8, 1, {"a-0": 4, "a-1": 4}, 1))
    waiting = JobSpec("wait", "bert-336m", 256, 50_000, 4, submit_time_s=0.0)
    return cl, [big, waiting]


def test_relocatable_running_counts_freed_gpus_and_keeps_placements(monkeypatch) -> None:
    import apportion.formulations.cells as cells_mod

    cl, jobs = _busy()
    monkeypatch.setattr(cells_mod, "PINNED_EXACT_LIMIT", 0)  # residual mode, as at cluster scale
    for reloc in (False, True):
        opts = CandidateOptions(place_bonus=1.0, relocatable_running=reloc)
        g = build_candidates(cl, jobs, 100.0, options=opts)
        m = build_cells_model(g)
        res = HighsBackend().solve(m, 10.0)
        assert res.status is Status.OPTIMAL
        choices = restore_placements(g, m.decode(res.x))
        dec = to_decision(g, choices, cl, jobs, REPORT)
        assert validate(dec, cl, jobs).ok
        placed = {a.job: a for a in dec.allocations}
        if not reloc:  # residual mode cannot reuse the GPUs "big" would free
            assert set(placed) == {"big"}
        else:  # both run: big shrinks to 4 GPUs, and stays on one of its own nodes
            assert set(placed) == {"big", "wait"}
            assert placed["big"].gpus == 4 and set(placed["big"].placement) <= {"a-0", "a-1"}
        gchoices, _, _ = GreedyCells().solve(g)
        assert validate(to_decision(g, gchoices, cl, jobs, REPORT), cl, jobs).ok


@settings(max_examples=15, deadline=None)
@given(moves=st.lists(st.tuples(st.sampled_from(["a-0", "a-1", "a-2", "a-3"]), st.sampled_from([1, 2])),
                      min_size=1, max_size=4, unique_by=lambda t: t[0]))
def test_kept_jobs_stay_where_they_run(moves: list[tuple[str, int]]) -> None:
    """Relocatable solve + restore: a job whose cell is kept keeps its exact placement."""
    cl = Cluster("c", [NodeGroup("a", 4, "A100-40GB", 4)])
    jobs = [JobSpec(f"r{i}", "bert-336m", 64, 10_000, k, iterations_done=5,
                    running=RunningState("A100-40GB", k, 1, {node: k}, 1))
            for i, (node, k) in enumerate(moves)]
    jobs.append(JobSpec("new", "bert-336m", 64, 10_000, 2))
    opts = CandidateOptions(relocatable_running=True, place_bonus=1.0)
    res = run_round(cl, jobs, 10.0, RoundConfig(time_budget_s=5.0, candidates=opts))
    g = res.graph
    from apportion.formulations.cells import CellChoice

    choices = [CellChoice(a.job, f"cell:{a.job}:{a.gpu_type}:{a.gpus}:{a.stages}", a.placement)
               for a in res.decision.allocations]
    dec = to_decision(g, restore_placements(g, choices), cl, jobs, REPORT)
    assert validate(dec, cl, jobs).ok
    for a in dec.allocations:
        j = next(x for x in jobs if x.id == a.job)
        if j.running is not None and (a.gpu_type, a.gpus, a.stages) == j.running.cell_key:
            assert a.placement == j.running.placement
            assert a.action.value == "keep"


def test_crius_greedy_keeps_crius_objective_and_apportion_is_jct_aware() -> None:
    assert make_policy("crius-greedy").quality == QualityOptions()
    ap = make_policy("apportion").quality
    assert ap.objective == "jct-aware" and ap.place_bonus > 0 and ap.relocatable
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
