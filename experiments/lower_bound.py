"""A yardstick no baseline is: a lower bound on the average JCT *any* schedule could reach on
a trace and cluster, so each policy's distance to the best possible is measured, not only
its rank among the others.

What a job may do is :mod:`apportion.experiments.optimistic_rates`'s: its *options*, each
(GPU type, GPUs charged, rate), the upper concave envelope of every GPU count on every type
at the truth's best placement and plan, with transfer and merging for fine-tuning jobs at
the largest work cut any sibling could give. Every way a policy runs a job in the simulator
is a mix of these with no more time and GPU-time and no less progress. Notation: job ``j``
arrives at ``a_j`` and needs ``w_j`` iterations; ``R_j`` is its fastest rate,
``e_j`` its most iterations per GPU-second, ``iso_j = w_j / R_j`` and ``v_j = w_j / e_j``
(the fewest GPU-seconds it can take); ``M_T`` the GPUs of the types in ``T``.

**When a job can first progress**, ``s_j``: the simulator decides at round ticks, multiples
of the round's length ``round_s`` (its first round is the first multiple at or after the
first arrival, and an idle cluster jumps to the multiple at or after the next arrival), so
no job is placed before the first tick at or after its arrival, and its first start costs
``start_cost_s`` before it progresses: ``s_j = ceil(a_j / round_s) round_s + start_cost_s``.

**Valid inequalities** (each holds for the completion times ``C_j`` of every schedule the
simulator can run, so the least sum subject to them is a bound):

1. *isolated*: ``C_j >= s_j + iso_j`` (no job progresses faster than ``R_j``), and, for
   fine-tuning jobs, by how it runs: the simulator fixes a job's mode at its first start,
   a transfer from ``p`` needs ``p`` finished and a merge with ``p`` needs ``p`` arrived,
   so ``C_j >= min(s_j + w_j / R_alone_j, min over p and mode of max(s_j, when p allows
   the mode) + w_j / r_jp)``, ``r_jp`` the fastest rate of that mode with ``p`` and "when
   ``p`` allows it" ``p``'s own least completion (a transfer) or ``s_p`` (a merge).
2. *mean busy time* (Goemans): the work-weighted mean ``B_j`` of the times job ``j``
   progresses is at most ``C_j - iso_j / 2`` (progress at the rate ``R_j`` packed against
   the end is the latest it can be), so ``C_j >= B_j + iso_j / 2``.
3. *time-indexed LP* (solved with HiGHS): time cut into slots ``k``; ``y[j,o,k]``, the
   seconds job ``j`` runs option ``o`` in slot ``k``. Every job does its work
   (``sum y rate / w_j >= 1``), runs at most one option at a time (``sum_o y[j,o,k] <=``
   the part of slot ``k`` after ``s_j``), no GPU type holds more than it has
   (``sum gpus_o y <= cap_t |k|``), and ``B_j >= sum_k (work fraction in k) x
   max(start_k, s_j)``, so by 2. ``C_j >= sum_k frac_jk max(start_k, s_j) + iso_j / 2``. A
   fine-tuning mode's options run only from the earliest any partner allows that mode (as
   in 1.): before, a slot offers the job's options alone (the envelope of what runs then). The
   last slot is open-ended, so the LP is always feasible. Slots are placed where the trace's
   events are (arrivals, isolated completions) as well as evenly: any slotting is valid, a
   finer one where jobs start and end is tighter.
4. *squared work* (Queyranne's parallel inequalities on the cluster seen as one machine of
   ``M_T`` GPUs, for the jobs ``S`` that can run only on types in ``T`` and first progress at
   ``s_j >= tau``): with ``v(S) = sum_S v_j``, ``sum_S v_j C_j >= tau v(S) + v(S)^2 / (2 M_T)
   + sum_S v_j iso_j / 2``. Why: job ``j`` holds at least ``v_j`` GPU-seconds per unit of its
   work fraction, the jobs of ``S`` hold at most ``M_T`` GPUs together and start no earlier
   than ``tau``, so their GPU-second-weighted mean busy times sum to at least ``tau v(S) +
   v(S)^2 / (2 M_T)``, and 2. adds ``iso_j / 2`` to each. Added to the LP for every type set
   of the trace and thresholds ``tau`` at its jobs' first progress times; alone (with 1.) they
   are the *aggregate* LP, solved where the time-indexed one is too big.
5. *SRPT on one machine*: the cluster as one machine of ``M`` GPUs processing job ``j`` as
   ``v_j`` GPU-seconds from ``s_j`` is a relaxation of every schedule; shortest remaining
   processing time is optimal there (Schrage), its sum of completions is a bound.

The bound on the average JCT is the largest of the isolated sum (1.), the LP (3. with 4.,
or 4. alone) and SRPT (5.), less the arrivals, over the jobs.

**What it is compared with** (:func:`bound_summary`): the bound above counts every job until
it finishes, as ``avg_jct_all_s`` does when every job finished (then ``avg_jct_s`` is the
same number). Where some job did not finish (dropped, or left when the replay stopped at
``E``), ``avg_jct_all_s`` counts each job until ``min(C_j, E)``: the bound is then the same
construction with the horizon ``E`` (``D_j = min(C_j, E)``, ``D_j <= E``, ``D_j >=
min(s_j + iso_j, E)``, the work fraction ``f_j`` done before ``E`` at most 1, and 2. becomes
``D_j >= E + sum_k frac_jk (max(start_k, s_j) - E) + (2 f_j - 1) iso_j / 2``: for a job
done by ``E`` it is 2.; for one that is not, ``D_j = E`` and the mean busy time of its done
part is at most ``E - f_j iso_j / 2``, with ``f_j^2 >= 2 f_j - 1``), SRPT truncated at ``E``
(SRPT has the fewest jobs unfinished at every instant), and a job no option runs counted
``E - a_j``. No bound holds for the finished-jobs average whatever set of jobs finished (a
policy that finishes only the shortest job averages its isolated time), so that average is
compared with the bound only when every job finished.

The rates are the ground truth's (what the simulator charges): optimistic, as a bound must
be. The LP stops on its simplex iterations, so the bound is the same on any machine (the
clock is only a safety stop); an LP stopped early is no bound, and the others stand.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import highspy
import numpy as np
from apportion.estimation.cache import DiskCache
from apportion.experiments.optimistic_rates import (
    MODE_GROUP,
    JobOptions,
    OptimisticRates,
    Option,
)
from scipy import sparse

from apportion.cluster import Cluster

log = logging.getLogger(__name__)

SIMPLEX_ITERATIONS = 5_000_000
#: fewer slots than this and the time-indexed LP says little: the aggregate LP instead
MIN_SLOTS = 6
#: thresholds of the squared-work rows per type set (quantiles of the first-progress times)
THRESHOLDS = 64
#: options per GPU type in the LP (optimistic_rates.upper_envelope): fewer, for more slots
OPTIONS_PER_TYPE = 6


@dataclass
class JctBound:
    """What :func:`jct_lower_bound` found; seconds."""

    avg_jct_s: float  # the bound on the average JCT (the largest of the ones below)
    isolated_avg_s: float  # the mean of the jobs' isolated times (inequality 1.)
    lp_avg_s: float | None  # the time-indexed LP's (3. with 4.), when it was solved
    slots: int
    status: str  # optimal | aggregate (the time-indexed LP too big) | isolated-only
    jobs: int  # the jobs averaged over
    unrunnable: list[str] = field(default_factory=list)  # jobs no configuration runs
    aggregate_avg_s: float | None = None  # the squared-work LP's (4. with 1.), when solved
    srpt_avg_s: float | None = None  # SRPT on the cluster as one machine (5.)
    horizon_s: float | None = None  # counted until min(finish, this); None: until finish
    round_s: float = 0.0  # the round grid the first starts wait for
    credited: dict[str, int] = field(default_factory=dict)  # jobs whose best option is a mode

    def as_dict(self) -> dict[str, Any]:
        return {"avg_jct_s": self.avg_jct_s, "isolated_avg_s": self.isolated_avg_s,
                "lp_avg_s": self.lp_avg_s, "slots": self.slots, "status": self.status,
                "jobs": self.jobs, "unrunnable": list(self.unrunnable),
                "aggregate_avg_s": self.aggregate_avg_s, "srpt_avg_s": self.srpt_avg_s,
                "horizon_s": self.horizon_s, "round_s": self.round_s,
                "credited": dict(self.credited)}


BOUND_VERSION = 2  # bumped when the bound's formulation changes (cached bounds go stale)


def first_progress(submit: np.ndarray, start_cost_s: float, round_s: float) -> np.ndarray:
    """``s_j``: the first round tick at or after each arrival, plus the first start's cost
    (the module's doc). A tick within a millionth of a round of the arrival counts as at
    it, so the clock's rounding never puts ``s_j`` after the simulator's first start."""
    if round_s > 0:
        tick = np.ceil((submit - 1e-6 * round_s) / round_s) * round_s
        submit = np.maximum(submit, tick)
    return submit + start_cost_s


def srpt_completions(release: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Completion times of shortest-remaining-processing-time on one unit-speed machine
    (preemptive, jobs released at ``release``): the least sum of completions there, and
    the fewest jobs unfinished at every instant."""
    n = len(release)
    order = np.argsort(release, kind="stable")
    done = np.empty(n)
    heap: list[tuple[float, int]] = []
    t, i = 0.0, 0
    while i < n or heap:
        if not heap:
            t = max(t, float(release[order[i]]))
        while i < n and release[order[i]] <= t:
            j = int(order[i])
            heapq.heappush(heap, (float(size[j]), j))
            i += 1
        rem, j = heapq.heappop(heap)
        nxt = float(release[order[i]]) if i < n else math.inf
        if t + rem <= nxt:
            t += rem
            done[j] = t
        else:
            heapq.heappush(heap, (rem - (nxt - t), j))
            t = nxt
    return done


def _digest(jobs: Sequence[Any]) -> str:
    return hashlib.sha256(json.dumps(
        [(j.job_id, j.submit_s, j.gpus, j.iterations, j.job_type, j.model, j.batch,
          j.gpu_type, j.plan, j.finetune) for j in jobs], default=str).encode()).hexdigest()


def cached_jct_lower_bound(jobs: Sequence[Any], truth: Any, cluster: Cluster,
                           start_cost_s: float = 0.0, cache: DiskCache | None = None,
                           **kw: Any) -> JctBound:
    """:func:`jct_lower_bound`, kept in the profile cache (``APPORTION_CACHE``): every
    policy and seed of a comparison replays the same trace on the same cluster, and the LP
    is solved once for all of them."""
    key = {"version": BOUND_VERSION, "jobs": _digest(jobs), "truth": getattr(truth, "name", ""),
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


@dataclass
class _Jobs:
    """The runnable jobs' figures the inequalities read (the module's notation)."""

    opts: list[JobOptions]
    arrive: np.ndarray
    ready: np.ndarray  # s_j
    work: np.ndarray  # w_j
    iso: np.ndarray  # w_j / R_j
    gpu_s: np.ndarray  # v_j
    types: list[frozenset[str]]
    srpt: np.ndarray | None = None  # completions of SRPT on the cluster as one machine
    # per job, (from when, the options then): alone from s_j, with a fine-tuning mode from
    # the earliest that mode could first run (_tiers)
    tiers: list[list[tuple[float, tuple[Option, ...]]]] = field(default_factory=list)
    first: np.ndarray = field(default_factory=lambda: np.zeros(0))  # least completions (1.)


def jct_lower_bound(jobs: Sequence[Any], truth: Any, cluster: Cluster,
                    start_cost_s: float = 0.0, round_s: float = 0.0,
                    horizon_s: float | None = None, slots: int = 128,
                    max_columns: int = 400_000, time_limit_s: float = 300.0) -> JctBound:
    """The bound for ``jobs`` (the trace's :class:`SimJob`s) replayed on ``cluster`` under
    ``truth`` in rounds of ``round_s`` (0: a job may start the moment it arrives), each
    first start costing ``start_cost_s``; with ``horizon_s``, every job counted until
    ``min(finish, horizon_s)`` (the module's doc). The time-indexed LP has at most
    ``slots`` slots and ``max_columns`` columns (fewer slots on a big trace; under
    :data:`MIN_SLOTS` the aggregate LP instead)."""
    capacity = {t: int(c) for t, c in cluster.capacity_by_type().items() if c > 0}
    # the bound asks the truth at every count; what a replay's own rates rested on
    # (``interpolated``, reported per replay) is left as it was
    seen = getattr(truth, "interpolated", None)
    kept = set(seen) if isinstance(seen, set) else None
    try:
        opts = OptimisticRates(truth, capacity).options(jobs, OPTIONS_PER_TYPE)
    finally:
        if kept is not None and isinstance(seen, set):
            seen.intersection_update(kept)
    unrunnable = [j.job_id for j, o in zip(jobs, opts) if o.best_rate <= 0]
    keep = [(j, o) for j, o in zip(jobs, opts) if o.best_rate > 0]
    horizon = None if horizon_s is None else float(horizon_s)
    # a horizon counts every job (one that never runs until the horizon); without one the
    # bound averages the jobs that can finish
    never = set(unrunnable)
    outside = ([max(0.0, horizon - float(j.submit_s)) for j in jobs if j.job_id in never]
               if horizon is not None else [])
    n = len(keep) + len(outside)
    if not keep:
        only = sum(outside) / n if n else 0.0
        return JctBound(only, only, None, 0, "isolated-only", n, unrunnable, horizon_s=horizon,
                        round_s=round_s)
    arrive = np.array([float(j.submit_s) for j, _ in keep])
    work = np.array([float(j.iterations) for j, _ in keep])
    best = np.array([o.best_rate for _, o in keep])
    js = _Jobs([o for _, o in keep], arrive, first_progress(arrive, start_cost_s, round_s),
               work, work / best, work / np.array([o.best_per_gpu for _, o in keep]),
               [o.types for _, o in keep])
    credited = _tiers(js, [j.job_id for j, _ in keep])
    lo = js.first
    if horizon is not None:
        lo = np.minimum(lo, horizon)

    def avg(total_completion: float) -> float:
        return (total_completion - float(arrive.sum()) + sum(outside)) / n

    iso_avg = avg(float(lo.sum()))
    speed = float(sum(capacity[t] for t in set().union(*js.types)))
    done = srpt_completions(js.ready, js.gpu_s / speed)
    js.srpt = done
    if horizon is not None:
        done = np.minimum(done, horizon)
    srpt_avg = avg(float(np.maximum(done, js.ready).sum()))
    per_slot = sum(max(len(o) for _, o in t) for t in js.tiers)
    k = min(slots, max_columns // max(1, per_slot))
    lp_avg = agg_avg = None
    status = "isolated-only"
    if k >= MIN_SLOTS:
        got, k = _solve(js, capacity, k, horizon, time_limit_s, time_indexed=True)
        if got is not None:
            lp_avg, status = avg(got), "optimal"
    else:
        log.info("JCT bound: %d options per slot: the aggregate LP", per_slot)
    if lp_avg is None and horizon is None:
        got, _ = _solve(js, capacity, 0, None, time_limit_s, time_indexed=False)
        if got is not None:
            agg_avg, status = avg(got), "aggregate"
    found = [x for x in (iso_avg, srpt_avg, lp_avg, agg_avg) if x is not None]
    return JctBound(max(found), iso_avg, lp_avg, k if lp_avg is not None else 0, status, n,
                    unrunnable, agg_avg, srpt_avg, horizon, round_s, credited)


def _tiers(js: _Jobs, ids: list[str]) -> dict[str, int]:
    """Each job's tiers and least completion (``js.tiers``, ``js.first``), and how many
    jobs a fine-tuning mode gives their least completion to.

    A transfer runs once its source finished, so no earlier than the source's own least
    completion; a merged pair once both jobs arrived: with partner ``p`` in mode ``m`` at
    its fastest rate ``r``, job ``j`` completes no earlier than ``max(s_j, when p allows
    m) + w_j / r``; alone, no earlier than ``s_j + w_j / R_alone``; its least completion is
    the smallest of these (inequality 1.). A mode's options join the job's from the
    earliest any partner allows it. Two passes: the second reads the first's completions
    for the sources."""
    index = {jid: i for i, jid in enumerate(ids)}
    own = js.ready + js.iso  # each job at its fastest, any mode: no completion is earlier
    credited: dict[str, int] = {}
    for _ in range(2):
        first = np.empty(len(ids))
        tiers: list[list[tuple[float, tuple[Option, ...]]]] = []
        credited = {}
        for i, o in enumerate(js.opts):
            alone = o.alone_rate()
            best = js.ready[i] + js.work[i] / alone if alone > 0 else math.inf
            how = "alone"
            since = {"alone": float(js.ready[i])}
            for pid, mode, rate in o.partners:
                q = index.get(pid)
                if q is None or rate <= 0:
                    continue  # a partner that never runs: no transfer from it, no pair
                start = float(max(js.ready[i], own[q] if mode == "transfer" else
                                  js.ready[q]))
                if start + js.work[i] / rate < best:
                    best, how = start + js.work[i] / rate, mode
                group = MODE_GROUP[mode]
                since[group] = min(since.get(group, math.inf), start)
            first[i] = max(best, own[i])
            if how != "alone":
                credited[how] = credited.get(how, 0) + 1
            out = []
            for t in sorted(set(since.values())):
                key = frozenset(g for g, at in since.items() if at <= t)
                out.append((t, o.by_modes.get(key, o.options)))
            tiers.append(out)
        own = first
    js.first, js.tiers = own, tiers
    return credited


def _slot_bounds(js: _Jobs, end: float, k: int) -> np.ndarray:
    """At most ``k + 1`` slot boundaries from the first progress to ``end``: half evenly
    (a busy cluster's queue drains long after the last arrival), half at quantiles of the
    trace's events (first progress times, isolated completions, completions of SRPT on the
    cluster as one machine), where an idle cluster's jobs start and end."""
    lo = float(js.ready.min())
    events = np.concatenate([js.ready, js.first] +
                            ([js.srpt] if js.srpt is not None else []))
    events = np.sort(events[(events >= lo) & (events <= end)])
    picks = events[np.linspace(0, len(events) - 1, k // 2 + 1).round().astype(int)]
    even = np.linspace(lo, end, k - k // 2 + 1)
    return np.unique(np.concatenate([[lo, end], even, picks]))


@dataclass
class _SlotColumns:
    """The time-indexed LP's y columns: per column its job, slot, GPU type (an index into
    the sorted types), GPUs, work fraction per second, most seconds and when its work can
    start in its slot."""

    job: list[int] = field(default_factory=list)
    slot: list[int] = field(default_factory=list)
    type: list[int] = field(default_factory=list)
    gpus: list[float] = field(default_factory=list)
    frac: list[float] = field(default_factory=list)
    ub: list[float] = field(default_factory=list)
    begin: list[float] = field(default_factory=list)


def _slot_columns(js: _Jobs, capacity: dict[str, int], slots: int, horizon: float | None,
                  types: list[str]) -> tuple[_SlotColumns, np.ndarray]:
    """Every (job, slot, option) column the time-indexed LP offers, and the slots' bounds."""
    cols = _SlotColumns()
    total_gpus = float(sum(capacity.values()))
    # slots to when every job could be done (the last one open-ended beyond)
    end = (horizon if horizon is not None else
           float(js.ready.max()) + float(js.gpu_s.sum()) / total_gpus + float(js.iso.max()))
    bounds = _slot_bounds(js, end, slots)
    starts, lengths = bounds[:-1], np.diff(bounds)
    if horizon is None:
        lengths[-1] = math.inf
    for j, tiers in enumerate(js.tiers):
        for k in range(len(starts)):
            stop = starts[k] + lengths[k]
            for i, (since, options) in enumerate(tiers):
                if stop <= since:
                    break  # before the job (or its mode) can run
                if i + 1 < len(tiers) and tiers[i + 1][0] <= starts[k]:
                    continue  # a later tier, with more options, runs the whole slot
                usable = min(lengths[k], stop - max(starts[k], since))
                for op in options:
                    cols.job.append(j)
                    cols.slot.append(k)
                    cols.type.append(types.index(op.gpu_type))
                    cols.gpus.append(op.gpus)
                    cols.frac.append(op.rate / js.work[j])  # work fraction per second
                    cols.ub.append(usable)
                    cols.begin.append(max(starts[k], since))
    return cols, bounds


class _Rows:
    """The LP's rows as COO triplets and their two sides, added a row at a time."""

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []
        self.cols: list[np.ndarray] = []
        self.vals: list[np.ndarray] = []
        self.lb: list[float] = []
        self.ub: list[float] = []

    def add(self, idx: np.ndarray, coef: np.ndarray, lo_: float, hi: float) -> None:
        self.rows.append(np.full(len(idx), len(self.lb)))
        self.cols.append(np.asarray(idx, dtype=int))
        self.vals.append(np.asarray(coef, dtype=float))
        self.lb.append(lo_)
        self.ub.append(hi)


def _time_indexed_rows(rows: _Rows, js: _Jobs, capacity: dict[str, int], types: list[str],
                       cols: _SlotColumns, bounds: np.ndarray, horizon: float | None) -> None:
    """Each job's work and completion rows, one option at a time per job and slot, and
    each type's capacity per slot."""
    m = len(cols.job)
    job = np.array(cols.job, dtype=int)
    slot = np.array(cols.slot, dtype=int)
    frac = np.array(cols.frac)
    begins = np.array(cols.begin)
    starts = bounds[:-1]
    ys = np.arange(m)
    by_job = np.split(np.argsort(job, kind="stable"),
                      np.flatnonzero(np.diff(np.sort(job, kind="stable"))) + 1)
    for mine in by_job:
        if not len(mine):
            continue
        j = int(job[mine[0]])
        begin = begins[mine]
        if horizon is None:
            rows.add(mine, frac[mine], 1.0, math.inf)  # its work done
            # C_j >= sum frac * begin + iso_j / 2 (inequalities 2. and 3.)
            rows.add(np.append(mine, m + j), np.append(-frac[mine] * begin, 1.0),
                     float(js.iso[j]) / 2, math.inf)
        else:
            rows.add(mine, frac[mine], 0.0, 1.0)  # no more than its work before E
            # D_j >= E - iso/2 + sum frac (begin - E + iso) (the module's doc)
            rows.add(np.append(mine, m + j),
                     np.append(-frac[mine] * (begin - horizon + js.iso[j]), 1.0),
                     horizon - float(js.iso[j]) / 2, math.inf)
    # one option at a time: per job and slot, within the part of the slot after s_j
    order = np.lexsort((slot, job))
    keys = job[order] * len(starts) + slot[order]
    ends = np.append(starts[1:], math.inf) if horizon is None else bounds[1:]
    for grp in np.split(order, np.flatnonzero(np.diff(keys)) + 1):
        j, k = int(job[grp[0]]), int(slot[grp[0]])
        usable = float(ends[k] - max(starts[k], js.ready[j]))
        if len(grp) > 1 and math.isfinite(usable):
            rows.add(grp, np.ones(len(grp)), 0.0, usable)
    # capacity per type and slot
    ttype = np.array(cols.type)
    gpus = np.array(cols.gpus)
    lengths = np.diff(bounds)
    for k in range(len(starts)):
        if horizon is None and k == len(starts) - 1:
            continue  # the last slot is open-ended
        for ti, t in enumerate(types):
            idx = ys[(slot == k) & (ttype == ti)]
            if len(idx):
                rows.add(idx, gpus[idx], 0.0, float(capacity[t] * lengths[k]))


def _lp_minimum(rows: _Rows, cost: np.ndarray, col_lb: np.ndarray, col_ub: np.ndarray,
                time_limit_s: float) -> float | None:
    """HiGHS's optimum of min cost.x within the rows and the columns' bounds; None when it
    did not prove it optimal (a stopped LP is no bound)."""
    n_cols = len(cost)
    a = sparse.csc_matrix((np.concatenate(rows.vals),
                           (np.concatenate(rows.rows), np.concatenate(rows.cols))),
                          shape=(len(rows.lb), n_cols))
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n_cols, len(rows.lb)
    lp.col_cost_ = cost
    inf = highspy.kHighsInf
    lp.col_lower_ = col_lb
    lp.col_upper_ = np.where(np.isinf(col_ub), inf, col_ub)
    lp.row_lower_ = np.where(np.isinf(rows.lb), -inf, rows.lb)
    lp.row_upper_ = np.where(np.isinf(rows.ub), inf, rows.ub)
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
        log.warning("JCT bound LP: %s; the other bounds stand",
                    h.modelStatusToString(h.getModelStatus()))
        return None
    return float(h.getInfo().objective_function_value)


def _solve(js: _Jobs, capacity: dict[str, int], slots: int, horizon: float | None,
           time_limit_s: float, time_indexed: bool) -> tuple[float | None, int]:
    """The LP's least sum of completions (of ``min(C_j, horizon)`` with a horizon): the
    time-indexed LP with the squared-work rows, or (``time_indexed`` false) the
    squared-work rows alone; None when HiGHS did not prove it optimal. And its slots."""
    n = len(js.work)
    types = sorted(capacity)
    cols, bounds = (_slot_columns(js, capacity, slots, horizon, types) if time_indexed
                    else (_SlotColumns(), np.zeros(1)))
    m = len(cols.job)
    n_cols = m + n  # C_j (or D_j) after the y columns; minimise their sum
    col_lb = np.zeros(n_cols)
    col_ub = np.concatenate([np.array(cols.ub), np.full(n, math.inf)])
    cost = np.concatenate([np.zeros(m), np.ones(n)])
    lo = js.first
    if horizon is not None:
        col_lb[m:] = np.minimum(lo, horizon)
        col_ub[m:] = horizon
    else:
        col_lb[m:] = lo
    rows = _Rows()
    if time_indexed:
        _time_indexed_rows(rows, js, capacity, types, cols, bounds, horizon)
    if horizon is None:
        for idx, rhs in _squared_work(js, capacity):
            rows.add(m + idx, js.gpu_s[idx] / js.gpu_s[idx].sum(), rhs, math.inf)
    n_slots = len(bounds) - 1
    if not rows.lb:
        return float(col_lb[m:].sum()), n_slots
    return _lp_minimum(rows, cost, col_lb, col_ub, time_limit_s), n_slots


def _squared_work(js: _Jobs, capacity: dict[str, int]) -> list[tuple[np.ndarray, float]]:
    """Inequality 4.'s rows, scaled by ``1 / v(S)``: (the jobs of ``S``, the right-hand
    side ``tau + v(S) / (2 M_T) + sum_S v_j iso_j / (2 v(S))``), for each type set ``T``
    of the trace (and all types together) and :data:`THRESHOLDS` thresholds ``tau``."""
    out = []
    sets = {frozenset(capacity)} | set(js.types)
    for tset in sorted(sets, key=sorted):
        inside = np.array([t <= tset for t in js.types])
        if not inside.any():
            continue
        gpus = float(sum(capacity[t] for t in tset))
        taus = np.unique(js.ready[inside])
        if len(taus) > THRESHOLDS:
            taus = np.unique(np.quantile(taus, np.linspace(0, 1, THRESHOLDS), method="lower"))
        for tau in taus:
            idx = np.flatnonzero(inside & (js.ready >= tau))
            v = js.gpu_s[idx]
            vs = float(v.sum())
            out.append((idx, float(tau) + vs / (2 * gpus) + float((v * js.iso[idx]).sum())
                        / (2 * vs)))
    return out


def bound_summary(jobs: Sequence[Any], truth: Any, cluster: Cluster, summary: dict[str, Any],
                  end_s: float | None, start_cost_s: float = 0.0,
                  round_s: float = 0.0) -> dict[str, Any]:
    """The summary's bound keys for a replay whose summary is ``summary`` and which stopped
    at ``end_s`` (the module's doc, *What it is compared with*):

    * ``avg_jct_lower_bound_s`` / ``jct_bound``: the bound counting every job until it
      finishes (the trace's and cluster's, the same for every policy);
    * ``avg_jct_all_lower_bound_s``: the bound on ``avg_jct_all_s`` as this replay counts
      it: the one above where every job finished, else every job counted until
      ``min(finish, end_s)`` (``jct_bound_all`` says how it was found);
    * ``avg_jct_to_bound``: ``avg_jct_all_s`` over ``avg_jct_all_lower_bound_s``;
    * ``avg_jct_finished_to_bound``: ``avg_jct_s`` over the bound where every job finished
      (the two averages are then one), None where the finished jobs are not all of them.

    Bounds are rounded down, ratios to four places."""
    full = cached_jct_lower_bound(jobs, truth, cluster, start_cost_s=start_cost_s,
                                  round_s=round_s)
    out: dict[str, Any] = {"avg_jct_lower_bound_s": _down(full.avg_jct_s),
                           "jct_bound": full.as_dict()}
    every = int(summary.get("finished") or 0) >= int(summary.get("jobs") or 0)
    if every or end_s is None:
        bound = full.avg_jct_s
    else:
        cut = cached_jct_lower_bound(jobs, truth, cluster, start_cost_s=start_cost_s,
                                     round_s=round_s, horizon_s=float(end_s))
        bound = cut.avg_jct_s
        out["jct_bound_all"] = cut.as_dict()
    out["avg_jct_all_lower_bound_s"] = _down(bound)
    avg_all, avg = summary.get("avg_jct_all_s"), summary.get("avg_jct_s")
    out["avg_jct_to_bound"] = (round(avg_all / bound, 4) if avg_all is not None and bound > 0
                               else None)
    out["avg_jct_finished_to_bound"] = (round(avg / full.avg_jct_s, 4)
                                        if every and avg is not None and full.avg_jct_s > 0
                                        else None)
    return out


def _down(x: float) -> float:
    """``x`` rounded down to the millisecond: a bound rounded stays a bound."""
    return math.floor(x * 1000) / 1000
