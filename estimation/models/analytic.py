"""The analytic estimator: FLOPs, an alpha-beta network and a memory ledger.

Per pipeline stage and micro-batch of ``m`` samples on a ``(dp, tp)`` stage:

* compute  ``3 * F_stage * m / (tp * peak * eff(tp))`` — forward plus a backward
  of twice the forward; 4x with activation checkpointing; ``eff(tp) =
  efficiency * (1 - tp_penalty * log2 tp)`` because tensor-parallel shards run
  narrower matrix multiplies;
* tensor-parallel traffic: four all-reduces of each layer's output per
  micro-batch (two forward, two backward) inside the node;
* pipeline traffic: the boundary activation forward and its gradient backward;
* the GPipe/1F1B pipeline: ``sum_s T_s + (B - 1) * max_s (T_s - comm_s)`` with
  ``B >= 4 * stages`` micro-batches (Crius 5.1), doubled until memory fits;
* then the data-parallel gradient all-reduce of each stage (not overlapped:
  conservative) and the optimizer step (memory bound: 16 bytes/param through HBM).

Memory per GPU: 16 bytes per parameter held (16-bit weights and gradients,
fp32 master weights and two Adam moments; ZeRO shards the 12 optimizer bytes,
and the gradients too from stage 2, over dp) plus activations of the micro-batches
in flight (the first stage of 1F1B holds ``min(B, stages)``) divided by tp, plus
a fixed reserve for the CUDA context and workspace. A plan fits where that is at most
the catalog's memory times ``usable_memory_fraction`` less the reserve, or, where the
cluster's node group says how much a job may use on its GPUs (``gpu_memory_gib``: a MIG
slice, a shared GPU), at most that: the micro-batch search then sizes for what the
job really has, and a plan larger than it is infeasible.

``efficiency`` (a fraction of the dense peak) defaults to the per-type values
calibrated on Crius's measurements (``apportion/data/efficiency.yaml``: 0.14 to
0.31); ``fit`` recalibrates it per GPU type from measured samples (the median
ratio of predicted to measured time). A type with no samples keeps the shipped
ratio to the measured ones: its default efficiency is scaled by the median
fitted-over-default ratio of the measured types (``efficiency_scale_``). Without
that, a workload measured slower than the model on one type would make every
unmeasured type look faster by the same factor, and a run would migrate its jobs
there (and back, once measured there too).
"""

from __future__ import annotations

import math
from dataclasses import replace
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from importlib import resources
from statistics import median
from typing import Any, NamedTuple


from apportion.cluster import Cluster
from apportion.gpus import get_gpu, gpu_catalog
from apportion.inputs import parse_shipped_yaml
from apportion.jobs import JobSpec
from apportion.models import ModelSpec, get_model
from apportion.plans import Cell, ExecutionPlan
from apportion.estimation.base import Estimate, ParamsMixin, Sample, unmeasured_scale, Source
from apportion.estimation.models.comm import Link, allreduce_time, p2p_seconds
from apportion.estimation.models.partition import cached_cuts

GiB = 2**30


def powers_of_two_dividing(n: int, upto: int | None = None) -> list[int]:
    out, p = [], 1
    while p <= n and (upto is None or p <= upto):
        if n % p == 0:
            out.append(p)
        p *= 2
    return out


class AnalyticEstimator(ParamsMixin):
    """Closed-form iteration time and memory; see the module docstring."""

    def __init__(self, efficiency: float | None = None, tp_penalty: float = 0.05,
                 memory_reserve_gib: float = 1.5, usable_memory_fraction: float = 0.95,
                 max_micro_batches: int = 1024, calibrate: str = "total") -> None:
        if calibrate not in ("total", "compute"):
            raise ValueError(f"calibrate must be 'total' or 'compute', not {calibrate!r}")
        self.calibrate = calibrate
        self.efficiency = efficiency
        self.tp_penalty = tp_penalty
        self.memory_reserve_gib = memory_reserve_gib
        self.usable_memory_fraction = usable_memory_fraction
        self.max_micro_batches = max_micro_batches

    # -- sklearn-style plumbing -------------------------------------------------

    def fit(self, samples: Iterable[Sample], cluster: Cluster | None = None) -> AnalyticEstimator:
        """Calibrate the sustained efficiency per GPU type from measured samples.

        ``calibrate="total"`` (the default, and how the shipped table was made):
        the median of predicted time at efficiency 1 over measured time.
        ``calibrate="compute"``: the same with the parts efficiency does not
        scale -- the DP all-reduce and the optimizer step -- taken out of both
        sides first; it matters where communication is a large share (on this
        2-core VM a 2-process gpt-tiny step spends a fifth of its time in gloo,
        and the total-time ratio then misjudges the efficiency by 2.7x).
        """
        ratios: dict[str, list[float]] = {}
        for s in samples:
            if not s.iter_time_s > 0:
                continue
            try:
                est = self._predict(s.job, s.plan, s.placement, s.gpu_type, cluster,
                                    eff_override=1.0)
            except (KeyError, ValueError):  # a model or GPU type the catalog cannot build
                continue
            if not est.feasible:
                continue
            if self.calibrate == "compute":
                fixed = est.breakdown.get("dp_allreduce_s", 0.0) + \
                    est.breakdown.get("optimizer_s", 0.0)
                if s.iter_time_s - fixed <= 0:
                    continue
                ratios.setdefault(s.gpu_type, []).append(
                    (est.iter_time_s - fixed) / (s.iter_time_s - fixed))
            else:
                ratios.setdefault(s.gpu_type, []).append(est.iter_time_s / s.iter_time_s)
        # predicted time at efficiency 1 divided by measured time is the efficiency
        self.efficiency_ = {g: float(median(r)) for g, r in ratios.items()}
        self.efficiency_scale_ = unmeasured_scale(self.efficiency_, self._default_eff)
        self.n_samples_ = {g: len(r) for g, r in ratios.items()}
        self.__dict__.pop("_source_memo", None)
        return self

    def source(self, gpu_type: str) -> Source:
        """``fitted`` where ``fit`` measured ``gpu_type``'s efficiency, else ``analytic``."""
        key = gpu_type
        memo = self.__dict__.setdefault("_source_memo", {})  # emptied by every fit
        if key not in memo:
            memo[key] = self._source(gpu_type)
        return memo[key]

    def _source(self, gpu_type: str) -> Source:
        n = getattr(self, "n_samples_", {}).get(gpu_type)
        if gpu_type in getattr(self, "efficiency_", {}):
            return Source("fitted", f"analytic model, {gpu_type}'s sustained efficiency fitted "
                          f"to {n} measured samples", estimator="analytic", samples=n)
        if getattr(self, "efficiency_", None):
            return Source("analytic", f"analytic model; {gpu_type} unmeasured, its catalog "
                          "efficiency scaled by the measured types' ratio", estimator="analytic")
        return Source("analytic", "layer FLOPs and bytes at the catalog's sustained efficiency",
                      estimator="analytic")

    def _default_eff(self, gpu_type: str) -> float:
        """The efficiency before any fit: the constructor's or the shipped table's."""
        return self.efficiency if self.efficiency is not None else shipped_efficiency(gpu_type)

    def _eff(self, gpu_type: str, tp: int) -> float:
        fitted = getattr(self, "efficiency_", {})
        if gpu_type in fitted:
            base = fitted[gpu_type]
        else:  # unmeasured: the shipped ratio to the measured types (module docstring)
            base = self._default_eff(gpu_type) * getattr(self, "efficiency_scale_", 1.0)
        return base * max(0.2, 1.0 - self.tp_penalty * math.log2(tp))

    # -- prediction --------------------------------------------------------------
    def predict(self, job: JobSpec, plan: ExecutionPlan, placement: Mapping[str, int],
                cluster: Cluster) -> Estimate:
        node = next(iter(placement), None)
        if node is None:
            raise ValueError("empty placement")
        gpu_type = cluster.nodes[node].gpu_type
        return replace(self._predict(job, plan, placement, gpu_type, cluster),
                       source=self.source(gpu_type))

    @staticmethod
    def _limit(cluster: Cluster | None, gpu_type: str,
               placement: Mapping[str, int] | None = None) -> float | None:
        """What the cluster says a job may use on one GPU (None: the catalog's, less the
        reserve): the smallest of the placement's nodes that say, else of the type's."""
        if cluster is None:
            return None
        if placement:
            said = [cluster.nodes[n].gpu_memory_gib for n in placement
                    if n in cluster.nodes and cluster.nodes[n].gpu_memory_gib is not None]
            if said:
                return min(min(said) * GiB, get_gpu(gpu_type).memory_bytes)
            if all(n in cluster.nodes for n in placement):
                return None
        return cluster.gpu_memory_bytes(gpu_type)

    def _links(self, placement: Mapping[str, int], gpu_type: str,
               cluster: Cluster | None) -> tuple[Link, Link]:
        """(intra-node link, link used by DP/PP groups) for a placement."""
        gpu = get_gpu(gpu_type)
        if cluster is not None and placement and all(n in cluster.nodes for n in placement):
            nodes = [cluster.nodes[n] for n in placement if placement[n] > 0]
            intra = Link(nodes[0].intra_link, min(n.intra_bandwidth_GBps for n in nodes))
            if len(nodes) > 1:
                return intra, Link("network", min(n.inter_bandwidth_GBps for n in nodes))
            return intra, intra
        intra = Link(gpu.link, gpu.link_GBps)
        return intra, intra

    def _predict(self, job: JobSpec, plan: ExecutionPlan, placement: Mapping[str, int],
                 gpu_type: str, cluster: Cluster | None, eff_override: float | None = None
                 ) -> Estimate:
        model = get_model(job.model)
        intra, outer = self._links(placement, gpu_type, cluster)
        return self._evaluate(model, job.global_batch_size, plan, gpu_type, intra, outer,
                              eff_override, self._limit(cluster, gpu_type, placement))

    def _evaluate(self, model: ModelSpec, gbs: int, plan: ExecutionPlan, gpu_type: str,
                  intra: Link, outer: Link, eff_override: float | None = None,
                  limit: float | None = None) -> Estimate:
        """One plan's estimate (:meth:`_plan_time`; ``limit``: the bytes the cluster says a
        job may use on one GPU, where it says)."""
        t = self._plan_time(model, gbs, plan, gpu_type, intra, outer, eff_override, limit)
        if t is None:
            return Estimate(math.inf, math.inf, False, plan, gbs, {"reason": 1.0})
        return _estimate(plan, gbs, t)

    def _plan_time(self, model: ModelSpec, gbs: int, plan: ExecutionPlan, gpu_type: str,
                   intra: Link, outer: Link, eff_override: float | None = None,
                   limit: float | None = None) -> PlanTime | None:
        """One plan's iteration time and memory, or None where the model has fewer layers
        than the plan has stages. The per-layer sums of a stage (FLOPs, parameters,
        activations, the TP all-reduces of its layers' outputs) are taken once per model and
        stage count (:func:`stage_sums`), so a plan costs O(stages), not O(layers); what it
        reads of the GPU is looked up once per type (:meth:`_device`). ``limit``: the bytes
        the cluster lets a job use on one GPU, in place of the catalog's less the reserve."""
        S, tp, dp = plan.pp, plan.tp, plan.dp
        cut = model_stages(model, S)
        if cut is None:
            return None
        sums = cut.sums
        peak_half, peak_tf32, usable, hbm_bytes_per_s = self._device(gpu_type)
        if limit is not None:
            usable = limit
        peak = peak_half if model.dtype_bytes <= 2 else peak_tf32
        if eff_override is None:
            eff = self._eff(gpu_type, tp)
        else:
            eff = eff_override * max(0.2, 1.0 - self.tp_penalty * math.log2(tp))
        per_replica = gbs / dp
        recompute = 4.0 if plan.checkpointing else 3.0
        B = max(plan.micro_batches, 4 * S if S > 1 else 1)
        top_b = max(1, int(per_replica))
        B = min(B, top_b)
        zero = plan.zero_stage
        opt_bytes = 12.0 / (dp if zero >= 1 else 1)
        grad_bytes = 2.0 / (dp if zero >= 2 else 1)
        weight_bytes = 2.0 / (dp if zero >= 3 else 1)
        if plan.offload:
            opt_bytes = 0.0
        state_bytes = weight_bytes + grad_bytes + opt_bytes
        # the data-parallel all-reduce and the per-layer TP message count do not depend on
        # B; the all-reduce grows with its bytes, so the largest stage's is the slowest
        max_params = cut.max_params / tp
        dp_s = allreduce_time(max_params * 2.0, dp, intra if dp * tp <= 1 else outer)
        # the fewest micro-batches whose activations fit (doubling), then the stages' times
        # at that count: only the memory depends on the search
        states = [p / tp * state_bytes for p in cut.params]
        acts = cut.ckpt_acts if plan.checkpointing else cut.acts
        cap = min(self.max_micro_batches, top_b)
        B, mb, peak_mem = _fewest_micro_batches(states, acts, per_replica, tp, S, B, top_b,
                                                cap, usable)
        comp_scale = tp * peak * eff
        tp_alpha = 4 * 2 * (tp - 1) * intra.alpha_s if tp > 1 else 0.0
        tp_beta = 4 * 2 * (tp - 1) / tp / intra.bytes_per_s if tp > 1 else 0.0
        first = sums[0]
        slowest = longest = recompute * first.flops * mb / comp_scale + (
            first.out_layers * tp_alpha + tp_beta * first.outs * mb if tp > 1 else 0.0)
        pipeline = slowest
        # each later stage also receives its boundary activations (twice: forward and back)
        outer_alpha, outer_bytes_per_s = outer.alpha_s, outer.bytes_per_s
        for st in sums[1:]:
            comp = recompute * st.flops * mb / comp_scale
            tpc = st.out_layers * tp_alpha + tp_beta * st.outs * mb if tp > 1 else 0.0
            recv = 2 * p2p_seconds(st.boundary * mb, outer_alpha, outer_bytes_per_s)
            t = comp + tpc + recv
            pipeline += t
            if t > slowest:  # noqa: PLR1730 - as max() would take it, without its call
                slowest = t
            if t - recv > longest:  # noqa: PLR1730
                longest = t - recv
        pipeline += (B - 1) * longest
        opt_step = 16.0 * max_params / hbm_bytes_per_s
        if plan.offload:  # optimizer step on the CPU, gradients and weights over PCIe
            opt_step = 16.0 * max_params / 10e9 + 4.0 * max_params / 16e9
        return PlanTime(pipeline + dp_s + opt_step, peak_mem, peak_mem <= usable, B, pipeline,
                        dp_s, opt_step, slowest)

    def _device(self, gpu_type: str) -> tuple[float, float, float, float]:
        """What a plan's estimate reads of a GPU type: peak FLOP/s in half precision and in
        TF32, the memory a job may use, and HBM bytes/s; memoised per type for the process's
        catalog (a round estimates thousands of plans over a few types)."""
        memo = self.__dict__.get("_device_memo")
        catalog = gpu_catalog()
        memory = (self.usable_memory_fraction, self.memory_reserve_gib)
        if memo is None or memo[0] is not catalog or memo[1] != memory:
            memo = (catalog, memory, {})
            self.__dict__["_device_memo"] = memo
        found = memo[2].get(gpu_type)
        if found is None:
            gpu = get_gpu(gpu_type)
            usable = gpu.memory_bytes * self.usable_memory_fraction - self.memory_reserve_gib * GiB
            found = memo[2][gpu_type] = (gpu.peak_flops("half"), gpu.peak_flops("tf32"), usable,
                                         gpu.hbm_GBps * 1e9)
        return found

    # -- cells ---------------------------------------------------------------------
    def shape_of(self, job: JobSpec) -> tuple[str, int]:
        """What :meth:`best_in_cell` reads of a job: jobs of one shape get the same cells."""
        return (job.model, job.global_batch_size)

    def best_in_cell(self, job: JobSpec, cell: Cell, cluster: Cluster) -> Estimate | None:
        """Best feasible uniform DP/TP split inside ``cell`` (TP within a node), or None.

        Jobs share models and batch sizes, so results are memoised by everything
        the estimate reads (the cluster by its fingerprint).
        """
        key = (cluster.fingerprint_hash, job.model, job.global_batch_size, cell.gpu_type, cell.gpus,
               cell.stages, tuple(sorted(getattr(self, "efficiency_", {}).items())),
               getattr(self, "efficiency_scale_", 1.0))
        cache = self.__dict__.setdefault("_cell_cache", {})
        if key not in cache:
            est = self._best_in_cell(job, cell, cluster)
            cache[key] = None if est is None else replace(est, source=self.source(cell.gpu_type))
        return cache[key]

    def _best_in_cell(self, job: JobSpec, cell: Cell, cluster: Cluster) -> Estimate | None:
        if cell.gpus % cell.stages:
            return None
        per_stage = cell.gpus // cell.stages
        max_tp = cluster.max_gpus_per_node(cell.gpu_type)
        # the cell's placement is the nominal one, so its links are too (None: no placement)
        links = self.__dict__.setdefault("_nominal_links", {})
        key = (cluster.fingerprint_hash, cell.gpu_type, cell.gpus)
        found = links.get(key, links)
        if found is links:
            placement = nominal_placement(cluster, cell.gpu_type, cell.gpus)
            found = links[key] = (None if placement is None
                                  else self._links(placement, cell.gpu_type, cluster))
        if found is None:
            return None
        model = get_model(job.model)
        if cell.stages > len(model.layers):
            return None
        intra, outer = found
        return self._best_split(job, model, cell, per_stage, max_tp, intra, outer,
                                cluster.gpu_memory_bytes(cell.gpu_type))

    def _best_split(self, job: JobSpec, model: ModelSpec, cell: Cell, per_stage: int, max_tp: int,
                    intra: Link, outer: Link, limit: float | None = None) -> Estimate | None:
        best: tuple[ExecutionPlan, PlanTime] | None = None
        gbs = job.global_batch_size
        for tp in powers_of_two_dividing(per_stage, max_tp):
            if gbs < per_stage // tp:
                continue
            plan = _uniform_plan(per_stage // tp, tp, cell.stages)
            t = self._plan_time(model, gbs, plan, cell.gpu_type, intra, outer, limit=limit)
            if t is not None and t.feasible and (best is None or t.total < best[1].total):
                best = (plan, t)
        return None if best is None else _estimate(best[0], gbs, best[1])  # the winner's only


@lru_cache(maxsize=4096)
def _uniform_plan(dp: int, tp: int, pp: int) -> ExecutionPlan:
    """The plan of a uniform split, one object per split: plans are frozen, and a round
    asks for the same few splits in thousands of cells."""
    return ExecutionPlan(dp=dp, tp=tp, pp=pp)


class PlanTime(NamedTuple):
    """A plan's estimate before it is an :class:`Estimate`: a cell's search builds the
    winner's only."""

    total: float
    peak_mem: float
    feasible: bool
    micro_batches: int
    pipeline: float
    dp_allreduce: float
    optimizer: float
    slowest_stage: float


def _estimate(plan: ExecutionPlan, gbs: int, t: PlanTime) -> Estimate:
    """The estimate of ``plan`` at its time ``t``, the plan at the micro-batches it runs."""
    B = t.micro_batches
    breakdown = {"pipeline_s": t.pipeline, "dp_allreduce_s": t.dp_allreduce,
                 "optimizer_s": t.optimizer, "micro_batches": float(B),
                 "slowest_stage_s": t.slowest_stage}
    if B == plan.micro_batches and not plan.spill_shards and not plan.spill_budget_mib:
        used = plan  # frozen: the plan as it runs is the plan asked about
    else:
        used = ExecutionPlan(dp=plan.dp, tp=plan.tp, pp=plan.pp, micro_batches=B,
                             zero_stage=plan.zero_stage, offload=plan.offload,
                             accumulation=plan.accumulation, checkpointing=plan.checkpointing)
    return Estimate(t.total, t.peak_mem, t.feasible, used, gbs, breakdown)


class StageSums(NamedTuple):
    """One pipeline stage's per-layer sums (the parts of a plan's estimate that do not
    depend on the plan): FLOPs, parameters, activation bytes, output bytes of its layers
    and how many of them have an output (each costs a TP all-reduce), the activations
    kept under checkpointing, and the boundary activation it receives."""

    flops: float
    params: float
    acts: float
    ckpt_acts: float
    outs: float
    out_layers: int
    boundary: float


class Stages(NamedTuple):
    """A model cut into balanced stages: each stage's sums, and the columns a plan's
    memory search reads of them (the largest stage's parameters, each stage's parameters
    and activations), taken once per model and stage count."""

    sums: tuple[StageSums, ...]
    max_params: float
    params: tuple[float, ...]
    acts: tuple[float, ...]
    ckpt_acts: tuple[float, ...]


def stage_sums(model: ModelSpec, stages: int) -> tuple[StageSums, ...] | None:
    """Per-stage sums of ``model`` cut into ``stages`` balanced stages (memoised on the
    model; None when it has fewer layers than stages)."""
    cut = model_stages(model, stages)
    return None if cut is None else cut.sums


def model_stages(model: ModelSpec, stages: int) -> Stages | None:
    """``model`` cut into ``stages`` balanced stages (:class:`Stages`, memoised on the
    model; None when it has fewer layers than stages)."""
    memo = model.__dict__.get("_stage_sums")
    if memo is None:
        memo = {}
        object.__setattr__(model, "_stage_sums", memo)
    found = memo.get(stages, memo)
    if found is memo:
        flops, params = model.attr("flops"), model.attr("params")
        acts, outs = model.attr("act_bytes"), model.attr("out_bytes")
        if stages > len(flops):
            found = None
        else:
            ranges = cached_cuts(tuple(flops), tuple(outs), stages)
            sums = tuple(StageSums(
                math.fsum(flops[a:b]), math.fsum(params[a:b]), math.fsum(acts[a:b]),
                math.fsum(outs[a:b]) + max(acts[a:b]), math.fsum(o for o in outs[a:b] if o > 0),
                sum(1 for o in outs[a:b] if o > 0), outs[a - 1] if a > 0 else 0.0)
                for a, b in ranges)
            found = Stages(sums, max(st.params for st in sums), tuple(st.params for st in sums),
                           tuple(st.acts for st in sums), tuple(st.ckpt_acts for st in sums))
        memo[stages] = found
    return found




@lru_cache(maxsize=1)
def _shipped_table() -> dict[str, Any]:
    text = resources.files("apportion").joinpath("data/efficiency.yaml").read_text()
    return parse_shipped_yaml(text)


def shipped_efficiency(gpu_type: str) -> float:
    """The calibrated sustained efficiency of a GPU type (apportion/data/efficiency.yaml)."""
    table = _shipped_table()
    return float(table["types"].get(gpu_type, table["default"]))


def nominal_placement(cluster: Cluster, gpu_type: str, gpus: int) -> dict[str, int] | None:
    """The most consolidated placement of ``gpus`` GPUs of one type (fullest nodes first),
    memoised on the cluster (treated as immutable once built): the candidates ask for it
    per job and type, each a sort of the type's nodes (10 s of a 10,000-job round)."""
    memo = cluster.__dict__.setdefault("_nominal_memo", {})
    key = (gpu_type, gpus)
    if key not in memo:
        memo[key] = _nominal(cluster, gpu_type, gpus)
    p = memo[key]
    return None if p is None else dict(p)


def _nominal(cluster: Cluster, gpu_type: str, gpus: int) -> dict[str, int] | None:
    nodes = sorted(cluster.nodes_of_type(gpu_type), key=lambda n: (-n.gpus, n.name))
    out: dict[str, int] = {}
    left = gpus
    for n in nodes:
        if left <= 0:
            break
        k = min(n.gpus, left)
        out[n.name] = k
        left -= k
    return out if left <= 0 else None


def _fewest_micro_batches(states: list[float], acts: Sequence[float], per_replica: float,
                          tp: int, S: int, B: int, top_b: int, cap: int,
                          usable: float) -> tuple[int, float, float]:
    """The fewest micro-batches, doubling from ``B`` up to ``cap``, whose activations fit
    ``usable`` bytes on the fullest stage's GPU: (micro-batches, samples in each, the peak
    memory at that count). ``S``: the stages."""
    later = list(zip(states[1:], acts[1:], range(S - 1, 0, -1)))
    while True:
        mb = per_replica / B
        # stage s holds the activations of min(B, S - s) micro-batches in flight; the
        # largest stage's memory is the peak (first of equals, as max() takes it)
        peak_mem = states[0] + acts[0] * mb / tp * (B if B < S else S)  # noqa: FURB136
        for state, act, k in later:  # (no min() call per stage: this loop is hot)
            m = state + act * mb / tp * (B if B < k else k)  # noqa: FURB136
            if m > peak_mem:  # noqa: PLR1730 - a max() call per stage is slower
                peak_mem = m
        if peak_mem <= usable or B >= cap:
            break
        B = min(B * 2, top_b)
    return B, mb, peak_mem
