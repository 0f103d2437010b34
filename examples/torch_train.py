"""A user's own torch training script that honours apportion's workload contract.

Run by ``apportion run`` on every rank of a job whose jobs YAML says::

    workload:
      kind: torchrun
      command: [python, examples/torch_train.py]

(or by hand under ``torchrun``). It uses only the contract: torchrun's
variables, ``APPORTION_PLAN`` (it honours DP, FSDP for ``zero >= 1`` and
tensor parallelism for ``tp > 1``, combined with DP), the global batch,
``APPORTION_ITERATIONS``, ``APPORTION_CHECKPOINT_DIR`` and
``APPORTION_PROGRESS_FILE``, through the small helpers of
``apportion.runtime.workload``. It resumes from its checkpoint directory
(full, unsharded state keyed by parameter name, so a job resized from 2 ranks
to 1 or from FSDP to TP continues), checkpoints periodically and on SIGTERM
(then exits 0), and exits 0 at the target. On CUDA each rank pins
``cuda:LOCAL_RANK`` and uses NCCL; otherwise gloo on CPU.

The model is a small token MLP language model learning ``next = (token + 1) mod V``
from synthetic data keyed by the global sample index, so the global batch is
the same samples whatever the plan. Environment knobs (``workload.env``):
``EXAMPLE_HIDDEN`` (64), ``EXAMPLE_LAYERS`` (2), ``EXAMPLE_LR`` (3e-3),
``EXAMPLE_STEP_SLEEP`` (seconds per step, for tests that must catch a job
mid-run; 0), ``EXAMPLE_FAIL_AT`` (raise at this iteration: a crashing
workload, for tests), ``EXAMPLE_HOLD`` (``WORLD:ITERATION``, ``*`` for any world: the job's first
launch, at that world size, stops stepping at that iteration until the scheduler stops,
resizes or cancels the job, so a test of a resize waits for events, never races the job's
end; a relaunch never holds).
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
from apportion.runtime import workload
from torch import nn
from torch.nn import functional as F

VOCAB, SEQ = 128, 16


class Block(nn.Module):
    def __init__(self, h: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, 4 * h)
        self.fc2 = nn.Linear(4 * h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class TokenMLP(nn.Module):
    def __init__(self, hidden: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, hidden)
        self.blocks = nn.ModuleList(Block(hidden) for _ in range(layers))
        self.head = nn.Linear(hidden, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


def samples(start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Global samples start .. start+count-1 (the same tensors whatever the plan)."""
    xs = []
    for i in range(start, start + count):
        g = torch.Generator().manual_seed(1_000_003 + i)
        xs.append(torch.randint(0, VOCAB, (SEQ,), generator=g))
    x = torch.stack(xs)
    return x, (x + 1) % VOCAB


def main() -> int:
    plan = workload.plan()
    dp, tp, zero = int(plan["dp"]), int(plan["tp"]), int(plan.get("zero", 0))
    accumulation = int(plan.get("accumulation", 1))
    rank, world = workload.rank(), workload.world_size()
    if dp * tp * int(plan.get("pp", 1)) != world:
        print(f"plan {plan} does not match WORLD_SIZE={world}", file=sys.stderr)
        return 2
    if int(plan.get("pp", 1)) != 1 or (tp > 1 and zero):
        print(f"this script runs DP, FSDP or TP plans, not {plan}", file=sys.stderr)
        return 2
    batch = workload.global_batch_size(16)
    if batch % (dp * accumulation):
        print(f"global batch {batch} does not split over dp={dp} x accumulation={accumulation}",
              file=sys.stderr)
        return 2
    micro = batch // (dp * accumulation)
    target = workload.iterations()
    ckpt_file = workload.checkpoint_dir() / "model.pt"
    workload.stop_requested()  # install the SIGTERM handler before anything slow
    fail_at = int(os.environ.get("EXAMPLE_FAIL_AT", "-1"))
    step_sleep = float(os.environ.get("EXAMPLE_STEP_SLEEP", "0"))
    hold_world, _, hold_at = os.environ.get("EXAMPLE_HOLD", "0:0").partition(":")

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(workload.device_index(torch.cuda.device_count()))
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo")
    torch.manual_seed(0)
    model = TokenMLP(int(os.environ.get("EXAMPLE_HIDDEN", "64")),
                     int(os.environ.get("EXAMPLE_LAYERS", "2"))).to(device)

    dp_rank, dp_group = rank, None
    wrapped: nn.Module = model
    if world > 1:
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh(device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
        dp_rank = mesh.get_local_rank("dp")
        if tp > 1:  # Megatron-style: fc1 by output column, fc2 by input row
            from torch.distributed.tensor.parallel import (
                ColwiseParallel,
                RowwiseParallel,
                parallelize_module,
            )
            for b in model.blocks:
                parallelize_module(b, mesh["tp"], {"fc1": ColwiseParallel(),
                                                   "fc2": RowwiseParallel()})
            dp_group = mesh.get_group("dp") if dp > 1 else None
        elif zero:  # ZeRO-like sharding
            from torch.distributed.fsdp import fully_shard
            for b in model.blocks:
                fully_shard(b, mesh=mesh["dp"], reshard_after_forward=zero == 3)
            fully_shard(model, mesh=mesh["dp"], reshard_after_forward=zero == 3)
        else:
            from torch.nn.parallel import DistributedDataParallel
            wrapped = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    opt = torch.optim.AdamW(model.parameters(), lr=float(os.environ.get("EXAMPLE_LR", "3e-3")))

    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_state_dict,
        set_state_dict,
    )
    start = 0
    if ckpt_file.exists():  # resume: full state, whatever plan wrote it
        saved = torch.load(ckpt_file, map_location="cpu", weights_only=True)
        set_state_dict(model, opt, model_state_dict=saved["model"],
                       optim_state_dict=saved["optim"],
                       options=StateDictOptions(full_state_dict=True))
        start = int(saved["iteration"])

    def save(it: int) -> None:
        msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True,
                                                                       cpu_offload=True))
        if rank == 0:
            tmp = ckpt_file.with_suffix(".tmp")
            torch.save({"model": msd, "optim": osd, "iteration": it}, tmp)
            os.replace(tmp, ckpt_file)  # atomic: a kill leaves the old checkpoint or the new
            workload.report_progress(it, checkpoint=True)
        if world > 1:
            dist.barrier()
        policy.saved()

    def agree(*flags: bool) -> list[bool]:
        """Every rank acts on rank 0's clock and signals: one all-reduce (MAX) per step."""
        t = torch.tensor([float(f) for f in flags], device=device)
        if world > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return [bool(v > 0) for v in t.tolist()]

    policy = workload.CheckpointPolicy()
    it = start
    while it < target:
        stop, due = agree(workload.stop_requested(), rank == 0 and policy.due(it) and it > start)
        if stop:
            break
        if hold_world in ("*", str(world)) and start == 0 and int(hold_at) <= it:
            time.sleep(0.1)  # held: only a stop (the scheduler's) ends this
            continue
        if due:
            save(it)
        if it == fail_at:
            raise RuntimeError(f"EXAMPLE_FAIL_AT: failing on purpose at iteration {it}")
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for k in range(accumulation):
            x, y = samples(it * batch + dp_rank * (batch // dp) + k * micro, micro)
            x, y = x.to(device), y.to(device)
            last = k == accumulation - 1
            ctx = wrapped.no_sync() if (not last and hasattr(wrapped, "no_sync")) else _null()
            if zero and world > 1 and tp == 1:
                model.set_requires_gradient_sync(last)  # type: ignore[operator]
            with ctx:
                loss = F.cross_entropy(wrapped(x).reshape(-1, VOCAB), y.reshape(-1))
                (loss / accumulation).backward()
            total += float(loss.detach()) / accumulation
        if dp_group is not None:  # TP with DP replicas: average gradients over the dp group
            for p in model.parameters():
                if p.grad is not None:
                    g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                    dist.all_reduce(g, group=dp_group)
                    g.div_(dp)
        opt.step()
        it += 1
        mean = torch.tensor([total], device=device)
        if world > 1:
            dist.all_reduce(mean)
            mean /= world
        workload.report_progress(it, loss=float(mean), world=world)
        if step_sleep:
            time.sleep(step_sleep)
    save(it)
    if world > 1:
        dist.destroy_process_group()
    return 0


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    sys.exit(main())

