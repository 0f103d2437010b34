"""What one GPU must hold to run a plan: the validator's own per-GPU memory arithmetic.

The validator checks every decision against the cluster independently of the
formulation and the estimator that made it, so it keeps its own ledger here,
read only from the job's model (:class:`~apportion.models.ModelSpec`: parameters,
activation and output bytes per layer, per sample) and the plan
(:class:`~apportion.plans.ExecutionPlan`). Exactness is impossible without
running the job (allocator fragmentation, communication buckets, the CUDA
context, a framework's own choices), and a validator that refused a plan the
estimator sized correctly would stop good rounds. So :func:`memory_floor` is a
**lower bound**: what any GPU of the plan holds at least. A plan over the GPU's
memory by this figure cannot run; a plan under it may still be tight, which is
the estimator's business.

The floor, per GPU, is the larger of two bounds on the plan's fullest GPU:

* **one layer's working set**: every layer sits on some stage, and while it
  trains that stage holds at least the layer's model states and its activations
  for one micro-batch: ``max_l (s p_l + m a_l) / tp``;
* **the average stage**: the stages share the model's states and activations,
  so the fullest holds at least their mean over ``pp`` stages:
  ``(s P + m A) / (pp tp)``, where under recomputation (``checkpointing``) ``A``
  is each layer's smaller of its activations and its output (what a
  checkpointed stage keeps at least: the inputs of its layers, plus one layer's
  activations while it recomputes).

with

* ``s`` bytes of model state per parameter: Adam's ledger, 16 bytes a
  parameter, split as 2 (16-bit weights) + 2 (gradients) + 12 (fp32 master
  weights and two moments). ZeRO shards the 12 over ``dp`` from stage 1, the
  gradients too from stage 2, the weights from stage 3; offload moves the
  optimizer states and the gradients to the host (and, at stage 3, the
  weights). A model trained in fp32 (4 + 4 + 8) holds at least as much under
  every sharding, so the 2/2/12 split is the smaller of the two;
* ``m`` samples in one micro-batch: the global batch over ``dp``, the plan's
  ``micro_batches`` and its ``accumulation`` steps (the fewest samples any of
  apportion's estimators or workers put through a GPU at once); only one
  micro-batch's activations are counted, whatever a pipeline keeps in flight;
* ``tp`` dividing everything (replicated norms and embeddings are not counted);
* nothing for the CUDA context, workspaces or fragmentation.

A **spilled** plan (Hydra) trains shard by shard on one GPU under its device
budget: the floor is the largest single layer at the global batch, ``max_l
(16 p_l + a_l B)``, which must fit the budget (every shard holds at least one
layer; the spilled trainer refuses a layer larger than its budget).

The memory a job may use on a GPU (:func:`device_memory_bytes`) is its node
group's ``gpu_memory_gib`` where the cluster says one (a MIG slice, a shared
GPU), else the catalog's whole memory: the floor is compared with all of it,
the estimator's own reserve for the CUDA context left out on purpose.

**What is not checked.** A job whose model is not in the catalog (a trace's own
job type such as Gavel's ``ResNet-18 (batch size 128)``, an operator's
measured-only model) has no layer graph, and the job format declares no memory
need: its per-GPU memory is unknown here. It is scheduled from measured rates,
and a rate of 0 is the rate source's way of saying it does not fit; the
validator checks everything else of its allocation. Inline ``custom:`` models
carry their layer graph in their name and are checked like catalog models.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from apportion.cluster import Cluster
from apportion.gpus import get_gpu
from apportion.jobs import JobSpec
from apportion.models import ModelSpec, catalog_model
from apportion.plans import ExecutionPlan

GiB = 2**30
MiB = 2**20
#: Adam's bytes per parameter: 16-bit weights, their gradients, and fp32 master weights with
#: two moments (the split the estimators shard by; module docstring)
WEIGHT_BYTES, GRADIENT_BYTES, OPTIMIZER_BYTES = 2.0, 2.0, 12.0
#: a spilled layer on the device while it trains: weights, gradients and optimizer state
SPILL_STATE_BYTES = WEIGHT_BYTES + GRADIENT_BYTES + OPTIMIZER_BYTES


def state_bytes_per_param(plan: ExecutionPlan) -> float:
    """Bytes of model state one GPU holds per parameter of its stage and TP shard."""
    dp = max(1, plan.dp)
    zero, off = plan.zero_stage, plan.offload
    weights = 0.0 if (off and zero >= 3) else WEIGHT_BYTES / (dp if zero >= 3 else 1)
    grads = 0.0 if off else GRADIENT_BYTES / (dp if zero >= 2 else 1)
    optimizer = 0.0 if off else OPTIMIZER_BYTES / (dp if zero >= 1 else 1)
    return weights + grads + optimizer


def micro_batch_samples(global_batch: int, plan: ExecutionPlan) -> float:
    """Samples in one micro-batch on one replica (fractional: a lower bound)."""
    return global_batch / (max(1, plan.dp) * max(1, plan.micro_batches)
                           * max(1, plan.accumulation))


@dataclass(frozen=True)
class _Columns:
    """What the floor reads of a model, once per model."""

    params: tuple[float, ...]
    acts: tuple[float, ...]
    total_params: float
    total_acts: float
    kept_acts: float  # under recomputation: each layer's smaller of activations and output


def _columns(model: ModelSpec) -> _Columns:
    """Memoised on the model (specs are immutable)."""
    found = model.__dict__.get("_floor_columns")
    if found is None:
        params, acts = model.attr("params"), model.attr("act_bytes")
        outs = model.attr("out_bytes")
        found = _Columns(tuple(params), tuple(acts), sum(params), sum(acts),
                         sum(min(a, o) for a, o in zip(acts, outs)))
        object.__setattr__(model, "_floor_columns", found)
    return found


@dataclass(frozen=True)
class Floor:
    """A plan's per-GPU memory floor in bytes, and its parts (for messages)."""

    bytes: float
    states: float  # the model states counted in it
    activations: float  # ... and the activations

    def describe(self) -> str:
        return (f"{self.bytes / GiB:.2f} GiB ({self.states / GiB:.2f} of model states, "
                f"{self.activations / GiB:.2f} of activations)")


def memory_floor(model: ModelSpec, global_batch: int, plan: ExecutionPlan) -> Floor:
    """The fewest bytes any GPU of ``plan`` holds for ``model`` at ``global_batch`` (module
    docstring)."""
    col = _columns(model)
    if not col.params:
        return Floor(0.0, 0.0, 0.0)
    if plan.spilled:  # one layer at the global batch, whole on one GPU (Hydra)
        best = max(zip(col.params, col.acts),
                   key=lambda pa: SPILL_STATE_BYTES * pa[0] + pa[1] * global_batch)
        states, acts = SPILL_STATE_BYTES * best[0], best[1] * global_batch
        return Floor(states + acts, states, acts)
    s = state_bytes_per_param(plan)
    m = micro_batch_samples(global_batch, plan)
    tp = max(1, plan.tp)
    layer = max(zip(col.params, col.acts), key=lambda pa: s * pa[0] + m * pa[1])
    one = (s * layer[0] + m * layer[1]) / tp
    stages = max(1, min(plan.pp, len(col.params)))
    kept = col.kept_acts if plan.checkpointing else col.total_acts
    avg_states = s * col.total_params / (stages * tp)
    avg_acts = m * kept / (stages * tp)
    if one >= avg_states + avg_acts:
        return Floor(one, s * layer[0] / tp, m * layer[1] / tp)
    return Floor(avg_states + avg_acts, avg_states, avg_acts)


def device_memory_bytes(cluster: Cluster, node: str) -> float:
    """The device memory a job may use on one GPU of ``node``: its group's ``gpu_memory_gib``
    where the cluster says one (at most the catalog's), else the catalog's whole memory."""
    n = cluster.nodes[node]
    catalog = get_gpu(n.gpu_type).memory_bytes
    if n.gpu_memory_gib is None:
        return catalog
    return min(float(n.gpu_memory_gib) * GiB, catalog)


def type_memory_bytes(cluster: Cluster, gpu_type: str) -> float:
    """What a job may use on every GPU of ``gpu_type`` here: the smallest of its nodes'."""
    said = cluster.gpu_memory_bytes(gpu_type)
    return said if said is not None else _catalog_memory_bytes(gpu_type)


@lru_cache(maxsize=1024)
def _catalog_memory_bytes(gpu_type: str) -> float:
    """The catalog's memory of a GPU type by name, looked up once (a round's candidates ask
    for every cell they estimate: 1.5 million times in the densest Philly day's replay)."""
    return get_gpu(gpu_type).memory_bytes


def plan_floor(job: JobSpec, plan: ExecutionPlan) -> Floor | None:
    """The floor of ``job`` under ``plan``, or None where its model has no layer graph;
    memoised by the model's name, the batch and the plan (a round asks for a few shapes
    many times: every option of every job of a model, then every allocation)."""
    return _named_floor(job.model, int(job.global_batch_size), plan)


@lru_cache(maxsize=65536)
def _named_floor(model_name: str, global_batch: int, plan: ExecutionPlan) -> Floor | None:
    model = catalog_model(model_name)
    return None if model is None else memory_floor(model, global_batch, plan)


def fits_memory(job: JobSpec, plan: ExecutionPlan, limit_bytes: float) -> bool:
    """Whether ``plan``'s floor fits ``limit_bytes`` per GPU (True where it cannot be known)."""
    floor = plan_floor(job, plan)
    return floor is None or floor.bytes <= limit_bytes


def memory_violation(job: JobSpec, plan: ExecutionPlan, nodes: Iterable[str],
                     cluster: Cluster) -> str | None:
    """Why ``plan`` cannot run on the GPUs of ``nodes`` (the smallest of them), or None."""
    floor = plan_floor(job, plan)
    known = [n for n in nodes if n in cluster.nodes]
    if floor is None or not known:
        return None
    node = min(known, key=lambda n: (device_memory_bytes(cluster, n), n))
    limit = device_memory_bytes(cluster, node)
    if plan.spilled and plan.spill_budget_mib > 0:
        budget = plan.spill_budget_mib * MiB
        if floor.bytes > budget:
            return (f"spilled plan {plan.label()}: its largest layer at the global batch needs "
                    f"{floor.describe()}, more than its budget of {plan.spill_budget_mib} MiB")
        return None  # the budget itself is checked against the device by the validator
    if floor.bytes <= limit:
        return None
    return (f"plan {plan.label()} needs at least {floor.describe()} per GPU; node {node}'s "
            f"{cluster.nodes[node].gpu_type} GPUs allow {limit / GiB:.2f} GiB")


__all__ = ["Floor", "GiB", "device_memory_bytes", "fits_memory", "memory_floor",
           "memory_violation", "micro_batch_samples", "plan_floor", "state_bytes_per_param",
           "type_memory_bytes"]
