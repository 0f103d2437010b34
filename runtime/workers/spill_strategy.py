"""The built-in trainer's strategy for a spilled plan (Hydra): a model larger than the
device, trained shard by shard.

The job's catalog model is viewed as its layers in order (``torch_nets.layered``:
embedding, blocks, head), cut by the pilot run (``pilot.partition``, Hydra's
Algorithm 1) under the plan's device-memory budget, and trained one mini-batch
at a time by :class:`~apportion.runtime.workers.spill.SpillTrainer`: every
shard's parameters and optimizer state live in host memory and are promoted to
the device for each of its units. Nothing about the units is re-implemented
here; this module only adapts them to the trainer's loop:

* one iteration is the trainer's ``train()`` over one batch (the global batch:
  a spilled plan runs one rank, no accumulation), with the iteration's learning
  rate (warm-up included) in the optimizer spec;
* checkpoints hold the *whole* model's state keyed by its own parameter names
  and the optimizer's per-parameter state in the same layout the other
  strategies write (``parallel._plain_full_state``), so a spilled job resumes
  under any partition (another GPU type, another budget) or whole, and a whole
  job's checkpoint resumes spilled: the shards are a way to run the model, not
  a property of its state.

Why the pilot is re-run at every launch rather than taken from the plan: the
plan's shard count is the estimator's, cut on the catalog's byte counts; the
pilot measures the real module on this device (the CUDA allocator on a GPU).
Double buffering is used where the pilot allows it (every layer's parameters fit
the reserve), as the estimate assumed.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import torch
from apportion.estimation.profilers.torch_models import layered
from apportion.runtime.workers.parallel import PlanError, settle
from apportion.runtime.workers.pilot import OptimSpec, Partition, partition
from apportion.runtime.workers.spill import SpillJob, SpillTrainer, optimized_names
from apportion.runtime.workers.torch_nets import loss_fn
from torch import nn

from apportion.plans import ExecutionPlan

log = logging.getLogger(__name__)

MiB = 2**20


def spill_budget(plan: ExecutionPlan, device: torch.device) -> float:
    """The device memory the pilot cuts under: the plan's budget, never more than the
    device has. On the CPU there is no device memory to read: the plan must say."""
    budget = float(plan.spill_budget_mib) * MiB
    if device.type == "cuda":
        total = float(torch.cuda.get_device_properties(device).total_memory)
        return min(budget, total) if budget > 0 else total
    if budget <= 0:
        raise PlanError(f"plan {plan.label()}: a spilled plan on the CPU needs the device "
                        "memory its shards are sized for (spill_budget_mib)")
    return budget


class SpillStrategy:
    """The surface the trainer's loop reads (``dp_rank``, ``fwd_s``, ``global_mean``,
    ``full_state``, ``load_full_state``, ``parameters``) plus :meth:`step`, which
    replaces the whole model's forward, backward and optimizer step: each shard steps
    its own optimizer in its backward unit."""

    name = "spill"
    dp_rank = 0
    fwd_s: float | None = None  # units interleave forward and backward: not separable

    def __init__(self, module: nn.Module, plan: ExecutionPlan, optim: OptimSpec,
                 sample: tuple[torch.Tensor, torch.Tensor], device: torch.device,
                 budget_bytes: float) -> None:
        # the model itself stays in host memory (the trainer built it there): SpillTrainer's
        # host copies are clones of it, and only a unit's shard is ever promoted to the device
        self.base = module.to("cpu")
        self.plan, self.optim, self.device = plan, optim, device
        self.layers = [m for _, m in layered(module)]
        self.partition, self.double_buffer = self._pilot(*sample, budget_bytes)
        self.job = SpillJob("job", self.layers, self.partition.boundaries, loss_fn, [], 1, optim)
        self.trainer = SpillTrainer([self.job], workers=0, devices=[str(device)],
                                    double_buffer=self.double_buffer)
        # each shard's state-dict names -> the model's own names (tied parameters map twice)
        own = {id(t): n for n, t in module.state_dict(keep_vars=True).items()}
        for n, t in module.named_parameters():
            own.setdefault(id(t), n)
        self.names = [{local: own[id(t)] for local, t in shard.state_dict(keep_vars=True).items()}
                      for shard in self.trainer.templates[0]]
        log.info("spilled: %d layers -> %d shards %s under %.0f B (double buffer: %s)",
                 len(self.layers), len(self.partition.shards), self.partition.boundaries,
                 budget_bytes, self.double_buffer)

    def _pilot(self, x: torch.Tensor, y: torch.Tensor, budget: float) -> tuple[Partition, bool]:
        """Hydra's pilot run, double-buffered where every layer's parameters fit the reserve;
        a layer that fits no shard is a plan this device cannot run."""
        try:
            return partition(self.layers, x, budget, self.optim, loss_fn=loss_fn, target=y,
                             device=str(self.device), repeats=1, double_buffer=True), True
        except MemoryError:
            pass
        try:
            return partition(self.layers, x, budget, self.optim, loss_fn=loss_fn, target=y,
                             device=str(self.device), repeats=1), False
        except MemoryError as exc:
            raise PlanError(f"plan {self.plan.label()}: the model cannot be spilled under "
                            f"{budget:.0f} B of device memory: {exc}") from None

    # -- the loop's surface ----------------------------------------------------------------
    def parameters(self) -> Any:
        return self.base.parameters()

    def global_mean(self, value: float) -> float:
        return value

    def step(self, x: torch.Tensor, y: torch.Tensor, lr: float) -> float:
        """One iteration on the global batch ``(x, y)`` at learning rate ``lr``: every
        shard's forward unit, then every backward unit, each stepping its shard."""
        self.job.batches = [(x, y)]
        self.job.optim = replace(self.optim, lr=lr)
        report = self.trainer.train()
        settle(self.device)
        return float(report.losses[self.job.name][-1])

    def full_state(self, opt: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """The whole model's state and its optimizer's, keyed by the model's own names."""
        model: dict[str, Any] = {}
        state: dict[str, Any] = {}
        for k, names in enumerate(self.names):
            for local, t in self.trainer.host[0][k].items():
                model[names[local]] = t.detach().to("cpu", copy=True)
            saved = self.trainer.opt_state[0][k]
            if saved is None:
                continue
            order = optimized_names(self.trainer.templates[0][k], self.trainer.held(0, k))
            for i, s in saved["state"].items():
                state[names[order[i]]] = {key: (v.to("cpu", copy=True) if torch.is_tensor(v)
                                                else v) for key, v in s.items()}
        probe = self.job.optim.make([nn.Parameter(torch.zeros(1))])
        group = {k: v for k, v in probe.param_groups[0].items() if k != "params"}
        group["params"] = [n for n, _ in self.base.named_parameters()]
        return ({n: model[n] for n in self.base.state_dict()},
                {"state": state, "param_groups": [group]})

    def load_full_state(self, model_sd: dict[str, Any], opt: Any,
                        opt_sd: dict[str, Any]) -> None:
        """Fill the host copies from a whole-model checkpoint (spilled or not)."""
        missing = [n for n in self.base.state_dict() if n not in model_sd]
        if missing:
            raise RuntimeError(f"checkpoint lacks {missing[:3]} of this model")
        saved = opt_sd.get("state", {})
        groups = opt_sd.get("param_groups") or [{}]
        hyper = {k: v for k, v in groups[0].items() if k != "params"}
        for k, names in enumerate(self.names):
            self.trainer.host[0][k] = {local: model_sd[n].detach().clone()
                                       for local, n in names.items()}
            order = optimized_names(self.trainer.templates[0][k], self.trainer.held(0, k))
            own = {i: saved[names[local]] for i, local in enumerate(order) if names[local] in saved}
            self.trainer.opt_state[0][k] = ({"state": own, "param_groups": [
                {**hyper, "params": list(range(len(order)))}]} if own else None)
