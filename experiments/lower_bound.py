"""A yardstick no baseline is: a lower bound on the average JCT *any* schedule could reach on
a trace and cluster, so each policy's distance to the best possible is measured, not only
its rank among the others.

Two bounds, the larger reported:

* **isolated**: each job alone on the cluster, on its fastest configuration (GPU type and
  count, at the ground truth's best placement and plan), starting the moment it arrives
  and paying only its first start: ``JCT_j >= start_cost + iterations_j / best_rate_j``.
* **time-indexed** (an LP, solved with HiGHS): time cut into slots; ``y[j,c,k]``, the
  seconds job ``j`` runs in configuration ``c`` during slot ``k``. Every job does its
  iterations (``sum y * rate >= iterations``), runs at most one configuration at a time
  (``sum_c y[j,c,k] <= |slot k|``, after its arrival and first start), and no GPU type
  holds more than it has (``sum gpus_c * y[j,c,k] <= capacity * |slot k|``); the last
  slot is open-ended, so the LP is always feasible. A job completes no earlier than any
  of its work, so no earlier than the work-weighted mean of its slots' starts, and no
  earlier than its isolated bound. Minimising the sum of completions less arrivals gives
  a bound on the average JCT that sees the cluster's capacity, which the isolated one does
  not (a busy trace's jobs cannot all run on the fastest type at once). Finer slots give
  a tighter bound; every slotting gives a valid one.

The rates are the ground truth's (what the simulator charges), each configuration at the
truth's best placement and plan: optimistic, as a bound must be.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import highspy
import numpy as np
from apportion.estimation.cache import DiskCache
from scipy import sparse

from apportion.cluster import Cluster

log = logging.getLogger(__name__)

SIMPLEX_ITERATIONS = 5_000_000


@dataclass
class JctBound:
    """What :func:`jct_lower_bound` found; seconds."""

    avg_jct_s: float  # the bound on the average JCT (the larger of the two)
    isolated_avg_s: float  # the mean of the jobs' isolated times
    lp_avg_s: float | None  # the time-indexed LP's, when it was solved
    slots: int
    status: str  # optimal | isolated-only (the LP not solved: too big, or its limit)
    jobs: int
    unrunnable: list[str] = field(default_factory=list)  # jobs no configuration runs

    def as_dict(self) -> dict[str, Any]:
        return {"avg_jct_s": self.avg_jct_s, "isolated_avg_s": self.isolated_avg_s,
                "lp_avg_s": self.lp_avg_s, "slots": self.slots, "status": self.status,
                "jobs": self.jobs, "unrunnable": list(self.unrunnable)}


def configurations(job: Any, truth: Any, capacity: dict[str, int]) -> list[tuple[str, int, float]]:
    """(GPU type, count, iterations/s) a job can run on: counts 1, 2, 4, ... up to the type's
    capacity and the job's own request; a count no faster than a smaller one of its type is
    left out (it only wastes GPUs, so no optimal schedule needs it)."""
    out = []
    for t, cap in sorted(capacity.items()):
        counts = sorted({2 ** i for i in range(int(math.log2(cap)) + 1) if 2 ** i <= cap}
                        | ({int(job.gpus)} if 0 < int(job.gpus) <= cap else set()))
        best = 0.0
        for g in counts:
            r = float(truth.rate(job, t, g))
            if r > best * (1 + 1e-9):
                out.append((t, g, r))
                best = r
    return out


BOUND_VERSION = 1  # bumped when the bound's formulation changes (cached bounds go stale)


def cached_jct_lower_bound(jobs: Sequence[Any], truth: Any, cluster: Cluster,
                           start_cost_s: float = 0.0, cache: DiskCache | None = None,
                           **kw: Any) -> JctBound:
    """:func:`jct_lower_bound`, kept in the profile cache (``APPORTION_CACHE``): every
    policy and seed of a comparison replays the same trace on the same cluster, and the LP
    is solved once for all of them."""
    digest = hashlib.sha256(json.dumps(
        [(j.job_id, j.submit_s, j.gpus, j.iterations, j.job_type, j.model, j.batch)
         for j in jobs], default=str).encode()).hexdigest()
    key = {"version": BOUND_VERSION, "jobs": digest, "truth": getattr(truth, "name", ""),
           "truth_class": type(truth).__name__, "cluster": cluster.fingerprint_hash,
           "start_cost_s": start_cost_s, **kw}
    store = cache or DiskCache()
    hit = store.get("jct-bound", key)
    if isinstance(hit, dict):
        try:
            return JctBound(**hit)
        except TypeError:  # an entry of another shape: solve again
            pass
    bound = jct_lower_bound(jobs, truth, cluster, start_cost_s, **kw)
    store.put("jct-bound", key, bound.as_dict())
    return bound


def jct_lower_bound(jobs: Sequence[Any], truth: Any, cluster: Cluster,
                    start_cost_s: float = 0.0, slots: int = 48,
                    max_columns: int = 250_000, time_limit_s: float = 120.0) -> JctBound:
    """The bound for ``jobs`` (the trace's :class:`SimJob`s: ``submit_s``, ``iterations``,
    ``gpus``) replayed on ``cluster`` under ``truth``. The LP has at most ``slots`` slots
    and ``max_columns`` columns (fewer, coarser slots on a big trace; under 4 slots the
    isolated bound stands alone); an LP stopped by its iteration
    limit or by the ``time_limit_s`` safety stop is no bound, and the isolated one stands."""
    capacity = {t: int(c) for t, c in cluster.capacity_by_type().items() if c > 0}
    confs = [configurations(j, truth, capacity) for j in jobs]
    unrunnable = [j.job_id for j, c in zip(jobs, confs) if not c]
    keep = [(j, c) for j, c in zip(jobs, confs) if c]
    if not keep:
        return JctBound(0.0, 0.0, None, 0, "isolated-only", 0, unrunnable)
    arrive = np.array([float(j.submit_s) for j, _ in keep])
    work = np.array([float(j.iterations) for j, _ in keep])
    best = np.array([max(r for _, _, r in c) for _, c in keep])
    isolated = start_cost_s + work / best
    iso_avg = float(isolated.mean())
    per_slot = sum(len(c) for _, c in keep)
    slots = min(slots, max_columns // max(1, per_slot))  # a big trace: coarser, still valid
    if slots < 4:
        log.info("JCT bound: %d configurations per slot: the isolated bound only", per_slot)
        return JctBound(iso_avg, iso_avg, None, 0, "isolated-only", len(keep), unrunnable)
    lp = _time_indexed(keep, arrive, work, isolated, capacity, start_cost_s, slots,
                       time_limit_s)
    if lp is None:
        return JctBound(iso_avg, iso_avg, None, slots, "isolated-only", len(keep), unrunnable)
    return JctBound(max(lp, iso_avg), iso_avg, lp, slots, "optimal", len(keep), unrunnable)


def _time_indexed(keep: list[tuple[Any, list[tuple[str, int, float]]]], arrive: np.ndarray,
                  work: np.ndarray, isolated: np.ndarray, capacity: dict[str, int],
                  start_cost_s: float, slots: int, time_limit_s: float) -> float | None:
    n = len(keep)
    ready = arrive + start_cost_s
    # slots from the first start to beyond when everything could be done: the last open
    gpu_work = sum(w / max(r / g for _, g, r in c) for w, (_, c) in zip(work, keep))
    horizon = float(ready.max()) + gpu_work / max(1, sum(capacity.values())) + float(
        isolated.max())
    bounds = np.linspace(float(ready.min()), horizon, slots + 1)
    starts, lengths = bounds[:-1], np.diff(bounds)
    lengths[-1] = math.inf
    types = sorted(capacity)
    cols_job, cols_slot, cols_type, cols_gpus, cols_rate, cols_ub = [], [], [], [], [], []
    for j, (_, confs) in enumerate(keep):
        for k in range(slots):
            if bounds[k + 1] <= ready[j]:
                continue  # before the job can run
            usable = min(lengths[k], bounds[k + 1] - max(starts[k], ready[j]))
            for t, g, r in confs:
                cols_job.append(j)
                cols_slot.append(k)
                cols_type.append(types.index(t))
                cols_gpus.append(g)
                cols_rate.append(r)
                cols_ub.append(usable)
    m = len(cols_job)
    job = np.array(cols_job)
    slot = np.array(cols_slot)
    rate = np.array(cols_rate)
    ub = np.array(cols_ub)
    # C_j columns after the y columns; minimise sum C_j
    n_cols = m + n
    col_lb = np.zeros(n_cols)
    col_ub = np.concatenate([ub, np.full(n, math.inf)])
    cost = np.concatenate([np.zeros(m), np.ones(n)])
    rows, cols, vals, row_lb, row_ub = [], [], [], [], []
    r = 0

    def add(idx: np.ndarray, coef: np.ndarray, lo: float, hi: float) -> None:
        nonlocal r
        rows.extend([r] * len(idx))
        cols.extend(idx.tolist())
        vals.extend(coef.tolist())
        row_lb.append(lo)
        row_ub.append(hi)
        r += 1

    ys = np.arange(m)
    for j in range(n):
        mine = ys[job == j]
        # its iterations done
        add(mine, rate[mine], float(work[j]), math.inf)
        # C_j >= work-weighted mean of its slots' starts: C_j - sum y*rate/w * start >= 0
        begin = np.maximum(starts[slot[mine]], ready[j])
        add(np.append(mine, m + j), np.append(-rate[mine] / work[j] * begin, 1.0), 0.0,
            math.inf)
    # one configuration at a time: per job and slot (only slots with more than one column)
    order = np.lexsort((slot, job))
    keys = job[order] * slots + slot[order]
    splits = np.flatnonzero(np.diff(keys)) + 1
    for grp in np.split(order, splits):
        if len(grp) > 1 and math.isfinite(lengths[slot[grp[0]]]):
            add(grp, np.ones(len(grp)), 0.0, float(lengths[slot[grp[0]]]))
    # capacity per type and slot
    ttype = np.array(cols_type)
    gpus = np.array(cols_gpus, float)
    for k in range(slots - 1):  # the last slot is open-ended
        for ti, t in enumerate(types):
            idx = ys[(slot == k) & (ttype == ti)]
            if len(idx):
                add(idx, gpus[idx], 0.0, float(capacity[t] * lengths[k]))
    # C_j >= arrival + isolated time: a column bound
    col_lb[m:] = arrive + isolated
    a = sparse.csc_matrix((vals, (rows, cols)), shape=(r, n_cols))
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n_cols, r
    lp.col_cost_ = cost
    lp.col_lower_, lp.col_upper_ = col_lb, np.where(np.isinf(col_ub), highspy.kHighsInf, col_ub)
    lp.row_lower_ = np.where(np.isinf(row_lb), -highspy.kHighsInf, row_lb)
    lp.row_upper_ = np.where(np.isinf(row_ub), highspy.kHighsInf, row_ub)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = a.indptr
    lp.a_matrix_.index_ = a.indices
    lp.a_matrix_.value_ = a.data
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    # the bound is the same on any machine: the LP stops on its iterations (the clock only a
    # safety stop), and a stopped LP is no bound
    h.setOptionValue("simplex_iteration_limit", SIMPLEX_ITERATIONS)
    h.setOptionValue("time_limit", float(time_limit_s))
    h.passModel(lp)
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        log.warning("JCT bound LP: %s; the isolated bound stands",
                    h.modelStatusToString(h.getModelStatus()))
        return None
    total = h.getInfo().objective_function_value
    return float((total - arrive.sum()) / n)
