"""DeepSpeed: a config and launch command from an execution plan, and a training entry.

:func:`deepspeed_config` turns a plan into DeepSpeed's JSON config without
changing it: ``train_batch_size`` is the job's constant global batch,
``gradient_accumulation_steps`` the plan's accumulation, the micro-batch per
GPU follows (DeepSpeed checks ``train_batch_size = micro * accumulation *
dp``), the ZeRO stage and offload come from the plan, and activation
checkpointing from its flag. :func:`launch_command` is the ``torchrun``
command that runs :func:`main` here (``deepspeed`` the launcher works too).

On CPU: install with ``DS_BUILD_OPS=0``, run with ``DS_ACCELERATOR=cpu`` and
gloo; DeepSpeed builds a communication op on first use (set
``TORCH_EXTENSIONS_DIR`` to a reused cache). Keep it behind the ``deepspeed``
extra; pipeline and tensor parallel plans are refused here (DeepSpeed's
pipeline engine needs a ``PipelineModule`` this entry does not build).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from apportion.runtime import workload as wl
from apportion.runtime.workers.train_config import TrainConfig, write_json

from apportion.plans import ExecutionPlan

log = logging.getLogger(__name__)


class DeepSpeedPlanError(ValueError):
    """A plan this DeepSpeed entry cannot run as given."""


def deepspeed_config(plan: ExecutionPlan, global_batch_size: int, lr: float = 1e-3,
                     device: str = "cpu") -> dict[str, Any]:
    """DeepSpeed's config for ``plan`` with the constant global batch."""
    dp = plan.dp
    steps = plan.accumulation_steps  # one-stage plans: their micro-batches accumulate too
    if global_batch_size % (dp * steps):
        raise DeepSpeedPlanError(f"global batch {global_batch_size} is not divisible by "
                                 f"dp*accumulation = {dp}*{steps}")
    cfg: dict[str, Any] = {
        "train_batch_size": global_batch_size,
        "train_micro_batch_size_per_gpu": global_batch_size // (dp * steps),
        "gradient_accumulation_steps": steps,
        "optimizer": {"type": "AdamW", "params": {"lr": lr, "torch_adam": True}},
        "zero_optimization": {"stage": plan.zero_stage},
        "steps_per_print": 1_000_000,
        "wall_clock_breakdown": False,
    }
    if plan.offload:
        if plan.zero_stage == 0:
            raise DeepSpeedPlanError("offload needs ZeRO stage >= 1 in DeepSpeed")
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
        if plan.zero_stage == 3:
            cfg["zero_optimization"]["offload_param"] = {"device": "cpu", "pin_memory": False}
    if plan.checkpointing:
        cfg["activation_checkpointing"] = {"partition_activations": plan.zero_stage == 3,
                                           "contiguous_memory_optimization": False}
    if device == "cuda":
        cfg["bf16"] = {"enabled": True}
    if plan.pp > 1:
        cfg["pipeline"] = {"stages": plan.pp, "micro_batches": plan.micro_batches}
    return cfg


def launch_command(plan: ExecutionPlan, train_config: str | Path, ds_config: str | Path,
                   master_port: int = 29500, python: str = sys.executable) -> list[str]:
    """``torchrun`` for :func:`main` with one process per GPU of the plan."""
    return [python, "-m", "torch.distributed.run", f"--nproc-per-node={plan.gpus}",
            f"--master-port={master_port}", "-m", "apportion.runtime.workers.deepspeed_config",
            str(train_config), str(ds_config)]


def launch_env(cache_dir: str | Path | None = None) -> dict[str, str]:
    env = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    if cache_dir is not None:
        env["TORCH_EXTENSIONS_DIR"] = str(cache_dir)
    return env


def build_comm_op() -> None:
    """Build (or load) DeepSpeed's JIT-compiled shared-memory collective op safely.

    DeepSpeed's CPU backend compiles that op on first use under torch's ``FileBaton``:
    a ``lock`` file in the build folder that a build killed midway (a preempted job, a
    timed-out test) leaves behind, after which every later DeepSpeed start on the
    machine waits on it forever. Here the build runs under an ``flock`` beside it, which
    the kernel releases when its holder dies; holding it, no builder started this way is
    alive, so a leftover baton is stale and is removed before building. Ranks of one job
    take the lock in turn; after the first build each load is a ninja no-op.
    """
    import fcntl

    from deepspeed.comm.torch import build_shm_op
    from torch.utils.cpp_extension import _get_build_directory

    build = Path(_get_build_directory("deepspeed_shm_comm", verbose=False))
    with open(build.parent / ".apportion-build.lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        (build / "lock").unlink(missing_ok=True)
        build_shm_op()


def _append(path: Path, rec: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(rec, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    """apportion's DeepSpeed trainer: ``CONFIG.json [DS.json]`` on every rank (torchrun's
    variables), the job's catalog model under the plan's ZeRO stage.

    What ``apportion run`` launches for ``workload.kind: deepspeed`` without a
    command. It honours the workload contract: DeepSpeed's config from
    ``DS.json``, else ``APPORTION_DEEPSPEED_CONFIG``, else built from the plan;
    resumes from DeepSpeed's checkpoint in the checkpoint directory (the
    optimizer state only when the ZeRO stage and, for stages 1-3, the
    data-parallel degree are unchanged; otherwise the weights, with a fresh
    optimizer); checkpoints periodically, on SIGTERM (then exits 0) and at the
    target; rank 0 appends progress lines.
    """
    args = sys.argv[1:] if argv is None else argv
    import deepspeed
    import torch
    import torch.distributed as dist
    from apportion.runtime.workers.checkpoint import force_weights_only
    from apportion.runtime.workers.torch_nets import build_net
    force_weights_only()  # before DeepSpeed loads anything
    cfg = TrainConfig.load(args[0])
    plan = cfg.execution_plan
    if plan.tp > 1 or plan.pp > 1:
        raise DeepSpeedPlanError(f"plan {plan.label()}: this DeepSpeed entry runs DP/ZeRO only")
    ds_cfg = _ds_config(args, cfg)
    wl.stop_requested()  # SIGTERM: checkpoint at the next step boundary
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(wl.device_index(torch.cuda.device_count()))
    build_comm_op()  # a stale build lock must never hang the job
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if world != plan.gpus:
        raise DeepSpeedPlanError(f"plan needs {plan.gpus} workers, {world} launched")
    net = build_net(cfg.model, cfg.seed)
    engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(),
                                           config=ds_cfg)
    workdir = Path(cfg.workdir)
    ckdir = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else workdir / "checkpoint"
    progress = Path(cfg.progress_file) if cfg.progress_file else workdir / wl.PROGRESS_FILE_NAME
    zero = int(ds_cfg["zero_optimization"]["stage"])
    start = _resumed_iteration(engine, ckdir, zero, plan.dp)
    policy = wl.CheckpointPolicy(cfg.checkpoint_every, cfg.checkpoint_interval_s)

    def save(it: int) -> None:
        engine.save_checkpoint(str(ckdir), client_state={"iteration": it})
        if rank == 0:
            write_json(ckdir / "apportion.json", {"dp": plan.dp, "zero": zero, "iteration": it})
            _append(progress, {"iteration": it, "checkpoint": True, "wall": time.time()})
        policy.saved()

    device = engine.device
    B, m = cfg.global_batch_size, ds_cfg["train_micro_batch_size_per_gpu"]
    losses: list[float] = []
    it = start
    while it < cfg.iterations:
        flags = torch.tensor([float(wl.stop_requested()),
                              float(rank == 0 and policy.due(it) and it > start)], device=device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        if flags[0] > 0:
            break
        if flags[1] > 0:
            save(it)
        t0 = time.perf_counter()
        total = _train_step(engine, cfg, it * B + rank * (B // plan.dp), m, device)
        t = torch.tensor([total], device=device)
        dist.all_reduce(t)
        losses.append(float(t) / world)
        it += 1
        if rank == 0:
            _append(progress, {"iteration": it, "loss": losses[-1], "wall": time.time(),
                               "iter_time_s": time.perf_counter() - t0, "zero": zero})
    save(it)
    if rank == 0:
        write_json(workdir / "deepspeed_losses.json", {"losses": losses, "zero_stage": zero,
                                                       "resumed_from": start})
    return 0


def _ds_config(args: list[str], cfg: TrainConfig) -> dict[str, Any]:
    """DeepSpeed's config: ``DS.json`` (the second argument), else the file
    ``APPORTION_DEEPSPEED_CONFIG`` names, else built from the plan."""
    ds_path = args[1] if len(args) > 1 else os.environ.get(wl.ENV_DEEPSPEED_CONFIG)
    return (json.loads(Path(ds_path).read_text()) if ds_path else
            deepspeed_config(cfg.execution_plan, cfg.global_batch_size, lr=cfg.lr))


def _resumed_iteration(engine: Any, ckdir: Path, zero: int, dp: int) -> int:
    """Resume from DeepSpeed's checkpoint in ``ckdir`` (tensors only: a planted pickle
    never runs), the optimizer state only when the ZeRO stage and, for stages 1-3, the
    data-parallel degree are unchanged; the iteration it reached (0: none)."""
    from apportion.runtime.workers.checkpoint import load_deepspeed

    start = 0
    if (ckdir / "latest").exists():  # tensors only: a planted pickle never runs
        saved = json.loads((ckdir / "apportion.json").read_text())
        same = saved.get("zero") == zero and (saved.get("dp") == dp or zero == 0)
        loaded = load_deepspeed(engine, ckdir, load_optimizer_states=same,
                                load_lr_scheduler_states=same)
        start = int(((loaded or (None, None))[1] or {}).get("iteration", 0))
    return start


def _train_step(engine: Any, cfg: TrainConfig, first_sample: int, m: int,
                device: Any) -> float:
    """One iteration's micro-batches of ``m`` samples from ``first_sample``, each
    backward and step through the engine (which accumulates); their mean loss."""
    from apportion.runtime.workers.torch_nets import batch, loss_fn

    total = 0.0
    steps = cfg.execution_plan.accumulation_steps
    for k in range(steps):
        x, y = batch(cfg.model, cfg.seed, first_sample + k * m, m)
        loss = loss_fn(engine(x.to(device)), y.to(device))
        engine.backward(loss)
        engine.step()
        total += float(loss.detach()) / steps
    return total


if __name__ == "__main__":
    sys.exit(main())
