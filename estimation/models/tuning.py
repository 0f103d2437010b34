"""Cell-guided parallelism tuning (Crius section 5.2, figure 11).

Inside a chosen cell each stage of ``n`` GPUs may run any hybrid ``(dp, tp)``
with ``dp * tp = n`` (powers of two, TP inside a node). The cell estimate
already says, per stage, whether DP-only or TP-only was better: that is the
stage's *favour*. Tuning searches each stage only within its favoured half of
the range, from its favoured extreme to the half-hybrid point
(``dp = tp = sqrt(n)``, rounded), and prunes the other half. The space shrinks
from ``prod_s |range_s|`` to ``prod_s |half_s|``; both sizes are reported.

Each candidate is scored with the same pipeline formula as the estimator;
a hybrid stage's compute is the TP profile at degree ``tp`` applied to
``1/dp`` of the micro-batch, its communication the TP all-reduces at degree
``tp`` plus the gradient all-reduce over ``dp``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

from apportion.estimation.models.crius import CellEstimator, NoMeasuredProfile, determine_stages

from apportion.cluster import Cluster
from apportion.gpus import get_gpu
from apportion.jobs import JobSpec
from apportion.models import get_model
from apportion.plans import Cell


@dataclass(frozen=True)
class TunedPlan:
    """The tuned per-stage ``(dp, tp)`` and what the pruning saved."""

    cell: Cell
    stage_layouts: tuple[tuple[int, int], ...]
    favours: tuple[str, ...]
    iter_time_s: float
    mem_per_gpu: float
    pruned_space: int
    full_space: int
    micro_batches: int
    source: dict[str, Any] | None = None  # where the stage profiles came from

    def as_dict(self) -> dict[str, Any]:
        return {"gpu_type": self.cell.gpu_type, "gpus": self.cell.gpus,
                "stages": self.cell.stages,
                "stage_layouts": [{"dp": d, "tp": t} for d, t in self.stage_layouts],
                "favours": list(self.favours), "iter_time_s": self.iter_time_s,
                "mem_per_gpu": self.mem_per_gpu, "pruned_space": self.pruned_space,
                "full_space": self.full_space, "micro_batches": self.micro_batches,
                "source": self.source}


def layouts(n: int, max_tp: int) -> list[tuple[int, int]]:
    """All ``(dp, tp)`` with ``dp * tp = n``, powers of two, ``tp <= max_tp``; DP-only first."""
    out, t = [], 1
    while t <= n:
        if n % t == 0 and t <= max(max_tp, 1):
            out.append((n // t, t))
        t *= 2
    return out


def favoured_half(n: int, max_tp: int, favour: str) -> list[tuple[int, int]]:
    """DP-only..half-hybrid when DP is favoured, half-hybrid..TP-only otherwise."""
    full = layouts(n, max_tp)
    if len(full) <= 1:
        return full
    half_tp = 2 ** (int(round(math.log2(n))) // 2)  # tp of the half-hybrid point
    if favour == "dp":
        return [(d, t) for d, t in full if t <= half_tp]
    return [(d, t) for d, t in full if t >= half_tp]


def tune_cell(job: JobSpec, cell: Cell, cluster: Cluster, estimator: CellEstimator | None = None,
              prune: bool = True) -> TunedPlan | None:
    """Tune the cell's per-stage layouts inside the favoured halves (or the full space)."""
    est = estimator or CellEstimator()
    model = get_model(job.model)
    max_tp = cluster.max_gpus_per_node(cell.gpu_type)
    intra, outer = est.links(cluster, cell.gpu_type, cell.gpus)
    estimate, plans = est.estimate_cell(model, job.global_batch_size, cell.gpu_type, cell.gpus,
                                        cell.stages, intra, outer, max_tp)
    if estimate is None:
        return None
    sp = determine_stages(model.attr("flops"), model.attr("out_bytes")[:-1], cell.gpus,
                          cell.stages)
    assert sp is not None
    best_assembly = min((p for p in plans if p.feasible), key=lambda p: p.iter_time_s)
    favours = best_assembly.modes
    B = best_assembly.micro_batches
    full = [layouts(n, max_tp) for n in sp.gpus]
    spaces = [favoured_half(n, max_tp, f) for n, f in zip(sp.gpus, favours)] if prune else full
    full_size = math.prod(len(x) for x in full)
    pruned_size = math.prod(len(x) for x in spaces)
    measured = est.measured_profiler(model.name, cell.gpu_type)
    why = ""
    if measured is not None:
        try:
            best = _search(est, measured, model, job, cell, sp, spaces, B, max_tp, intra, outer)
        except NoMeasuredProfile as exc:
            why = str(exc)
        else:
            return None if best is None else TunedPlan(
                cell, best[2], favours, best[0], best[1], pruned_size, full_size, B,
                measured.source(cell.gpu_type).as_dict())
    best = _search(est, est._profiler(), model, job, cell, sp, spaces, B, max_tp, intra, outer)
    if best is None:
        return None
    return TunedPlan(cell, best[2], favours, best[0], best[1], pruned_size, full_size, B,
                     est.analytic_source(model.name, cell.gpu_type, why).as_dict())


def _search(est: CellEstimator, prof: Any, model: Any, job: JobSpec, cell: Cell, sp: Any,
            spaces: list[list[tuple[int, int]]], B: int, max_tp: int, intra: Any, outer: Any
            ) -> tuple[float, float, tuple[tuple[int, int], ...]] | None:
    """The fastest per-stage ``(dp, tp)`` of ``spaces`` that fits, scored with ``prof``'s
    stage profiles: ``(iteration s, memory per GPU, layouts)``, or None."""
    tables = est._tables()
    outs, params = model.attr("out_bytes"), model.attr("params")
    gpu = get_gpu(cell.gpu_type)
    usable = gpu.memory_bytes * est.usable_memory_fraction
    mb = job.global_batch_size / B
    S = cell.stages
    spans = outer.kind == "network" and outer != intra
    best: tuple[float, float, tuple[tuple[int, int], ...]] | None = None
    for combo in itertools.product(*spaces):
        times, comms, grads, mems, opts = [], [], [], [], []
        for s, ((d, t), (a, b)) in enumerate(zip(combo, sp.ranges)):
            inflight = min(B, S - s)
            sub_mb = mb / d
            p = prof.profile(model, (a, b), cell.gpu_type, t, "tp" if t > 1 else "dp", sub_mb,
                             inflight)
            tpc = sum(4 * tables.time("all_reduce", o * sub_mb, t, intra)
                      for o in outs[a:b]) if t > 1 else 0.0
            recv = 0.0
            if s > 0:
                nbytes = outs[a - 1] * mb / d
                recv = 2 * tables.time("send_recv", nbytes, 2, outer if spans else intra)
                if t > 1:
                    recv += 2 * tables.time("all_gather", nbytes, t, intra)
            times.append(p.compute_s + tpc + recv)
            comms.append(recv)
            stage_params = sum(params[a:b]) / t
            link_dp = outer if (spans and d * t > max_tp) else intra
            grads.append(tables.time("all_reduce", 2.0 * stage_params, d, link_dp) if d > 1 else 0.0)
            mems.append(p.mem_bytes)
            opts.append(16.0 * stage_params / (gpu.hbm_GBps * 1e9))
        if max(mems) > usable:
            continue
        total = sum(times) + (B - 1) * max(x - c for x, c in zip(times, comms)) + max(grads) + \
            max(opts)
        if best is None or total < best[0]:
            best = (total, max(mems), tuple(combo))
    return best


def parse_job_cell(job: str, cell: str) -> tuple[JobSpec, Cell]:
    """``MODEL[:BATCH]`` and ``GPU_TYPE:GPUS[:STAGES]`` as given on the command line.

    Raises :class:`~apportion.errors.InputError` naming the option and the field.
    """
    from apportion.errors import CatalogError, InputError

    parts = job.split(":")
    try:
        get_model(parts[0])
    except CatalogError as exc:
        raise InputError("--job", "model", str(exc)) from None
    try:
        batch = int(parts[1]) if len(parts) > 1 else 256
    except ValueError:
        raise InputError("--job", "batch", f"{parts[1]!r} is not an integer") from None
    if batch <= 0 or len(parts) > 2:
        raise InputError("--job", "batch", "expected MODEL[:BATCH] with BATCH > 0")
    gpu, gpus, stages = parse_cell(cell)
    spec = JobSpec(id="cli", model=get_model(parts[0]).name, global_batch_size=batch,
                   iterations=1, requested_gpus=gpus, requested_gpu_type=gpu)
    return spec, Cell("cli", gpu, gpus, stages)


def parse_cell(cell: str, option: str = "--cell") -> tuple[str, int, int]:
    """``GPU_TYPE:GPUS[:STAGES]`` as ``(type, gpus, stages)``; an
    :class:`~apportion.errors.InputError` naming ``option`` and the field otherwise."""
    from apportion.errors import CatalogError, InputError
    from apportion.gpus import canonical_gpu_name

    c = cell.split(":")
    if len(c) not in (2, 3):
        raise InputError(option, "cell", "expected GPU_TYPE:GPUS[:STAGES]")
    try:
        gpu = canonical_gpu_name(c[0])
    except CatalogError as exc:
        raise InputError(option, "gpu_type", str(exc)) from None
    try:
        gpus, stages = int(c[1]), int(c[2]) if len(c) == 3 else 1
    except ValueError:
        raise InputError(option, "gpus", "GPUS and STAGES must be integers") from None
    if gpus <= 0 or stages <= 0:
        raise InputError(option, "gpus", "GPUS and STAGES must be positive")
    return gpu, gpus, stages


def estimate_report(job: JobSpec, cell: Cell, cluster: Cluster, estimator: str = "crius",
                    cache_dir: str | None = None) -> dict[str, Any]:
    """Every estimator's view of one cell, with where each figure came from (``source``),
    plus the Crius-tuned plan (JSON-ready). The estimators are the ones ``--estimator``
    names build (:func:`~apportion.estimation.registry.make_estimator`): Crius's reads the
    measured stage profiles of the profile cache (``cache_dir``, default
    ``$APPORTION_CACHE``), Morphling's its cached fits; ``refused`` lists the stage profiles
    of this model and GPU type that were not used, and why."""
    from apportion.estimation.registry import make_estimator

    from apportion.errors import InputError

    if cluster.capacity_by_type().get(cell.gpu_type, 0) < cell.gpus:
        raise InputError("--cell", "gpus", f"the cluster has "
                         f"{cluster.capacity_by_type().get(cell.gpu_type, 0)} {cell.gpu_type} GPUs")
    known = ("crius", "analytic", "morphling")
    names = list(known) if estimator == "all" else [estimator]
    if any(n not in known for n in names):
        raise InputError("--estimator", "estimator", f"{estimator!r} is not one of "
                         "crius, analytic, morphling, all")
    choices: dict[str, Any] = {n: make_estimator(n, cache_dir=cache_dir) for n in names}
    out: dict[str, Any] = {"job": {"model": job.model, "global_batch_size":
                                   job.global_batch_size},
                           "cell": {"gpu_type": cell.gpu_type, "gpus": cell.gpus,
                                    "stages": cell.stages}, "estimates": {}}
    for n in names:
        e = choices[n].best_in_cell(job, cell, cluster)
        out["estimates"][n] = None if e is None else {
            "iter_time_s": e.iter_time_s, "throughput": e.throughput,
            "mem_per_gpu_gib": e.mem_per_gpu / 2**30, "plan": e.plan.as_dict(),
            "breakdown": dict(e.breakdown),
            "source": None if e.source is None else e.source.as_dict()}
    if "crius" in names:
        t = tune_cell(job, cell, cluster, choices["crius"])
        out["tuned"] = None if t is None else t.as_dict()
        store = choices["crius"].stage_profiles
        out["refused"] = [] if store is None else store.refusals(job.model, cell.gpu_type)
    return out
