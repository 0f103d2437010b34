"""Hydra's pilot-run partitioning (Algorithm 1) on a real torch model.

The model is an ordered list of layers (the cut points). Layer by layer, a
single mini-batch is pushed forward through the next layer and a tensor of the
output's shape is back-propagated through it *without freeing* what the
earlier layers of the shard hold, so the shard's footprint is the running sum.
When adding a layer would exceed the budget (device memory less the
double-buffer reserve), the shard is cut before it and a new shard starts.
Each shard's forward and backward unit times are then measured for the
scheduler.

On CPU the "device" has no allocator to fail, so the footprint is *measured*
and compared with a configurable byte budget: parameter bytes, gradient bytes,
optimizer-state bytes (a real optimizer step on a copy of the layer), and
activation bytes (every tensor autograd saves for backward, caught with
``saved_tensors_hooks``, plus the layer's output). On CUDA the allocator's own
peak (``torch.cuda.max_memory_allocated``) is used and an out-of-memory error
ends the shard, as in the paper.

torch is imported lazily so the package imports without the torch extra.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from apportion.formulations.shards import DEFAULT_BUFFER_FRACTION, chain_runtimes

from apportion.spilling import greedy_shards

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


@dataclass
class OptimSpec:
    """An element-wise optimizer (so per-shard optimizers equal one whole-model optimizer).

    The kinds and hyper-parameters are the built-in trainer's (``workload.train``), so a
    spilled run of a job steps exactly as its whole run would. Gradient clipping by a
    global norm is not element-wise and has no place here."""

    kind: str = "sgd"  # "sgd", "adam" or "adamw"
    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0

    def make(self, params: Any) -> torch.optim.Optimizer | None:
        """The optimizer over ``params``; None when there is nothing to train."""
        import torch

        params = list(params)
        if not params:
            return None

        if self.kind == "sgd":
            return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum,
                                   weight_decay=self.weight_decay, foreach=False)
        if self.kind == "adam":
            return torch.optim.Adam(params, lr=self.lr, weight_decay=self.weight_decay,
                                    foreach=False)
        if self.kind == "adamw":
            return torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay,
                                     foreach=False)
        raise ValueError(f"unknown optimizer {self.kind!r}")


@dataclass
class ShardProfile:
    """One shard: layers [start, stop), its measured bytes and unit runtimes."""

    start: int
    stop: int
    param_bytes: int = 0
    grad_bytes: int = 0
    optim_bytes: int = 0
    activation_bytes: int = 0
    forward_s: float = 0.0
    backward_s: float = 0.0

    @property
    def total_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optim_bytes + self.activation_bytes


@dataclass
class Partition:
    """Algorithm 1's output: shard boundaries and per-shard profiles."""

    shards: list[ShardProfile]
    budget_bytes: float
    device: str
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def boundaries(self) -> list[int]:
        """Layer index where each shard starts (the paper's array A of cut points)."""
        return [s.start for s in self.shards]

    def unit_runtimes(self, minibatches: int, epochs: int = 1) -> list[float]:
        """The model's chain of unit runtimes for the scheduler."""
        return chain_runtimes([s.forward_s for s in self.shards],
                              [s.backward_s for s in self.shards], minibatches, epochs)

    def unit_memory(self, minibatches: int, epochs: int = 1) -> list[float]:
        one = [float(s.total_bytes) for s in self.shards]
        return (one + one[::-1]) * (minibatches * epochs)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def layer_footprint(layer: torch.nn.Module, x: torch.Tensor, optim: OptimSpec
                    ) -> tuple[dict[str, int], torch.Tensor]:
    """Measured bytes of one layer trained on ``x`` (on a copy; ``layer`` is untouched)
    and its output (detached) for the next layer."""
    import torch

    work = copy.deepcopy(layer)
    params = [p for p in work.parameters() if p.requires_grad]
    own = {p.data_ptr() for p in work.parameters()}
    saved = {"bytes": 0}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.data_ptr() not in own:  # weights saved for backward are not activations
            saved["bytes"] += _nbytes(t)
        return t

    inp = x.detach().requires_grad_(x.is_floating_point())
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = work(inp)
    out.backward(torch.randn_like(out) if out.is_floating_point() else None)
    opt = optim.make(params)
    state = 0
    if opt is not None:
        opt.step()
        state = sum(_nbytes(v) for st in opt.state.values() for v in st.values()
                    if isinstance(v, torch.Tensor) and v.dim() > 0)
    sizes = {
        "param": sum(_nbytes(p) for p in work.parameters()),
        "grad": sum(_nbytes(p.grad) for p in params if p.grad is not None),
        "optim": state,
        "activation": saved["bytes"] + _nbytes(out),
    }
    return sizes, out.detach()


def time_units(layers: Sequence[torch.nn.Module], x: torch.Tensor, loss_fn: Callable[..., Any] | None,
               y: torch.Tensor | None, optim: OptimSpec, repeats: int = 3) -> tuple[float, float]:
    """Median forward-unit and backward-unit seconds of a shard, as the spilled trainer runs
    them: forward without autograd; backward = forward with autograd (recompute),
    backward pass and the shard's optimizer step. Runs on a copy."""
    import torch

    shard = copy.deepcopy(torch.nn.Sequential(*layers))
    opt = optim.make(list(shard.parameters()))
    fwd, bwd = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        with torch.no_grad():
            out = shard(x)
        fwd.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        inp = x.detach().requires_grad_(x.is_floating_point())
        out = shard(inp)
        if loss_fn is not None and y is not None:
            loss_fn(out, y).backward()
        else:
            out.backward(torch.ones_like(out))
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        bwd.append(time.perf_counter() - t0)
    return sorted(fwd)[len(fwd) // 2], sorted(bwd)[len(bwd) // 2]


def partition(layers: Sequence[torch.nn.Module], sample: torch.Tensor, budget_bytes: float,
              optim: OptimSpec | None = None, buffer_fraction: float = DEFAULT_BUFFER_FRACTION,
              loss_fn: Callable[..., Any] | None = None, target: torch.Tensor | None = None,
              device: str = "cpu", repeats: int = 3, double_buffer: bool = False) -> Partition:
    """Algorithm 1: grow each shard layer by layer until the next layer would exceed
    ``budget_bytes * (1 - buffer_fraction)``; then time every shard's units.

    ``budget_bytes`` is the device's memory (on CUDA, the allocator's limit is
    enforced too). Raises MemoryError if a single layer does not fit.

    ``double_buffer``: the spilled trainer will promote the next shard's parameters
    into the reserve while this shard computes, so a shard's parameters must also fit
    the reserve (``budget_bytes * buffer_fraction``); without this cut a 1 GiB budget
    peaked at 1.22 GB double-buffered on an H200.
    """

    optim = optim or OptimSpec()
    limit = budget_bytes * (1.0 - buffer_fraction)
    reserve = budget_bytes * buffer_fraction if double_buffer else float("inf")
    if device.startswith("cuda"):
        return _partition_cuda(layers, sample, limit, budget_bytes, optim, loss_fn, target, device,
                               repeats, reserve)
    # measure every layer on its real input, then cut by the one rule (apportion.spilling)
    measured: list[dict[str, int]] = []
    inputs: list[int] = []
    x = sample
    for layer in layers:
        sizes, out = layer_footprint(layer, x, optim)
        measured.append(sizes)
        inputs.append(_nbytes(x))
        x = out
    cuts = greedy_shards([sum(m.values()) for m in measured], [m["param"] for m in measured],
                         inputs, budget_bytes, buffer_fraction, double_buffer)
    shards = []
    for a, b in cuts:
        s = ShardProfile(a, b)
        for m in measured[a:b]:
            s.param_bytes += m["param"]
            s.grad_bytes += m["grad"]
            s.optim_bytes += m["optim"]
            s.activation_bytes += m["activation"]
        s.activation_bytes += inputs[a]  # a shard also holds its input batch
        shards.append(s)
    _time_shards(layers, shards, sample, loss_fn, target, optim, repeats)
    log.info("pilot partition: %d layers -> %d shards %s under %.0f B", len(layers), len(shards),
             [s.start for s in shards], limit)
    return Partition(shards, budget_bytes, device, {"limit_bytes": limit,
                                                    "reserve_bytes": _finite(reserve)})


def _check_reserve(i: int, param_bytes: int, reserve: float) -> None:
    if param_bytes > reserve:
        raise MemoryError(f"layer {i}'s parameters ({param_bytes} B) do not fit the double-buffer "
                          f"reserve ({reserve:.0f} B): raise buffer_fraction or train without "
                          "double buffering")


def _finite(v: float) -> float | None:
    return None if v == float("inf") else v


def _param_bytes(layer: torch.nn.Module) -> int:
    return sum(_nbytes(p) for p in layer.parameters())


def _time_shards(layers: Sequence[torch.nn.Module], shards: list[ShardProfile],
                 sample: torch.Tensor, loss_fn: Callable[..., Any] | None,
                 target: torch.Tensor | None, optim: OptimSpec, repeats: int) -> None:
    import torch

    x = sample
    for k, s in enumerate(shards):
        last = k == len(shards) - 1
        s.forward_s, s.backward_s = time_units(
            layers[s.start:s.stop], x, loss_fn if last else None, target if last else None,
            optim, repeats)
        with torch.no_grad():
            x = torch.nn.Sequential(*layers[s.start:s.stop])(x)


def _partition_cuda(layers: Sequence[torch.nn.Module], sample: torch.Tensor, limit: float,
                    budget_bytes: float, optim: OptimSpec, loss_fn: Callable[..., Any] | None,
                    target: torch.Tensor | None, device: str, repeats: int,
                    reserve: float = float("inf")) -> Partition:
    """Algorithm 1 with the CUDA allocator: keep the shard's layers, activations and
    gradients resident, read the peak after each layer, cut on OOM, over ``limit``, or
    when the shard's parameters would outgrow the double-buffer ``reserve``."""
    import torch

    dev = torch.device(device)
    shards: list[ShardProfile] = []
    start, x = 0, sample.to(dev)
    held: list[Any] = []

    def reset() -> int:
        held.clear()
        torch.cuda.empty_cache()
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        return torch.cuda.memory_allocated(dev)

    base = reset()
    i, ok_peak, params = 0, 0, 0
    while i < len(layers):
        own = _param_bytes(layers[i])
        _check_reserve(i, own, reserve)
        if params + own > reserve:  # the next shard's parameters would not prefetch
            shards.append(ShardProfile(start, i, activation_bytes=int(ok_peak)))
            start, params = i, 0
            base = reset()
        try:
            work = copy.deepcopy(layers[i]).to(dev)
            inp = x.detach().requires_grad_(x.is_floating_point())
            out = work(inp)
            out.backward(torch.randn_like(out))
            opt = optim.make([p for p in work.parameters() if p.requires_grad])
            if opt is not None:
                opt.step()
            held.append((work, inp, out, opt))  # "without freeing its memory"
            peak = torch.cuda.max_memory_allocated(dev) - base
            fits = peak <= limit
        except torch.cuda.OutOfMemoryError:
            fits, peak = False, -1
        if not fits:
            if i == start:
                raise MemoryError(f"layer {i} alone does not fit in {limit:.0f} B on {device}")
            shards.append(ShardProfile(start, i, activation_bytes=int(ok_peak)))
            start, params = i, 0
            base = reset()
            continue
        ok_peak = peak
        params += own
        x = out.detach()
        i += 1
    shards.append(ShardProfile(start, len(layers), activation_bytes=int(ok_peak)))
    reset()
    moved = [copy.deepcopy(layer).to(dev) for layer in layers]
    _time_shards(moved, shards, sample.to(dev), loss_fn,
                 target.to(dev) if target is not None else None, optim, repeats)
    return Partition(shards, budget_bytes, device, {"limit_bytes": limit, "allocator": True,
                                                    "reserve_bytes": _finite(reserve)})
