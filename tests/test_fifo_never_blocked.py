"""Gavel's FIFO: a job that can never run (no type it runs on can hold its GPUs) does not
block the queue; a job that fits once GPUs free up still does (strict FIFO, as Gavel's).
Before, the first such job stopped every job behind it for the rest of the replay."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from apportion.experiments.groundtruth import AnalyticTruth
from apportion.experiments.simulator import SimConfig, Simulator
from apportion.experiments.traces import SimJob, Trace

from apportion.cluster import Cluster, NodeGroup
from apportion.policies import make_policy

CL = Cluster("two", [NodeGroup("a", 1, "A100-40GB", 4), NodeGroup("b", 1, "A40", 2)])


class OnlyOnA40ForBig(AnalyticTruth):
    """The analytic truth, but job ``big`` runs on A40s only (out of memory on the A100
    partition, say): 3 GPUs of A40 do not exist, so it can never run here."""

    def rate(self, job: SimJob, gpu_type: str, gpus: int,
             placement: Mapping[str, int] | None = None, plan: str | None = None,
             **kw: Any) -> float:
        if job.job_id == "big" and gpu_type != "A40":
            return 0.0
        return super().rate(job, gpu_type, gpus, placement, plan)


def _job(jid: str, submit: float, gpus: int, iters: float) -> SimJob:
    return SimJob(jid, submit, gpus, iters, "bert-336m", model="bert-336m", batch=32)


def test_a_job_that_can_never_run_does_not_block_fifo() -> None:
    trace = Trace("t", [_job("big", 0.0, 3, 500.0)] +
                  [_job(f"j{i}", 10.0 + i, 1, 300.0) for i in range(4)])
    res = Simulator(CL, trace, make_policy("fifo"), OnlyOnA40ForBig(CL),
                    SimConfig(stall_rounds=10)).run()
    jobs = res.jobs.set_index("job_id")
    assert jobs.loc[[f"j{i}" for i in range(4)], "finished"].all()
    assert not jobs.loc["big", "finished"]  # it never runs: the replay names it


def test_a_job_that_fits_later_still_blocks_fifo() -> None:
    """Strict FIFO is Gavel's: a 4-GPU job waits for the A100s to free up, and the 1-GPU
    job behind it waits too, though an A40 is free."""
    trace = Trace("t", [_job("first", 0.0, 2, 20000.0), _job("wide", 1.0, 4, 200.0),
                        _job("small", 2.0, 1, 50.0)])
    res = Simulator(CL, trace, make_policy("fifo"), AnalyticTruth(CL),
                    SimConfig(interval_s=60.0)).run()
    jobs = res.jobs.set_index("job_id")
    assert jobs["finished"].all()
    assert jobs.loc["small", "first_start_s"] >= jobs.loc["wide", "first_start_s"]
