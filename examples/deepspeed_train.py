"""A user's own DeepSpeed training script that honours apportion's workload contract.

Run by ``apportion run`` on every rank of a job whose jobs YAML says::

    workload:
      kind: deepspeed
      command: [python, examples/deepspeed_train.py]

For kind ``deepspeed`` apportion writes DeepSpeed's JSON config for the
round's plan (``train_batch_size`` = the job's constant global batch, the
micro-batch and accumulation, the ZeRO stage and offload) and names it in
``APPORTION_DEEPSPEED_CONFIG``; the script passes it to
``deepspeed.initialize`` unchanged. Everything else is the contract:
torchrun's variables, ``APPORTION_ITERATIONS``, ``APPORTION_CHECKPOINT_DIR``
(DeepSpeed's own checkpoints, ``engine.save_checkpoint``; resumed with
``apportion.runtime.workers.checkpoint.load_deepspeed``, which loads tensors only),
``APPORTION_PROGRESS_FILE`` (through
``apportion.runtime.workload.report_progress``), SIGTERM = checkpoint and exit
0. On CPU it runs with gloo (``DS_ACCELERATOR=cpu`` is picked automatically
without a GPU).

Resizing: a ZeRO stage 0 checkpoint reloads on any data-parallel degree; ZeRO
stages 1-3 partition the optimizer state by rank, so a changed degree resumes
the model weights and restarts the optimizer state (DeepSpeed's universal
checkpoints lift that; see its documentation).
"""

from __future__ import annotations

import json
import os
import sys
import time

import deepspeed
import torch
import torch.distributed as dist
from apportion.runtime import workload
from apportion.runtime.workers.checkpoint import load_deepspeed
from torch import nn
from torch.nn import functional as F

VOCAB, SEQ, HIDDEN = 128, 16, 64


def samples(start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    xs = []
    for i in range(start, start + count):
        g = torch.Generator().manual_seed(1_000_003 + i)
        xs.append(torch.randint(0, VOCAB, (SEQ,), generator=g))
    x = torch.stack(xs)
    return x, (x + 1) % VOCAB


def main() -> int:
    with open(os.environ[workload.ENV_DEEPSPEED_CONFIG]) as fh:
        cfg = json.load(fh)
    plan = workload.plan()
    rank, world, dp = workload.rank(), workload.world_size(), int(plan["dp"])
    target = workload.iterations()
    ckdir = workload.checkpoint_dir()
    workload.stop_requested()  # SIGTERM handler first
    torch.set_num_threads(1)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(workload.device_index(torch.cuda.device_count()))
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, 4 * HIDDEN), nn.GELU(),
                          nn.Linear(4 * HIDDEN, VOCAB))
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=cfg)
    micro = int(cfg["train_micro_batch_size_per_gpu"])
    accumulation = int(cfg["gradient_accumulation_steps"])
    batch = int(cfg["train_batch_size"])
    start = 0
    if (ckdir / "latest").exists():
        saved = json.loads((ckdir / "apportion.json").read_text())
        zero = cfg["zero_optimization"]["stage"]
        same = saved.get("zero") == zero and (saved.get("dp") == dp or zero == 0)
        # tensors only: DeepSpeed's own loader unpickles anything, and a file planted in
        # the checkpoint folder would run as this job
        loaded = load_deepspeed(engine, ckdir, load_optimizer_states=same,
                                load_lr_scheduler_states=same, load_module_strict=True)
        start = int(((loaded or (None, None))[1] or {}).get("iteration", 0))

    def save(it: int) -> None:
        engine.save_checkpoint(str(ckdir), client_state={"iteration": it})  # collective
        if rank == 0:
            (ckdir / "apportion.json").write_text(json.dumps({
                "dp": dp, "zero": cfg["zero_optimization"]["stage"], "iteration": it}))
            workload.report_progress(it, checkpoint=True)
        policy.saved()

    policy = workload.CheckpointPolicy()
    device = engine.device
    it = start
    while it < target:
        flags = torch.tensor([float(workload.stop_requested()),
                              float(rank == 0 and policy.due(it) and it > start)], device=device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        if flags[0] > 0:
            break
        if flags[1] > 0:
            save(it)
        total = 0.0
        for k in range(accumulation):
            x, y = samples(it * batch + engine.global_rank * (batch // dp) + k * micro, micro)
            loss = F.cross_entropy(engine(x.to(device)).reshape(-1, VOCAB),
                                   y.to(device).reshape(-1))
            engine.backward(loss)
            engine.step()
            total += float(loss.detach()) / accumulation
        it += 1
        mean = torch.tensor([total], device=device)
        dist.all_reduce(mean)
        workload.report_progress(it, loss=float(mean) / world, zero=cfg["zero_optimization"]
                                 ["stage"])
        time.sleep(float(os.environ.get("EXAMPLE_STEP_SLEEP", "0")))
    save(it)
    return 0


if __name__ == "__main__":
    sys.exit(main())
