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
from pathlib import Path
from typing import Any

from apportion.plans import ExecutionPlan

log = logging.getLogger(__name__)


class DeepSpeedPlanError(ValueError):
    """A plan this DeepSpeed entry cannot run as given."""


def deepspeed_config(plan: ExecutionPlan, global_batch_size: int, lr: float = 1e-3,
                     device: str = "cpu") -> dict[str, Any]:
    """DeepSpeed's config for ``plan`` with the constant global batch."""
    dp = plan.dp
    if global_batch_size % (dp * plan.accumulation):
        raise DeepSpeedPlanError(f"global batch {global_batch_size} is not divisible by "
                                 f"dp*accumulation = {dp}*{plan.accumulation}")
    cfg: dict[str, Any] = {
        "train_batch_size": global_batch_size,
        "train_micro_batch_size_per_gpu": global_batch_size // (dp * plan.accumulation),
        "gradient_accumulation_steps": plan.accumulation,
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
            f"--master-port={master_port}", "-m", "apportion.runtime.deepspeed_config",
            str(train_config), str(ds_config)]


def launch_env(cache_dir: str | Path | None = None) -> dict[str, str]:
    env = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    if cache_dir is not None:
        env["TORCH_EXTENSIONS_DIR"] = str(cache_dir)
    return env


def main(argv: list[str] | None = None) -> int:
    """Train a catalog model under DeepSpeed: ``CONFIG.json DS.json`` (under torchrun)."""
    args = sys.argv[1:] if argv is None else argv
    import deepspeed
    import torch
    from apportion.runtime.launch import TrainConfig, write_json
    from apportion.runtime.torch_nets import batch, build_net, loss_fn
    cfg = TrainConfig.load(args[0])
    ds_cfg = json.loads(Path(args[1]).read_text())
    plan = cfg.execution_plan
    if plan.tp > 1 or plan.pp > 1:
        raise DeepSpeedPlanError(f"plan {plan.label()}: this DeepSpeed entry runs DP/ZeRO only")
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if world != plan.gpus:
        raise DeepSpeedPlanError(f"plan needs {plan.gpus} workers, {world} launched")
    net = build_net(cfg.model, cfg.seed)
    engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(),
                                           config=ds_cfg)
    B, m = cfg.global_batch_size, ds_cfg["train_micro_batch_size_per_gpu"]
    losses = []
    for it in range(cfg.iterations):
        total = 0.0
        for k in range(plan.accumulation):
            x, y = batch(cfg.model, cfg.seed, it * B + rank * (B // plan.dp) + k * m, m)
            loss = loss_fn(engine(x), y)
            engine.backward(loss)
            engine.step()
            total += float(loss.detach()) / plan.accumulation
        t = torch.tensor([total])
        torch.distributed.all_reduce(t)
        losses.append(float(t) / world)
    if rank == 0:
        write_json(Path(cfg.workdir) / "deepspeed_losses.json", {"losses": losses,
                                                                 "zero_stage": plan.zero_stage})
    return 0


if __name__ == "__main__":
    sys.exit(main())
