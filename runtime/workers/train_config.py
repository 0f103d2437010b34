"""The contract between an executor and apportion's built-in workers: the worker config
(:class:`TrainConfig`, one JSON file per launch) and the atomic JSON files both sides
read and write. Neutral ground: executors write it, workers (torch, DeepSpeed, JAX)
read it, and neither imports the other.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from apportion.plans import ExecutionPlan


def write_json(path: str | Path, obj: Any) -> None:
    """Atomic JSON write (temporary file in the same folder, then rename)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    with os.fdopen(fd, "w") as fh:
        json.dump(obj, fh, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, p)


def read_json_file(path: str | Path) -> Any | None:
    """A JSON file written by :func:`write_json`, or ``None`` when absent."""
    p = Path(path)
    try:
        return json.loads(p.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


@dataclass
class TrainConfig:
    job: str
    model: str
    global_batch_size: int
    iterations: int
    plan: dict[str, Any] = field(default_factory=dict)
    workdir: str = "."
    seed: int = 0
    lr: float = 1e-3
    stop_at: int | None = None  # checkpoint and exit after this many iterations in total
    checkpoint_every: int = 0  # periodic checkpoints every N iterations (0: off) ...
    checkpoint_interval_s: float = 0.0  # ... or every T seconds (0: off); always when stopping
    backend: str = "auto"  # auto | gloo | nccl
    launch_id: str = ""  # echoed in progress.json so an executor never reads a previous group's
    optimizer: str = "adamw"  # adamw | adam | sgd (the jobs YAML's workload.train block)
    weight_decay: float = 0.0
    momentum: float = 0.0
    warmup_iterations: int = 0
    grad_clip: float = 0.0
    checkpoint_dir: str = ""  # "": <workdir>/checkpoint (APPORTION_CHECKPOINT_DIR)
    progress_file: str = ""  # "": <workdir>/progress.jsonl (APPORTION_PROGRESS_FILE)
    # a job whose batch the round chooses (a batch_range): the batch its ``iterations`` are
    # counted in (0: ``global_batch_size``, a job that fixes its batch); the worker then counts
    # its progress in samples (``samples // job_batch_size``) and reports gradient statistics
    job_batch_size: int = 0
    gradient_stats: bool = False  # report grad_sqr and grad_var on every progress line

    @property
    def execution_plan(self) -> ExecutionPlan:
        return ExecutionPlan(**self.plan)

    def dump(self, path: str | Path) -> None:
        write_json(path, asdict(self))

    @classmethod
    def load(cls, path: str | Path) -> TrainConfig:
        return cls(**json.loads(Path(path).read_text()))
