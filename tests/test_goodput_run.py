"""Goodput in ``apportion run``: a job with a ``batch_range`` gets its global batch chosen by
the round, the batch reaches its workers (``APPORTION_GLOBAL_BATCH_SIZE``, the trainer's
config), the built-in torch trainer measures its gradient statistics and writes them on its
progress lines, and the store keeps them for the next round's efficiency.

The end-to-end test is a real CPU torch run (two DDP ranks under gloo) through the CLI."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apportion.decision import Allocation
from apportion.jobs import JobSpec
from apportion.plans import ExecutionPlan
from apportion.runtime.executors.launch import launch_spec
from apportion.runtime.workload import (
    ENV_GLOBAL_BATCH,
    gradient_noise,
    gradient_stats,
    read_progress_since,
)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apportion.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=400)


@given(sqr=st.floats(1e-6, 1e3), var=st.floats(0, 1e4), small=st.integers(1, 64),
       more=st.integers(1, 512))
def test_two_batch_sizes_give_back_the_gradient_statistics(sqr: float, var: float, small: int,
                                                           more: int) -> None:
    """At their expectations (``|G|^2 + tr(S)/B`` for a B-sample mean), the two squared norms
    give back the true gradient's squared norm and the per-sample variance."""
    big = small + more
    got = gradient_noise(sqr + var / small, small, sqr + var / big, big)
    assert got == pytest.approx((sqr, var), rel=1e-6, abs=1e-6 * (1 + var))


def test_progress_lines_carry_the_statistics(tmp_path: Path) -> None:
    f = tmp_path / "progress.jsonl"
    f.write_text('{"iteration": 1, "grad_sqr": 0.5, "grad_var": 4.0}\n'
                 '{"iteration": 2, "grad_sqr": "x", "grad_var": 4.0}\n'
                 '{"iteration": 2, "checkpoint": true}\n')
    view = read_progress_since(f)
    assert view.grad_stats == (0.5, 4.0) and view.iteration == 2
    assert gradient_stats({"grad_sqr": -1.0, "grad_var": 1.0}) is None
    assert gradient_stats({"grad_sqr": True, "grad_var": 1.0}) is None


def test_the_chosen_batch_reaches_the_workers(tmp_path: Path) -> None:
    job = JobSpec("g", "gpt-tiny", 8, 12, 2, batch_range=(4, 32))
    alloc = Allocation("g", "cpu", 2, 1, ExecutionPlan(dp=2), {"local": 2}, 1.0,
                       global_batch_size=16)
    spec = launch_spec(job, alloc, "start", tmp_path)
    cfg = spec.files["config.json"]
    assert spec.env[ENV_GLOBAL_BATCH] == "16"
    assert (cfg["global_batch_size"], cfg["job_batch_size"], cfg["gradient_stats"]) == (16, 8,
                                                                                       True)
    fixed = launch_spec(JobSpec("f", "gpt-tiny", 8, 12, 2),
                        Allocation("f", "cpu", 2, 1, ExecutionPlan(dp=2), {"local": 2}, 1.0),
                        "start", tmp_path)
    assert fixed.env[ENV_GLOBAL_BATCH] == "8"
    assert (fixed.files["config.json"]["job_batch_size"],
            fixed.files["config.json"]["gradient_stats"]) == (0, False)


@pytest.mark.parametrize("entry,words", [
    ("batch_range: [16, 32]", "outside batch_range"),
    ("batch_range: [32, 16]", "smallest <= largest"),
    ("grad_stats: [1.0, -2.0]", "non-negative"),
])
def test_a_bad_batch_range_or_statistics_is_refused_by_field(tmp_path: Path, entry: str,
                                                             words: str) -> None:
    (tmp_path / "jobs.yaml").write_text(
        "jobs:\n  - {id: g, model: gpt-tiny, global_batch_size: 8, iterations: 12, "
        f"requested_gpus: 2, {entry}}}\n")
    r = _cli("submit", "jobs.yaml", "--state", "s.db", cwd=tmp_path)
    assert r.returncode == 2 and "jobs.yaml" in r.stderr and words in r.stderr, r.stderr
    assert entry.split(":")[0] in r.stderr


def test_run_chooses_the_batch_and_the_store_keeps_the_reported_statistics(tmp_path: Path
                                                                           ) -> None:
    """A job submitted with its noise scale known (500 samples: a large batch costs little
    efficiency) gets a larger batch than its own at its first start; its two ranks run at it,
    count progress in samples of its own batch, measure their gradients, and the store keeps
    what they last reported (no longer what it was submitted with)."""
    pytest.importorskip("torch")
    (tmp_path / "jobs.yaml").write_text(
        "jobs:\n  - {id: g, model: gpt-tiny, global_batch_size: 8, batch_range: [4, 32], "
        "grad_stats: [0.1, 50.0], iterations: 12, requested_gpus: 2}\n")
    assert _cli("submit", "jobs.yaml", "--state", "s.db", cwd=tmp_path).returncode == 0
    r = _cli("run", "--executor", "local", "--cluster", "local", "--state", "s.db",
             "--interval", "2", "--until-idle", "--timeout", "300", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    status = json.loads(_cli("status", "--state", "s.db", "--json", cwd=tmp_path).stdout)
    job = next(j for j in status["jobs"] if j["id"] == "g")
    assert job["state"] == "finished" and job["iterations_done"] == 12
    db = sqlite3.connect(tmp_path / "s.db")
    first = json.loads(db.execute("SELECT decision_json FROM decisions ORDER BY round_id "
                                  "LIMIT 1").fetchone()[0])["allocations"][0]
    batch = first["global_batch_size"]
    decided = {a.get("global_batch_size") for (d,) in db.execute(
        "SELECT decision_json FROM decisions").fetchall()
        for a in json.loads(d)["allocations"]}  # a decision without one: the job's own
    assert batch is not None and 8 < batch <= 32 and batch % first["gpus"] == 0, first
    cfg = json.loads(next(tmp_path.rglob("config.json")).read_text())
    assert (cfg["global_batch_size"], cfg["job_batch_size"]) == (batch, 8)
    lines = [json.loads(x) for x in next(tmp_path.rglob("progress.jsonl")).read_text()
             .splitlines()]
    reported = [(x["grad_sqr"], x["grad_var"]) for x in lines if "grad_sqr" in x]
    assert reported and all(s > 0 and v > 0 for s, v in reported)
    kept = db.execute("SELECT grad_sqr, grad_var, reports FROM gradient_stats WHERE job = 'g'"
                      ).fetchone()
    assert kept is not None and (kept[0], kept[1]) in reported and kept[2] >= 1
    # its measured steps are labelled with the batch its group ran, never taken for steps of
    # its own batch (the estimators would credit a larger batch with no extra time)
    timed = db.execute("SELECT DISTINCT batch FROM estimator_samples WHERE job = 'g'").fetchall()
    assert timed and batch in {t[0] for t in timed} and {t[0] for t in timed} <= decided, timed
    from apportion.store import open_store

    with open_store(tmp_path / "s.db") as s:  # what the next round reads of the job
        assert s.job("g").to_jobspec().grad_stats == (kept[0], kept[1])
        assert all(x["batch"] in decided for x in s.samples("g"))


@pytest.mark.parametrize("builtin", [True, False])
def test_the_slurm_executor_passes_the_statistics_on(tmp_path: Path, builtin: bool) -> None:
    """Slurm's launches report through the job folder, as every executor's: the built-in
    trainer's progress JSON and a user workload's progress lines both carry the statistics,
    and the launch keeps the last ones (its Progress hands them to the round)."""
    from apportion.runtime.executors.slurm.executor import (
        BUILTIN_PROGRESS,
        SlurmExecutor,
        _Launch,
    )

    alloc = Allocation("g", "cpu", 2, 1, ExecutionPlan(dp=2), {"local": 2}, 1.0)
    launch = _Launch("g", 12, alloc, "7", "L1", tmp_path, builtin, 0.0, 0)
    if builtin:
        (tmp_path / BUILTIN_PROGRESS).write_text(json.dumps(
            {"iterations_done": 3, "launch_id": "L1", "grad_sqr": 0.5, "grad_var": 8.0}))
    else:
        (tmp_path / "progress.jsonl").write_text(
            '{"iteration": 3, "grad_sqr": 0.5, "grad_var": 8.0}\n')
    reader = object.__new__(SlurmExecutor)  # _read_progress reads the folder, nothing of its own
    reader._read_progress(launch)
    assert (launch.iterations_done, launch.grad_stats) == (3, (0.5, 8.0))
