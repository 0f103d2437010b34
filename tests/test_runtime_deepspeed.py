"""DeepSpeed config and launch command from a plan; a real ZeRO run on CPU when installed."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest
from apportion.runtime.workers.deepspeed_config import (
    DeepSpeedPlanError,
    deepspeed_config,
    launch_command,
    launch_env,
)
from hypothesis import given
from hypothesis import strategies as st

from apportion.plans import ExecutionPlan


@given(dp=st.sampled_from([1, 2, 4]), acc=st.sampled_from([1, 2, 4]), stage=st.integers(0, 3),
       offload=st.booleans(), gc=st.booleans(), micro=st.sampled_from([1, 2, 3]))
def test_config_keeps_the_plan_and_the_global_batch(dp: int, acc: int, stage: int,
                                                    offload: bool, gc: bool, micro: int) -> None:
    plan = ExecutionPlan(dp=dp, accumulation=acc, zero_stage=stage, offload=offload,
                         checkpointing=gc)
    batch = dp * acc * micro
    if offload and stage == 0:
        with pytest.raises(DeepSpeedPlanError, match="offload"):
            deepspeed_config(plan, batch)
        return
    cfg = deepspeed_config(plan, batch)
    assert cfg["train_batch_size"] == batch
    assert cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * dp == batch
    assert cfg["zero_optimization"]["stage"] == stage
    assert ("offload_optimizer" in cfg["zero_optimization"]) == offload
    assert ("offload_param" in cfg["zero_optimization"]) == (offload and stage == 3)
    assert ("activation_checkpointing" in cfg) == gc
    json.dumps(cfg)


def test_indivisible_batch_is_refused_not_changed() -> None:
    with pytest.raises(DeepSpeedPlanError, match="not divisible"):
        deepspeed_config(ExecutionPlan(dp=4), 6)


def test_launch_command_runs_one_process_per_gpu() -> None:
    cmd = launch_command(ExecutionPlan(dp=2, tp=2), "c.json", "ds.json", 1234)
    assert "--nproc-per-node=4" in cmd and "--master-port=1234" in cmd
    assert cmd[-3:] == ["apportion.runtime.workers.deepspeed_config", "c.json", "ds.json"]


def test_zero2_trains_on_cpu_like_the_torch_worker(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")
    from apportion.runtime.workers.train_config import TrainConfig
    from apportion.runtime.executors.local.executor import free_port
    from apportion.runtime.workers.trainer import LOSSES_FILE, Worker
    plan = ExecutionPlan(dp=2, zero_stage=2)
    cfg = TrainConfig("j", "gpt-tiny", 4, 2, plan.as_dict(), str(tmp_path))
    cfg.dump(tmp_path / "config.json")
    (tmp_path / "ds.json").write_text(json.dumps(deepspeed_config(plan, 4)))
    cache = Path(os.environ.get("TORCH_EXTENSIONS_DIR")
                 or Path(tempfile.gettempdir()) / "apportion-torch-extensions")
    env = {**os.environ, **launch_env(cache)}
    # a build killed midway (a preempted job) leaves torch's baton behind: never a hang
    stale = cache / "deepspeed_shm_comm" / "lock"
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.touch()
    out = subprocess.run(launch_command(plan, tmp_path / "config.json", tmp_path / "ds.json",
                                        free_port()), env=env, capture_output=True, text=True,
                         timeout=540, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    ds = json.loads((tmp_path / "deepspeed_losses.json").read_text())["losses"]
    base = TrainConfig("j", "gpt-tiny", 4, 2, ExecutionPlan().as_dict(), str(tmp_path / "base"))
    assert Worker(base, 0, 1).run() == 0
    want = [json.loads(x)["loss"] for x in (tmp_path / "base" / LOSSES_FILE).read_text()
            .splitlines()]
    assert ds == pytest.approx(want, abs=1e-3)  # DeepSpeed's AdamW: same math, other kernels
