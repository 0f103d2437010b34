"""The fair harness: information modes every policy shares, summaries over seeds with CIs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from apportion.cli import app
from apportion.experiments import traces as tr
from apportion.experiments.groundtruth import AnalyticTruth, NoisyView
from apportion.experiments.harness import ci95, write_tables
from apportion.experiments.information import ProfiledRates, rate_source
from apportion.policies import make_policy
from apportion.experiments.simulator import JobState, SimConfig, Simulator, _spec
from test_sim_properties import MODELS, small_cluster

runner = CliRunner()


def _trace(n: int = 8) -> tr.Trace:
    return tr.synthetic(n=n, rate_per_h=10.0, seed=3, sizes={1: 0.4, 2: 0.4, 4: 0.2},
                        models=MODELS, iterations=(50.0, 300.0), gpu_types=["A40", "A100-40GB"])


def _views(truth, cl, **kw):
    return [JobState(_spec(j), trace=j) for j in _trace().jobs], ProfiledRates(truth, cl, **kw)


def test_profiled_points_are_measured_truth_with_seeded_noise() -> None:
    cl = small_cluster()
    truth = AnalyticTruth(cl)
    jobs, pr = _views(truth, cl, sigma=0.1, seed=4)
    _, again = _views(truth, cl, sigma=0.1, seed=4)
    for js in jobs:
        for t in cl.gpu_types:
            for g in pr.points(js, t):
                true = truth.rate(js.trace, t, g)
                seen = pr.rate(js, t, g)
                assert seen == again.rate(js, t, g)  # same seed, same measurement
                if true > 0:
                    assert seen > 0 and abs(math.log(seen / true)) < 0.5  # sigma 0.1: < 5 sigma
                else:
                    assert seen == 0.0
    exact = ProfiledRates(truth, cl, sigma=0.0)
    js = jobs[0]
    t = cl.gpu_types[0]
    assert exact.rate(js, t, 1) == truth.rate(js.trace, t, 1)


@given(st.integers(0, 7), st.sampled_from([1, 2, 3, 4, 6, 8]))
@settings(max_examples=40, deadline=None)
def test_unprofiled_counts_follow_the_scaling_model(i: int, gpus: int) -> None:
    """Between measurements the scaling model speaks: more GPUs never make a job slower than
    the model says, and a count the model cannot run is 0."""
    cl = small_cluster()
    truth = AnalyticTruth(cl)
    jobs, pr = _views(truth, cl, sigma=0.0)
    js = jobs[i % len(jobs)]
    for t in cl.gpu_types:
        r = pr.rate(js, t, gpus)
        model = pr.model_rate(js, t, gpus)
        if gpus > cl.capacity_by_type()[t] or model <= 0:
            assert r == 0.0
        else:
            assert r >= 0.0 and math.isfinite(r)
            if gpus in pr.points(js, t):
                assert r == truth.rate(js.trace, t, gpus)


def test_rate_source_modes() -> None:
    cl = small_cluster()
    truth = AnalyticTruth(cl)
    assert isinstance(rate_source("oracle", truth, cl), NoisyView)
    assert isinstance(rate_source("estimated", truth, cl), ProfiledRates)
    with pytest.raises(ValueError, match="information mode"):
        rate_source("psychic", truth, cl)


@pytest.mark.parametrize("information", ["oracle", "estimated"])
def test_every_policy_sees_the_same_source(information: str) -> None:
    """Within one run the view's rate source is the run's, whichever policy asks."""
    cl = small_cluster()
    seen: dict[str, str] = {}
    for name in ("sia", "apportion"):
        pol = make_policy(name, time_budget_s=1.0) if name == "apportion" else make_policy(name)
        sim = Simulator(cl, _trace(5), pol, AnalyticTruth(cl),
                        SimConfig(seed=2, information=information))
        res = sim.run()
        assert res.summary["information"] == information
        assert res.summary["finished"] == 5
        seen[name] = res.summary["rates"]
    assert len(set(seen.values())) == 1


def test_ci95_and_tables_over_seeds(tmp_path: Path) -> None:
    assert ci95([1.0]) == 0.0
    assert ci95([1.0, 1.0, 1.0]) == 0.0
    assert ci95([1.0, 2.0, 3.0]) == pytest.approx(2.4841, abs=1e-3)  # t(0.975, 2) * 1 / sqrt(3)
    results = [("a", s, {"avg_jct_s": v, "p99_jct_s": 2 * v, "jobs": 3, "finished": 3,
                         "information": "estimated", "estimator": "analytic"})
               for s, v in enumerate([1.0, 2.0, 3.0])]
    mean = write_tables(tmp_path, results)
    row = mean.iloc[0]
    assert row["avg_jct_s"] == 2.0 and row["seeds"] == 3
    assert row["avg_jct_s_ci95"] == pytest.approx(2.4841, abs=1e-3)
    md = (tmp_path / "summary.md").read_text()
    # in hours: 2 s is 0.000556 h, its interval 2.48 s is 0.00069 h
    assert md.startswith("information: estimated") and "0.000556 ± 0.00069" in md
    assert set(pd.read_csv(tmp_path / "summary.csv").columns) >= {"avg_jct_s_ci95", "seeds"}


@pytest.mark.parametrize("argv, flag", [
    (["simulate", "--trace", "philly", "--cluster", "crius-testbed", "--policy", "fcfs",
      "--information", "psychic"], "--information"),
    (["simulate", "--trace", "philly", "--cluster", "crius-testbed", "--policy", "fcfs",
      "--estimator", "crystal-ball"], "--estimator"),
    (["compare", "--trace", "philly", "--cluster", "crius-testbed", "--policies", "fcfs",
      "--information", "psychic"], "--information"),
    (["simulate", "--trace", "philly", "--cluster", "crius-testbed", "--policy", "nope"],
     "--policy"),
    (["solve-round", "--policy", "nope"], "--policy"),
    (["solve-round", "--estimator", "nope"], "--estimator"),
])
def test_bad_new_flags_exit_2_naming_the_flag(argv: list[str], flag: str, tmp_path: Path) -> None:
    r = runner.invoke(app, argv + (["--out", str(tmp_path)] if argv[0] == "compare" else []))
    assert r.exit_code == 2, r.output
    assert flag in (r.output + (r.stderr if r.stderr_bytes is not None else "")), r.output


def test_compare_names_the_mode_and_aggregates_seeds(tmp_path: Path) -> None:
    r = runner.invoke(app, ["compare", "--trace", "synthetic:12", "--cluster", "crius-testbed",
                            "--policies", "fcfs,sia", "--seeds", "2", "--out", str(tmp_path),
                            "--information", "oracle", "--workers", "1"])
    assert r.exit_code == 0, r.output
    root = next(tmp_path.iterdir())
    assert root.name.endswith("-oracle")
    summary = pd.read_csv(root / "summary.csv")
    assert list(summary["seeds"]) == [2, 2]
    assert (root / "summary.md").read_text().startswith("information: oracle")
    for p in ("fcfs", "sia"):
        for s in (0, 1):
            assert json.loads((root / f"{p}-s{s}" / "summary.json").read_text())[
                "information"] == "oracle"
    assert (root / "jct_cdf.png").stat().st_size > 0


def test_estimated_mode_takes_every_estimator_auto_as_its_tables() -> None:
    cl = small_cluster()
    truth = AnalyticTruth(cl)
    jobs, auto = _views(truth, cl, sigma=0.1, seed=4, estimator="auto")
    _, tables = _views(truth, cl, sigma=0.1, seed=4, estimator="tables")
    assert auto.estimator_name == "auto:tables" and auto.scaling is None
    for js in jobs[:3]:
        for t in cl.gpu_types:
            for g in (1, 2, 3, 4):
                assert auto.rate(js, t, g) == tables.rate(js, t, g)
    for name in ("analytic", "crius", "morphling"):
        _, pr = _views(truth, cl, sigma=0.1, seed=4, estimator=name)
        assert pr.scaling is not None and pr.rate(jobs[0], cl.gpu_types[0], 3) >= 0


class _NoOneGpu(ProfiledRates):
    """A scaling model that finds no plan on one GPU (Morphling's, for a large model)."""

    def model_rate(self, js, gpu_type, gpus, placement=None):  # type: ignore[override]
        return 0.0 if gpus == 1 else super().model_rate(js, gpu_type, gpus, placement)


@given(st.integers(0, 7), st.sampled_from([2, 3]))
@settings(max_examples=30, deadline=None)
def test_a_profiled_point_the_model_cannot_run_is_not_the_reference(i: int, gpus: int) -> None:
    """A count between the profiled points is scaled from the nearest point the model runs:
    when the model finds no 1-GPU plan although one GPU was measured running, 2 GPUs are still
    scaled from the request (it used to be called unrunnable)."""
    cl = small_cluster()
    truth = AnalyticTruth(cl)
    jobs = [JobState(_spec(j), trace=j) for j in _trace().jobs]
    pr = _NoOneGpu(truth, cl, sigma=0.0, estimator="analytic")
    js = jobs[i % len(jobs)]
    for t in cl.gpu_types:
        req = int(js.spec.requested_gpus)
        if not (gpus < req <= cl.capacity_by_type()[t]):
            continue
        here, there = pr.model_rate(js, t, gpus), pr.model_rate(js, t, req)
        measured = pr.measured(js, t, req)
        expected = measured * here / there if here > 0 and there > 0 and measured > 0 else 0.0
        assert pr.rate(js, t, gpus) == pytest.approx(expected)
