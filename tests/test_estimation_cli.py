"""`apportion estimate` and `apportion bench estimate`: output and exit-2 input errors."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from apportion.cli import app

runner = CliRunner()


def test_estimate_prints_every_estimator_and_the_tuned_plan(tmp_path):
    out = tmp_path / "e.json"
    r = runner.invoke(app, ["estimate", "--job", "bert-1.3b:128", "--cell", "A40:8:2",
                            "--json", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    assert set(data["estimates"]) == {"crius", "analytic", "morphling"}
    crius = data["estimates"]["crius"]
    assert crius["plan"]["pp"] == 2 and crius["iter_time_s"] > 0
    assert data["tuned"]["pruned_space"] <= data["tuned"]["full_space"]


def test_bad_inputs_exit_2_and_write_nothing(tmp_path):
    out = tmp_path / "e.json"
    for args in (["estimate", "--job", "nope", "--cell", "A40:8"],
                 ["estimate", "--job", "bert-1.3b:x", "--cell", "A40:8"],
                 ["estimate", "--job", "bert-1.3b", "--cell", "Z99:8"],
                 ["estimate", "--job", "bert-1.3b", "--cell", "A40:999"],
                 ["bench", "estimate", "--against", "nobody"],
                 ["profile", "bert-1.3b", "--backend", "torch"]):
        r = runner.invoke(app, args + ["--json", str(out)])
        assert r.exit_code == 2, (args, r.output)
        assert not out.exists()


def test_bench_estimate_errors_writes_the_full_error_tables(tmp_path, monkeypatch):
    from apportion.experiments.bench import estimate as est

    fake = {"against": "morphling", "targets": {}, "protocols": {"paper": {
        "overall": {"n": 1, "mean_error": 0.05, "max_error": 0.05},
        "tables": {"model_family": [{"model": "vit", "family": "DP", "n": 1,
                                     "mean_error": 0.05, "median_error": 0.05,
                                     "max_error": 0.05}],
                   "family_kind": [], "gpus_kind": [], "model_kind": []},
        "worst": [], "worst_by_model": {}, "excluded": []}}}
    calls = []
    monkeypatch.setattr(est, "run", lambda against: calls.append(against) or fake)
    out = tmp_path / "errors.md"
    r = runner.invoke(app, ["bench", "estimate", "--against", "morphling", "--errors", str(out)])
    assert r.exit_code == 0, r.output
    assert calls == ["morphling"]
    text = out.read_text()
    assert text == est.errors_markdown(fake) and "## Protocol `paper`" in text
    # the tables are Morphling's: another benchmark is refused before any work
    r = runner.invoke(app, ["bench", "estimate", "--against", "crius", "--errors", str(out)])
    assert r.exit_code == 2 and "--errors" in r.stderr and calls == ["morphling"]
