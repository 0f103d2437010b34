"""Gavel's round mechanism, pinned on a four-job replay (no wall clock, a few seconds).

What Gavel's ``scheduler.py`` does and ``apportion.policies.gavel`` reproduces:
the allocation is recomputed at a reset, and a reset waits for
``minimum_time_between_allocation_resets`` (1,920 s) after the last one unless
that one was at time 0; a job that arrives between resets is outside the
allocation and does not run until the next reset, even with GPUs idle.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from apportion.experiments import traces as tr
from apportion.experiments.groundtruth import GavelTruth, NoisyView
from apportion.experiments.harness import gavel_cluster
from apportion.experiments.simulator import PROFILES, JobState, Simulator, _spec

from apportion.formulations.gavel import equal_share, max_min_value
from apportion.policies.gavel import GAVEL_RESET_INTERVAL_S, MaxMinFairness
from apportion.view import View

pytestmark = pytest.mark.skipif(not tr.data_root().exists(), reason="shared data not present")

V100 = "V100-32GB"


def _job(i: int, submit_s: float) -> tr.SimJob:
    # one GPU, long enough to run through the whole test (Gavel's LM, batch 80, on V100
    # does about 4 steps/s): nobody finishes, so only arrivals change the job set
    return tr.SimJob(f"j{i}", submit_s, 1, 1e6, "LM (batch size 80)", batch=80)


def _replay(reset_interval_s: float) -> dict[str, float]:
    """Four 1-GPU jobs on four V100s: three at 0 and 300 s, the fourth at 500 s. Returns
    each job's first start."""
    jobs = [_job(0, 0.0), _job(1, 0.0), _job(2, 300.0), _job(3, 500.0)]
    cfg = replace(PROFILES["gavel"], information="oracle", jct_bound=False,
                  max_sim_s=3000.0, stall_rounds=50)
    pol = MaxMinFairness(reset_interval_s=reset_interval_s)
    res = Simulator(gavel_cluster(4, 0, 0), tr.Trace("mech", jobs), pol, GavelTruth(),
                    cfg).run()
    return dict(zip(res.jobs["job_id"], res.jobs["first_start_s"]))


def test_an_arrival_waits_for_the_next_reset() -> None:
    # rounds every 360 s. t=0: j0, j1 (a reset at time 0). t=360: j2 arrived; the last
    # reset was at time 0, so Gavel resets at once (its ``_last_reset_time == 0`` test).
    # t=720: j3 arrived, 360 s after the last reset: no reset, j3 has no allocation and
    # waits although a V100 is idle; the first boundary 1,920 s after 360 s is 2,520 s
    start = _replay(GAVEL_RESET_INTERVAL_S)
    assert start["j0"] == 0.0 and start["j1"] == 0.0
    assert start["j2"] == 360.0
    assert start["j3"] == 2520.0


def test_without_the_interval_an_arrival_runs_at_the_next_round() -> None:
    # the same replay with resets allowed every round: j3 starts at the first boundary
    start = _replay(0.0)
    assert start["j3"] == 720.0


def test_a_reset_is_not_due_before_the_interval() -> None:
    pol = MaxMinFairness()
    cl = gavel_cluster(4, 0, 0)
    truth = NoisyView(GavelTruth())
    states = [JobState(_spec(j), trace=j) for j in (_job(0, 0.0), _job(1, 0.0))]

    def decide(now: float, jobs: list[JobState]) -> None:
        pol.decide(View(now, cl, jobs, truth, interval_s=360.0))

    decide(0.0, states)
    assert pol.last_reset == 0.0 and set(pol.X) == {"j0", "j1"}
    late = JobState(_spec(_job(2, 400.0)), trace=_job(2, 400.0))
    decide(400.0, [*states, late])  # last reset at 0: reset now
    assert pol.last_reset == 400.0 and "j2" in pol.X
    newer = JobState(_spec(_job(3, 500.0)), trace=_job(3, 500.0))
    decide(400.0 + GAVEL_RESET_INTERVAL_S - 1.0, [*states, late, newer])
    assert pol.last_reset == 400.0 and "j3" not in pol.X  # not due: no reset
    decide(400.0 + GAVEL_RESET_INTERVAL_S, [*states, late, newer])
    assert pol.last_reset == 400.0 + GAVEL_RESET_INTERVAL_S and "j3" in pol.X


def test_max_min_normalises_by_the_equal_share() -> None:
    # the policy's LP objective is Gavel's: throughput over the equal (proportional) share
    pol = MaxMinFairness()
    cl = gavel_cluster(4, 4, 4)
    jobs = [JobState(_spec(j), trace=j) for j in (
        tr.SimJob("a", 0.0, 1, 1e5, "ResNet-50 (batch size 64)", batch=64),
        tr.SimJob("b", 0.0, 2, 1e5, "LM (batch size 80)", batch=80),
        tr.SimJob("c", 0.0, 1, 1e5, "Transformer (batch size 128)", batch=128))]
    view = View(0.0, cl, jobs, NoisyView(GavelTruth()), interval_s=360.0)
    pol.decide(view)
    types = [t for t in (V100, "P100", "K80")]
    T = np.array([[view.rate(js, t, js.spec.requested_gpus) for t in types] for js in jobs])
    sf = np.array([1.0, 2.0, 1.0])
    X = np.array([[pol.X[js.id][t] for t in types] for js in jobs])
    x_eq = equal_share(np.array([4.0, 4.0, 4.0]), 3)
    assert np.allclose(x_eq, 1.0 / 3.0)
    value = max_min_value(T, sf, np.ones(3), x_eq, X)
    assert pol.lp_value is not None and pol.lp_value(X) == pytest.approx(value, rel=1e-9)
    # every job reaches at least its equal share's normalised throughput times sf
    assert value >= 1.0 - 1e-5
