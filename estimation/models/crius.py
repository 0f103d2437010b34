"""Crius's agile cell estimator (Crius sections 4.2 and 5.1).

1. **Stage determination** (figure 7): every layer gets ``gpus * F_i / F``
   GPUs (so all layers would take equally long); the chain is cut at the
   ``S - 1`` smallest inter-layer communications (ties, common in
   transformers whose blocks all emit the same tensor, are broken towards
   balanced stage FLOPs); each stage's accumulated GPUs are rounded to powers
   of two that sum to the cell's GPUs (exactly, by dynamic programming over
   the log-rounding error).
2. **Stage profiles**: per stage a data-parallel-only and a tensor-parallel-only
   profile: compute seconds per micro-batch and memory per device. The default
   :class:`AnalyticStageProfiler` derives them from layer FLOPs and bytes (TP
   shards run narrower matrix multiplies: a per-degree efficiency loss). Where the
   profile cache holds usable measured profiles of the model on the cell's GPU type
   (``apportion profile``, torch or JAX: :mod:`apportion.estimation.stage_profiles`),
   :class:`MeasuredStageProfiler` answers from them instead: a shard measured is read, a
   shard not measured is the analytic one at the model's measured-over-analytic ratio (so
   a cell is never scored on two scales); the estimate's source says which (``profiled``
   with the profiles' device, age and the shards derived, or ``analytic`` with what was
   missing and what was refused).
3. **Communication** from measured tables
   (:class:`~apportion.estimation.models.tables.CommTables`; alpha-beta for links never
   measured): TP all-reduces inside a stage, send/recv (plus all-gather when
   the receiving stage is tensor-parallel) between stages, the DP gradient
   all-reduce.
4. **Assembly**: the ``2^S`` plans (each stage DP-only or TP-only) scored with
   the pipeline formula ``sum_s T_s + (B - 1) * max_s (T_s - comm_s)``,
   ``B = 4 x stages`` (GPipe, as Crius), plus the slowest stage's gradient
   all-reduce and the optimizer step; plans whose stage memory exceeds the GPU
   are dropped; the best is the cell's estimate.

``fit`` calibrates the estimates on measured iteration times such as Crius's own
database: a sustained-efficiency factor per GPU type (median ratio, like the
analytic estimator), per type and family, or a regression of the cells' log error
(``calibration="cell"``, see :meth:`CellEstimator.fit`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from statistics import median
from typing import Protocol

import numpy as np
from apportion.estimation.base import Estimate, ParamsMixin, Sample, Source, unmeasured_scale
from apportion.estimation.models.analytic import nominal_placement
from apportion.estimation.models.comm import Link
from apportion.estimation.models.tables import CommTables
from apportion.estimation.stage_profiles import Hit, StageProfiles, StageRecord

from apportion.cluster import Cluster
from apportion.gpus import get_gpu
from apportion.jobs import JobSpec
from apportion.models import ModelSpec, get_model
from apportion.plans import Cell, ExecutionPlan

GiB = 2**30


# ---------------------------------------------------------------------------
# 1. stage determination
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class StagePlan:
    """Stages as layer ranges ``[start, end)`` with their GPU counts."""

    ranges: tuple[tuple[int, int], ...]
    gpus: tuple[int, ...]
    exact_gpus: tuple[float, ...]


def gpu_shares(flops: Sequence[float], gpus: int) -> list[float]:
    """GPUs per layer proportional to its FLOPs (figure 7: 1/16 of the FLOPs of 8 GPUs -> 0.5)."""
    total = float(sum(flops))
    if total <= 0:
        return [gpus / len(flops)] * len(flops)
    return [gpus * f / total for f in flops]


def _choose_cuts(flops: Sequence[float], comm: Sequence[float], stages: int,
                 rel_tol: float = 0.01) -> list[int]:
    """Cut positions (cut ``i`` lies after layer ``i``): the ``S-1`` smallest communications.

    Positions whose traffic ties (within ``rel_tol``) with the largest one that
    must be taken are chosen to balance the stages' FLOPs (exact DP).
    """
    n = len(flops)
    k = stages - 1
    if k == 0:
        return []
    pos = list(range(n - 1))
    order = sorted(pos, key=lambda i: comm[i])
    threshold = comm[order[k - 1]]
    tol = rel_tol * max(threshold, 1e-12)
    mandatory = [i for i in pos if comm[i] < threshold - tol]
    ties = [i for i in pos if abs(comm[i] - threshold) <= tol]
    need = k - len(mandatory)
    if need <= 0:
        return sorted(order[:k])
    allowed = sorted(set(mandatory) | set(ties))
    must = set(mandatory)
    prefix = [0.0]
    for f in flops:
        prefix.append(prefix[-1] + float(f))
    # DP over allowed cut positions: minimise the largest stage FLOPs
    # state (index in allowed of the last cut, cuts used) -> best bottleneck
    INF = math.inf
    m = len(allowed)
    best = [[INF] * (k + 1) for _ in range(m)]
    back = [[-1] * (k + 1) for _ in range(m)]
    for j, c in enumerate(allowed):
        # first cut at c: all mandatory cuts before c would be skipped -> forbidden
        if any(x < c for x in must):
            continue
        best[j][1] = prefix[c + 1]
    for used in range(2, k + 1):
        for j, c in enumerate(allowed):
            for i in range(j):
                prev = allowed[i]
                if best[i][used - 1] == INF:
                    continue
                if any(prev < x < c for x in must):
                    continue
                v = max(best[i][used - 1], prefix[c + 1] - prefix[prev + 1])
                if v < best[j][used]:
                    best[j][used], back[j][used] = v, i
    final, arg = INF, -1
    for j, c in enumerate(allowed):
        if best[j][k] == INF or any(x > c for x in must):
            continue
        v = max(best[j][k], prefix[n] - prefix[c + 1])
        if v < final:
            final, arg = v, j
    if arg < 0:
        return sorted(order[:k])
    cuts, j, used = [], arg, k
    while j >= 0 and used >= 1:
        cuts.append(allowed[j])
        j, used = back[j][used], used - 1
    return sorted(cuts)


def round_to_powers_of_two(exact: Sequence[float], total: int) -> tuple[int, ...] | None:
    """Powers of two, one per stage, summing to ``total`` and closest in log2 to ``exact``.

    None when ``total`` is not a sum of ``len(exact)`` powers of two.
    """
    S = len(exact)
    if total < S:
        return None
    pows = [1 << e for e in range(int(math.log2(total)) + 1)]
    INF = math.inf
    # best[s][g]: min cost for the first s stages using g GPUs
    best = [[INF] * (total + 1) for _ in range(S + 1)]
    pick = [[0] * (total + 1) for _ in range(S + 1)]
    best[0][0] = 0.0
    for s in range(1, S + 1):
        want = max(exact[s - 1], 1e-9)
        for g in range(total + 1):
            for p in pows:
                if p > g or best[s - 1][g - p] == INF:
                    continue
                c = best[s - 1][g - p] + abs(math.log2(p / want))
                if c < best[s][g] - 1e-12:
                    best[s][g], pick[s][g] = c, p
    if best[S][total] == INF:
        return None
    out, g = [], total
    for s in range(S, 0, -1):
        out.append(pick[s][g])
        g -= pick[s][g]
    return tuple(out[::-1])


def round_to_integers(exact: Sequence[float], total: int) -> tuple[int, ...] | None:
    """Whole GPUs, at least one per stage, summing to ``total``, by largest remainder of the
    shares scaled to ``total``; None when ``total`` is below the stage count."""
    S = len(exact)
    if total < S:
        return None
    scale = total / max(float(sum(exact)), 1e-12)
    want = [max(e * scale, 1.0) for e in exact]
    out = [max(1, math.floor(w)) for w in want]
    while sum(out) > total:  # the stage furthest above its share gives one back
        i = max((j for j in range(S) if out[j] > 1), key=lambda j: out[j] - want[j])
        out[i] -= 1
    while sum(out) < total:  # the stage furthest below its share takes one more
        i = max(range(S), key=lambda j: want[j] - out[j])
        out[i] += 1
    return tuple(out)


def determine_stages(flops: Sequence[float], comm: Sequence[float], gpus: int, stages: int
                     ) -> StagePlan | None:
    """Crius figure 7: FLOPs-share GPUs, cuts at the smallest communications, powers of two
    (whole GPUs by largest remainder where no sum of powers of two fills the cell).

    ``comm[i]`` is the traffic of a cut after layer ``i`` (``len(flops) - 1``
    entries are used). None when the cell has fewer GPUs than stages.
    """
    n = len(flops)
    if stages < 1 or stages > n or gpus < stages:
        return None
    shares = gpu_shares(flops, gpus)
    cuts = _choose_cuts(flops, comm, stages)
    bounds = [0] + [c + 1 for c in cuts] + [n]
    ranges = tuple((bounds[i], bounds[i + 1]) for i in range(stages))
    exact = tuple(sum(shares[a:b]) for a, b in ranges)
    # a cell no sum of S powers of two fills (a job kept on 6 GPUs, or given 3) still gets
    # whole stages: a round that places it needs its estimate
    rounded = round_to_powers_of_two(exact, gpus) or round_to_integers(exact, gpus)
    if rounded is None:
        return None
    return StagePlan(ranges, rounded, exact)


# ---------------------------------------------------------------------------
# 2. stage profiles
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class StageProfile:
    """One stage under one layout: per micro-batch seconds and per-device bytes."""

    mode: str  # "dp" | "tp" | "hybrid" (DP over TP groups of ``tp`` devices)
    devices: int
    compute_s: float  # forward + backward of one micro-batch (per device)
    mem_bytes: float  # peak per device
    tp_comm_s: float = 0.0  # intra-stage collectives per micro-batch
    grad_sync_s: float = 0.0  # DP all-reduce of the stage's gradients per iteration
    tp: int = 0  # TP width (0: every device for "tp", one for "dp")

    @property
    def tp_width(self) -> int:
        return self.tp or (self.devices if self.mode == "tp" else 1)


class StageProfiler(Protocol):
    def profile(self, model: ModelSpec, rng: tuple[int, int], gpu_type: str, devices: int,
                mode: str, micro_batch: float, inflight: int) -> StageProfile: ...


class AnalyticStageProfiler:
    """FLOPs and bytes of the stage's layers; see the module docstring."""

    def __init__(self, efficiency: float | Mapping[str, float] = 0.45, tp_penalty: float = 0.08,
                 checkpointing: bool = False) -> None:
        self.efficiency = efficiency
        self.tp_penalty = tp_penalty
        self.checkpointing = checkpointing

    def eff(self, gpu_type: str, family: str | None = None) -> float:
        """Efficiency for ``gpu_type`` (``"<gpu>|<family>"`` keys override per family)."""
        if isinstance(self.efficiency, Mapping):
            e = self.efficiency
            if family is not None and f"{gpu_type}|{family}" in e:
                return float(e[f"{gpu_type}|{family}"])
            return float(e.get(gpu_type, e.get("*", 0.45)))
        return float(self.efficiency)

    def profile(self, model: ModelSpec, rng: tuple[int, int], gpu_type: str, devices: int,
                mode: str, micro_batch: float, inflight: int) -> StageProfile:
        a, b = rng
        gpu = get_gpu(gpu_type)
        peak = gpu.peak_flops("half" if model.dtype_bytes <= 2 else "tf32")
        flops = model.attr("flops")[a:b]
        params = sum(model.attr("params")[a:b])
        acts = model.attr("act_bytes")[a:b]
        outs = model.attr("out_bytes")[a:b]
        mult = 4.0 if self.checkpointing else 3.0
        act = (sum(outs) + max(acts)) if self.checkpointing else sum(acts)
        if mode == "dp":
            per_dev = micro_batch / devices
            comp = mult * sum(flops) * per_dev / (peak * self.eff(gpu_type, model.family))
            mem = 16.0 * params + act * per_dev * inflight
        else:
            e = self.eff(gpu_type, model.family) * max(0.2, 1.0 - self.tp_penalty *
                                                        math.log2(devices))
            comp = mult * sum(flops) * micro_batch / (devices * peak * e)
            mem = 16.0 * params / devices + act * micro_batch / devices * inflight
        return StageProfile(mode, devices, comp, mem + 1.5 * GiB)


class NoMeasuredProfile(LookupError):
    """A stage shard the cell needs has no usable measured profile."""


class MeasuredStageProfiler:
    """Stage profiles from measured records (:class:`~apportion.estimation.stage_profiles.
    StageProfiles`): the shard's compute per micro-batch, and its resident bytes plus the
    activations of ``inflight`` micro-batches.

    A shard the cell needs but nobody measured (another stage split, a TP width not
    profiled) is the ``analytic`` profiler's, its compute scaled by the median ratio of
    measured to analytic compute over the records of the same model, GPU type and layout
    (any layout where that one has none): every cell of a profiled model is then on the
    measured scale, and a solver never prefers an unmeasured cell because the analytic
    model is optimistic on this device. ``hits`` and ``derived`` list what was read and
    what was derived, for the estimate's source."""

    def __init__(self, store: StageProfiles, analytic: StageProfiler | None = None) -> None:
        self.store = store
        self.analytic = analytic
        self.hits: list[Hit] = []
        self.derived: list[str] = []
        self.basis: list[StageRecord] = []  # the records a ratio was taken from
        self._ratios: dict[tuple[str, str, str], float | None] = {}

    def profile(self, model: ModelSpec, rng: tuple[int, int], gpu_type: str, devices: int,
                mode: str, micro_batch: float, inflight: int) -> StageProfile:
        hit = self.store.lookup(model.name, gpu_type, rng, mode, devices, micro_batch)
        if hit is not None:
            self.hits.append(hit)
            m = hit.stage
            return StageProfile(mode, devices, m.compute_s,
                                m.static_bytes + m.act_bytes * max(inflight, 1))
        ratio = self.ratio(model, gpu_type, mode)
        if ratio is None or self.analytic is None:
            raise NoMeasuredProfile(f"no measured {mode} profile of {model.name} layers "
                                    f"[{rng[0]},{rng[1]}) on {devices} {gpu_type} "
                                    f"(micro-batch {micro_batch:g})")
        p = self.analytic.profile(model, rng, gpu_type, devices, mode, micro_batch, inflight)
        self.derived.append(f"{mode} x{devices} [{rng[0]},{rng[1]})")
        return replace(p, compute_s=p.compute_s * ratio)

    def ratio(self, model: ModelSpec, gpu_type: str, mode: str) -> float | None:
        """Median measured-over-analytic compute of the model's records on ``gpu_type`` in
        ``mode`` (else in any mode); None without an analytic profiler or a record."""
        key = (model.name, gpu_type, mode)
        if key not in self._ratios:
            got = None
            if self.analytic is not None:
                by_mode: dict[str, list[float]] = {}
                for r in self.store.records(model.name, gpu_type):
                    if r.measured.compute_s <= 0 or r.end > len(model.layers):
                        continue
                    a = self.analytic.profile(model, (r.start, r.end), gpu_type, r.devices,
                                              r.mode, r.micro_batch, 1).compute_s
                    if a > 0:
                        by_mode.setdefault(r.mode, []).append(r.measured.compute_s / a)
                        self.basis.append(r)
                pool = by_mode.get(mode) or [x for v in by_mode.values() for x in v]
                got = float(median(pool)) if pool else None
            self._ratios[key] = got
        return self._ratios[key]

    def source(self, gpu_type: str) -> Source:
        """``profiled``: the device and libraries of the records read, the oldest one's age,
        how far a micro-batch was scaled from the one measured, and which shards were
        derived at the measured ratio."""
        now = self.store.clock()
        recs = list({h.record.path or id(h.record): h for h in self.hits}.values())
        if not recs:  # every shard derived: the records behind the ratio are the source
            recs = [Hit(r, r.measured, 1.0) for r in self.basis]
        devices = sorted({h.record.device for h in recs})
        backends = sorted({h.record.backend for h in recs})
        age = max((h.age_s(now) for h in recs), default=0.0)
        scaled = sorted({h.scale for h in self.hits if h.scale != 1.0})
        device = ", ".join(devices)
        stand_in = f" (standing in for {gpu_type})" if any(
            d.lower() == "cpu" for d in devices) else ""
        measured = len({h.record.path or id(h.record) for h in self.hits})
        detail = (f"{'/'.join(backends)} stage profiles measured on {device}{stand_in}, the "
                  f"oldest {_age(age)} old: {measured} stage shards measured")
        if scaled:
            detail += (" (micro-batch scaled linearly from the measured one: x" +
                       ", x".join(f"{x:.3g}" for x in scaled) + ")")
        derived = sorted(set(self.derived))
        if derived:
            detail += (f", {len(derived)} derived from the analytic profiles at the measured "
                       f"ratio ({', '.join(derived)})")
        return Source("profiled", detail, estimator="crius", age_s=age, device=device,
                      backend="/".join(backends))


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


# ---------------------------------------------------------------------------
# 3-4. the cell estimator
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class AssembledPlan:
    modes: tuple[str, ...]
    stage_gpus: tuple[int, ...]
    iter_time_s: float
    mem_per_gpu: float
    feasible: bool
    micro_batches: int
    breakdown: Mapping[str, float] = field(default_factory=dict)
    stage_tp: tuple[int, ...] = ()  # TP width per stage


@dataclass(frozen=True)
class _Scores:
    """A block of assemblies: each row's layout per stage and its terms."""

    choice: np.ndarray  # (rows, stages) option index per stage
    iter_time: np.ndarray
    mem: np.ndarray
    pipeline: np.ndarray
    grad: np.ndarray
    opt: np.ndarray


#: assemblies scored per block (bounds the arrays: a 16-stage cell has 2^16 of them)
_BLOCK = 1 << 16


def _score_assemblies(options: Sequence[Sequence[StageProfile]],
                      recvs: Sequence[Sequence[Sequence[float]]],
                      optimizer: Sequence[Sequence[float]], B: int, hbm_Bps: float,
                      usable: float, best_only: bool = False) -> Iterable[_Scores]:
    """Every assembly's iteration time, in ``itertools.product`` order, block by block: a
    pipeline of its stages' micro-batch times (compute, TP collectives and the activation
    received, ``recvs[s][prev][cur]``) filled ``B - 1`` times by its slowest stage's
    non-receive part, plus the slowest stage's gradient sync and optimizer step.
    Assemblies with an impossible layout (infinite compute) are left out. Each sum runs
    stage by stage in the order a per-assembly loop adds them, so every figure is the
    same float that loop gives. ``best_only``: one row, the fastest assembly that fits
    (ties: the first), or nothing."""
    S = len(options)
    sizes = [len(o) for o in options]
    total = math.prod(sizes)
    strides = [math.prod(sizes[s + 1:]) for s in range(S)]
    base = [np.array([p.compute_s + p.tp_comm_s for p in o]) for o in options]
    grads = [np.array([p.grad_sync_s for p in o]) for o in options]
    mems = [np.array([p.mem_bytes for p in o]) for o in options]
    opts = [np.array(o, dtype=float) for o in optimizer]
    rec = [np.array(r, dtype=float) for r in recvs]
    best: tuple[float, _Scores] | None = None
    for lo in range(0, total, _BLOCK):
        n = np.arange(lo, min(total, lo + _BLOCK))
        idx = np.stack([(n // strides[s]) % sizes[s] for s in range(S)], axis=1)
        ok = np.ones(len(n), dtype=bool)
        for s in range(S):
            ok &= np.isfinite(base[s][idx[:, s]])
        idx = idx[ok]
        if not len(idx):
            continue
        pipe = np.zeros(len(idx))
        slow = np.full(len(idx), -np.inf)
        grad = np.full(len(idx), -np.inf)
        opt = np.full(len(idx), -np.inf)
        mem = np.full(len(idx), -np.inf)
        for s in range(S):
            c = idx[:, s]
            recv = rec[s][idx[:, s - 1], c] if s > 0 else rec[0][0][c]
            t = base[s][c] + recv
            pipe = pipe + t
            slow = np.maximum(slow, t - recv)
            grad = np.maximum(grad, grads[s][c])
            opt = np.maximum(opt, opts[s][c])
            mem = np.maximum(mem, mems[s][c])
        pipe = pipe + (B - 1) * slow
        opt = opt / hbm_Bps
        it = pipe + grad + opt
        block = _Scores(idx, it, mem, pipe, grad, opt)
        if not best_only:
            yield block
            continue
        fits = np.flatnonzero(mem <= usable)
        if len(fits):
            i = int(fits[np.argmin(it[fits])])
            if best is None or it[i] < best[0]:
                best = (float(it[i]), _Scores(idx[i:i + 1], it[i:i + 1], mem[i:i + 1],
                                              pipe[i:i + 1], grad[i:i + 1], opt[i:i + 1]))
    if best is not None:
        yield best[1]


class CellEstimator(ParamsMixin):
    """Crius's agile cell estimator behind the fit/predict protocol."""

    def __init__(self, efficiency: float = 0.45, tp_penalty: float = 0.08,
                 tables: CommTables | None = None, profiler: StageProfiler | None = None,
                 usable_memory_fraction: float = 0.95, micro_batch_factor: int = 4,
                 max_micro_batches: int = 512, per_family: bool = False,
                 calibration: str | None = None, ridge: float | str = "cv",
                 stage_profiles: StageProfiles | None = None) -> None:
        self.efficiency = efficiency
        # also calibrate "<gpu>|<family>" efficiencies (operator mixes differ: on Crius's
        # data BERT sustains about twice Wide-ResNet's fraction of peak on the same GPU)
        self.per_family = per_family
        if calibration not in (None,) + CALIBRATIONS:
            raise ValueError(f"calibration must be one of {', '.join(CALIBRATIONS)}, "
                             f"not {calibration!r}")
        # what fit calibrates (see fit); None: "family" with per_family, else "type"
        self.calibration = calibration
        if isinstance(ridge, str) and ridge != "cv":
            raise ValueError(f"ridge must be a number or 'cv', not {ridge!r}")
        # the cell calibration's penalty; "cv": chosen per fit from RIDGE_GRID by the
        # held-out error of fits that leave whole models out (only the fit's own samples)
        self.ridge = ridge
        self.tp_penalty = tp_penalty
        self.tables = tables
        self.profiler = profiler
        self.usable_memory_fraction = usable_memory_fraction
        self.micro_batch_factor = micro_batch_factor
        self.max_micro_batches = max_micro_batches
        # measured stage profiles (the profile cache's): used for the cells of a model
        # measured on their GPU type; None: analytic (or ``profiler``) only
        self.stage_profiles = stage_profiles

    # -- components --------------------------------------------------------------------
    def _profiler(self, eff_scale: float = 1.0) -> StageProfiler:
        if self.profiler is not None:
            return self.profiler
        fitted = getattr(self, "efficiency_", {})
        eff = {g: e * eff_scale for g, e in fitted.items()}
        eff["*"] = self.efficiency * eff_scale * unmeasured_scale(fitted, lambda _: self.efficiency)
        return AnalyticStageProfiler(eff, self.tp_penalty)

    def measured_profiler(self, model: str, gpu_type: str) -> MeasuredStageProfiler | None:
        """A profiler over the measured stage profiles of ``model`` on ``gpu_type``, or None
        where none is usable (or a custom ``profiler`` is set: it answers alone)."""
        if self.profiler is not None or self.stage_profiles is None:
            return None
        if not self.stage_profiles.records(model, gpu_type):
            return None
        return MeasuredStageProfiler(self.stage_profiles, self._profiler())

    def analytic_source(self, model: str, gpu_type: str, why: str = "") -> Source:
        """The source of an estimate from the analytic stage profiles (or a custom
        ``profiler``): ``fitted`` where a calibration on measured cells applies, else
        ``analytic``; with why no measured profile served and what was refused."""
        refused = tuple(self.stage_profiles.refusals(model, gpu_type)) \
            if self.stage_profiles is not None else ()
        note = f"; {why}" if why else ""
        if self.profiler is not None:
            return Source("profiled", f"stage profiler {type(self.profiler).__name__} on "
                          "this machine (no provenance recorded)", estimator="crius",
                          backend=type(self.profiler).__name__, refused=refused)
        n = getattr(self, "n_samples_", None)
        if getattr(self, "coef_", None) is not None or getattr(self, "efficiency_", None):
            return Source("fitted", f"analytic stage profiles calibrated ({self._mode()}) on "
                          f"{n} measured cells{note}", estimator="crius", samples=n,
                          refused=refused)
        return Source("analytic", f"analytic stage profiles (layer FLOPs and bytes at the "
                      f"catalog's peak){note}", estimator="crius", refused=refused)

    def _tables(self) -> CommTables:
        return self.tables if self.tables is not None else CommTables()

    @staticmethod
    def links(cluster: Cluster, gpu_type: str, gpus: int) -> tuple[Link, Link]:
        """(intra-node link, link between the nodes a consolidated placement spans)."""
        placement = nominal_placement(cluster, gpu_type, gpus) or {}
        nodes = [cluster.nodes[n] for n in placement] or cluster.nodes_of_type(gpu_type)
        if not nodes:
            gpu = get_gpu(gpu_type)
            link = Link(gpu.link, gpu.link_GBps)
            return link, link
        intra = Link(nodes[0].intra_link, min(n.intra_bandwidth_GBps for n in nodes))
        if len(nodes) > 1:
            return intra, Link("network", min(n.inter_bandwidth_GBps for n in nodes))
        return intra, intra

    def assemble(self, model: ModelSpec, batch: int, stages: StagePlan, gpu_type: str,
                 intra: Link, outer: Link, max_tp: int, eff_scale: float = 1.0,
                 micro_batches: int | None = None, hybrid: bool = False,
                 feasible_only: bool = False, profiler: StageProfiler | None = None
                 ) -> list[AssembledPlan]:
        """All ``2^S`` DP-only/TP-only assemblies of ``stages`` with their scores (with
        ``hybrid``, a stage neither layout fits may also run DP over TP groups), in
        ``itertools.product`` order of the stages' layouts; ``feasible_only``: only the
        fastest of those that fit (none if none fits; ties: the first), which is all an
        estimate needs. ``profiler``: the stage profiles to score with (default: the
        analytic ones, or the estimator's ``profiler``)."""
        S = len(stages.ranges)
        B = micro_batches or self.micro_batch_factor * S
        B = max(1, min(B, batch))
        mb = batch / B
        prof = profiler or self._profiler(eff_scale)
        tables = self._tables()
        outs = model.attr("out_bytes")
        params = model.attr("params")
        gpu = get_gpu(gpu_type)
        usable = gpu.memory_bytes * self.usable_memory_fraction
        nodes_span = outer.kind == "network" and outer != intra
        options: list[list[StageProfile]] = []
        for s, (a, b) in enumerate(stages.ranges):
            n = stages.gpus[s]
            inflight = min(B, S - s)
            opts = []
            dp_p = prof.profile(model, (a, b), gpu_type, n, "dp", mb, inflight)
            stage_params = sum(params[a:b])
            link_dp = outer if (nodes_span and n > max_tp) else intra
            grad = tables.time("all_reduce", 2.0 * stage_params, n, link_dp) if n > 1 else 0.0
            opts.append(StageProfile("dp", n, dp_p.compute_s, dp_p.mem_bytes, 0.0, grad))
            if n > 1 and n <= max_tp and mb >= 1:
                tp_p = prof.profile(model, (a, b), gpu_type, n, "tp", mb, inflight)
                tpc = sum(4 * tables.time("all_reduce", o * mb, n, intra) for o in outs[a:b])
                opts.append(StageProfile("tp", n, tp_p.compute_s, tp_p.mem_bytes, tpc, 0.0))
            elif n > 1:
                opts.append(StageProfile("tp", n, math.inf, math.inf))
            if hybrid and n > 1 and all(o.mem_bytes > usable for o in opts):
                # neither layout fits: DP over TP groups as wide as a node allows (Alpa's
                # 2D stage mesh) -- a round that placed the cell still gets its estimate
                tp = max((w for w in range(2, min(n, max_tp) + 1) if n % w == 0), default=1)
                if 1 < tp < n:
                    dp = n // tp
                    hy = prof.profile(model, (a, b), gpu_type, tp, "tp", mb / dp, inflight)
                    tpc = sum(4 * tables.time("all_reduce", o * mb / dp, tp, intra)
                              for o in outs[a:b])
                    grad = tables.time("all_reduce", 2.0 * stage_params / tp, dp, link_dp)
                    opts.append(StageProfile("hybrid", n, hy.compute_s, hy.mem_bytes, tpc, grad,
                                             tp=tp))
            options.append(opts)
        # every term of an assembly depends on one stage's layout or on two neighbours':
        # computed once per layout and per neighbouring pair, then scored for every
        # assembly at once (:func:`_score_assemblies`)
        link = outer if nodes_span else intra
        recvs: list[list[list[float]]] = [[[0.0] * len(options[0])]]
        for s in range(1, S):
            nbytes = outs[stages.ranges[s][0] - 1] * mb
            recvs.append([[2.0 * self._recv(src, dst, nbytes, link, intra, tables)
                           for dst in options[s]] for src in options[s - 1]])
        optimizer = [[16.0 * sum(params[a:b]) / p.tp_width for p in options[s]]
                     for s, (a, b) in enumerate(stages.ranges)]
        plans: list[AssembledPlan] = []
        for sc in _score_assemblies(options, recvs, optimizer, B, gpu.hbm_GBps * 1e9, usable,
                                    feasible_only):
            for row in range(len(sc.iter_time)):
                chosen = [options[s][c] for s, c in enumerate(sc.choice[row])]
                plans.append(AssembledPlan(
                    tuple(p.mode for p in chosen), stages.gpus, float(sc.iter_time[row]),
                    float(sc.mem[row]), bool(sc.mem[row] <= usable), B,
                    {"pipeline_s": float(sc.pipeline[row]), "dp_allreduce_s": float(sc.grad[row]),
                     "optimizer_s": float(sc.opt[row]), "micro_batches": float(B)},
                    tuple(p.tp_width for p in chosen)))
        return plans

    @staticmethod
    def _recv(src: StageProfile, dst: StageProfile, nbytes: float, link: Link, intra: Link,
              tables: CommTables) -> float:
        """One micro-batch's activation from stage layout ``src`` into ``dst`` (one way)."""
        par = min(src.devices, dst.devices)
        if src.mode == "dp" and dst.mode == "dp":
            return tables.time("send_recv", nbytes / par, 2, link)
        if dst.mode == "tp":
            return tables.time("send_recv", nbytes / max(1, par), 2, link) + \
                tables.time("all_gather", nbytes, dst.devices, intra)
        return tables.time("send_recv", nbytes / dst.devices, 2, link)

    def _to_estimate(self, best: AssembledPlan, batch: int, S: int, gpus: int) -> Estimate:
        widths = best.stage_tp or tuple(g if m == "tp" else 1
                                        for g, m in zip(best.stage_gpus, best.modes))
        tp = max(widths or (1,))
        dp = max(1, gpus // (S * tp))
        plan = ExecutionPlan(dp=dp, tp=tp, pp=S, micro_batches=best.micro_batches)
        bd = dict(best.breakdown)
        for i, (g, w) in enumerate(zip(best.stage_gpus, widths)):
            bd[f"stage{i}_gpus"] = float(g)
            bd[f"stage{i}_tp"] = float(w)
        return Estimate(best.iter_time_s, best.mem_per_gpu, best.feasible, plan, batch, bd)

    def estimate_cell(self, model: ModelSpec, batch: int, gpu_type: str, gpus: int, stages: int,
                      intra: Link, outer: Link, max_tp: int, eff_scale: float = 1.0,
                      keep_plans: bool = True
                      ) -> tuple[Estimate | None, list[AssembledPlan]]:
        """The cell's estimate (its fastest assembly that fits) and every assembly scored
        on the way (``keep_plans=False``: only the fastest that fits of each search), from
        the measured stage profiles where the model was profiled on the GPU type (a shard not
        measured derived at the measured ratio), else from the analytic ones; the estimate's
        ``source`` says which."""
        why = ""
        measured = self.measured_profiler(model.name, gpu_type)
        if measured is None and self.stage_profiles is not None and self.profiler is None:
            why = f"no measured stage profile of {model.name} on {gpu_type}"
            other = sorted({r.gpu_type for r in self.stage_profiles.records(model.name)})
            if other:  # a profile stands only for its device's type: say what there is
                why += (f" (the cache holds {', '.join(other)} profiles of it; a profile "
                        "stands only for the GPU type it was measured on)")
        if measured is not None:
            try:
                est, plans = self._estimate_cell(model, batch, gpu_type, gpus, stages, intra,
                                                 outer, max_tp, eff_scale, keep_plans, measured)
            except NoMeasuredProfile as exc:
                why = str(exc)
            else:
                src = measured.source(gpu_type)
                return (None if est is None else replace(est, source=src)), plans
        est, plans = self._estimate_cell(model, batch, gpu_type, gpus, stages, intra, outer,
                                         max_tp, eff_scale, keep_plans, None)
        if est is None:
            return None, plans
        return replace(est, source=self.analytic_source(model.name, gpu_type, why)), plans

    def _estimate_cell(self, model: ModelSpec, batch: int, gpu_type: str, gpus: int,
                       stages: int, intra: Link, outer: Link, max_tp: int, eff_scale: float,
                       keep_plans: bool, profiler: StageProfiler | None
                       ) -> tuple[Estimate | None, list[AssembledPlan]]:
        flops = model.attr("flops")
        sp = determine_stages(flops, model.attr("out_bytes")[:-1], gpus, stages)
        if sp is None:
            return None, []
        # B = 4 x stages (GPipe, as Crius); doubled while every assembly is out of
        # memory, as the training framework would accumulate more micro-batches
        # only then, DP x TP stages where neither layout fits (a placed cell needs an estimate)
        ok: list[AssembledPlan] = []
        for hybrid in (False, True):
            B = max(1, min(self.micro_batch_factor * stages, batch))
            while True:
                plans = self.assemble(model, batch, sp, gpu_type, intra, outer, max_tp,
                                      eff_scale, B, hybrid, feasible_only=not keep_plans,
                                      profiler=profiler)
                ok = [p for p in plans if p.feasible]
                if ok or B >= min(batch, self.max_micro_batches):
                    break
                B = min(B * 2, batch)
            if ok:
                break
        if not ok:
            return None, plans
        best = min(ok, key=lambda p: p.iter_time_s)
        return self._to_estimate(best, batch, stages, gpus), plans

    def cell_estimate(self, model: ModelSpec, batch: int, gpu_type: str, gpus: int,
                      stages: int, intra: Link, outer: Link, max_tp: int) -> Estimate | None:
        """:meth:`estimate_cell`'s estimate, memoised on the estimator's state. The assembly
        search scores ``2^S`` layouts per micro-batch count and is a pure function of the
        cell, the links and the fitted efficiencies; a replay asks for the same cell for
        every placement and every round (a Philly day with this estimator spent 99 % of its
        time re-assembling). A custom profiler or communication table may change under the
        estimator, so those are never memoised. The memo holds one state's estimates: a
        refit (``run``'s and ``serve``'s online fits) starts it afresh, so it never grows
        with the number of fits."""
        if self.profiler is not None or self.tables is not None:
            return self.estimate_cell(model, batch, gpu_type, gpus, stages, intra, outer,
                                      max_tp, keep_plans=False)[0]
        state = (self.efficiency, tuple(sorted(getattr(self, "efficiency_", {}).items())),
                 self.tp_penalty, self.usable_memory_fraction, self.micro_batch_factor,
                 self.max_micro_batches,
                 # a profile written (or aged out) since: the memo's estimates are stale
                 self.stage_profiles.stamp() if self.stage_profiles is not None else None)
        held = self.__dict__.get("_cell_memo")
        if held is None or held[0] != state:
            held = self.__dict__["_cell_memo"] = (state, {})
        memo = held[1]
        key = (model, batch, gpu_type, gpus, stages, intra, outer, max_tp)
        if key not in memo:
            memo[key] = self.estimate_cell(model, batch, gpu_type, gpus, stages, intra, outer,
                                           max_tp, keep_plans=False)[0]
        return memo[key]

    # -- protocol --------------------------------------------------------------------
    def best_in_cell(self, job: JobSpec, cell: Cell, cluster: Cluster) -> Estimate | None:
        """The best of the cell's assembled plans, or None (no stage split, all OOM)."""
        model = get_model(job.model)
        if cell.stages > len(model.layers) or cell.gpus < cell.stages:
            return None
        if not cluster.nodes_of_type(cell.gpu_type) or \
                cluster.capacity_by_type().get(cell.gpu_type, 0) < cell.gpus:
            return None
        intra, outer = self.links(cluster, cell.gpu_type, cell.gpus)
        est = self.cell_estimate(model, job.global_batch_size, cell.gpu_type, cell.gpus,
                                 cell.stages, intra, outer,
                                 cluster.max_gpus_per_node(cell.gpu_type))
        coef = getattr(self, "coef_", None)
        if est is None or coef is None or (est.source is not None and
                                           est.source.kind == "profiled"):
            return est  # a calibration of the analytic profiles does not apply to measured
        hosts = len(nominal_placement(cluster, cell.gpu_type, cell.gpus) or {}) or 1
        c = math.exp(self._correction(cell_features(model, job.global_batch_size,
                                                    cell.gpu_type, cell.gpus, hosts, est)))
        return replace(est, iter_time_s=est.iter_time_s * c,
                       breakdown={**est.breakdown, "calibration": c},
                       source=self.analytic_source(job.model, cell.gpu_type))

    def _correction(self, feats: Mapping[str, float]) -> float:
        """``log(measured / analytic)`` the fitted cell calibration predicts. A GPU type or
        family no sample measured takes the median of the fitted coefficients of the same
        kind (an intercept: of its type, else of its family, else of all; a slope: of the
        same slope over the types, or families, that were measured), so a fit never moves
        an unmeasured type against the measured ones."""
        return _apply(self.coef_, feats)

    def predict(self, job: JobSpec, plan: ExecutionPlan, placement: Mapping[str, int],
                cluster: Cluster) -> Estimate:
        """The cell estimate of ``(type, plan.gpus, plan.pp)`` (the tuner picks DP/TP)."""
        node = next(iter(placement), None)
        if node is None:
            raise ValueError("empty placement")
        gpu_type = cluster.nodes[node].gpu_type
        cell = Cell(job.id, gpu_type, sum(placement.values()), plan.pp)
        est = self.best_in_cell(job, cell, cluster)
        if est is None:
            return Estimate(math.inf, math.inf, False, plan, job.global_batch_size, {},
                            self.analytic_source(job.model, gpu_type, "no stage split fits"))
        return est

    def _mode(self) -> str:
        return self.calibration or ("family" if self.per_family else "type")

    def fit(self, samples: Iterable[Sample],
            cluster: Cluster | Sequence[Cluster] | None = None) -> CellEstimator:
        """Calibrate on measured cells (``calibration``):

        * ``"type"``: per GPU type, efficiency = base x median(predicted / measured);
        * ``"family"`` (or ``per_family``): also per GPU type and model family;
        * ``"cell"``: ``log(measured / predicted)`` of the uncalibrated estimator as a
          ridge regression (numpy) on :func:`cell_features` -- an intercept per GPU type
          and family (not penalised), the GPU count's and hosts' log per type (and the
          hosts' per type and family), the per-GPU batch's and the model size's log, and of
          the plan the stage model chose its stages, its TP width per family and its
          all-reduce's share of the time per family -- applied to every estimate
          (``coef_``), the penalty chosen by fits that leave whole models of the samples
          out (``ridge="cv"``, :func:`_choose_ridge`; ``ridge_``). The stage model keeps its
          plan choice and its balance of compute and communication; what it cannot see (how
          a type's cells scale with GPUs and hosts, how a model's size and batch per GPU
          fill the GPU, how a family's TP shards and all-reduces run) is learned from the
          measurements. On Crius's data, held out five folds by model, this ranks each
          job's cells with a mean Spearman of 0.91 at 15.8 % mean error (13.2 % on the rows
          Crius's own estimates cover, which score 15.0 %).

        A sample's cell is ``(gpu_type, plan.gpus, plan.pp)``. ``cluster`` is the cluster
        of every sample or one per sample; without one the estimator uses the GPU's
        catalog link inside one node.
        """
        samples = list(samples)
        clusters: Sequence[Cluster | None]
        if cluster is None or isinstance(cluster, Cluster):
            clusters = [cluster] * len(samples)
        else:
            clusters = list(cluster)
            if len(clusters) != len(samples):
                raise ValueError(f"{len(clusters)} clusters for {len(samples)} samples")
        mode = self._mode()
        ratios: dict[str, list[float]] = {}
        rows: list[tuple[dict[str, float], float]] = []
        models: list[str] = []
        saved = self.__dict__.pop("efficiency_", None)
        saved_coef = self.__dict__.pop("coef_", None)
        try:
            for s, cl in zip(samples, clusters):
                predicted = self._uncalibrated(s, cl)
                if predicted is None:
                    continue
                model, est, hosts = predicted
                ratio = est.iter_time_s / s.iter_time_s
                ratios.setdefault(s.gpu_type, []).append(ratio)
                if mode == "family":
                    ratios.setdefault(f"{s.gpu_type}|{model.family}", []).append(ratio)
                rows.append((cell_features(model, s.job.global_batch_size, s.gpu_type,
                                           s.plan.gpus, hosts, est), -math.log(ratio)))
                models.append(s.job.model)
        finally:
            if saved is not None:
                self.efficiency_ = saved
            if saved_coef is not None:
                self.coef_ = saved_coef
        lam = _choose_ridge(rows, models) if self.ridge == "cv" else float(self.ridge)
        self.ridge_ = lam
        self.n_samples_ = len(rows)
        self.heldout_error_ = _heldout(rows, models, mode, lam)
        if mode == "cell":
            self.coef_ = _ridge(rows, lam)
            self.__dict__.pop("efficiency_", None)
            return self
        self.efficiency_ = {g: self.efficiency * float(median(r)) for g, r in ratios.items()}
        return self

    def _uncalibrated(self, s: Sample, cl: Cluster | None
                      ) -> tuple[ModelSpec, Estimate, int] | None:
        """A sample's model, the uncalibrated estimate of its cell and its hosts (on
        ``cl``, else inside one node), or None for a sample :meth:`fit` cannot use (no
        measured time, a model or type the catalog cannot build, no plan for the cell)."""
        if not s.iter_time_s > 0:
            return None
        try:
            model = get_model(s.job.model)
            get_gpu(s.gpu_type)
        except (KeyError, ValueError):  # a model or type the catalog cannot build
            return None
        if cl is not None:
            intra, outer = self.links(cl, s.gpu_type, s.plan.gpus)
            max_tp = cl.max_gpus_per_node(s.gpu_type)
            hosts = len(nominal_placement(cl, s.gpu_type, s.plan.gpus) or {}) or 1
        else:
            gpu = get_gpu(s.gpu_type)
            intra = outer = Link(gpu.link, gpu.link_GBps)
            max_tp = s.plan.gpus
            hosts = 1
        est, _ = self.estimate_cell(model, s.job.global_batch_size, s.gpu_type,
                                    s.plan.gpus, s.plan.pp, intra, outer, max_tp,
                                    keep_plans=False)
        if est is None:
            return None
        return model, est, hosts


# slopes per GPU type (``<type>|<slope>``), per type and family
# (``<type>|<family>|<slope>``) and per family (``<family>|<slope>``); any other name with a
# ``|`` is an intercept ``<type>|<family>``
_TYPE_SLOPES = ("log2_gpus", "log2_hosts")
_FAMILY_SLOPES = ("log2_tp", "comm_share")
_SLOPES = _TYPE_SLOPES + _FAMILY_SLOPES
CALIBRATIONS = ("type", "family", "cell")


def _is_intercept(name: str) -> bool:
    parts = name.split("|")
    return len(parts) == 2 and parts[1] not in _SLOPES


def _siblings(name: str, coef: Mapping[str, float]) -> list[float]:
    """The fitted coefficients a feature no sample exercised (an unmeasured GPU type or
    family) borrows the median of: the same slope over the measured types or families, or
    for an intercept ``<type>|<family>`` those of its type, else of its family, else all."""
    parts = name.split("|")
    if len(parts) == 3:  # <type>|<family>|<slope>: the family's, else every type's
        fam, slope = parts[1], parts[2]
        return ([v for k, v in coef.items() if k.count("|") == 2 and k.split("|")[1:] ==
                 [fam, slope]]
                or [v for k, v in coef.items() if k.count("|") == 2 and k.endswith("|" + slope)])
    if len(parts) == 2 and parts[1] in _SLOPES:  # a type's or a family's slope
        return [v for k, v in coef.items() if k.count("|") == 1 and k.endswith("|" + parts[1])]
    if _is_intercept(name):
        gpu, fam = parts
        return ([v for k, v in coef.items() if _is_intercept(k) and k.startswith(gpu + "|")]
                or [v for k, v in coef.items() if _is_intercept(k) and k.endswith("|" + fam)]
                or [v for k, v in coef.items() if _is_intercept(k)])
    return []


def _apply(coef: Mapping[str, float], feats: Mapping[str, float]) -> float:
    """The calibration ``coef`` at a cell's features, a feature no sample exercised taking
    the median of its siblings' coefficients (:func:`_siblings`)."""
    out = 0.0
    for name, x in feats.items():
        if name in coef:
            out += coef[name] * x
            continue
        same = _siblings(name, coef)
        out += float(median(same)) * x if same else 0.0
    return out


def cell_features(model: ModelSpec, batch: int, gpu_type: str, gpus: int, hosts: int,
                  est: Estimate | None = None) -> dict[str, float]:
    """What the ``"cell"`` calibration regresses on: ``<type>|<family>`` (an intercept),
    ``<type>|log2_gpus`` and ``<type>|log2_hosts`` (how the type's cells scale),
    ``<type>|<family>|log2_hosts`` (how a family's traffic crosses the type's network),
    ``log2_batch_per_gpu`` and ``log_params`` (how full the GPU's kernels run), and of the
    analytic estimate ``est`` the stage model chose: ``log2_pp`` (its stages),
    ``<family>|log2_tp`` (its TP width: how the family's shards run against the stage
    model's TP penalty) and ``<family>|comm_share`` (the share of its time the gradient
    all-reduce takes: how the family's communication runs against the tables')."""
    fam = model.family
    out = {f"{gpu_type}|{fam}": 1.0,
           f"{gpu_type}|log2_gpus": math.log2(max(gpus, 1)),
           f"{gpu_type}|log2_hosts": math.log2(max(hosts, 1)),
           f"{gpu_type}|{fam}|log2_hosts": math.log2(max(hosts, 1)),
           "log2_batch_per_gpu": math.log2(max(batch / max(gpus, 1), 1e-9)),
           "log_params": math.log(max(model.params, 1.0) / 1e9)}
    if est is not None:
        out["log2_pp"] = math.log2(max(est.plan.pp, 1))
        out[f"{fam}|log2_tp"] = math.log2(max(est.plan.tp, 1))
        total = est.iter_time_s if est.iter_time_s > 0 else 1.0
        out[f"{fam}|comm_share"] = float(est.breakdown.get("dp_allreduce_s", 0.0)) / total
    return out


def _heldout(rows: Sequence[tuple[Mapping[str, float], float]], models: Sequence[str],
             mode: str, lam: float, folds: int = 5) -> dict[str, float]:
    """Per model, the mean relative error of its cells predicted by the calibration fitted on
    the other folds (every ``folds``-th cell held out together): ``--estimator auto``
    compares it with the other estimators'. The efficiency calibrations are read as the
    scale they put on the analytic cell (the median ratio of the cell's type, or type and
    family); the ``"cell"`` one as its regression."""
    k = min(folds, len(rows))
    errs: dict[str, list[float]] = {}
    for f in range(k):
        train = [r for i, r in enumerate(rows) if i % k != f]
        if not train:
            continue
        coef = _ridge(train, lam) if mode == "cell" else {}
        for i in range(f, len(rows), k):
            feats, y = rows[i]
            if mode == "cell":
                pred = _apply(coef, feats)
            else:
                key = _intercept(feats)
                pool = [v for ft, v in train if _intercept(ft) == key] if mode == "family" else []
                pool = pool or [v for ft, v in train
                                if _intercept(ft).split("|")[0] == key.split("|")[0]]
                pred = float(median(pool)) if pool else 0.0
            errs.setdefault(models[i], []).append(abs(math.exp(pred - y) - 1.0))
    return {m: sum(v) / len(v) for m, v in errs.items()}


def _intercept(feats: Mapping[str, float]) -> str:
    """The ``<type>|<family>`` feature of a cell."""
    return next(n for n in feats if _is_intercept(n))


RIDGE_GRID = (0.3, 1.0, 3.0, 10.0)
RIDGE_DEFAULT = 1.0


def _choose_ridge(rows: Sequence[tuple[Mapping[str, float], float]], models: Sequence[str],
                  grid: Sequence[float] = RIDGE_GRID, folds: int = 5) -> float:
    """The penalty of :data:`RIDGE_GRID` whose fits predict the fit's own cells best with
    each model's cells held out together (models dealt round-robin into ``folds`` groups,
    sorted by name: no seed); :data:`RIDGE_DEFAULT` with fewer than two models. Only the
    samples being fitted are used, so a benchmark's held-out cells never choose it."""
    names = sorted(set(models))
    if len(names) < 2:
        return RIDGE_DEFAULT
    k = min(folds, len(names))
    group = {m: i % k for i, m in enumerate(names)}
    best: tuple[float, float] | None = None
    for lam in grid:
        errs: list[float] = []
        for f in range(k):
            train = [r for r, m in zip(rows, models) if group[m] != f]
            if not train:
                continue
            coef = _ridge(train, lam)
            for (feats, y), m in zip(rows, models):
                if group[m] == f:
                    errs.append(abs(math.exp(_apply(coef, feats) - y) - 1.0))
        score = sum(errs) / len(errs) if errs else math.inf
        if best is None or score < best[0] - 1e-12:
            best = (score, lam)
    return best[1] if best is not None else RIDGE_DEFAULT


def _ridge(rows: Sequence[tuple[Mapping[str, float], float]], lam: float) -> dict[str, float]:
    """Ridge regression of ``y`` on the named features (intercepts ``<type>|<family>`` not
    penalised), solved with numpy; ``{}`` without rows."""
    import numpy as np

    if not rows:
        return {}
    names = sorted({n for f, _ in rows for n in f})
    X = np.array([[f.get(n, 0.0) for n in names] for f, _ in rows])
    y = np.array([v for _, v in rows])
    pen = np.array([0.0 if _is_intercept(n) else lam for n in names])
    A = X.T @ X + np.diag(pen) + 1e-9 * np.eye(len(names))
    beta = np.linalg.solve(A, X.T @ y)
    return {n: float(b) for n, b in zip(names, beta)}
