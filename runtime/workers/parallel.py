"""Parallel strategies for the torch worker: DDP, FSDP (ZeRO-like), tensor and pipeline parallel.

Each strategy wraps a freshly built module and exposes the same small surface
to the training loop (``forward_backward``, ``global_mean``, ``full_state``,
``load_full_state``, ``dp_rank``). Checkpoints always hold *full* (unsharded,
fully-qualified-name keyed) model and optimizer state, written through
``torch.distributed.checkpoint.state_dict``, so a job checkpointed under one
plan and world size resumes under any other: that is what resizing needs.

Pipeline parallelism lives in ``runtime.workers.pipeline_parallel`` (built on the
``Strategy`` here); ``runtime.workers.strategies.wrap`` picks the strategy for a plan.
What no strategy runs is refused by ``trainer.check_plan`` with a
:class:`PlanError`: PP combined with TP or ZeRO, TP combined with ZeRO, and
offload on CPU.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
import torch.distributed as dist
from apportion.runtime.workers.torch_nets import loss_fn
from torch import nn

from apportion.plans import ExecutionPlan

log = logging.getLogger(__name__)


class PlanError(ValueError):
    """A plan this backend cannot run as given (the plan is never changed to make it fit)."""


def settle(device: torch.device) -> None:
    """Wait for the device's queued kernels, so a wall-clock interval holds the work it
    timed (CUDA runs asynchronously: without this a forward pass times its launches only);
    nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Strategy:
    """Single process or DDP: every rank holds the whole model."""

    name = "ddp"

    def __init__(self, module: nn.Module, plan: ExecutionPlan, rank: int, world: int) -> None:
        self.base = module
        self.plan, self.rank, self.world = plan, rank, world
        self.dp_rank = rank
        self.model: nn.Module = module
        self.device = _device_of(module)
        if world > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP
            cuda = self.device.type == "cuda"
            self.model = DDP(module, device_ids=[self.device.index] if cuda else None)

    def parameters(self) -> Any:
        return self.model.parameters()

    def _no_sync(self, sync: bool) -> Any:
        import contextlib
        if sync or self.world == 1:
            return contextlib.nullcontext()
        return self.model.no_sync()  # type: ignore[operator]

    fwd_s: float | None = 0.0  # forward seconds since the step began (None: not separable)

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor, scale: float, sync: bool) -> float:
        with self._no_sync(sync):
            t0 = time.perf_counter()
            loss = loss_fn(self.model(x), y)
            settle(self.device)
            self.fwd_s = (self.fwd_s or 0.0) + time.perf_counter() - t0
            (loss * scale).backward()
        self.after_backward(sync)
        return float(loss.detach())

    def after_backward(self, sync: bool) -> None:
        """Hook for strategies that synchronise gradients by hand."""

    def global_mean(self, value: float) -> float:
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return float(t.item()) / self.world

    def full_state(self, opt: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
        """Full model and optimizer state keyed by parameter name (every DDP rank holds it)."""
        return _plain_full_state(self.base, opt)

    def load_full_state(self, model_sd: dict[str, Any], opt: torch.optim.Optimizer,
                        opt_sd: dict[str, Any]) -> None:
        _plain_load(self.base, opt, model_sd, opt_sd)


class _ShardedState:
    """Full state through ``torch.distributed.checkpoint.state_dict`` (gathers DTensor shards;
    a collective, so every rank calls it). Imported lazily: it costs seconds of start-up."""

    model: nn.Module

    def full_state(self, opt: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
        return get_state_dict(self.model, opt,
                              options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def load_full_state(self, model_sd: dict[str, Any], opt: torch.optim.Optimizer,
                        opt_sd: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict
        set_state_dict(self.model, opt, model_state_dict=model_sd, optim_state_dict=opt_sd,
                       options=StateDictOptions(full_state_dict=True))


def _plain_full_state(module: nn.Module, opt: torch.optim.Optimizer
                      ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The same FQN-keyed layout ``get_state_dict`` writes, without a process group."""
    names = {id(p): n for n, p in module.named_parameters()}
    raw = opt.state_dict()
    order = [p for g in opt.param_groups for p in g["params"]]
    state = {names[id(order[i])]: {k: (v.to("cpu", copy=True) if torch.is_tensor(v) else v)
                                   for k, v in s.items()} for i, s in raw["state"].items()}
    groups = []
    for g in raw["param_groups"]:
        gg = {k: v for k, v in g.items() if k != "params"}
        gg["params"] = [names[id(order[i])] for i in g["params"]]
        groups.append(gg)
    return ({k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()},
            {"state": state, "param_groups": groups})


def _plain_load(module: nn.Module, opt: torch.optim.Optimizer, model_sd: dict[str, Any],
                opt_sd: dict[str, Any]) -> None:
    module.load_state_dict(model_sd)
    index = {n: i for i, (n, _) in enumerate(module.named_parameters())}
    by_name = dict(module.named_parameters())
    order = [p for g in opt.param_groups for p in g["params"]]
    pos = {id(p): i for i, p in enumerate(order)}
    state = {pos[id(by_name[n])]: s for n, s in opt_sd["state"].items() if n in index}
    groups = []
    for g in opt_sd["param_groups"]:
        gg = {k: v for k, v in g.items() if k != "params"}
        gg["params"] = [pos[id(by_name[n])] for n in g["params"]]
        groups.append(gg)
    opt.load_state_dict({"state": state, "param_groups": groups})


class FsdpStrategy(_ShardedState, Strategy):
    """ZeRO-like sharding with FSDP2 ``fully_shard``: stage 3 reshards parameters after the
    forward pass; stages 1 and 2 keep them gathered until the backward pass (ZeRO-2-like)."""

    name = "fsdp"

    def __init__(self, module: nn.Module, plan: ExecutionPlan, rank: int, world: int) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        self.base, self.plan, self.rank, self.world = module, plan, rank, world
        self.dp_rank = rank
        self.device = _device_of(module)
        mesh = init_device_mesh(self.device.type, (world,))
        reshard = plan.zero_stage == 3
        for blk in getattr(module, "blocks", []):
            fully_shard(blk, mesh=mesh, reshard_after_forward=reshard)
        self.model = fully_shard(module, mesh=mesh, reshard_after_forward=reshard)  # type: ignore[assignment]

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor, scale: float, sync: bool) -> float:
        self.model.set_requires_gradient_sync(sync)  # type: ignore[operator]
        t0 = time.perf_counter()
        loss = loss_fn(self.model(x), y)
        settle(self.device)
        self.fwd_s = (self.fwd_s or 0.0) + time.perf_counter() - t0
        (loss * scale).backward()
        return float(loss.detach())


class TensorParallelStrategy(_ShardedState, Strategy):
    """Megatron-style TP inside each block (q/k/v and fc1 column-wise, o and fc2 row-wise)
    on a (dp, tp) device mesh; gradients are averaged over the dp dimension by hand."""

    name = "tp"

    def __init__(self, module: nn.Module, plan: ExecutionPlan, rank: int, world: int) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )
        self.base, self.plan, self.rank, self.world = module, plan, rank, world
        heads = int(module.shape.heads)  # type: ignore[union-attr,arg-type]
        if heads % plan.tp:
            raise ValueError(f"tensor parallel degree {plan.tp} does not divide {heads} heads")
        self.device = _device_of(module)
        mesh = init_device_mesh(self.device.type, (plan.dp, plan.tp), mesh_dim_names=("dp", "tp"))
        self.dp_rank = mesh.get_local_rank("dp")
        self.dp_group = mesh.get_group("dp") if plan.dp > 1 else None
        layout = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
                  "attn.v": ColwiseParallel(), "attn.o": RowwiseParallel(),
                  "fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
        for blk in module.blocks:  # type: ignore[union-attr]
            parallelize_module(blk, mesh["tp"], layout)
        self.model = module

    def after_backward(self, sync: bool) -> None:
        if not sync or self.dp_group is None:
            return
        for p in self.model.parameters():
            if p.grad is None:
                continue
            g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            dist.all_reduce(g, group=self.dp_group)
            g.div_(self.plan.dp)


def _device_of(module: nn.Module) -> torch.device:
    """Where the module's parameters live (the worker moved it to its device before wrapping)."""
    p = next(module.parameters(), None)
    return p.device if p is not None else torch.device("cpu")
