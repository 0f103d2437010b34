"""No checkpoint ever loads code: a pickle planted where any worker resumes from (the
built-in trainer's file, DeepSpeed's tag folder and its ``latest`` pointer, the JAX
worker's arrays) is refused with a reason naming the file, and the command it carries
never runs. Every case starts a real worker process, as ``apportion run`` would."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from apportion.plans import ExecutionPlan


class _Payload:
    """Unpickling this runs ``touch marker`` (what an attacker's file would do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def _ds_env() -> dict[str, str]:
    from apportion.runtime.workers.deepspeed_config import launch_env

    cache = Path(os.environ.get("TORCH_EXTENSIONS_DIR")
                 or Path(tempfile.gettempdir()) / "apportion-torch-extensions")
    env = {**os.environ, **launch_env(cache)}
    env.pop("TORCH_FORCE_WEIGHTS_ONLY_LOAD", None)
    env["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"  # a job's env cannot turn the guard off
    return env


def _ds_job(tmp_path: Path, iterations: int) -> tuple[Path, list[str]]:
    from apportion.runtime.workers.train_config import TrainConfig
    from apportion.runtime.executors.local.executor import free_port
    from apportion.runtime.workers.deepspeed_config import deepspeed_config, launch_command

    plan = ExecutionPlan(dp=1, zero_stage=1)
    jobdir = tmp_path / "job"
    jobdir.mkdir(exist_ok=True)
    cfg = TrainConfig("j", "gpt-tiny", 4, iterations, plan.as_dict(), str(jobdir))
    cfg.dump(jobdir / "config.json")
    (jobdir / "ds.json").write_text(json.dumps(deepspeed_config(plan, 4)))
    return jobdir, launch_command(plan, jobdir / "config.json", jobdir / "ds.json", free_port())


def test_deepspeed_trainer_resumes_tensors_only(tmp_path: Path) -> None:
    """A real DeepSpeed checkpoint resumes; the same folder with a planted model file, or a
    ``latest`` that points outside the checkpoint folder, fails the worker naming the file,
    and the planted command never runs (DeepSpeed itself loads with weights_only=False)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("deepspeed")
    jobdir, cmd = _ds_job(tmp_path, 2)
    env = _ds_env()
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=540)
    assert first.returncode == 0, first.stderr[-3000:]
    ck = jobdir / "checkpoint"
    tag = (ck / "latest").read_text().strip()
    # resuming a genuine checkpoint works through the guarded loader
    _, cmd = _ds_job(tmp_path, 3)
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=540)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((jobdir / "deepspeed_losses.json").read_text())["resumed_from"] == 2
    marker = tmp_path / "pwned"
    tag = (ck / "latest").read_text().strip()
    model_file = next((ck / tag).glob("*model_states.pt"))
    torch.save({"module": {}, "evil": _Payload(marker)}, model_file)
    _, cmd = _ds_job(tmp_path, 5)
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=540)
    assert out.returncode != 0
    assert not marker.exists()
    assert "CheckpointError" in out.stderr and model_file.name in out.stderr
    # ``latest`` naming a folder outside the checkpoint folder is refused before any load
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "mp_rank_00_model_states.pt").write_bytes(pickle.dumps(_Payload(marker)))
    (ck / "latest").write_text("../../outside")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=540)
    assert out.returncode != 0 and not marker.exists()
    assert "not a folder of" in out.stderr


LOADER_SCRIPT = r"""
import os, sys, json
from pathlib import Path
import torch, deepspeed
from apportion.runtime.workers.checkpoint import force_weights_only
from apportion.runtime.workers.deepspeed_config import build_comm_op, deepspeed_config
from apportion.plans import ExecutionPlan
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2], RANK="0", WORLD_SIZE="1",
                  LOCAL_RANK="0")
build_comm_op()
deepspeed.init_distributed(dist_backend="gloo")
net = torch.nn.Linear(4, 4)
engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(),
                                  config=deepspeed_config(ExecutionPlan(zero_stage=1), 4))
ck = Path(sys.argv[1])
engine.save_checkpoint(str(ck), tag="t")
torch.save({"module": {}, "evil": Payload()}, next((ck / "t").glob("*model_states.pt")))
force_weights_only()
try:
    engine.load_checkpoint(str(ck), tag="t")  # DeepSpeed's own call: weights_only=False
except Exception as exc:
    print("REFUSED", type(exc).__name__)
"""


def test_deepspeed_own_loader_is_forced_to_weights_only(tmp_path: Path) -> None:
    """Past the tag check (a file swapped after it): every torch.load in the worker process
    loads weights only, DeepSpeed's ``weights_only=False`` notwithstanding."""
    pytest.importorskip("deepspeed")
    from apportion.runtime.executors.local.executor import free_port

    marker = tmp_path / "pwned"
    payload = (f"class Payload:\n    def __reduce__(self):\n"
               f"        return (os.system, ('touch {marker}',))\n")
    script = LOADER_SCRIPT.replace("os.environ.update", payload + "os.environ.update", 1)
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "ck"), str(free_port())],
                         env=_ds_env(), capture_output=True, text=True, timeout=540)
    assert "REFUSED" in out.stdout, out.stderr[-3000:]
    assert not marker.exists()


JAX_SCRIPT = r"""
import sys
from apportion.runtime.workers.jax_worker import train_contract
sys.exit(train_contract(sys.argv[1]))
"""


def test_jax_worker_refuses_object_arrays(tmp_path: Path) -> None:
    """The JAX worker's checkpoint is arrays only: an ``.npz`` holding a pickled object is
    refused by numpy's loader before anything is unpickled."""
    pytest.importorskip("jax")
    import numpy as np

    from apportion.runtime.workers.train_config import TrainConfig

    marker = tmp_path / "pwned"
    jobdir = tmp_path / "job"
    (jobdir / "checkpoint").mkdir(parents=True)
    evil = np.empty(1, dtype=object)
    evil[0] = _Payload(marker)
    np.savez(jobdir / "checkpoint" / "params.npz", iteration=np.array(1), p0=evil)
    cfg = TrainConfig("j", "gpt-tiny", 4, 2, ExecutionPlan().as_dict(), str(jobdir))
    cfg.dump(jobdir / "config.json")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "RANK": "0", "WORLD_SIZE": "1"}
    out = subprocess.run([sys.executable, "-c", JAX_SCRIPT, str(jobdir / "config.json")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert not marker.exists()
    assert "allow_pickle" in out.stderr
