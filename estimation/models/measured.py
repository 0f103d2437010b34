"""Lookup tables of measured iteration times, with interpolation: the ``tables`` estimator.

Rows are measurements ``(model, global batch, GPU type, GPUs, iteration time)``
— from the state store's estimator samples (what ``apportion run`` measured on
this cluster) or a CSV an operator keeps. A cell is answered from the rows of
its model and GPU type (batch size matching when the table has it): an exact
GPU count returns the fastest measurement; another count is interpolated in
log-log space between the nearest measured counts below and above, and
extrapolated from the nearest one with the measured scaling exponent (capped
at linear) outside them. A model or GPU type without rows has no estimate
(``None``), which is what lets ``auto`` fall back to another estimator.

Memory is not measured by a time table; a measured configuration ran, so it is
feasible, and an interpolated one is taken to be feasible too. A time does not say
how the job ran, though, and the plan it is given must fit each GPU: a catalog model's
cell keeps the table's own split (data parallel over its stages) where the validator's
memory floor (:mod:`apportion.plan_memory`) lets it fit, else takes the analytic model's
plan and memory (its best split in the cell, else its fastest split whose floor fits:
:func:`~apportion.estimation.rate_estimator.fastest_fitting_split`); no cell where none
fits. A model the catalog lacks has no layer graph: its split stands as it is.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from apportion.cluster import Cluster
from apportion.errors import InputError
from apportion.estimation.base import Estimate, ParamsMixin, Sample, Source
from apportion.estimation.models.analytic import AnalyticEstimator
from apportion.estimation.rate_estimator import fastest_fitting_split
from apportion.inputs import read_csv
from apportion.jobs import JobSpec, control_characters
from apportion.models import catalog_model
from apportion.plan_memory import fits_memory, type_memory_bytes
from apportion.plans import Cell, ExecutionPlan

Row = tuple[str, int | None, str, int, float]  # model, batch (None: any), GPU type, GPUs, iter s
REQUIRED_COLUMNS = ("model", "gpu_type", "gpus", "iter_time_s")
#: a measured iteration takes at least a microsecond and at most ~4 months
MIN_ITER_TIME_S, MAX_ITER_TIME_S = 1e-6, 1e7
#: GPU counts and batch sizes, as a jobs file bounds them
MAX_GPUS = 1_000_000


@lru_cache(maxsize=1)
def _planner() -> AnalyticEstimator:
    """The analytic model that sizes a measured cell's plan (one per process: it memoises)."""
    return AnalyticEstimator()


class TableEstimator(ParamsMixin):
    """Measured iteration times per (model, batch, GPU type, GPU count), interpolated."""

    def __init__(self, rows: Iterable[Row] = ()) -> None:
        self.rows = tuple(rows)

    # -- building ---------------------------------------------------------------------
    @classmethod
    def from_store_samples(cls, samples: Iterable[Mapping[str, Any]],
                           batches: Mapping[str, int] | None = None) -> TableEstimator:
        """Rows from ``StateStore.samples()`` (``batches``: job id -> global batch). A
        spilled plan's step (Hydra, shard by shard) is not a row: a table has no plan, and
        its time would stand for the whole model's on that GPU."""
        rows: list[Row] = []
        for s in samples:
            if (s.get("plan") or {}).get("spill_shards"):
                continue
            batch = (batches or {}).get(str(s.get("job")))
            rows.append((str(s["model"]), batch, str(s["gpu_type"]), int(s["gpus"]),
                         float(s["iter_time_s"])))
        return cls(rows)

    @classmethod
    def from_csv(cls, path: str | Path) -> TableEstimator:
        """A CSV with columns model, gpu_type, gpus, iter_time_s (and optionally
        global_batch_size), read by the one input reader (:mod:`apportion.inputs`: a
        regular file, 4 MB, UTF-8, bounded fields); errors name the file, the line and
        the column. A time below :data:`MIN_ITER_TIME_S` is refused: it is no measurement,
        and its reciprocal (a throughput) would overflow into the decision as Infinity."""
        table = read_csv(path, "measured times CSV", required=REQUIRED_COLUMNS)
        rows: list[Row] = []
        for i, r in table.iter():
            for col in ("model", "gpu_type"):
                if not (r.get(col) or "").strip():
                    raise InputError(table.source, table.where(i, col), "is empty")
                bad = control_characters(r[col])
                if bad:
                    raise InputError(table.source, table.where(i, col),
                                     f"contains control characters ({', '.join(bad)})")
            gpus = int(table.number(i, "gpus", integer=True, minimum=1, maximum=MAX_GPUS))
            t = float(table.number(i, "iter_time_s", minimum=MIN_ITER_TIME_S,
                                   maximum=MAX_ITER_TIME_S))
            batch = table.optional_number(i, "global_batch_size", integer=True, minimum=1,
                                          maximum=MAX_GPUS)
            rows.append((r["model"].strip(), None if batch is None else int(batch),
                         r["gpu_type"].strip(), gpus, t))
        return cls(rows)

    # -- the estimator protocol -------------------------------------------------------
    def fit(self, samples: Iterable[Sample]) -> TableEstimator:
        """Add measured samples as rows (a table learns by remembering). A row already held
        is not added again: the online refit passes every sample so far on each refit."""
        self.rows_ = tuple(dict.fromkeys(tuple(getattr(self, "rows_", ())) + tuple(
            (s.job.model, s.job.global_batch_size, s.gpu_type,
             sum(int(v) for v in s.placement.values()) or s.plan.gpus, float(s.iter_time_s))
            for s in samples if s.iter_time_s > 0)))
        return self

    def _points(self, model: str, batch: int, gpu_type: str) -> dict[int, float]:
        pts: dict[int, float] = {}
        for m, b, t, g, s in self.rows + tuple(getattr(self, "rows_", ())):
            if m == model and t == gpu_type and (b is None or b == batch):
                pts[g] = min(s, pts.get(g, math.inf))
        return pts

    def has_data(self, job: JobSpec) -> bool:
        return any(m == job.model and (b is None or b == job.global_batch_size)
                   for m, b, _, _, _ in self.rows + tuple(getattr(self, "rows_", ())))

    def iter_time(self, job: JobSpec, gpu_type: str, gpus: int) -> float | None:
        pts = self._points(job.model, job.global_batch_size, gpu_type)
        if not pts:
            return None
        if gpus in pts:
            return pts[gpus]
        lo = max((g for g in pts if g < gpus), default=None)
        hi = min((g for g in pts if g > gpus), default=None)
        if lo is not None and hi is not None:  # log-log interpolation of the time
            w = math.log(gpus / lo) / math.log(hi / lo)
            return math.exp((1 - w) * math.log(pts[lo]) + w * math.log(pts[hi]))
        near = lo if lo is not None else hi
        assert near is not None
        others = sorted(g for g in pts if g != near)
        exp = 1.0  # time ~ gpus^-exp; measured where two counts exist, at most linear
        if others:
            o = others[-1] if lo is not None else others[0]
            exp = min(1.0, max(0.0, -math.log(pts[o] / pts[near]) / math.log(o / near)))
        return pts[near] * (near / gpus) ** exp

    def source(self, job: JobSpec, gpu_type: str, gpus: int) -> Source:
        """``measured``: the table row of this very cell, or how the rows around it were
        interpolated (or extrapolated) to it."""
        pts = self._points(job.model, job.global_batch_size, gpu_type)
        n = len(pts)
        if gpus in pts:
            how = f"measured table row: {job.model} on {gpus} {gpu_type}"
        else:
            lo = max((g for g in pts if g < gpus), default=None)
            hi = min((g for g in pts if g > gpus), default=None)
            how = (f"interpolated between the measured rows of {lo} and {hi} {gpu_type}"
                   if lo is not None and hi is not None else
                   f"extrapolated from the measured row of {lo or hi} {gpu_type}")
        return Source("measured", how, estimator="tables", samples=n)

    def predict(self, job: JobSpec, plan: ExecutionPlan, placement: Mapping[str, int],
                cluster: Cluster) -> Estimate:
        node = next(iter(placement), None)
        gpu_type = cluster.nodes[node].gpu_type if node in cluster.nodes else ""
        t = self.iter_time(job, gpu_type, plan.gpus)
        if t is None:
            return Estimate(math.inf, 0.0, False, plan, job.global_batch_size, {"measured": 0.0})
        return Estimate(t, 0.0, True, plan, job.global_batch_size, {"measured": 1.0},
                        self.source(job, gpu_type, plan.gpus))

    def best_in_cell(self, job: JobSpec, cell: Cell, cluster: Cluster) -> Estimate | None:
        if cell.gpus % cell.stages:
            return None
        t = self.iter_time(job, cell.gpu_type, cell.gpus)
        if t is None:
            return None
        plan = ExecutionPlan(dp=cell.gpus // cell.stages, pp=cell.stages)
        source = self.source(job, cell.gpu_type, cell.gpus)
        if catalog_model(job.model) is None or fits_memory(
                job, plan, type_memory_bytes(cluster, cell.gpu_type)):
            return Estimate(t, 0.0, True, plan, job.global_batch_size, {"measured": 1.0},
                            source)
        planner = _planner()  # the table's split cannot hold it: a plan that fits, sized
        sized = planner.best_in_cell(job, cell, cluster) or fastest_fitting_split(
            planner, job, cell, cluster)
        if sized is None:
            return None
        return Estimate(t, sized.mem_per_gpu, True, sized.plan, job.global_batch_size,
                        {"measured": 1.0}, source)
