"""apportion schedules every job the view can rate: models the catalog lacks (Gavel's,
ElasticFlow's, the fine-tuning traces', an operator's measured-only model) get candidates
from the rate source — their data-parallel plan, memory as the rate says — in both
information modes and on a real cluster's ``--estimator tables``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from apportion.estimation.rate_estimator import RateEstimator
from apportion.formulations.plans import CalibratedPlans, EstimatedPlans
from typer.testing import CliRunner

from apportion.cli import app
from apportion.cluster import Cluster, NodeGroup
from apportion.decision import Reason
from apportion.jobs import JobSpec
from apportion.models import catalog_model
from apportion.plans import Cell, ExecutionPlan

runner = CliRunner()
CL = Cluster("c", [NodeGroup("a", 2, "A100-40GB", 4), NodeGroup("b", 4, "A10", 2)])
OPTIMISING = ("apportion", "apportion-plans", "apportion-deadline", "crius-greedy")


def rate(job: JobSpec, gpu_type: str, gpus: int) -> float:
    """A measured table: runs on A100s only (0 on A10: does not fit there)."""
    return 2.0 * gpus ** 0.9 if gpu_type == "A100-40GB" else 0.0


def test_a_model_the_catalog_lacks_is_its_rates_dp_plan() -> None:
    job = JobSpec("g", "ResNet-18 (batch size 128)", 128, 100, 2)
    assert catalog_model(job.model) is None
    est = RateEstimator(rate)
    e = est.best_in_cell(job, Cell("g", "A100-40GB", 4, 1), CL)
    assert e is not None and e.feasible
    assert e.plan == ExecutionPlan(dp=4) and e.iter_time_s == pytest.approx(1 / rate(job, "A100-40GB", 4))
    assert e.mem_per_gpu == 0.0  # not known; it ran, so it fits
    assert est.best_in_cell(job, Cell("g", "A100-40GB", 4, 2), CL) is None  # no pipeline measured
    assert est.best_in_cell(job, Cell("g", "A10", 2, 1), CL) is None  # rate 0: does not run
    p = est.predict(job, ExecutionPlan(dp=4), {"a-0": 2, "a-1": 2}, CL)
    assert p.feasible and p.iter_time_s == pytest.approx(e.iter_time_s)
    assert not est.predict(job, ExecutionPlan(dp=2), {"b-0": 2}, CL).feasible
    # the plans formulation: one data-parallel option at the rate, none where it is 0
    opts = CalibratedPlans(EstimatedPlans(), rate).options(job, "A100-40GB", 4, CL)
    assert [(o.plan, o.family) for o in opts] == [(ExecutionPlan(dp=4), "dp")]
    assert CalibratedPlans(EstimatedPlans(), rate).options(job, "A10", 2, CL) == []


@pytest.mark.parametrize("information", ["oracle", "estimated"])
@pytest.mark.parametrize("policy", OPTIMISING)
def test_apportion_replays_gavels_trace(policy: str, information: str, tmp_path: Path,
                                        shared_data: Path) -> None:
    """Gavel's own trace (job types such as ``ResNet-18 (batch size 128)``): exit 1 before."""
    out = tmp_path / "s.json"
    r = runner.invoke(app, ["simulate", "--trace", "gavel-small", "--cluster", "2:2:2",
                            "--policy", policy, "--max-jobs", "4", "--information", information,
                            "--deterministic", "--json", str(out)])
    assert r.exit_code == 0, r.output
    s = json.loads(out.read_text())
    assert s["finished"] == s["jobs"] == 4


@pytest.mark.parametrize("trace,cluster", [("fm-1-roberta-base", "4:0:0"),
                                           ("elasticflow-philly", "A100")])
def test_apportion_replays_finetune_and_elasticflow_traces(trace: str, cluster: str,
                                                           tmp_path: Path,
                                                           shared_data: Path) -> None:
    """``roberta-base@mrpc`` and ``vgg16``: exit 1 before."""
    if cluster == "A100":
        cluster = str(tmp_path / "a100.yaml")
        Path(cluster).write_text("name: a100\nnode_groups:\n  - {prefix: a, count: 2, "
                                 "gpu_type: A100-40GB, gpus_per_node: 8}\n")
    out = tmp_path / "s.json"
    r = runner.invoke(app, ["simulate", "--trace", trace, "--cluster", cluster, "--policy",
                            "apportion", "--max-jobs", "3", "--information", "oracle",
                            "--deterministic", "--interval", "3600", "--json", str(out)])
    assert r.exit_code == 0, r.output
    s = json.loads(out.read_text())
    assert s["finished"] + s["dropped"] == s["jobs"] == 3 and s["finished"] >= 1


def _queue(tmp_path: Path) -> tuple[Path, Path]:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(
        "now_s: 100\njobs:\n"
        "  - {id: mine, model: {measured: my-resnet}, global_batch_size: 128, iterations: 1000,"
        " requested_gpus: 2}\n"
        "  - {id: bert, model: bert-0.76b, global_batch_size: 128, iterations: 1000,"
        " requested_gpus: 2}\n")
    tables = tmp_path / "tables.csv"
    tables.write_text("model,gpu_type,gpus,iter_time_s\nmy-resnet,A40,1,0.5\nmy-resnet,A40,2,0.3\n"
                      "bert-0.76b,A40,2,0.4\nbert-0.76b,A10,2,0.8\n")
    return jobs, tables


@pytest.mark.parametrize("policy", [*OPTIMISING, "fcfs", "sia"])
def test_an_operators_measured_only_model_is_scheduled_from_its_tables(policy: str,
                                                                        tmp_path: Path) -> None:
    """``--estimator tables`` rows for a model the catalog lacks: it runs its DP plan where
    it was measured (A40); before, admission refused it (``catalog``)."""
    jobs, tables = _queue(tmp_path)
    out = tmp_path / "d.json"
    r = runner.invoke(app, ["solve-round", "--jobs", str(jobs), "--estimator", "tables",
                            "--tables", str(tables), "--policy", policy, "--time-budget", "2",
                            "--json", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    mine = next(a for a in d["allocations"] if a["job"] == "mine")
    assert mine["gpu_type"] == "A40"
    assert mine["plan"]["dp"] == mine["gpus"] and mine["plan"]["pp"] == mine["plan"]["tp"] == 1


def test_without_measurements_it_is_refused_by_name(tmp_path: Path) -> None:
    """The analytic estimator cannot describe it: admission says so (stage admit), and a
    misspelt catalog name is still a bad input."""
    jobs, _ = _queue(tmp_path)
    out = tmp_path / "d.json"
    r = runner.invoke(app, ["solve-round", "--jobs", str(jobs), "--json", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    p = next(p for p in d["pending"] if p["job"] == "mine")
    assert p["reason"] == Reason.CATALOG.value and p["stage"] == "admit"
    assert "my-resnet" in p["detail"]
    jobs.write_text(jobs.read_text().replace("{measured: my-resnet}", "my-resnet"))
    r = runner.invoke(app, ["solve-round", "--jobs", str(jobs), "--json", str(out)])
    assert r.exit_code == 2 and "unknown model 'my-resnet'" in r.output
