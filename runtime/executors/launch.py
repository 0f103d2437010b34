"""Launch specs: the command, environment and config of one worker group.

A :class:`LaunchSpec` is everything needed to start one job's worker group
for one allocation: the command every rank runs (apportion's trainer, its
DeepSpeed or JAX entry, or the job's own ``workload.command``), the workload
contract's environment (``runtime.workload``), and the
:class:`~apportion.runtime.workers.trainer.TrainConfig` the built-in workers read.
Every engine builds its workers from the same spec (local processes, Ray
actors, Slurm tasks, Kubernetes containers), so what ``--executor dry-run``
prints is exactly what the others would run.

The plan comes from the allocation unchanged; only the batch split is derived
(accumulation stays as the plan says; the per-rank micro-batch follows from
the constant global batch). Where the global batch does not divide, the
trainer refuses the plan with a message instead of the executor editing it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from apportion.runtime.workers.deepspeed_config import DeepSpeedPlanError, deepspeed_config
from apportion.runtime.workers.train_config import TrainConfig
from apportion.runtime.workload import (
    CHECKPOINT_DIR_NAME,
    ENV_DEEPSPEED_CONFIG,
    ENV_GPU_TYPE,
    ENV_PROGRESS_FILE,
    ENV_TORCH_WEIGHTS_ONLY,
    PROGRESS_FILE_NAME,
    job_env,
    rank_env,
    ranks_by_node,
)

from apportion.decision import Allocation
from apportion.jobs import JobSpec, Workload, job_dirname

log = logging.getLogger(__name__)

TRAINER_MODULE = "apportion.runtime.workers.trainer"
DEEPSPEED_MODULE = "apportion.runtime.workers.deepspeed_config"
JAX_MODULE = "apportion.runtime.workers.jax_worker"


@dataclass
class LaunchSpec:
    job: str
    action: str
    workers: int
    gpu_type: str
    placement: dict[str, int]
    command: list[str]  # what every rank runs (the trainer, or the workload's own command)
    env: dict[str, str]  # shared by every rank: the workload contract, then the job's env
    config: dict[str, Any]  # the built-in trainers' TrainConfig
    workdir: str  # the job's own folder (workdir / job_dirname(id))
    per_worker_env: list[dict[str, str]] = field(default_factory=list)  # RANK, LOCAL_RANK, ...
    kind: str = "builtin"
    cwd: str = ""  # the ranks' working directory (workload.workdir, else the job folder)
    launch_id: str = ""
    nodes: list[str] = field(default_factory=list)  # the node of each rank
    files: dict[str, Any] = field(default_factory=dict)  # JSON files written before the launch

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def progress_file(self) -> str:
        return self.env[ENV_PROGRESS_FILE]


def run_batch(job: JobSpec, alloc: Allocation) -> int:
    """The global batch a launch runs: the one the round chose for the allocation (a job with
    a ``batch_range``), else the job's own."""
    return int(alloc.global_batch_size or job.global_batch_size)


def train_config(job: JobSpec, alloc: Allocation, workdir: str | Path, seed: int = 0,
                 **extra: Any) -> TrainConfig:
    """The worker config for ``job`` on ``alloc``: the plan exactly as the round chose it, at
    the batch it chose; a job whose batch is a decision counts its progress in samples of its
    own batch and reports its gradient statistics."""
    ranged = job.batch_range is not None
    return TrainConfig(job=job.id, model=job.model, global_batch_size=run_batch(job, alloc),
                       iterations=job.iterations, plan=alloc.plan.as_dict(),
                       workdir=str(workdir), seed=seed,
                       job_batch_size=job.global_batch_size if ranged else 0,
                       gradient_stats=ranged, **extra)


def workload_command(kind: str, command: Sequence[str], jobdir: Path, python: str) -> list[str]:
    """What every rank runs: the user's command, or apportion's own entry for the kind."""
    if command:
        return list(command)
    cfg = str(jobdir / "config.json")
    if kind == "deepspeed":
        return [python, "-m", DEEPSPEED_MODULE, cfg]
    if kind == "jax":
        return [python, "-m", JAX_MODULE, "--config", cfg]
    return [python, "-m", TRAINER_MODULE, cfg]


def launch_spec(job: JobSpec, alloc: Allocation, action: str, workdir: str | Path,
                master_addr: str = "127.0.0.1", master_port: int = 29500,
                python: str = sys.executable, seed: int = 0, threads: int = 1,
                launch_id: str = "", checkpoint_every: int = 0,
                checkpoint_interval_s: float = 0.0, **extra: Any) -> LaunchSpec:
    """The spec for one worker group, for every workload kind and every engine.

    Every rank gets the workload contract (``runtime.workload.job_env`` and
    ``rank_env``: torchrun's variables and apportion's), ranks numbered node
    by node in the placement's order. The job's ``workload`` says what runs
    and may set its own checkpoint period (else the run's) and, for the
    built-in trainers, the optimiser (``train``).
    """
    w = job.workload or Workload()
    # absolute: ranks run in workload.workdir (or elsewhere on another node) and must still
    # find the job folder; the folder is a name, never the id as a path (see job_dirname)
    jobdir = Path(workdir).absolute() / job_dirname(job.id)
    every = w.checkpoint_every if w.checkpoint_every is not None else checkpoint_every
    interval = (w.checkpoint_interval_s if w.checkpoint_interval_s is not None
                else checkpoint_interval_s)
    train = {**extra, **dict(w.train)}
    if "warmup_iterations" in train:
        train["warmup_iterations"] = int(train["warmup_iterations"])  # type: ignore[call-overload]
    cfg = train_config(job, alloc, jobdir, seed, launch_id=launch_id, checkpoint_every=every,
                       checkpoint_interval_s=interval,
                       checkpoint_dir=str(jobdir / CHECKPOINT_DIR_NAME),
                       progress_file=str(jobdir / PROGRESS_FILE_NAME), **train)
    world = alloc.plan.gpus
    env = {"OMP_NUM_THREADS": str(threads), ENV_GPU_TYPE: alloc.gpu_type,
           ENV_TORCH_WEIGHTS_ONLY: "1", **w.env,
           **job_env(job.id, alloc.plan, job.iterations, jobdir, world, master_addr, master_port,
                     launch_id=launch_id, checkpoint_every=every,
                     checkpoint_interval_s=interval, global_batch_size=run_batch(job, alloc))}
    files: dict[str, Any] = {"config.json": asdict(cfg)}
    if w.kind == "deepspeed":
        try:
            files["deepspeed.json"] = deepspeed_config(alloc.plan, run_batch(job, alloc),
                                                       lr=cfg.lr)
            env[ENV_DEEPSPEED_CONFIG] = str(jobdir / "deepspeed.json")
        except DeepSpeedPlanError as exc:  # the workload will refuse the plan itself
            log.warning("job %s: no DeepSpeed config for plan %s: %s", job.id,
                        alloc.plan.label(), exc)
    placement = dict(alloc.placement)
    if sum(placement.values()) != world:
        placement = {next(iter(placement), "local"): world}
    ranks = ranks_by_node(placement)
    per_rank = [rank_env(r, lr, lw) for _, r, lr, lw in ranks]
    cmd = workload_command(w.kind, w.command, jobdir, python)
    return LaunchSpec(job.id, action, world, alloc.gpu_type, dict(alloc.placement), cmd, env,
                      files["config.json"], str(jobdir), per_rank, kind=w.kind,
                      cwd=w.workdir or str(jobdir), launch_id=launch_id,
                      nodes=[n for n, *_ in ranks], files=files)


def torchrun_command(spec: LaunchSpec, nnodes: int = 1) -> list[str]:
    """The same group as one ``torchrun`` invocation (what a multi-node engine would run)."""
    per_node = spec.workers // max(1, nnodes)
    return ["torchrun", f"--nnodes={nnodes}", f"--nproc-per-node={per_node}",
            f"--master-addr={spec.env['MASTER_ADDR']}", f"--master-port={spec.env['MASTER_PORT']}",
            "-m", TRAINER_MODULE, spec.command[-1]]
