"""Launch specs (command, environment, config per worker group) and the dry-run executor.

A :class:`LaunchSpec` is everything needed to start one job's worker group
for one allocation: the torchrun-compatible command, the environment, and the
:class:`~apportion.runtime.trainer.TrainConfig` the workers read. Every engine
builds its workers from the same spec (local processes, Ray actors,
Kubernetes containers), so what ``--executor dry-run`` prints is exactly what
the others would run.

The plan comes from the allocation unchanged; only the batch split is derived
(accumulation stays as the plan says; the per-rank micro-batch follows from
the constant global batch). Where the global batch does not divide, the
trainer refuses the plan with a message instead of the executor editing it.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from apportion.runtime.executor import Event, Health, Progress, actions_for

from apportion.decision import Allocation, Decision
from apportion.jobs import JobSpec, job_dirname
from apportion.plans import ExecutionPlan

log = logging.getLogger(__name__)

TRAINER_MODULE = "apportion.runtime.trainer"


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

    @property
    def execution_plan(self) -> ExecutionPlan:
        return ExecutionPlan(**self.plan)

    def dump(self, path: str | Path) -> None:
        write_json(path, asdict(self))

    @classmethod
    def load(cls, path: str | Path) -> TrainConfig:
        return cls(**json.loads(Path(path).read_text()))




@dataclass
class LaunchSpec:
    job: str
    action: str
    workers: int
    gpu_type: str
    placement: dict[str, int]
    command: list[str]
    env: dict[str, str]
    config: dict[str, Any]
    workdir: str
    per_worker_env: list[dict[str, str]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def train_config(job: JobSpec, alloc: Allocation, workdir: str | Path, seed: int = 0,
                 **extra: Any) -> TrainConfig:
    """The worker config for ``job`` on ``alloc``: the plan exactly as the round chose it."""
    return TrainConfig(job=job.id, model=job.model, global_batch_size=job.global_batch_size,
                       iterations=job.iterations, plan=alloc.plan.as_dict(),
                       workdir=str(workdir), seed=seed, **extra)


def launch_spec(job: JobSpec, alloc: Allocation, action: str, workdir: str | Path,
                master_addr: str = "127.0.0.1", master_port: int = 29500,
                python: str = sys.executable, seed: int = 0, threads: int = 1,
                **extra: Any) -> LaunchSpec:
    """The spec for one worker group; ``per_worker_env`` holds each rank's torchrun variables."""
    jobdir = Path(workdir) / job_dirname(job.id)  # a name, never a path: see job_dirname
    cfg = train_config(job, alloc, jobdir, seed, **extra)
    world = alloc.plan.gpus
    env = {"MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
           "WORLD_SIZE": str(world), "OMP_NUM_THREADS": str(threads),
           "APPORTION_GPU_TYPE": alloc.gpu_type}
    ranks = [{"RANK": str(r), "LOCAL_RANK": str(r)} for r in range(world)]
    cmd = [python, "-m", TRAINER_MODULE, str(jobdir / "config.json")]
    return LaunchSpec(job.id, action, world, alloc.gpu_type, dict(alloc.placement), cmd, env,
                      asdict(cfg), str(jobdir), ranks)


def torchrun_command(spec: LaunchSpec, nnodes: int = 1) -> list[str]:
    """The same group as one ``torchrun`` invocation (what a multi-node engine would run)."""
    per_node = spec.workers // max(1, nnodes)
    return ["torchrun", f"--nnodes={nnodes}", f"--nproc-per-node={per_node}",
            f"--master-addr={spec.env['MASTER_ADDR']}", f"--master-port={spec.env['MASTER_PORT']}",
            "-m", TRAINER_MODULE, spec.command[-1]]


class DryRunExecutor:
    """Prints and returns the launch specs of every action; runs nothing.

    It keeps its own notion of what runs (so a second round's actions are
    reconciled against the first) and reports jobs as never progressing.
    """

    name = "dry-run"

    def __init__(self, workdir: str | Path = "apportion-runs", out: IO[str] | None = None) -> None:
        self.workdir = Path(workdir)
        self.out = out if out is not None else sys.stdout
        self.running: dict[str, Allocation] = {}
        self.jobs: dict[str, JobSpec] = {}
        self.specs: list[LaunchSpec] = []

    def apply(self, decision: Decision, state: Sequence[JobSpec]) -> list[Event]:
        by_id = {j.id: j for j in state}
        self.jobs.update(by_id)
        events: list[Event] = []
        for step in actions_for(decision, self.running, self.running):
            if step.allocation is None:
                self.running.pop(step.job, None)
                ev = Event(step.job, step.action.value, detail="stop with checkpoint")
            else:
                a = step.allocation
                spec = launch_spec(by_id[step.job], a, step.action.value, self.workdir)
                self.specs.append(spec)
                self.running[step.job] = a
                ev = Event(step.job, step.action.value, spec.workers, a.gpu_type,
                           "no change" if step.action.value == "keep" else "launch",
                           spec=spec.as_dict())
            self.out.write(json.dumps(ev.as_dict(), sort_keys=True) + "\n")
            events.append(ev)
        self.out.flush()
        return events

    def poll(self) -> list[Progress]:
        return [Progress(j, self.jobs[j].iterations_done, self.jobs[j].iterations, Health.STARTING,
                         workers=a.plan.gpus, plan=a.plan.label())
                for j, a in sorted(self.running.items())]

    def shutdown(self, checkpoint: bool = True) -> list[Event]:
        events = [Event(j, "preempt", detail="dry-run shutdown") for j in sorted(self.running)]
        self.running.clear()
        return events
