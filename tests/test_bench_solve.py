"""`apportion bench solve` rows: every backend's answer valid, never worse than the greedy."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from apportion.cli import app
from apportion.experiments.bench.solve import bench_one, synthetic_cluster


def test_bench_rows_are_valid_and_beat_the_greedy() -> None:
    rows = bench_one(40, 128, 3, ["highs", "cp-sat", "chain"], budget_s=10.0, seed=3)
    assert {r.backend for r in rows} == {"highs", "cp-sat", "chain"}
    for r in rows:
        assert r.valid, r
        assert r.objective is not None and r.objective >= r.greedy_objective - 1e-6
        if r.status == "optimal":
            assert r.gap is not None and r.gap <= 1e-3


def test_crius_cluster_shape() -> None:
    c = synthetic_cluster(1280, 4)
    assert c.total_gpus == 1280 and c.capacity_by_type() == {
        "A100-40GB": 320, "A40": 320, "A10": 320, "V100-32GB": 320}


def test_bench_solve_command_writes_contract_rows(tmp_path: Path) -> None:
    out = tmp_path / "b.json"
    r = CliRunner().invoke(app, ["bench", "solve", "--quick", "--backends", "highs",
                                 "--time-budget", "5", "--json", str(out)])
    assert r.exit_code == 0, r.output
    rows = json.loads(out.read_text())
    assert len(rows) == 3
    for row in rows:
        for key in ("jobs", "gpus", "types", "backend", "wall_s", "objective", "bound", "gap",
                    "greedy_objective"):
            assert key in row
    assert CliRunner().invoke(app, ["bench", "solve", "--backends", "gurobi"]).exit_code == 2
