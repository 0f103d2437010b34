"""What a Gavel LP policy reports for its round: the LP's optimum as the bound, and the LP's
objective at the time shares its rounds realised. Max-min fairness is a minimum over jobs:
a job that runs on no type (throughput 0 on each) is left out of the LP, so it no longer
makes the optimum, the bound and every allocation 0; and while a job of the allocation
still waits for its first turn there is no measure of the rounding yet, so objective and
gap are not reported (they read 0 and 100 %, whatever the allocation)."""

from __future__ import annotations

from apportion.cluster import Cluster, NodeGroup
from apportion.decision import Decision
from apportion.jobs import JobSpec
from apportion.policies import RoundConfig, run_round

CLUSTER = Cluster("a40", [NodeGroup("a", 2, "A40", 4)])


def _round(jobs: list[JobSpec]) -> Decision:
    return run_round(CLUSTER, jobs, 0.0, RoundConfig(policy="gavel-max-min-fairness")).decision


def test_a_job_that_runs_nowhere_leaves_the_bound_alone() -> None:
    runs = [JobSpec(f"b{i}", "bert-336m", 64, 1000, 2) for i in range(3)]
    nowhere = JobSpec("llama", "llama-30b", 256, 1000, 4)  # 30 B parameters on 48 GB GPUs
    alone, beside = _round(runs).report, _round([*runs, nowhere]).report
    assert alone.bound is not None and alone.bound > 0
    assert beside.bound == alone.bound  # it was 0
    assert beside.gap is not None and beside.gap < 0.5  # it was 100 %
    d = _round([*runs, nowhere])
    (p,) = [p for p in d.pending if p.job == "llama"]
    assert p.reason.value == "no-fit-memory" and p.can_ever_fit is False


def test_while_a_job_waits_for_its_turn_no_gap_is_claimed() -> None:
    jobs = [JobSpec(f"b{i}", "bert-336m", 64, 1000, 4) for i in range(4)]  # 16 GPUs asked, 8
    rep = _round(jobs).report
    assert rep.bound is not None and rep.bound > 0
    assert rep.objective is None and rep.gap is None and rep.status == "feasible"
