"""Runtime feedback is shared: a configuration a job held and made no progress on rates 0
for every policy (``JobView.stalled_on``, applied by ``View.rate``).

Before, only apportion's formulations dropped such a cell; a baseline whose rates said a
configuration was fine kept a job there for the rest of the replay (Sia left 9 jobs of
Philly day 1 unfinished that way), which is the same observation used by one policy only.
"""

from __future__ import annotations

import pytest
from apportion.experiments import traces as tr
from apportion.experiments.groundtruth import AnalyticTruth
from apportion.policies import make_policy
from apportion.experiments.simulator import SimConfig, Simulator
from test_sim_properties import FAST, small_cluster

from apportion.view import JobView, View


class _Lying:
    """Rates that promise A40s are twice as fast as A100s; the truth cannot run on A40."""

    name = "lying"

    def __init__(self, truth: AnalyticTruth) -> None:
        self.truth = truth

    def rate(self, js, gpu_type, gpus, placement=None, plan=None, **kw) -> float:
        best = self.truth.rate(js.trace, "A100-40GB", gpus)
        return 2 * best if gpu_type == "A40" else best


class _NoA40(AnalyticTruth):
    def rate(self, job, gpu_type, gpus, *a, **kw) -> float:  # type: ignore[override]
        return 0.0 if gpu_type == "A40" else super().rate(job, gpu_type, gpus, *a, **kw)


@pytest.mark.parametrize("policy", [p for p in FAST if p not in ("morphling",)] + ["apportion"])
def test_every_policy_leaves_a_configuration_that_made_no_progress(policy: str) -> None:
    cl = small_cluster()
    jobs = [tr.SimJob(f"j{i}", 0.0, 2, 400.0, "bert-0.76b", model="bert-0.76b", batch=256)
            for i in range(2)]
    truth = _NoA40(cl)
    sim = Simulator(cl, tr.Trace("stall", jobs), make_policy(policy), truth,
                    SimConfig(information="oracle", stall_rounds=20))
    sim.view = _Lying(truth)
    res = sim.run()
    assert res.summary["finished"] == 2, (policy, res.jobs)


def test_view_rate_is_zero_where_the_job_stalled() -> None:
    cl = small_cluster()
    job = tr.SimJob("j", 0.0, 2, 400.0, "bert-0.76b", model="bert-0.76b", batch=256)
    truth = AnalyticTruth(cl)
    from apportion.experiments.simulator import _spec

    js = JobView(_spec(job), trace=job)
    view = View(0.0, cl, [js], _Lying(truth), needs_catalog=False)
    assert view.rate(js, "A40", 2) > 0
    js.stalled_on.add(("A40", 2))
    assert view.rate(js, "A40", 2) == 0.0
    assert view.rate(js, "A40", 1) > 0 and view.rate(js, "A100-40GB", 2) > 0
