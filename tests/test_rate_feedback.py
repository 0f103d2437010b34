"""Every policy's rates in a replay are corrected by the throughput measured at runtime.

Between two rounds in which a job held the same allocation without a restart, its progress
is its measured rate there; where the rate source is off by more than the dead band, the
view's rate for that GPU type and count is corrected for every policy
(``measured_rates.RateFeedback``, ``JobView.rate_factor``, ``View.rate``). A job promised
to run fast on a type where it really crawls is moved off it — by apportion and by a
baseline alike; with rates that are the truth (oracle) nothing is corrected.
"""

from __future__ import annotations

from typing import Any

import pytest
from apportion.experiments import traces as tr
from apportion.experiments.groundtruth import AnalyticTruth
from apportion.policies import make_policy
from apportion.experiments.simulator import SimConfig, Simulator
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sim_properties import small_cluster

from apportion.decision import Allocation
from apportion.jobs import JobSpec
from apportion.plans import ExecutionPlan
from apportion.measured_rates import RateFeedback
from apportion.view import JobView, View


class _SlowA40(AnalyticTruth):
    """The truth: on A40 a job runs at a quarter of its A100 rate."""

    def rate(self, job, gpu_type, gpus, *a, **kw) -> float:  # type: ignore[override]
        if gpu_type == "A40":
            return 0.25 * super().rate(job, "A100-40GB", gpus, *a, **kw)
        return super().rate(job, gpu_type, gpus, *a, **kw)


class _Promising:
    """Rates that promise A40s are twice as fast as A100s."""

    name = "promising"

    def __init__(self, truth: AnalyticTruth) -> None:
        self.truth = truth

    def rate(self, js, gpu_type, gpus, placement=None, plan=None, **kw) -> float:
        best = AnalyticTruth.rate(self.truth, js.trace, "A100-40GB", gpus)
        return 2 * best if gpu_type == "A40" else best


def _replay(view: Any, truth: AnalyticTruth, information: str = "oracle",
            policy_name: str = "apportion", feedback: bool = True
            ) -> tuple[Any, list[dict[str, str]], Any]:
    cl = small_cluster()
    job = tr.SimJob("j", 0.0, 2, 3 * 3600.0, "bert-0.76b", model="bert-0.76b", batch=256)
    policy = make_policy(policy_name)
    types: list[dict[str, str]] = []

    class Logged(Simulator):
        def _apply(self, decision: Any, active: Any, states: Any, now: float) -> Any:
            types.append({a.job: a.gpu_type for a in decision.allocations})
            return super()._apply(decision, active, states, now)

    sim = Logged(cl, tr.Trace("feedback", [job]), policy, truth,
                 SimConfig(information=information, rate_feedback=feedback))
    if view is not None:
        sim.view = view
    return sim.run(), types, policy


def test_a_job_promised_a_fast_type_where_it_crawls_is_moved_off_it() -> None:
    truth = _SlowA40(small_cluster())
    res, types, policy = _replay(_Promising(truth), truth)
    assert res.summary["finished"] == 1
    held = [t["j"] for t in types if "j" in t]
    assert held[0] == "A40"  # the promise is believed first
    assert held[-1] == "A100-40GB"  # the measurement moves it
    moved = held.index("A100-40GB")
    # each A40 shape it tries is measured within two rounds (a correction is per GPU type
    # and count: the source may be off on one count and right on another); once on A100
    # it stays there
    assert moved <= 6, held
    assert set(held[moved:]) == {"A100-40GB"}, held
    factors = policy._view_rate.factors["j"]
    assert factors and all(t == "A40" and f == pytest.approx(0.125) for (t, _), f in
                           factors.items())


def test_rates_that_are_the_truth_are_not_corrected() -> None:
    truth = _SlowA40(small_cluster())
    res, types, policy = _replay(None, truth)  # oracle: the view is the truth
    assert res.summary["finished"] == 1
    assert all(t.get("j", "A100-40GB") == "A100-40GB" for t in types)
    assert policy._view_rate.factors == {}


@pytest.mark.parametrize("name", ["sia", "crius-greedy"])
def test_a_baseline_gets_the_same_correction(name: str) -> None:
    """The feedback is in the view, not in apportion: a baseline that re-decides placements
    moves off the crawling type too, and without the feedback it stays there."""
    truth = _SlowA40(small_cluster())
    res, types, _ = _replay(_Promising(truth), truth, policy_name=name)
    held = [t["j"] for t in types if "j" in t]
    assert res.summary["finished"] == 1
    assert held[0] == "A40" and held[-1] == "A100-40GB", held
    res, types, _ = _replay(_Promising(truth), truth, policy_name=name, feedback=False)
    assert {t["j"] for t in types if "j" in t} == {"A40"}


class _Const:
    name = "const"

    def __init__(self, value: float) -> None:
        self.value = value

    def rate(self, js, gpu_type, gpus, placement=None, plan=None, **kw) -> float:
        return self.value


@settings(max_examples=60, deadline=None)
@given(source=st.floats(0.01, 10.0), measured=st.floats(0.0, 20.0),
       dt=st.floats(1.0, 900.0), restarted=st.booleans(), moved=st.booleans())
def test_a_clean_window_measures_the_rate(source: float, measured: float, dt: float,
                                          restarted: bool, moved: bool) -> None:
    """Factor = measured / source when the window is at least a minute, on one allocation,
    without a restart, with progress, and outside the dead band; otherwise none. The view's
    rate is the source's times the factor on that type and count only."""
    cl = small_cluster()
    spec = JobSpec("j", "bert-336m", 64, 10**6, 2)
    alloc = Allocation("j", "A40", 2, 1, ExecutionPlan(dp=2), {"a40-0": 2}, 1.0)
    js = JobView(spec, alloc=alloc, done=100.0)
    fb = RateFeedback()
    rates = _Const(source)
    assert fb.observe(View(0.0, cl, [js], rates, needs_catalog=False)) == []
    js.done = 100.0 + measured * dt
    if restarted:
        js.restarts += 1
    if moved:
        js.alloc = Allocation("j", "A40", 2, 1, ExecutionPlan(dp=2), {"a40-1": 2}, 1.0)
    view = View(dt, cl, [js], rates, needs_catalog=False)
    changed = fb.observe(view)
    measured = (js.done - 100.0) / dt  # what the progress says (a tiny rate rounds to none)
    f = measured / source
    expect = (dt >= 60.0 and not restarted and not moved and measured > 0
              and not 1 / RateFeedback.deadband <= f <= RateFeedback.deadband)
    assert changed == ([("j", "A40", 2)] if expect else [])
    if expect:
        assert view.rate(js, "A40", 2) == pytest.approx(round(f, 3) * source)
    else:
        assert view.rate(js, "A40", 2) == pytest.approx(source)
    assert view.rate(js, "A40", 1) == pytest.approx(source)
    assert view.rate(js, "A100-40GB", 2) == pytest.approx(source)
