"""Clock and trace faults: out-of-order submit times, zero durations, jobs larger than the cluster."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from apportion.experiments import trace_catalog as catalog
from apportion.experiments import traces as tr
from apportion.experiments.groundtruth import AnalyticTruth
from apportion.experiments.simulator import SimConfig, Simulator

from apportion.cluster import Cluster, NodeGroup
from apportion.policies import make_policy


def _cluster() -> Cluster:
    return Cluster("mini", [NodeGroup("a100", 2, "A100-40GB", 4, 64, 512.0, "nvlink", 600.0, 25.0)])


def test_csv_faults_are_handled_and_reported(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    f.write_text("job_id,submit_time_s,num_gpus,duration_s\n"
                 "a,100,1,3600\nb,50,2,1800\nc,10,4,0\ne,5,1,60\n")
    t = catalog.load_trace(str(f))
    assert [j.job_id for j in t.jobs] == ["e", "b", "a"]  # sorted; the zero-duration job dropped
    assert any("out of order" in n for n in t.notes) and any("dropped 1" in n for n in t.notes)


def test_job_larger_than_the_cluster_is_refused_and_the_rest_finish() -> None:
    base = tr.synthetic(n=6, rate_per_h=30.0, seed=3, sizes={1: 0.6, 2: 0.4},
                        models={"bert-0.76b": 1.0}, iterations=(50.0, 200.0))
    huge = replace(base.jobs[0], job_id="huge", gpus=10_000)
    trace = tr.Trace("faulty", [huge, *base.jobs[1:]], "mem")
    cl = _cluster()
    for policy in ("fcfs", "srtf", "apportion"):
        res = Simulator(cl, trace, make_policy(policy), AnalyticTruth(cl), SimConfig()).run()
        s = res.summary
        assert s["refused_larger_than_cluster"] == 1
        assert s["finished"] == len(trace.jobs) - 1, policy  # nothing waits behind it forever
        # refused by the pipeline's admission, with its typed reason, as every driver does
        big = res.jobs[~res.jobs["finished"].astype(bool)]
        assert len(big) == 1 and bool(big["dropped"].iloc[0])
