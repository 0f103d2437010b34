"""A job's global batch as a decision (Pollux's goodput), chosen cell by cell.

A job that gives a ``batch_range`` (:class:`~apportion.jobs.JobSpec`) lets the scheduler
choose the global batch it trains with. A larger batch feeds more GPUs and runs more
samples per second, but each sample counts for less: the statistical efficiency ``E``
falls as the batch grows past the job's gradient noise scale (Pollux, OSDI'21;
:mod:`apportion.estimation.goodput.efficiency`). What a job gains from a cell is its
*goodput* there, progress per second = samples per second x ``E``, at the best batch.

The candidate builder asks :func:`best_in_cell` for each cell (type, count, stages); it
tries the job's :func:`batch_options` and keeps the one of most progress per second, so a
cell is (type, count, stages, batch) with its batch chosen for it. Nothing else the
objective counts depends on the batch (a move's restart is the allocation's; a new batch
on the same GPUs restarts nothing, as Pollux re-tunes it between epochs), so the best
batch of a cell is the only one worth a column. The estimate keeps the job's own
``global_batch_size`` (its ``iterations`` are counted at it) and says the batch chosen in
``Estimate.batch``; the decoder writes it into the allocation
(``Allocation.global_batch_size``).

Progress per second at a batch comes from

* an estimator that rates batches (``rates_batches``, :meth:`best_at_batch`): a replay's
  rate source on a truth whose rates are goodput (Pollux's), efficiency included, in the
  job's own units, at the job's progress;
* any other estimator: its time for a step at that batch (the job with that global
  batch), times the progress such a step makes in the job's own iterations,
  ``(b / B) * E(b) / E(B)``, ``E`` from the gradient statistics the job reports
  (``JobSpec.grad_stats``: ``E(b) / E(B) = (var + sqr * B) / (var + sqr * b)`` with the
  per-sample variance). A job that reports
  none yet keeps its own batch: without its noise scale every larger batch looks free.

A job without a ``batch_range`` gets exactly the estimator's answer, as before.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from apportion.estimation.base import Estimate
from apportion.estimation.goodput.efficiency import statistical_efficiency

from apportion.cluster import Cluster
from apportion.jobs import JobSpec
from apportion.plans import Cell

#: batches tried per cell, spaced geometrically over the job's range (its own batch and
#: the range's ends among them)
GRID_POINTS = 12


def batch_options(job: JobSpec, gpus: int, points: int = GRID_POINTS) -> list[int]:
    """The global batches tried for ``job`` on ``gpus`` GPUs: multiples of the GPU count
    (each GPU an equal share, as data parallelism runs it and as Pollux's batches are: GPUs
    x per-GPU batch x steps) nearest a geometric grid over its ``batch_range``, the range's
    first and last such multiple, and its own batch; its own batch alone where it gives no
    range."""
    if job.batch_range is None:
        return [job.global_batch_size]
    lo, hi = (int(x) for x in job.batch_range)
    k = max(1, int(gpus))
    first, last = -(-max(lo, k) // k) * k, hi // k * k
    vals = set()
    if first <= last:
        grid = np.geomspace(first, last, max(2, points)) if last > first else [first]
        vals = {min(last, max(first, int(round(float(x) / k)) * k)) for x in grid}
        vals |= {first, last}
    if lo <= job.global_batch_size <= hi:
        vals.add(int(job.global_batch_size))
    return sorted(vals)


def efficiency(job: JobSpec, batch: float) -> float:
    """``E(batch)`` relative to one sample, from the job's reported gradient statistics
    (``grad_var`` per sample: Pollux's ``E`` with ``M0 = 1``; only its ratios between
    batches are used); 1 without them."""
    if job.grad_stats is None:
        return 1.0
    sqr, var = job.grad_stats
    return float(statistical_efficiency(batch, 1.0, sqr, var))


def progress_gain(job: JobSpec, batch: int) -> float:
    """Progress of one step at ``batch`` in the job's own iterations (steps of its own
    batch ``B``): ``(batch / B) * E(batch) / E(B)``."""
    own = max(1, int(job.global_batch_size))
    return batch / own * efficiency(job, batch) / max(efficiency(job, own), 1e-300)


def _at(est: Any, job: JobSpec, cell: Cell, cluster: Cluster, batch: int) -> Estimate | None:
    """One batch's estimate, its time in the job's own iterations."""
    if getattr(est, "rates_batches", False):
        return est.best_at_batch(job, cell, cluster, batch)
    e = est.best_in_cell(replace(job, global_batch_size=batch), cell, cluster)
    if e is None or not e.feasible or e.iter_time_s <= 0:
        return None
    return replace(e, iter_time_s=e.iter_time_s / progress_gain(job, batch),
                   global_batch_size=job.global_batch_size, batch=batch)


def best_in_cell(est: Any, job: JobSpec, cell: Cell, cluster: Cluster) -> Estimate | None:
    """The cell's estimate at the job's best batch (module docstring); the estimator's own
    answer for a job that fixes its batch."""
    if job.batch_range is None or (job.grad_stats is None
                                   and not getattr(est, "rates_batches", False)):
        return est.best_in_cell(job, cell, cluster)
    best: Estimate | None = None
    own = job.global_batch_size
    for b in batch_options(job, cell.gpus):
        e = _at(est, job, cell, cluster, b)
        if e is None or not e.feasible or e.iter_time_s <= 0:
            continue
        # the fastest; among equals the job's own batch, then the smaller
        if best is None or (e.iter_time_s, b != own, b) < (best.iter_time_s,
                                                          best.batch != own, best.batch or 0):
            best = e if e.batch is not None else replace(e, batch=b)
    return best


__all__ = ["GRID_POINTS", "batch_options", "best_in_cell", "efficiency", "progress_gain"]
