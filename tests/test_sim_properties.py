"""Simulator properties: every job finishes, capacity holds every round, seeds reproduce,
completions are exact."""

from __future__ import annotations

import pandas as pd
import pytest
from apportion.experiments import traces as tr
from apportion.experiments.groundtruth import AnalyticTruth
from apportion.policies import make_policy
from apportion.experiments.simulator import SimConfig, Simulator
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.cluster import Cluster, NodeGroup


def small_cluster() -> Cluster:
    return Cluster("mini", [NodeGroup("a40", 3, "A40", 2, 48, 256.0, "pcie", 32.0, 12.5),
                            NodeGroup("a100", 2, "A100-40GB", 4, 64, 512.0, "nvlink", 600.0, 25.0)])


MODELS = {"bert-0.76b": 0.5, "wresnet-0.5b": 0.5}
FAST = ["fcfs", "fcfs-backfill", "srtf", "tiresias", "gandiva", "gandiva-migrate",
        "gavel-max-sum-throughput", "gavel-max-min-fairness", "fifo", "elasticflow-ls", "sia",
        "synergy", "antman", "morphling"]


def run(policy: str, trace: tr.Trace, seed: int = 0, **cfg: object) -> object:
    cl = small_cluster()
    return Simulator(cl, trace, make_policy(policy), AnalyticTruth(cl),
                     SimConfig(seed=seed, **cfg)).run()  # the pipeline validates every round


def trace_of(n: int, seed: int) -> tr.Trace:
    return tr.synthetic(n=n, rate_per_h=12.0, seed=seed, sizes={1: 0.5, 2: 0.3, 4: 0.2},
                        models=MODELS, iterations=(50.0, 400.0))


def capacity_ok(res: object, cl: Cluster) -> bool:
    tl = res.timeline
    cap = cl.capacity_by_type()
    return all((tl[f"busy_{g}"] <= cap[g] + 1e-9).all() for g in cap)


@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 14), seed=st.integers(0, 1000), policy=st.sampled_from(FAST))
def test_every_job_finishes_and_capacity_holds(n: int, seed: int, policy: str) -> None:
    res = run(policy, trace_of(n, seed), seed)
    assert res.summary["finished"] == n, res.jobs[~res.jobs["finished"]]
    assert capacity_ok(res, small_cluster())
    fin = res.jobs
    assert (fin["finish_s"] >= fin["submit_s"]).all()
    assert (fin["done"] == fin["iterations"]).all()


@pytest.mark.parametrize("policy", ["srtf", "gavel-max-min-fairness", "tiresias", "sia"])
def test_same_seed_same_results(policy: str) -> None:
    t = trace_of(12, 7)
    a, b = run(policy, t, 3, noise_sigma=0.2), run(policy, t, 3, noise_sigma=0.2)
    pd.testing.assert_frame_equal(a.jobs, b.jobs)
    pd.testing.assert_frame_equal(a.timeline, b.timeline)


def test_completion_time_is_exact() -> None:
    job = tr.SimJob("solo", 0.0, 2, 777.0, "bert-0.76b", model="bert-0.76b", batch=256,
                    gpu_type="A40")
    cl = small_cluster()
    truth = AnalyticTruth(cl)
    res = Simulator(cl, tr.Trace("solo", [job]), make_policy("fcfs"), truth,
                    SimConfig(interval_s=300.0, start_cost_s=40.0)).run()
    rate = truth.rate(job, "A40", 2)
    assert res.jobs.loc[0, "jct_s"] == pytest.approx(40.0 + 777.0 / rate, rel=1e-12)


def test_restart_cost_charged_on_preemption() -> None:
    mk = lambda i, t, it: tr.SimJob(f"j{i}", t, 4, it, "bert-0.76b", model="bert-0.76b",
                                     batch=256, gpu_type="A100-40GB")
    t = tr.Trace("preempt", [mk(0, 0.0, 20000.0), mk(1, 0.0, 20000.0), mk(2, 400.0, 50.0)])
    cl = small_cluster()
    res = {}
    for cost in (0.0, 600.0):
        res[cost] = Simulator(cl, t, make_policy("srtf"), AnalyticTruth(cl),
                              SimConfig(restart_cost_s=cost)).run()
    assert res[0.0].jobs["restarts"].sum() >= 1  # the short job preempted a long one
    long0 = res[0.0].jobs.set_index("job_id")
    long6 = res[600.0].jobs.set_index("job_id")
    preempted = long0.index[long0["restarts"] > 0][0]
    assert long6.loc[preempted, "jct_s"] == pytest.approx(long0.loc[preempted, "jct_s"] + 600.0)


def test_noise_changes_the_view_not_the_truth() -> None:
    t = trace_of(8, 5)
    res = run("fcfs", t, 0, noise_sigma=0.5)
    # FCFS ignores estimates except for choosing a type: jobs still progress at true rates
    assert res.summary["finished"] == 8
