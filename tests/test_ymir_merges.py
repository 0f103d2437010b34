"""YMIR merges in replays: the fine-tuning truth runs a merged pair as Titan's simulator does
(a task whose merged curve never reaches its target takes the curve's length; each task
its own epochs), so the merger has pairs to merge. Before, 409 of the 520 pairs YMIR saw
on FM-1 RoBERTa-base could not run merged and ``ymir`` equalled ``ymir-temporal``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from apportion.experiments.finetune_truth import FinetuneTruth, finetune_root
from apportion.experiments.traces import FinetuneInfo, SimJob, Trace
from typer.testing import CliRunner

from apportion.cli import app

pytestmark = pytest.mark.skipif(not finetune_root().is_dir(),
                                reason="titan-finetune data not present")
runner = CliRunner()
V100 = "V100-32GB"


def _job(jid: str, task: str, lr: str, steps: str, target: float, batch: int) -> SimJob:
    return SimJob(jid, 0.0, 1, 0.0, f"roberta-base@{task}", batch=batch, gpu_type=V100,
                  finetune=FinetuneInfo("roberta-base", task, lr, steps, target))


def test_a_pair_whose_merged_curve_misses_a_target_runs_merged_for_the_curves_length() -> None:
    truth = FinetuneTruth()
    # FM-1 RoBERTa-base's qnli and mrpc jobs: mrpc's merged curve peaks at 0.905 < 0.907
    qnli = _job("q", "qnli", "4e-5", "8", 0.9031667581914699, 128)
    mrpc = _job("m", "mrpc", "1e-3", "8", 0.9071803852889667, 128)
    qnli, mrpc = truth.with_iterations(Trace("t", [qnli, mrpc])).jobs
    data = truth.data("roberta-base")
    eq, em = data.spatial_epochs(qnli.finetune, mrpc.finetune)
    assert em == 10.0 and eq < 10.0  # mrpc: the curve's length (Titan's max_epochs)
    merged = truth.rate(qnli, V100, 1, members=(mrpc,))
    assert merged > 0  # was 0: "cannot run merged"
    # the merged job's work is each task's own epochs of its own samples (Titan's rule)
    sq, sm = data.samples_to_target["qnli"], data.samples_to_target["mrpc"]
    nq, nm = data.normal_epochs(qnli.finetune), data.normal_epochs(mrpc.finetune)
    t = truth.iteration_time("roberta-base", 1, qnli.batch + mrpc.batch)
    assert merged == pytest.approx(qnli.iterations / ((eq * sq / nq + em * sm / nm)
                                                      / (qnli.batch + mrpc.batch) * t))
    same = _job("q2", "qnli", "4e-5", "8", 0.9031667581914699, 128)
    assert truth.rate(qnli, V100, 1, members=(same,)) == 0.0  # the same task: unmeasured


def test_ymir_merges_in_a_replay(tmp_path: Path) -> None:
    out, jobs = tmp_path / "s.json", tmp_path / "jobs.csv"
    r = runner.invoke(app, ["simulate", "--trace", "fm-generated:40", "--cluster", "16:0:0",
                            "--profile", "ymir", "--policy", "ymir", "--information", "oracle",
                            "--json", str(out), "--jobs-csv", str(jobs)])
    assert r.exit_code == 0, r.output
    s = json.loads(out.read_text())
    assert s["finished"] == s["jobs"] == 40
    assert s["merged_jobs"] > 0 and s["transferred_jobs"] > 0  # both modes, one policy
    assert "merged into " in jobs.read_text()
