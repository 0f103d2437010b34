"""A round runs with one BLAS thread, and gives the process's threads back when it ends.

OpenBLAS's threads spin between a round's short dot products on the cores the solver needs
(apportion/blas_threads.py: 0.77x a replay's CPU with one). The limit must hold inside every
round and must not outlive it: ``apportion run`` starts training workers, and a library
user's own numpy work keeps the threads it had."""

from __future__ import annotations

from typing import Any

import numpy as np
from threadpoolctl import threadpool_info

from apportion.cluster import Cluster, NodeGroup
from apportion.decision import Decision
from apportion.estimation.models.analytic import AnalyticEstimator
from apportion.estimation.rates import EstimatorRates
from apportion.jobs import JobSpec
from apportion.policies import make_policy
from apportion.round import run_pipeline
from apportion.view import View, view_of

CL = Cluster("c", [NodeGroup("a", 2, "A100-40GB", 4)])


def _blas_threads() -> list[int]:
    return [d["num_threads"] for d in threadpool_info() if d["user_api"] == "blas"]


class _Recording:
    """A baseline policy that notes the BLAS threads it ran with."""

    name = "recording"

    def __init__(self) -> None:
        self.inner = make_policy("fcfs")
        self.seen: list[int] = []

    def decide(self, view: View) -> Decision:
        self.seen = _blas_threads()
        return self.inner.decide(view)


def test_a_round_runs_with_one_blas_thread_and_restores_the_processs() -> None:
    np.dot(np.ones(4), np.ones(4))  # numpy's BLAS loaded
    before = _blas_threads()
    assert before, "numpy's BLAS is not visible to threadpoolctl"
    jobs = [JobSpec(f"j{i}", "bert-336m", 64, 1000, 1 + i % 2) for i in range(3)]
    pol: Any = _Recording()
    result = run_pipeline(view_of(CL, jobs, 0.0, EstimatorRates(AnalyticEstimator(), CL)), pol)
    assert result.decision.allocations
    assert pol.seen and set(pol.seen) == {1}
    assert _blas_threads() == before
