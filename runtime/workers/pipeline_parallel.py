"""Pipeline parallelism for the torch worker, on ``torch.distributed.pipelining``.

A plan ``dp=D, pp=P, micro_batches=M`` (tp == 1, no ZeRO) runs on ``D*P`` ranks laid
out as ``rank = d*P + s``: ``d`` is the data-parallel replica, ``s`` the pipeline stage.

* **Stages are built by hand**, not traced: every rank builds the *whole* seeded catalog
  module (so every parameter value equals the single-process run's) and its stage
  (:class:`StageModule`) holds references to the parts it runs: stage 0 the embedding,
  a contiguous run of ``blocks``, the last stage the final norm and the head. Tracing
  (``pipeline()``/``torch.export``) is not used: it needs split points inside the catalog
  modules, is tied to one micro-batch shape, and buys nothing for a sequential net whose
  parts are addressable by name.
* **Tied embeddings** (gpt/bert: the head is ``wte.weight.t()``) are held by the first
  and the last stage, as Megatron does; their gradients are summed over a two-rank
  "tie" group before the step, so both copies stay identical.
* **The schedule** is 1F1B when ``M >= P`` (it needs that many micro-batches), GPipe
  otherwise. Each pipeline stage is created with *static* input/output examples, so the
  schedule skips its metadata-inference round trip on the first step; activations must
  be marked ``requires_grad`` there (see :func:`stage_io`), or the stages disagree on
  whether a gradient is sent back and the pipeline hangs.
* **Gradients** are scaled inside the schedule's loss function (``scale / M``; the
  schedule's own ``scale_grads`` is off because it would rescale gradients already
  accumulated by earlier accumulation steps) and averaged over the dp group by hand on
  the last accumulation step, like ``TensorParallelStrategy.after_backward``.
* **Checkpoints** hold the full model and optimizer state keyed by the single-process
  module's names: each replica-0 rank contributes its stage's part, gathered to rank 0
  with ``gather_object``; on resume each rank loads only its own keys. So a job moves
  freely between a pipeline plan and any other plan.

Every collective here is entered by every rank of the world or of the group named, in
the same order (``global_mean`` and ``full_state`` included: stages without a loss or
without replica 0 still take part); process groups are created once, by every rank, in
one fixed order (``dist.new_group`` is itself a collective over the world).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from apportion.runtime.workers.parallel import PlanError, Strategy
from apportion.runtime.workers.torch_nets import NetShape, loss_fn
from torch import nn

from apportion.plans import ExecutionPlan

log = logging.getLogger(__name__)


def split_blocks(layers: int, stages: int) -> list[tuple[int, int]]:
    """Contiguous, balanced ``[lo, hi)`` block ranges, one per stage (earlier stages get the
    remainder: stage 0 also runs the embedding, but the last stage runs the vocabulary-sized
    head, the larger of the two for the token nets)."""
    if stages > layers:
        raise PlanError(f"pp={stages} stages for a model of {layers} blocks: every stage "
                          "needs at least one block; the plan is not changed to fit")
    base, extra = divmod(layers, stages)
    out, lo = [], 0
    for s in range(stages):
        hi = lo + base + (1 if s < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


class StageModule(nn.Module):
    """One pipeline stage of a catalog module (``TokenNet`` or ``VitNet``).

    It holds the *same* submodule objects as the full module (no copies), so parameter
    values and fully-qualified names come from the full module. The forward pass repeats
    the full module's forward piecewise; ``tests/test_runtime_pipeline.py`` checks that the
    stages composed in one process give the full module's output exactly.
    """

    patch: nn.Linear  # vit, first stage
    cls: nn.Parameter
    pos: nn.Parameter
    wpe: nn.Embedding  # gpt/bert, first stage
    wte: nn.Embedding  # gpt/bert, first stage (embedding) and last stage (tied head)
    ln_f: nn.LayerNorm  # last stage
    head: nn.Linear  # vit, last stage

    def __init__(self, full: nn.Module, index: int, stages: int, lo: int, hi: int) -> None:
        super().__init__()
        net: Any = full  # TokenNet or VitNet; their parts are read by name
        self.index, self.stages = index, stages
        self.first, self.last = index == 0, index == stages - 1
        self.vit = hasattr(net, "patch")
        self.blocks = nn.ModuleList(net.blocks[lo:hi])
        if self.first:
            if self.vit:
                self.patch, self.cls, self.pos = net.patch, net.cls, net.pos
            else:
                self.wpe = net.wpe
        if not self.vit and (self.first or self.last):
            self.wte = net.wte  # the embedding, and/or the tied head
        if self.last:
            self.ln_f = net.ln_f
            if self.vit:
                self.head = net.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            if self.vit:
                x = self.patch(x)
                x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
            else:
                pos = torch.arange(x.shape[1], device=x.device)
                x = self.wte(x) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x)
        if self.last:
            if self.vit:
                return self.head(self.ln_f(x[:, 0]))
            return self.ln_f(x) @ self.wte.weight.t()
        return x


def stage_io(shape: NetShape, mb: int, index: int, stages: int
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Example (meta-device) input and output of stage ``index`` for a micro-batch of ``mb``.

    Given to ``PipelineStage`` so it runs in static mode: without them the schedule infers
    shapes on its first step by exchanging pickled metadata between stages. In static mode
    ``requires_grad`` of these examples decides the backward wiring: an output example that
    does not require grad gives the stage no gradient buffer, so it never receives its
    output gradient (its backward then fails, or its peer waits forever on a send nobody
    receives). Activations therefore carry ``requires_grad=True``; only the first stage's
    data input does not.
    """
    meta = torch.device("meta")
    if shape.family == "vit":
        first_in = torch.empty(mb, shape.patches, shape.patch_dim, device=meta)
        hidden = torch.empty(mb, shape.patches + 1, shape.hidden, device=meta)
        last_out = torch.empty(mb, shape.vocab, device=meta)
    else:
        first_in = torch.empty(mb, shape.seq, dtype=torch.long, device=meta)
        hidden = torch.empty(mb, shape.seq, shape.hidden, device=meta)
        last_out = torch.empty(mb, shape.seq, shape.vocab, device=meta)
    hidden.requires_grad_(True)
    last_out.requires_grad_(True)
    inp = first_in if index == 0 else hidden
    out = last_out if index == stages - 1 else hidden
    return inp, out


class _Groups:
    """The (dp, pp) layout's process groups, created by every rank in one fixed order.

    ``dist.new_group`` is a collective over the whole world: a rank that skips a call, or
    makes the calls in another order, leaves the others waiting forever. So every rank
    creates every group (pipelines, then dp groups, then tie groups) and keeps its own.
    """

    def __init__(self, dp: int, pp: int, rank: int, tie: bool) -> None:
        self.dp_rank, self.stage = divmod(rank, pp)
        self.pp: Any = None
        self.dp: Any = None
        self.tie: Any = None
        if dp == 1:
            self.pp = None  # the whole world is the one pipeline: use the default group
        else:
            for d in range(dp):
                g = dist.new_group([d * pp + s for s in range(pp)])
                if d == self.dp_rank:
                    self.pp = g
            for s in range(pp):
                g = dist.new_group([d * pp + s for d in range(dp)])
                if s == self.stage:
                    self.dp = g
        if tie:
            for d in range(dp):
                ranks = [d * pp, d * pp + pp - 1]
                g = dist.new_group(ranks)
                if rank in ranks:
                    self.tie = g


def _flat_all_reduce(tensors: list[torch.Tensor], group: Any, divide: int = 1) -> None:
    """All-reduce (sum) ``tensors`` in one flat buffer (one gloo call instead of one per
    parameter), then divide by ``divide``."""
    if not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    if divide != 1:
        flat.div_(divide)
    off = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[off:off + n].view_as(t))
        off += n


class PipelineStrategy(Strategy):
    """One rank of a (dp, pp) pipeline-parallel plan (see the module docstring)."""

    name = "pp"

    def __init__(self, module: nn.Module, plan: ExecutionPlan, rank: int, world: int,
                 micro: int) -> None:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
        self.base, self.plan, self.rank, self.world = module, plan, rank, world
        P, M = plan.pp, plan.micro_batches
        if micro % M:
            raise PlanError(f"per-rank micro-batch {micro} is not divisible by "
                              f"micro_batches={M}")
        shape: NetShape = module.shape  # type: ignore[assignment]
        ranges = split_blocks(len(module.blocks), P)  # type: ignore[arg-type]
        self.tied = hasattr(module, "wte")
        self.groups = _Groups(plan.dp, P, rank, self.tied)
        self.dp_rank, self.stage_index = self.groups.dp_rank, self.groups.stage
        lo, hi = ranges[self.stage_index]
        self.model = StageModule(module, self.stage_index, P, lo, hi)
        self.is_first, self.is_last = self.model.first, self.model.last
        device = next(module.parameters()).device
        inp, out = stage_io(shape, micro // M, self.stage_index, P)
        self.stage = PipelineStage(self.model, self.stage_index, P, device, input_args=inp,
                                   output_args=out, group=self.groups.pp)
        self._scale = 1.0 / M
        schedule = Schedule1F1B if M >= P else ScheduleGPipe
        self.schedule = schedule(self.stage, M, loss_fn=self._scaled_loss, scale_grads=False)
        names = {id(p): n for n, p in module.named_parameters()}
        self.owned = [(names[id(p)], p) for p in self.model.parameters()]
        log.info("rank %d: pipeline stage %d/%d (blocks %d-%d), replica %d, %s", rank,
                 self.stage_index, P, lo, hi - 1, self.dp_rank, schedule.__name__)

    # -- training ---------------------------------------------------------------
    def parameters(self) -> Iterator[nn.Parameter]:
        return (p for _, p in self.owned)

    def _scaled_loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Per-micro-batch mean loss times ``scale / M``: the M equal micro-batches' gradients
        then sum to ``scale`` times the full micro-batch's mean gradient."""
        return loss_fn(out, target) * self._scale

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor, scale: float, sync: bool) -> float:
        """Run the schedule over this rank's micro-batch; the loss (last stage only; 0.0
        elsewhere) is the unscaled mean, as ``global_mean`` expects."""
        self.fwd_s = None  # forward and backward interleave in the schedule: not separable
        self._scale = scale / self.plan.micro_batches
        losses: list[torch.Tensor] = []
        args = (x,) if self.is_first else ()
        target = y if self.is_last else None
        self.schedule.step(*args, target=target, losses=losses if self.is_last else None,
                           return_outputs=False)
        self.after_backward(sync)
        if not self.is_last:
            return 0.0
        return float(sum(float(v.detach()) for v in losses) / scale)

    def after_backward(self, sync: bool) -> None:
        """On the last accumulation step: sum the tied embedding's two gradients, then average
        every gradient over the dp group."""
        if not sync:
            return
        if self.tied and self.groups.tie is not None:
            w = self.model.wte.weight
            if w.grad is None:
                w.grad = torch.zeros_like(w)
            _flat_all_reduce([w.grad], self.groups.tie)
        if self.plan.dp > 1:
            grads = []
            for _, p in self.owned:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                grads.append(p.grad)
            _flat_all_reduce(grads, self.groups.dp, divide=self.plan.dp)

    def global_mean(self, value: float) -> float:
        """The step's global mean loss: only last stages hold a loss, one per replica; every
        rank enters the all-reduce (a rank that skipped it would hang the others)."""
        t = torch.tensor([value if self.is_last else 0.0], dtype=torch.float64,
                         device=self.stage.device)
        dist.all_reduce(t)
        return float(t.item()) / self.plan.dp

    # -- checkpoints --------------------------------------------------------------
    def _stage_state(self, opt: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
        """This stage's part of the full state, keyed by the full module's names."""
        model_sd = {n: p.detach().to("cpu", copy=True) for n, p in self.owned}
        order = [p for g in opt.param_groups for p in g["params"]]
        names = {id(p): n for n, p in self.owned}
        raw = opt.state_dict()
        state = {names[id(order[i])]: {k: (v.to("cpu", copy=True) if torch.is_tensor(v) else v)
                                       for k, v in s.items()} for i, s in raw["state"].items()}
        groups = []
        for g in raw["param_groups"]:
            gg = {k: v for k, v in g.items() if k != "params"}
            gg["params"] = [names[id(order[i])] for i in g["params"]]
            groups.append(gg)
        return model_sd, {"state": state, "param_groups": groups}

    def full_state(self, opt: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
        """Full state on rank 0 (empty dicts elsewhere). A collective: every rank calls it.

        Replica 0's stages send their parts; the tied embedding comes from stage 0 (the last
        stage's copy is identical). Keys and parameter-group order follow the full module,
        exactly as ``parallel._plain_full_state`` writes them for one process."""
        part = self._stage_state(opt) if self.dp_rank == 0 else None
        parts: list[Any] | None = [None] * self.world if self.rank == 0 else None
        dist.gather_object(part, parts, dst=0)
        if self.rank != 0:
            return {}, {}
        assert parts is not None
        model_sd: dict[str, Any] = {}
        opt_state: dict[str, Any] = {}
        group_names: list[set[str]] = []
        hyper: list[dict[str, Any]] = []
        for got in parts:
            if got is None:
                continue
            msd, osd = got
            for k, v in msd.items():
                model_sd.setdefault(k, v)
            for k, v in osd["state"].items():
                opt_state.setdefault(k, v)
            for i, g in enumerate(osd["param_groups"]):
                if i == len(group_names):
                    group_names.append(set())
                    hyper.append({k: v for k, v in g.items() if k != "params"})
                group_names[i].update(g["params"])
        order = [n for n, _ in self.base.named_parameters()]
        missing = [n for n in order if n not in model_sd]
        if missing:
            raise RuntimeError(f"pipeline checkpoint gathered no state for {missing[:3]}...")
        groups = [{**h, "params": [n for n in order if n in names]}
                  for h, names in zip(hyper, group_names, strict=True)]
        full = {k: v for k, v in self.base.state_dict().items() if k not in model_sd}
        full.update(model_sd)  # buffers (none in the catalog nets) come from the local copy
        return ({n: full[n] for n in self.base.state_dict()},
                {"state": {n: opt_state[n] for n in order if n in opt_state},
                 "param_groups": groups})

    def load_full_state(self, model_sd: dict[str, Any], opt: torch.optim.Optimizer,
                        opt_sd: dict[str, Any]) -> None:
        """Load the whole module (every rank builds it), then the optimizer state of this
        stage's own parameters only."""
        self.base.load_state_dict(model_sd)
        order = [p for g in opt.param_groups for p in g["params"]]
        pos = {id(p): i for i, p in enumerate(order)}
        mine = {n: pos[id(p)] for n, p in self.owned}
        state = {mine[n]: s for n, s in opt_sd["state"].items() if n in mine}
        groups = []
        for g in opt_sd["param_groups"]:
            gg = {k: v for k, v in g.items() if k != "params"}
            # the optimizer pairs saved and live parameters by position: list them in its order
            gg["params"] = sorted(mine[n] for n in g["params"] if n in mine)
            groups.append(gg)
        opt.load_state_dict({"state": state, "param_groups": groups})
