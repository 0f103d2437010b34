"""Every executor that can run here without a cluster x every workload kind, through
``apportion run`` (the executors with a cluster — Slurm, Ray, Kubernetes — have their own
suites, which start one: tests/test_runtime_slurm.py, test_runtime_ray*.py,
test_k8s_executor.py). ``dry-run`` prints each kind's launch; a kind's launch names what
every rank runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from apportion.runtime.executors import EXECUTORS

KINDS = {
    "builtin": ({}, "apportion.runtime.workers.trainer"),
    "torchrun": ({"kind": "torchrun", "command": ["python", "train.py"]}, "train.py"),
    "deepspeed": ({"kind": "deepspeed"}, "apportion.runtime.workers.deepspeed_config"),
    "jax": ({"kind": "jax"}, "apportion.runtime.workers.jax_worker"),
}


def test_the_matrix_covers_every_executor() -> None:
    assert set(EXECUTORS) == {"dry-run", "local", "slurm", "ray", "kubernetes"}


def test_dry_run_launches_every_workload_kind(tmp_path: Path) -> None:
    jobs = [{"id": kind, "model": "gpt-tiny", "global_batch_size": 8, "iterations": 4,
             "requested_gpus": 1, **({"workload": w} if w else {})}
            for kind, (w, _) in KINDS.items()]
    (tmp_path / "j.yaml").write_text(yaml.safe_dump({"jobs": jobs}))
    cli = [sys.executable, "-m", "apportion.cli"]
    assert subprocess.run([*cli, "submit", "j.yaml", "--state", "s.db"], cwd=tmp_path,
                          capture_output=True, timeout=120).returncode == 0
    r = subprocess.run([*cli, "run", "--executor", "dry-run", "--cluster", "crius-testbed",
                        "--state", "s.db", "--interval", "1", "--timeout", "3",
                        "--time-budget", "2"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    events = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    launched = {e["job"]: e for e in events if e.get("spec")}
    assert set(launched) == set(KINDS), sorted(launched)
    for kind, (_, runs) in KINDS.items():
        command = " ".join(launched[kind]["spec"]["command"])
        assert runs in command, (kind, command)


@pytest.mark.parametrize("kind", ["builtin", "torchrun"])
def test_local_trains_every_cheap_kind(kind: str, tmp_path: Path) -> None:
    """The local executor trains the kinds that need no extra: the built-in trainer and a
    user's torchrun script (DeepSpeed and JAX: tests/test_runtime_workloads.py)."""
    pytest.importorskip("torch")
    root = Path(__file__).resolve().parent.parent
    w = ({} if kind == "builtin" else
         {"workload": {"kind": "torchrun",
                       "command": ["python", str(root / "examples" / "torch_train.py")]}})
    (tmp_path / "j.yaml").write_text(yaml.safe_dump({"jobs": [
        {"id": kind, "model": "gpt-tiny", "global_batch_size": 8, "iterations": 4,
         "requested_gpus": 1, **w}]}))
    cli = [sys.executable, "-m", "apportion.cli"]
    assert subprocess.run([*cli, "submit", "j.yaml", "--state", "s.db"], cwd=tmp_path,
                          capture_output=True, timeout=120).returncode == 0
    r = subprocess.run([*cli, "run", "--executor", "local", "--cluster", "local", "--state",
                        "s.db", "--interval", "2", "--until-idle", "--timeout", "300",
                        "--time-budget", "3"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    st = json.loads(subprocess.run([*cli, "status", "--state", "s.db", "--json"],
                                   cwd=tmp_path, capture_output=True, text=True,
                                   timeout=60).stdout)
    (job,) = st["jobs"]
    assert job["state"] == "finished" and job["iterations_done"] == 4, job
