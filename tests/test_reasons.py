"""A waiting job's reason says what is wrong, through the round's doors: a job the tables
have no measurement for is ``no-estimate`` (it was ``no-fit-memory``), and a plans job no
node's CPUs or host memory can hold is ``no-fit-host`` naming both (it was ``no-capacity
... went to higher-value jobs``, on a cluster with its GPUs free)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from apportion.cli import app
from apportion.decision import UNRESOLVABLE, Reason
from apportion.jobs import JobSpec
from apportion.policies import RoundConfig, run_round
from apportion.runtime.executors.local.executor import local_cluster

runner = CliRunner()


def test_a_job_without_a_measurement_is_no_estimate(tmp_path: Path) -> None:
    (tmp_path / "m.csv").write_text("model,gpu_type,gpus,iter_time_s,global_batch_size\n"
                                    "bert-1.3b,A40,4,1.9,256\nbert-1.3b,A40,8,1.05,256\n")
    out = tmp_path / "d.json"
    r = runner.invoke(app, ["solve-round", "--estimator", "tables", "--tables",
                            str(tmp_path / "m.csv"), "--json", str(out), "--no-isolate",
                            "--time-budget", "3"])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    assert d["allocations"] and d["pending"]
    for p in d["pending"]:
        assert p["reason"] == "no-estimate" and "no measured iteration time" in p["detail"], p


def test_a_plans_job_no_node_can_host_says_so() -> None:
    cl = local_cluster(2)  # 2 CPUs: less than the plans' 4 CPUs per GPU
    d = run_round(cl, [JobSpec("j", "gpt-tiny", 8, 10, 1)], 0.0,
                  RoundConfig(formulation="plans", time_budget_s=3, isolate=False)).decision
    (p,) = d.pending
    assert p.reason is Reason.NO_FIT_HOST and "CPUs" in p.detail and "2 CPUs" in p.detail
    assert p.reason in UNRESOLVABLE and p.can_ever_fit is False
