"""Deadline admission (Crius-DDL / ElasticFlow) and objectives as options."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.cluster import Cluster, NodeGroup
from apportion.formulations.candidates import CandidateOptions
from apportion.formulations.objectives import OBJECTIVES
from apportion.jobs import JobSpec, RunningState
from apportion.policies import RoundConfig, run_round
from apportion.validator import validate

MODELS = ["bert-336m", "bert-0.76b", "wresnet-0.5b", "moe-0.69b"]


def _cluster() -> Cluster:
    return Cluster("d", [NodeGroup("a", 2, "A100-40GB", 4), NodeGroup("v", 2, "V100-32GB", 4)])


@settings(max_examples=15)
@given(specs=st.lists(st.tuples(st.sampled_from(MODELS), st.sampled_from([1, 2, 4]),
                                st.integers(100, 20000), st.floats(600.0, 200000.0),
                                st.booleans()), min_size=1, max_size=6))
def test_placed_deadline_jobs_finish_in_time(specs) -> None:
    cluster, now = _cluster(), 1000.0
    jobs = [JobSpec(f"j{i}", m, 64, iters, n, submit_time_s=0.0, deadline_s=now + slack,
                    admitted=adm) for i, (m, n, iters, slack, adm) in enumerate(specs)]
    r = run_round(cluster, jobs, now, RoundConfig(formulation="deadline", backend="highs"))
    d = r.decision
    assert validate(d, cluster, jobs).ok
    by_id = {j.id: j for j in jobs}
    for a in d.allocations:
        job = by_id[a.job]
        assert now + job.remaining_iterations * a.iter_time_s <= job.deadline_s + 1e-6
    for p in d.pending:
        if p.reason.value == "deadline-unmeetable":
            # refused only when no candidate of any size meets it
            assert not any(dd.get("job") == p.job and dd.get("kind") == "cell"
                           for _, dd in r.graph.nodes(data=True))
    assert d.meta["deadline_jobs"] == len(jobs)


def test_admitted_job_outranks_new_ones() -> None:
    cluster = Cluster("one", [NodeGroup("a", 1, "A100-40GB", 4)])
    now = 0.0
    admitted = JobSpec("old", "bert-0.76b", 64, 2000, 4, deadline_s=1e6, admitted=True)
    newcomers = [JobSpec(f"new{i}", "bert-336m", 64, 100, 1, deadline_s=1e6) for i in range(4)]
    r = run_round(cluster, [admitted, *newcomers], now,
                  RoundConfig(formulation="deadline", backend="cp-sat"))
    assert r.decision.allocation("old") is not None
    assert validate(r.decision, cluster, [admitted, *newcomers]).ok


def test_unmeetable_deadline_is_refused() -> None:
    cluster = Cluster("one", [NodeGroup("a", 1, "T4", 1, intra_node_link="pcie")])
    job = JobSpec("late", "bert-336m", 32, 10**7, 1, deadline_s=10.0)
    r = run_round(cluster, [job], 0.0, RoundConfig(formulation="deadline"))
    assert r.decision.pending[0].reason.value == "deadline-unmeetable"


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_every_objective_solves_and_validates(objective: str) -> None:
    cluster = _cluster()
    jobs = [JobSpec(f"j{i}", MODELS[i % 4], 64, 1000 * (i + 1), 2 ** (i % 3), submit_time_s=i * 100.0)
            for i in range(8)]
    jobs.append(JobSpec("run", "bert-336m", 64, 5000, 2,
                        running=RunningState("A100-40GB", 2, 1, {"a-0": 2})))
    cfg = RoundConfig(backend="highs", candidates=CandidateOptions(objective=objective),
                      deterministic=True)
    r = run_round(cluster, jobs, 5000.0, cfg)
    assert r.decision.report.status == "optimal"
    assert validate(r.decision, cluster, jobs).ok
    assert r.graph.graph["objective"]["kind"] == objective


def test_jct_objective_prefers_short_jobs_under_contention() -> None:
    cluster = Cluster("one", [NodeGroup("a", 1, "A100-40GB", 4)])
    short = JobSpec("short", "bert-336m", 64, 100, 4)
    long = JobSpec("long", "bert-336m", 64, 100000, 4)
    r = run_round(cluster, [short, long], 0.0,
                  RoundConfig(backend="highs", candidates=CandidateOptions(objective="jct",
                                                                           scales=(1.0,))))
    assert r.decision.allocation("short") is not None and r.decision.allocation("long") is None
    r = run_round(cluster, [short, long], 0.0,
                  RoundConfig(backend="highs", candidates=CandidateOptions(objective="makespan",
                                                                           scales=(1.0,))))
    assert r.decision.allocation("long") is not None and r.decision.allocation("short") is None


def test_restart_cost_keeps_running_job_when_gain_is_small() -> None:
    cluster = Cluster("c", [NodeGroup("a", 1, "A100-40GB", 8)])
    run = JobSpec("r", "bert-336m", 64, 1000, 4, running=RunningState("A100-40GB", 4, 1, {"a-0": 4}))
    cheap = RoundConfig(backend="highs", candidates=CandidateOptions(keep_bonus=0.0, restart_s=0.0))
    dear = RoundConfig(backend="highs", candidates=CandidateOptions(keep_bonus=0.0, restart_s=300.0,
                                                                    round_s=300.0))
    grown = run_round(cluster, [run], 0.0, cheap).decision.allocation("r")
    kept = run_round(cluster, [run], 0.0, dear).decision.allocation("r")
    assert grown is not None and grown.gpus == 8  # free GPUs and no cost: it grows
    assert kept is not None and kept.action.value == "keep"  # a whole round lost: it stays
