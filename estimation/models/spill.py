"""Hydra's spilled training as an estimate: shards, device memory and iteration time.

A model that fits no GPU whole is trained shard by shard (Hydra, sections 4
and 5.2): every shard's parameters and optimizer state live in host memory
and are promoted to the device for each of its units (a forward unit, then a
backward unit that recomputes the forward, back-propagates and steps the
shard's optimizer). The estimate models the spilled trainer as it runs
(``runtime.workers.spill``), on the catalog's layer graph:

**Shards.** The catalog's layers are cut by the one rule the worker's pilot
run uses (:func:`apportion.spilling.greedy_shards`) under the device budget:
a layer holds ``16 p`` bytes while it trains (the analytic model's weights,
gradients and optimizer state per parameter) plus ``a B`` of activations
(``a`` per sample, ``B`` the global batch: one rank, no accumulation); a shard
also holds its input, ``o B`` (``o`` the previous layer's output per sample).
Double buffering (15 % of the budget reserved for the next shard's weights) is
assumed where every layer's weights fit the reserve, as the pilot does; else a
single buffer.

**Iteration time**, per global batch::

    T = T_c + (H2D + D2H) / W - O

* ``T_c``: the round's estimator's time for the whole model on one GPU with
  activation recomputation (``checkpointing=True``), memory ignored. A spilled
  iteration computes what whole training computes plus one more forward (each
  backward unit re-runs its shard's forward: a unit leaves nothing on the device),
  which is recomputation's cost; the optimizer step is the same per parameter.
* ``H2D = P (2w + s) + 3 A`` and ``D2H = P (w + s) + 2 A`` bytes: ``P``
  parameters of ``w`` bytes each (the model's dtype) and ``s = 16 - 2w`` bytes
  of optimizer state each (fp32 master weights and Adam's two moments for a
  16-bit model; the two moments for an fp32 one; gradients never leave the
  device). The forward unit promotes the weights; the backward unit promotes
  weights and optimizer state and returns both. ``A = B sum_b o_b`` over the
  shard boundaries: an activation leaves its shard and enters the next one's
  forward and backward units, its gradient leaves and enters once each.
* ``W``: the GPU's host link, the catalog's ``host_GBps`` (the data sheet's PCIe
  generation, per direction), times ``efficiency``.
* ``O`` (double buffering only): while a unit computes, the next unit's shard
  weights are promoted into the reserve, so each such copy hides behind the
  unit before it, up to that unit's compute: ``sum_u min(w P_next(u) / W, t_u)``
  with ``t_u`` the unit's share of ``T_c`` (its shard's share of the FLOPs; a
  forward unit one quarter of it, a backward unit three quarters). The
  optimizer state and the copies back are not overlapped (the trainer moves
  them inside the unit).

**Memory.** Per GPU: the largest shard's bytes (plus, double-buffered, the
largest prefetched weights), at most the budget. Host memory: the weights and
optimizer state of the whole model, ``P (w + s)``, and the activations carried
between units, ``B sum_b o_b``.

``experiments/results/spill/README.md`` compares this with the spilled trainer's
measured steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from typing import Any

from apportion.estimation.base import Estimate
from apportion.estimation.models.analytic import nominal_placement

from apportion.cluster import Cluster
from apportion.gpus import GpuType, get_gpu
from apportion.jobs import JobSpec
from apportion.models import ModelSpec, catalog_model, get_model
from apportion.plans import ExecutionPlan
from apportion.shards_spec import DEFAULT_BUFFER_FRACTION
from apportion.spilling import greedy_shards

MiB = 2**20
STATE_BYTES = 16.0  # per parameter on the device while it trains (the analytic model's ledger)


@dataclass(frozen=True)
class SpillCut:
    """A model cut for spilling under a budget: shards (layer ranges) and their bytes."""

    shards: tuple[tuple[int, int], ...]
    double_buffer: bool
    device_bytes: float  # the largest shard's, plus the prefetched weights when double-buffered
    boundary_bytes: float  # activations crossing every shard boundary, per sample


def spill_cut(model: ModelSpec, batch: int, budget_bytes: float,
              buffer_fraction: float = DEFAULT_BUFFER_FRACTION) -> SpillCut:
    """The catalog model cut as the pilot would cut it (double-buffered where it can be).
    Raises MemoryError (naming the layer) when one layer alone does not fit."""
    params, acts, outs = model.attr("params"), model.attr("act_bytes"), model.attr("out_bytes")
    w = float(model.dtype_bytes)
    totals = [STATE_BYTES * p + a * batch for p, a in zip(params, acts)]
    weights = [w * p for p in params]
    inputs = [0.0] + [o * batch for o in outs[:-1]]
    try:
        cuts, double = greedy_shards(totals, weights, inputs, budget_bytes, buffer_fraction,
                                     double_buffer=True), True
    except MemoryError:
        cuts, double = greedy_shards(totals, weights, inputs, budget_bytes, buffer_fraction), False
    held = max(sum(totals[a:b]) + inputs[a] for a, b in cuts)
    prefetch = max(sum(weights[a:b]) for a, b in cuts) if double else 0.0
    return SpillCut(tuple(cuts), double, held + prefetch,
                    sum(outs[b - 1] for _, b in cuts[:-1]))


def host_bytes(model: ModelSpec, batch: int, cut: SpillCut) -> float:
    """Host memory a spilled run holds: every weight and its optimizer state, and the
    activations carried between units."""
    w = float(model.dtype_bytes)
    return model.params * (STATE_BYTES - w) + cut.boundary_bytes * batch


def spill_estimate(model: ModelSpec, batch: int, gpu: GpuType, compute_s: float,
                   budget_bytes: float, efficiency: float = 1.0,
                   buffer_fraction: float = DEFAULT_BUFFER_FRACTION) -> Estimate:
    """The spilled plan of ``model`` on one ``gpu`` under ``budget_bytes`` of device memory,
    given ``compute_s`` (the whole model's iteration time with recomputation): see the
    module docstring. Infeasible (with the reason in ``breakdown``) when no cut fits."""
    if not (math.isfinite(compute_s) and compute_s > 0 and budget_bytes > 0):
        return Estimate(math.inf, math.inf, False, ExecutionPlan(), batch, {"no_compute": 1.0})
    try:
        cut = spill_cut(model, batch, budget_bytes, buffer_fraction)
    except MemoryError:
        return Estimate(math.inf, math.inf, False, ExecutionPlan(), batch, {"layer_too_large": 1.0})
    params, flops = model.attr("params"), model.attr("flops")
    w = float(model.dtype_bytes)
    state = STATE_BYTES - 2 * w
    acts = cut.boundary_bytes * batch
    h2d = model.params * (2 * w + state) + 3 * acts
    d2h = model.params * (w + state) + 2 * acts
    link = gpu.host_GBps * 1e9 * efficiency
    copy_s = (h2d + d2h) / link
    hidden = 0.0
    if cut.double_buffer:
        total_flops = math.fsum(flops) or 1.0
        share = [math.fsum(flops[a:b]) / total_flops * compute_s for a, b in cut.shards]
        load = [w * math.fsum(params[a:b]) / link for a, b in cut.shards]
        n = len(cut.shards)
        # forward units 0..n-2 hide the next shard's forward promotion; backward units
        # n-1..1 hide the previous shard's backward promotion
        hidden = math.fsum(min(load[k + 1], share[k] / 4) for k in range(n - 1))
        hidden += math.fsum(min(load[k - 1], share[k] * 3 / 4) for k in range(1, n))
    total = compute_s + copy_s - hidden
    plan = ExecutionPlan(spill_shards=len(cut.shards),
                         spill_budget_mib=max(1, int(budget_bytes // MiB)))
    return Estimate(total, cut.device_bytes, True, plan, batch, {
        "compute_s": compute_s, "copy_s": copy_s, "hidden_s": hidden, "h2d_bytes": h2d,
        "d2h_bytes": d2h, "shards": float(len(cut.shards)),
        "double_buffer": float(cut.double_buffer), "host_bytes": host_bytes(model, batch, cut)})


GiB = 2**30
# the analytic estimator's defaults, for estimators that do not say (AutoEstimator, tables)
USABLE_FRACTION, RESERVE_GIB = 0.95, 1.5


def device_budget(cluster: Cluster, gpu_type: str, estimator: Any) -> float:
    """Bytes of device memory a job may use on one GPU of ``gpu_type``: the node group's
    ``gpu_memory_gib`` where it says, else the catalog's memory less the estimator's
    reserve (as the analytic model's feasibility check)."""
    said = cluster.gpu_memory_bytes(gpu_type)
    if said is not None:
        return said
    fraction = float(getattr(estimator, "usable_memory_fraction", USABLE_FRACTION))
    reserve = float(getattr(estimator, "memory_reserve_gib", RESERVE_GIB))
    return get_gpu(gpu_type).memory_bytes * fraction - reserve * GiB


def host_share_bytes(cluster: Cluster, gpu_type: str) -> float:
    """The smallest host-memory share one GPU of ``gpu_type`` brings with it."""
    nodes = cluster.nodes_of_type(gpu_type)
    return min((n.host_memory_gib / n.gpus for n in nodes), default=0.0) * GiB


def spilled_on(job: JobSpec, cluster: Cluster, gpu_type: str, estimator: Any
               ) -> tuple[Estimate | None, str | None]:
    """``job`` spilled on one GPU of ``gpu_type`` (Hydra): ``(estimate, None)`` where it can
    be, ``(None, why)`` where it cannot, ``(None, None)`` where it needs no spilling (its
    model fits one GPU whole: its cells are missing for another reason, which spilling
    would only hide) or the type has no GPU. The device budget is what a job may use there
    (:func:`device_budget`); the weights and optimizer state it holds in host memory must
    fit the GPU's share of its node (every allocation is given that share)."""
    if catalog_model(job.model) is None:  # cut by its layers: a catalog model only
        return None, f"{job.model!r} is not a catalog model (spilling cuts its layers)"
    placement = nominal_placement(cluster, gpu_type, 1)
    if placement is None:
        return None, None
    model = get_model(job.model)
    # recomputation: each backward unit re-runs its shard's forward
    whole = estimator.predict(job, ExecutionPlan(checkpointing=True), placement, cluster)
    budget = device_budget(cluster, gpu_type, estimator)
    if 0 < whole.mem_per_gpu <= budget:
        return None, None
    e = spill_estimate(model, job.global_batch_size, get_gpu(gpu_type), whole.iter_time_s,
                       budget)
    if not e.feasible:
        return None, (f"{gpu_type}: " + ("a single layer at the global batch exceeds its "
                                         "memory" if "layer_too_large" in e.breakdown else
                                         "the estimator has no time for the model"))
    need, share = e.breakdown["host_bytes"], host_share_bytes(cluster, gpu_type)
    if need > share:
        return None, (f"{gpu_type}: spilling holds {need / GiB:.0f} GiB in host memory, a "
                      f"GPU's share of its node is {share / GiB:.0f} GiB")
    return e, None
