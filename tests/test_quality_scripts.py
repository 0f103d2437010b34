"""The quality tables' scripts (experiments/results/quality/): the row list replays every
row with policies the registry knows, and the tables fill each baseline's bound ratio from
the run's bound without inventing one where none was measured."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pandas as pd
import pytest

from apportion.policies import policy_names

QUALITY = Path(__file__).resolve().parents[1] / "experiments" / "results" / "quality"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"quality_{name}", QUALITY / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_rows_name_registered_policies_and_every_row(tmp_path, capsys):
    rows = _load("rows")
    assert rows.main(["--dry-run", "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(rows.ROWS)
    known = set(policy_names())
    for line in lines:
        pol = line.split("--policies ")[1].split()[0].split(",")
        assert set(pol) <= known, set(pol) - known
    # a subset keeps only the policies each row ranks; a written row is skipped
    (tmp_path / "crius-pai-oracle").mkdir()
    (tmp_path / "crius-pai-oracle" / "summary.csv").write_text("policy\n")
    assert rows.main(["--dry-run", "--out", str(tmp_path), "--policies", "apportion-plans"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and all("--policies apportion-plans " in s for s in lines)
    assert not any("crius-pai-oracle" in s for s in lines)
    assert rows.main(["--rows", "no-such-row", "--dry-run"]) == 2


@pytest.mark.parametrize("seeds,ci,filled", [(3, 0.01, True), (1, 0.0, False), (3, 0.0, True)])
def test_bound_filled_from_the_run(seeds, ci, filled):
    summarise = _load("summarise")
    df = pd.DataFrame({
        "policy": ["apportion", "sia"], "seeds": [3, seeds], "avg_jct_s": [200.0, 300.0],
        "avg_jct_s_ci95": [1.0, ci], "avg_jct_lower_bound_s": [100.0, float("nan")],
        "avg_jct_to_bound": [2.0, float("nan")]})
    if seeds == 3 and ci == 0.0:
        df.loc[0, "seeds"] = 1  # a 1-seed row's bound serves seeds that repeat one replay
    got = summarise._fill_bound(df)
    assert bool(got[1]) is filled and not got[0]
    if filled:
        assert df.loc[1, "avg_jct_to_bound"] == pytest.approx(3.0)
    else:
        assert pd.isna(df.loc[1, "avg_jct_to_bound"])


@pytest.mark.parametrize("ratios", [[0.94, 0.9], [None, None]])
def test_deadline_rows_show_the_share_met(tmp_path, ratios):
    """A row whose jobs carry deadlines shows ElasticFlow's deadline satisfactory ratio
    beside the JCTs; a row without deadlines has no such column."""
    summarise = _load("summarise")
    run = tmp_path / "elasticflow-philly-oracle"
    run.mkdir()
    pd.DataFrame({
        "policy": ["elasticflow", "apportion"], "seeds": [1, 1], "jobs": [100, 100],
        "finished": [94, 100], "avg_jct_s": [4e4, 3.8e4], "avg_jct_s_ci95": [0.0, 0.0],
        "p99_jct_s": [3e5, 2e5], "p99_jct_s_ci95": [0.0, 0.0], "avg_queue_s": [10.0, 10.0],
        "avg_restarts": [0.0, 0.0], "avg_jct_all_s": [8e4, 3.8e4],
        "deadline_ratio": ratios}).to_csv(run / "summary.csv", index=False)
    (run / "summary.md").write_text("information: oracle\n")
    md, rows = summarise.table(run)
    if ratios[0] is None:
        assert "deadlines met" not in md and "deadline_ratio" not in rows[0]
    else:
        assert "deadlines met |" in md and "| 0.940 |" in md
        assert {r["policy"]: r["deadline_ratio"] for r in rows} == {"elasticflow": 0.94,
                                                                   "apportion": 0.9}


def test_no_bound_filled_where_jobs_were_left_unfinished():
    """A policy that left jobs unfinished is compared with the bound counting them until its
    own replay's end: another policy's bound (every job to its finish) is not its yardstick."""
    summarise = _load("summarise")
    df = pd.DataFrame({
        "policy": ["apportion", "elasticflow"], "seeds": [1, 1], "jobs": [100, 100],
        "finished": [100, 94], "avg_jct_s": [200.0, 150.0], "avg_jct_s_ci95": [0.0, 0.0],
        "avg_jct_lower_bound_s": [100.0, float("nan")],
        "avg_jct_to_bound": [2.0, float("nan")]})
    got = summarise._fill_bound(df)
    assert not got.any() and pd.isna(df.loc[1, "avg_jct_to_bound"])


def test_rebound_writes_the_bound_where_every_job_finished(tmp_path, monkeypatch):
    """rebound.py puts the bound computed again into a run's summary: the ratio of the mean
    JCT over the seeds' mean bound for a policy that finished every job, n/a for one that
    did not (its replay's end, which its bound needs, is not kept), shown ≈."""
    rebound = _load("rebound")
    summarise = _load("summarise")
    run = tmp_path / "gavel-mmf-oracle"
    run.mkdir()
    pd.DataFrame({"policy": ["apportion", "elasticflow"], "seeds": [2, 2], "jobs": [96, 96],
                  "finished": [96, 95], "avg_jct_s": [300.0, 200.0],
                  "avg_jct_all_s": [300.0, 400.0], "avg_jct_lower_bound_s": [50.0, 50.0],
                  "avg_jct_to_bound": [6.0, 8.0], "avg_jct_to_bound_ci95": [0.1, 0.1]}
                 ).to_csv(run / "summary.csv", index=False)
    monkeypatch.setattr(rebound, "row_bounds", lambda name, seeds: [100.0, 140.0][:seeds])
    df = rebound.rebound(run)
    assert df["avg_jct_lower_bound_s"].tolist() == [120.0, 120.0]
    assert df.loc[0, "avg_jct_to_bound"] == pytest.approx(2.5)
    assert pd.isna(df.loc[1, "avg_jct_to_bound"]) and pd.isna(df.loc[1, "avg_jct_all_lower_bound_s"])
    assert df["avg_jct_to_bound_ci95"].isna().all()
    back = pd.read_csv(run / "summary.csv")
    assert summarise._fill_bound(back).all()  # shown ≈
