"""Every registered estimator through ``solve-round``, both formulations: every cell the
round places carries an estimate (a positive, finite iteration time and throughput; none
null), and the decision names the estimator each job's estimate came from.

The estimators come from the registry (what ``--estimator`` accepts), so a new one is
checked at the door it is chosen at, not only through the library."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from apportion.cli import app
from apportion.estimation.registry import ESTIMATORS

runner = CliRunner()

JOBS = ("now_s: 100\njobs:\n"
        "  - {id: a, model: bert-0.76b, global_batch_size: 128, iterations: 1000,"
        " requested_gpus: 2}\n"
        "  - {id: b, model: wresnet-0.5b, global_batch_size: 256, iterations: 500,"
        " requested_gpus: 4}\n"
        "  - {id: c, model: bert-336m, global_batch_size: 64, iterations: 2000,"
        " requested_gpus: 1}\n")
TABLES = ("model,gpu_type,gpus,iter_time_s\n"
          + "".join(f"{m},{t},{g},{s * 8 / g:.3f}\n"
                    for m, s in (("bert-0.76b", 0.4), ("wresnet-0.5b", 0.6), ("bert-336m", 0.2))
                    for t in ("A100-40GB", "A40", "A10", "V100-32GB") for g in (1, 2, 4, 8)))


@pytest.mark.parametrize("formulation", ["cells", "plans"])
@pytest.mark.parametrize("estimator", list(ESTIMATORS))
def test_every_placed_cell_has_an_estimate(estimator: str, formulation: str,
                                           tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS)
    args = ["solve-round", "--jobs", str(jobs), "--estimator", estimator,
            "--formulation", formulation, "--time-budget", "5", "--deterministic",
            "--json", str(tmp_path / "d.json")]
    if estimator in ("tables", "auto"):
        tables = tmp_path / "tables.csv"
        tables.write_text(TABLES)
        args += ["--tables", str(tables)]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    d = json.loads((tmp_path / "d.json").read_text())
    assert d["allocations"], d["pending"]
    named = d["meta"]["estimator"]
    for a in d["allocations"]:
        for key in ("iter_time_s", "est_throughput"):
            v = a[key]
            assert v is not None and math.isfinite(v) and v > 0, (a["job"], key, v)
        assert a["estimator"].split(":")[0] == estimator, a
        if isinstance(named, dict):
            assert named["per_job"][a["job"]] == a["estimator"]
