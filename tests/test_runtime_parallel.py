"""FSDP (ZeRO-like) and tensor-parallel plans train the same trajectory as DP, and a job can
move between strategies through its full-state checkpoint (real gloo process groups)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from apportion.runtime.executors.launch import launch_spec
from apportion.runtime.workers.train_config import TrainConfig
from apportion.runtime.executors.local.executor import free_port, spawn, wait
from apportion.runtime.workers.trainer import LOSSES_FILE, Worker

from apportion.decision import Allocation
from apportion.jobs import JobSpec, job_dirname
from apportion.plans import ExecutionPlan

LOSS_TOL = 1e-4


def test_dp_fsdp_tp_share_one_trajectory(tmp_path: Path) -> None:
    job = JobSpec("j", "gpt-tiny", 4, 4, 2)
    base = TrainConfig("j", "gpt-tiny", 4, 4, ExecutionPlan().as_dict(), str(tmp_path / "base"))
    assert Worker(base, 0, 1).run() == 0
    phases = [(ExecutionPlan(dp=2), 1), (ExecutionPlan(dp=2, zero_stage=3), 2),
              (ExecutionPlan(tp=2), 3), (ExecutionPlan(dp=2, zero_stage=2), None)]
    for plan, stop_at in phases:
        a = Allocation("j", "T4", 2, 1, plan, {"local-0": 2}, 1.0)
        spec = launch_spec(job, a, "resize", tmp_path / "moved", master_port=free_port(),
                           stop_at=stop_at)
        assert wait(spawn(spec), 120), (Path(spec.workdir) / "rank0.log").read_text()[-2000:]

    def read(d: Path) -> list[dict]:
        return [json.loads(x) for x in (d / LOSSES_FILE).read_text().splitlines()]

    want = {r["iteration"]: r["loss"] for r in read(tmp_path / "base")}
    got = read(tmp_path / "moved" / job_dirname("j"))
    assert [r["plan"] for r in got] == ["dp2-tp1-pp1", "dp2-tp1-pp1-zero3", "dp1-tp2-pp1",
                                        "dp2-tp1-pp1-zero2"]
    for r in got:
        assert r["loss"] == pytest.approx(want[r["iteration"]], abs=LOSS_TOL), r
