"""A rate source presented as a cell estimator: measured (or oracle) speed, analytic plans.

Formulations read estimates through ``best_in_cell(job, cell, cluster) ->
Estimate | None``. A simulator, a lookup of measured throughputs or an
operator's profiling run knows something different: how many iterations per
second a job makes on ``gpus`` GPUs of ``gpu_type`` under its best plan. This
adapter turns such a *rate function*

    ``rate_fn(job: JobSpec, gpu_type: str, gpus: int) -> iterations/s`` (0: cannot run)

into the estimator interface, so the same formulation, solvers and validator
can schedule on measured truth (the harness's ``oracle`` information mode) or
on any other rate source, and a comparison with a policy that sees truth is
fair.

What comes from where:

* **time**: ``iter_time_s = 1 / rate_fn(job, gpu_type, gpus)``; a rate of 0
  (or less) means the cell cannot run: ``None``. The rate does not depend on
  the stage count (a rate source measures the job's best plan at a size), so
  cells of the same size with different stage counts get the same rate, and
  :func:`apportion.formulations.candidates.prune_dominated` keeps the one
  with the fewest stages;
* **plan and memory**: the DP/TP split inside the cell and the memory per GPU
  come from an inner estimator (an :class:`AnalyticEstimator` by default):
  its best feasible split in the cell, or, where the inner model thinks no
  split fits but the rate source says the job runs (the rate source is the
  better witness), its fastest split that the validator's own memory ledger
  (:mod:`apportion.plan_memory`, a lower bound per GPU) lets fit the GPU, marked
  feasible; none where no split does (the plan would be refused as written);
* ``fit(samples)`` records measured iteration times, keyed by (model, global
  batch, GPU type, GPU count); a measured configuration overrides ``rate_fn``.
* **a batch the job lets the scheduler choose** (``batch_rate_fn``: a rate source whose
  rate at a global batch is the job's progress there, Pollux's goodput in a replay):
  :meth:`RateEstimator.best_at_batch`, which
  :func:`apportion.formulations.batch_options.best_in_cell` asks per batch option.
* **a model the catalog lacks** (Gavel's ``ResNet-18 (batch size 128)``,
  ElasticFlow's ``vgg16``, a fine-tuning task; :func:`apportion.models.catalog_model`):
  no inner estimator can describe it, so the rate source is the whole estimate — as
  it is for every baseline. Its rate stands for the job's data-parallel plan on that
  many GPUs (:func:`rated_estimate`: one stage, DP over every GPU), and memory is
  what the rate says: a positive rate ran there, so it fits (memory per GPU is not
  known: 0); a rate of 0 does not run (no cell).

Rates are memoised per (job id, GPU type, GPU count) when ``memoize`` is true
(a rate function that changes, say with a per-round view, must be given a
fresh adapter or ``clear()``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from apportion.estimation.models.analytic import (
    AnalyticEstimator,
    nominal_placement,
    powers_of_two_dividing,
)
from apportion.estimation.base import Estimate, ParamsMixin, Sample, Source

from apportion.cluster import Cluster
from apportion.jobs import JobSpec
from apportion.models import catalog_model
from apportion.plan_memory import fits_memory, type_memory_bytes
from apportion.plans import Cell, ExecutionPlan

log = logging.getLogger(__name__)

RateFn = Callable[[JobSpec, str, int], float]
#: ``(job, gpu_type, gpus, global batch) -> the job's progress per second at that batch``
BatchRateFn = Callable[[JobSpec, str, int, int], float]


class RateEstimator(ParamsMixin):
    """Cell estimates whose time comes from ``rate_fn`` and whose plan/memory from ``inner``.

    Parameters
    ----------
    rate_fn:
        ``(job, gpu_type, gpus) -> iterations/s`` of the job's best plan on
        that many GPUs of that type; 0 when it cannot run there.
    inner:
        the estimator that proposes the DP/TP split and the memory per GPU
        (default: a new :class:`AnalyticEstimator`).
    memoize:
        cache rates per (job id, GPU type, GPU count).
    """

    def __init__(self, rate_fn: RateFn, inner: AnalyticEstimator | None = None,
                 memoize: bool = True, batch_rate_fn: BatchRateFn | None = None) -> None:
        if not callable(rate_fn):
            raise TypeError("rate_fn must be callable: (job, gpu_type, gpus) -> iterations/s")
        self.rate_fn = rate_fn
        self.inner = inner
        self.memoize = memoize
        self.batch_rate_fn = batch_rate_fn
        self._inner = inner if inner is not None else AnalyticEstimator()
        # (job, type, count) -> {(batch, gradient statistics): rate}: a job's reported
        # statistics move its rates (goodput), so they are part of what is memoised
        self._rates: dict[tuple[str, str, int], dict[tuple[Any, ...], float]] = {}

    @property
    def rates_batches(self) -> bool:
        """Whether this rates a job at any global batch (:meth:`best_at_batch`): its rate
        source's rate at a batch is the job's progress there, efficiency included."""
        return self.batch_rate_fn is not None

    # -- sklearn-style plumbing ----------------------------------------------------
    def fit(self, samples: Iterable[Sample], cluster: Cluster | None = None) -> RateEstimator:
        """Record measured iteration times; a measured configuration overrides ``rate_fn``."""
        measured: dict[tuple[str, int, str, int], float] = {}
        for s in samples:
            if s.iter_time_s > 0:
                gpus = int(sum(s.placement.values()))
                measured[(s.job.model, s.job.global_batch_size, s.gpu_type, gpus)] = 1.0 / s.iter_time_s
        self.measured_ = measured
        self._rates.clear()
        return self

    def clear(self) -> None:
        """Forget memoised rates (call when the rate source has changed)."""
        self._rates.clear()

    def forget(self, job_id: str, gpu_type: str, gpus: int) -> None:
        """Forget one memoised rate (the rate source changed there: a measurement)."""
        self._rates.pop((job_id, gpu_type, gpus), None)

    # -- rates -----------------------------------------------------------------------
    def rate(self, job: JobSpec, gpu_type: str, gpus: int, batch: int | None = None) -> float:
        """Iterations/s of ``job`` on ``gpus`` GPUs of ``gpu_type`` (0: cannot run); at
        global ``batch`` (the job's progress there, in its own iterations) where given."""
        measured = getattr(self, "measured_", {})
        mk = (job.model, job.global_batch_size, gpu_type, gpus)
        if batch is None and mk in measured:
            return measured[mk]
        key = (job.id, gpu_type, gpus)
        variant = (batch, job.grad_stats)
        got = self._rates.get(key) if self.memoize else None
        if got is not None and variant in got:
            return got[variant]
        if got and next(iter(got))[1] != job.grad_stats:  # older statistics: stale rates
            got.clear()
        if batch is None:
            r = float(self.rate_fn(job, gpu_type, gpus))
        elif self.batch_rate_fn is not None:
            r = float(self.batch_rate_fn(job, gpu_type, gpus, int(batch)))
        else:
            raise ValueError("this rate source rates no batch but the job's own")
        r = r if math.isfinite(r) and r > 0 else 0.0
        if self.memoize:
            self._rates.setdefault(key, {})[variant] = r
        return r

    # -- the estimator interface ----------------------------------------------------------
    def best_in_cell(self, job: JobSpec, cell: Cell, cluster: Cluster) -> Estimate | None:
        """The cell's estimate: the rate source's time, the inner estimator's plan and memory."""
        if cell.gpus <= 0 or cell.gpus % cell.stages:
            return None
        r = self.rate(job, cell.gpu_type, cell.gpus)
        if r <= 0:
            return None
        if catalog_model(job.model) is None:  # the rate is all there is: its DP plan
            return rated_estimate(job, cell.gpus, cell.stages, 1.0 / r)
        base = self._inner.best_in_cell(job, cell, cluster)
        if base is None:
            base = self._fastest_split(job, cell, cluster)
            if base is None:
                return None
        return self._timed(base, 1.0 / r, job.global_batch_size)

    def best_at_batch(self, job: JobSpec, cell: Cell, cluster: Cluster, batch: int
                      ) -> Estimate | None:
        """The cell's estimate with the job at global ``batch`` (:attr:`rates_batches`):
        the rate source's progress there as the time (in the job's own iterations, so the
        estimate keeps the job's ``global_batch_size``), the plan and memory sized for that
        batch; ``Estimate.batch`` says it."""
        if cell.gpus <= 0 or cell.gpus % cell.stages:
            return None
        r = self.rate(job, cell.gpu_type, cell.gpus, batch)
        if r <= 0:
            return None
        if catalog_model(job.model) is None:
            got = rated_estimate(job, cell.gpus, cell.stages, 1.0 / r)
            return None if got is None else replace(got, batch=int(batch))
        at = replace(job, global_batch_size=int(batch))
        base = self._inner.best_in_cell(at, cell, cluster) or self._fastest_split(at, cell,
                                                                                   cluster)
        if base is None:
            return None
        return replace(self._timed(base, 1.0 / r, job.global_batch_size), batch=int(batch))

    def predict(self, job: JobSpec, plan: ExecutionPlan, placement: Mapping[str, int],
                cluster: Cluster) -> Estimate:
        """The rate source's time for the placement's type and size; memory from ``inner``."""
        node = next(iter(placement), None)
        if node is None:
            raise ValueError("empty placement")
        gpu_type = cluster.nodes[node].gpu_type
        gpus = int(sum(placement.values()))
        r = self.rate(job, gpu_type, gpus)
        if catalog_model(job.model) is None:
            got = rated_estimate(job, gpus, 1, 1.0 / r) if r > 0 else None
            return got if got is not None else Estimate(math.inf, 0.0, False, plan,
                                                        job.global_batch_size, {"rated": 1.0})
        base = self._inner.predict(job, plan, placement, cluster)
        if r <= 0:
            return replace(base, iter_time_s=math.inf, feasible=False)
        return self._timed(base, 1.0 / r, job.global_batch_size)

    # -- helpers ----------------------------------------------------------------------
    @staticmethod
    def _timed(base: Estimate, iter_time_s: float, gbs: int) -> Estimate:
        breakdown = dict(base.breakdown)
        breakdown["inner_iter_time_s"] = float(base.iter_time_s)
        inner = base.source.kind if base.source is not None else "the inner estimator"
        return Estimate(iter_time_s, base.mem_per_gpu, True, base.plan, gbs, breakdown,
                        Source("measured", f"the rate source's measured speed; plan and memory "
                               f"from the {inner} estimate", estimator="rates"))

    def _fastest_split(self, job: JobSpec, cell: Cell, cluster: Cluster) -> Estimate | None:
        return fastest_fitting_split(self._inner, job, cell, cluster)


def fastest_fitting_split(inner: Any, job: JobSpec, cell: Cell, cluster: Cluster
                          ) -> Estimate | None:
    """``inner``'s fastest DP/TP split in the cell, feasible in its memory model or not,
    among those whose memory floor (:func:`apportion.plan_memory.memory_floor`) fits the
    GPU: a plan the validator would refuse is no plan. What a witness that the job runs
    there (a rate, a measured time) is given as its plan where ``inner`` sizes none."""
    placement = nominal_placement(cluster, cell.gpu_type, cell.gpus)
    if placement is None:
        return None
    limit = type_memory_bytes(cluster, cell.gpu_type)
    per_stage = cell.gpus // cell.stages
    best: Estimate | None = None
    for tp in powers_of_two_dividing(per_stage, cluster.max_gpus_per_node(cell.gpu_type)):
        plan = ExecutionPlan(dp=per_stage // tp, tp=tp, pp=cell.stages)
        if job.global_batch_size < plan.dp:
            continue
        try:
            e = inner.predict(job, plan, placement, cluster)
        except (KeyError, ValueError) as exc:  # the inner model cannot describe the job
            log.debug("inner estimator cannot evaluate %s on %s: %s", job.id, cell, exc)
            return None
        if not fits_memory(job, e.plan, limit):
            continue
        if math.isfinite(e.iter_time_s) and (best is None or e.iter_time_s < best.iter_time_s):
            best = e
    return best


def rated_estimate(job: JobSpec, gpus: int, stages: int, iter_time_s: float) -> Estimate | None:
    """The estimate a rate alone gives (a model the catalog lacks): the job's data-parallel
    plan over ``gpus`` GPUs, one stage (None for more: the rate measured no pipeline), run
    at ``iter_time_s``; memory per GPU unknown (0) and feasible, since it ran there."""
    if stages != 1 or gpus <= 0 or not (math.isfinite(iter_time_s) and iter_time_s > 0):
        return None
    return Estimate(iter_time_s, 0.0, True, ExecutionPlan(dp=gpus), job.global_batch_size,
                    {"rated": 1.0}, Source("measured", "the rate source's measured speed "
                                           "(a model the catalog lacks: its DP plan)",
                                           estimator="rates"))


__all__ = ["BatchRateFn", "RateEstimator", "RateFn", "fastest_fitting_split", "rated_estimate"]
