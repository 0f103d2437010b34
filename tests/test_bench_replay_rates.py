"""`apportion bench rates`: the estimated mode's rates against the truth, per estimator,
on held-out cells only (the profiled points are measurements, the same for every
estimator)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from apportion.experiments.bench import replay_rates as rr
from typer.testing import CliRunner

from apportion.cli import app

runner = CliRunner()
ALL = ["analytic", "crius", "morphling", "tables"]


def test_offered_counts_are_powers_of_two_and_the_request() -> None:
    assert rr.offered_counts(320, 16) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert rr.offered_counts(64, 5) == [1, 2, 4, 5, 8, 16, 32, 64]
    assert rr.offered_counts(8, 16) == [1, 2, 4, 8]  # a request beyond the type is not offered
    assert [g for g in range(1, 20) if rr.is_near(g, 8)] == [4, 16]
    assert [g for g in range(1, 20) if rr.is_near(g, 5)] == [10]


def test_rank_correlation_matches_scipys() -> None:
    from apportion.experiments.bench.accuracy import spearman

    cases = [([1, 2, 3, 4], [1, 3, 2, 4]), ([0, 0, 5, 2.2, 3, 8], [3, 0, 0, 2, 4, 8]),
             ([1, 1, 1], [1, 2, 3]), ([2, 1, 2, 1, 0], [5, 4, 5, 3, 3])]
    for a, b in cases:
        mine, ref = rr.spearman(a, b), spearman(a, b)
        assert (math.isnan(mine) and math.isnan(ref)) or math.isclose(mine, ref), (a, b)


def _cell(truth: float, pred: float, gpus: int, job: str = "a", ref: float = 1.0,
          ref_pred: float = 1.0) -> dict:
    return {"seed": 0, "job": job, "model": "m", "batch": 1, "request": 1, "gpu_type": "T",
            "gpus": gpus, "truth": truth, "interpolated": False, "ref_type": "T", "ref_truth": ref,
            "pred": {"e": pred}, "ref_pred": {"e": ref_pred}}


def test_scores_count_runnability_apart_and_read_speed_as_a_ratio() -> None:
    cells = [_cell(2.0, 2.2, 2), _cell(4.0, 3.0, 4), _cell(8.0, 8.0, 8)]
    assert rr.score(cells, "e")["rank"] == {"rho": 1.0, "jobs": 1}  # 2.2 < 3 < 8: 2 < 4 < 8
    cells += [_cell(0.0, 5.0, 16), _cell(3.0, 0.0, 32), _cell(0.0, 0.0, 64)]
    s = rr.score(cells, "e")
    assert s["cells"] == 3 and s["false_runnable"] == 1 and s["missed"] == 1
    assert s["both_zero"] == 1
    assert math.isclose(s["rate"]["mean"], (0.1 + 0.25 + 0.0) / 3)
    assert math.isclose(s["rate"]["within"], 2 / 3)  # 10 % off is within 10 %
    # the rank reads every cell, an unrunnable one as 0: calling 16 GPUs runnable (and
    # fastest but one) and 32 not costs rank
    assert s["rank"]["jobs"] == 1 and s["rank"]["rho"] < 0.9
    # a reference predicted 2x too fast halves every relative speed: 50 % off, whatever
    # the rate's own error
    s2 = rr.score([_cell(2.0, 4.0, 2, ref_pred=2.0)], "e")
    assert math.isclose(s2["rate"]["median"], 1.0) and math.isclose(s2["speed"]["median"], 0.0)


def _jobs(st: rr._Setting, n: int) -> list:
    from apportion.experiments.simulator import JobState, _spec

    return [JobState(_spec(j), trace=j) for j in st.trace.jobs[:n]]


@pytest.mark.parametrize("spec", ["crius-pai", "gavel-max-min-fairness"])
def test_profiled_points_are_the_measurement_for_every_estimator(shared_data: Path,
                                                                  spec: str) -> None:
    """At a profiled point every estimator answers the measurement itself: the truth at
    profile noise 0, one and the same noisy figure at sigma 0.1. So the benchmark leaves
    those points out, and only ever scores the cells an estimator predicts."""
    from apportion.experiments.information import rate_source

    st = rr.load_setting(spec, 0, max_jobs=6)
    oracle = rate_source("oracle", st.truth, st.cluster, 0, noise=0.0)
    caps = st.cluster.capacity_by_type()
    exact = {e: rate_source("estimated", st.truth, st.cluster, 0, estimator=e,
                            profile_noise=0.0) for e in ALL}
    noisy = {e: rate_source("estimated", st.truth, st.cluster, 0, estimator=e) for e in ALL}
    for js in _jobs(st, 6):
        for t in sorted(caps):
            pts = exact["tables"].points(js, t)
            assert 1 in pts and (js.spec.requested_gpus in pts) == \
                (js.spec.requested_gpus <= caps[t])
            for g in pts:
                truth = oracle.rate(js, t, g)
                assert {v.rate(js, t, g) for v in exact.values()} == {truth}
                assert len({v.rate(js, t, g) for v in noisy.values()}) == 1
            counts = rr.offered_counts(caps[t], js.spec.requested_gpus)
            assert set(rr.held_out(exact["tables"], js, t, counts)) == set(counts) - set(pts)
    # the scored cells are the held-out ones only (analytic and tables: the cheap two)
    cells = rr.score_setting(st, 0, ["analytic", "tables"], 0.0)
    assert cells
    by_job = {js.id: js for js in _jobs(st, 6)}
    for c in cells:
        assert c["gpus"] not in exact["tables"].points(by_job[c["job"]], c["gpu_type"])


def test_tables_at_zero_noise_is_exact_at_the_request_and_one_gpu(shared_data: Path) -> None:
    from apportion.experiments.information import rate_source

    st = rr.load_setting("crius-venus", 0, max_jobs=8)
    oracle = rate_source("oracle", st.truth, st.cluster, 0, noise=0.0)
    view = rate_source("estimated", st.truth, st.cluster, 0, estimator="tables",
                       profile_noise=0.0)
    for js in _jobs(st, 8):
        for t in st.cluster.gpu_types:
            for g in (1, js.spec.requested_gpus):
                assert view.rate(js, t, g) == oracle.rate(js, t, g)


def test_cli_scores_a_small_trace_and_repeats_exactly(shared_data: Path, tmp_path: Path) -> None:
    args = ["bench", "rates", "--trace", "gavel-max-min-fairness", "--max-jobs", "5",
            "--seeds", "2"]
    r = runner.invoke(app, [*args, "--json", str(tmp_path / "a.json")])
    assert r.exit_code == 0, r.output
    for e in ALL:
        assert f"| gavel-max-min-fairness | {e} |" in r.stdout
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("|")]
    assert len(rows) == 3 * (2 + len(ALL))  # three tables, each unwrapped
    assert all(ln.endswith("|") for ln in rows)
    res = json.loads((tmp_path / "a.json").read_text())
    (row,) = res["traces"]
    assert row["jobs"] == 10 and row["seeds"] == 2 and set(row["estimators"]) == set(ALL)
    s = row["estimators"]["tables"]
    assert s["cells"] > 0 and 0.0 <= s["rate"]["within"] <= 1.0
    assert -1.0 <= s["rank"]["rho"] <= 1.0
    # Gavel's job types are outside the catalog: the three model-based estimators fall back
    # on one curve and agree cell for cell
    assert row["models_outside_catalog"]
    assert row["estimators"]["analytic"]["rate"] == row["estimators"]["crius"]["rate"]
    r2 = runner.invoke(app, [*args, "--json", str(tmp_path / "b.json")])
    assert r2.exit_code == 0, r2.output
    assert (tmp_path / "a.json").read_text() == (tmp_path / "b.json").read_text()


def test_cli_catalog_models_with_a_disk_cache(shared_data: Path, tmp_path: Path) -> None:
    args = ["bench", "rates", "--trace", "crius-pai", "--max-jobs", "3", "--seeds", "1",
            "--estimator", "analytic", "--estimator", "tables", "--cache", str(tmp_path / "c"),
            "--json", "-"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    first = json.loads(r.stdout)
    assert list(first["traces"][0]["estimators"]) == ["analytic", "tables"]
    assert list((tmp_path / "c").glob("replay-rates-analytic-*.json"))
    r2 = runner.invoke(app, args)  # read back from the cache: the same figures
    assert r2.exit_code == 0 and json.loads(r2.stdout) == first


@pytest.mark.parametrize("flag,value", [
    ("--seeds", "0"), ("--seeds", "1000"), ("--max-jobs", "0"), ("--estimator", "nope"),
    ("--trace", "no-such-trace"), ("--trace", "philly-d15"), ("--profile-noise", "-0.1"),
    ("--profile-noise", "nan"), ("--cluster", "no-such-cluster"),
])
def test_bad_flags_exit_2_naming_the_flag(flag: str, value: str) -> None:
    r = runner.invoke(app, ["bench", "rates", "--trace", "gavel-max-min-fairness", flag, value])
    assert r.exit_code == 2, r.output
    assert flag in r.stderr, r.stderr


def test_a_bad_output_is_refused_before_any_work(tmp_path: Path) -> None:
    r = runner.invoke(app, ["bench", "rates", "--json", str(tmp_path)])  # a folder
    assert r.exit_code == 2 and "--json" in r.stderr, r.output
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = runner.invoke(app, ["bench", "rates", "--cache", str(blocker)])  # a file
    assert r.exit_code == 2 and "--cache" in r.stderr, r.output
