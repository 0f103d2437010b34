"""Gavel (Narayanan et al., OSDI'20): policies as allocations, enforced by rounds.

A policy computes an allocation ``X[m][j]``: the fraction of time job ``m``
should spend on GPU type ``j`` (rows sum to at most 1; sum over jobs of
``X[m][j] * scale_factor_m`` at most the GPUs of type ``j``). The round-based
mechanism then realises it:

* the allocation is recomputed, and the time counters are reset, when the set
  of jobs has changed (an arrival or a completion) and at least
  ``reset_interval_s`` (Gavel's ``minimum_time_between_allocation_resets``,
  1,920 s by default) have passed since the last reset, or no reset has yet
  happened after time 0; at a reset each job's time on each type restarts at
  half a round (so new jobs are not infinitely favoured) and its deficit grows
  by (allocated - received) time. A job that arrives between resets is outside
  the allocation until the next one and does not run before it (Gavel's
  ``_schedule_jobs_on_workers`` assigns workers only to jobs in ``_allocation``);
  its time counters start at half a round, its deficit at 0;
* priority of job ``m`` on type ``j`` = ``X[m][j] / fraction``, where
  ``fraction`` = time ``m`` ran on ``j`` / total job time on ``j`` since the
  reset (``X * 1e9`` when ``fraction`` is 0; 0 when ``X`` is 0 or the job
  cannot run on ``j``);
* per type, jobs are sorted by (priority, deficit, allocation) descending;
  types are visited fastest first (shuffled, seeded, for the heterogeneity-
  agnostic FIFO); a job is scheduled on at most one type per round when its
  ``scale_factor`` GPUs are still free; FIFO never schedules a 0-priority job;
* jobs scheduled on the type they already held keep their GPUs.

Allocations (one class each):

* ``gavel-max-sum-throughput``: ``max sum_m sum_j T[m][j] X[m][j]`` (raw
  steps/s, as Gavel's implementation);
* ``gavel-max-min-fairness`` (heterogeneity-aware, ``MaxMinFairness_Perf``):
  ``max min_m (1/w_m) sf_m T[m]·X[m] / (T[m]·X_eq[m])``, ``X_eq`` the equal
  share (each type's fraction of the cluster's GPUs; Gavel's
  ``ProportionalPolicy``);
* ``fifo`` (Gavel's FIFO, base mode): jobs in arrival order get 1.0 on a
  random type (seeded) that has ``scale_factor`` free GPUs; they keep it;
* ``gandiva`` (Gavel's Gandiva allocation without co-location): every job
  gets an equal share of every type, ``x = capacity / n / sf``, rows
  normalised to at most 1; heterogeneity-blind.

Both LPs are built in ``apportion.formulations.gavel`` and solved by
``apportion.solvers.cvx`` with Gavel's solver first (ECOS, an interior-point
method, where installed; then Clarabel, also interior-point; then HiGHS): the
LPs have many optimal allocations, and an interior-point method returns one
inside the optimal face, as Gavel's does, where a simplex method returns a
vertex that leaves more jobs at 0 on a type; see
``experiments/GAVEL_FIDELITY.md`` for every deviation from Gavel.

Gap and bound (the LP policies): each round's report carries the LP's optimum as its
bound and, as its objective, the LP's objective at the time shares the round mechanism
has realised since the allocation was computed (this round's choice included). The
realised shares are a convex combination of integral rounds, each feasible for the LP,
so the bound holds; the gap is the mechanism's rounding loss (large in the first rounds
after a change, shrinking as the rounds catch up with ``X``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from apportion.decision import Decision, Reason, SolveReport
from apportion.formulations.gavel import (
    equal_share,
    max_min_fairness,
    max_min_value,
    max_sum_throughput,
    sum_throughput_value,
)
from apportion.policies.base import Choice, Packer, build_decision, type_order
from apportion.solvers.cvx import solve_cvxpy
from apportion.view import View

log = logging.getLogger(__name__)

_ARRIVED_LATE = ("Gavel round: arrived after the allocation was computed; it waits for the "
                 "next reset")
# Gavel's ``Scheduler(minimum_time_between_allocation_resets=1920)``: the default of its
# simulator (``simulate_scheduler_with_trace.py`` passes none): an allocation is recomputed
# at most this often after the job set changes
GAVEL_RESET_INTERVAL_S = 1920.0
# Gavel solves its LPs with ECOS (``--solver`` default), an interior-point method; Clarabel is
# the other interior-point solver cvxpy ships; HiGHS (simplex) where neither is installed
GAVEL_SOLVERS = ("ECOS", "CLARABEL", "HIGHS", "SCS")


class GavelRound:
    """The round mechanism; subclasses give ``allocation(state, jobs, types, T, sf, w)``."""

    name = "gavel"
    perf = True  # heterogeneity-aware: visit types fastest first (else shuffled)
    fifo = False
    min_over_jobs = False  # the LP's objective is a minimum over jobs (max-min fairness)

    def __init__(self, time_per_round: float | None = None,
                 reset_interval_s: float = GAVEL_RESET_INTERVAL_S,
                 solvers: tuple[str, ...] = GAVEL_SOLVERS) -> None:
        self.round_s = time_per_round
        self.reset_interval_s = float(reset_interval_s)
        self.solvers = tuple(solvers)
        self.X: dict[str, dict[str, float]] = {}
        self.job_time: dict[str, dict[str, float]] = {}
        self.worker_time: dict[str, float] = {}
        self.deficit: dict[str, dict[str, float]] = {}
        self.last_reset = 0.0
        self.members: frozenset[str] = frozenset()
        self.seen_time: dict[str, dict[str, float]] = {}
        self.lp_s = 0.0
        self.lp_solver = ""
        # the LP's objective as a function of an allocation (rows in ``lp_jobs`` order, columns
        # in type order); None for the allocations that are not an LP (FIFO, Gandiva)
        self.lp_value: Callable[[np.ndarray], float] | None = None
        self.lp_jobs: list[str] = []

    # -- allocation --------------------------------------------------------------------
    def allocation(self, state: Any, jobs: list[Any], types: list[str], T: np.ndarray,
                   sf: np.ndarray, w: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _throughputs(self, state: Any, jobs: list[Any], types: list[str]) -> np.ndarray:
        return np.array([[state.rate(js, t, js.spec.requested_gpus) for t in types] for js in jobs])

    # -- bookkeeping -------------------------------------------------------------------
    def _account(self, state: Any, types: list[str], rs: float) -> None:
        """Add last round's run time on each type (read from the simulator's counters); a
        job seen for the first time starts at half a round on every type (Gavel's
        ``add_job``), its deficit at 0; the types' totals grow only at a reset."""
        for js in state.jobs:
            if js.id not in self.job_time:
                self.job_time[js.id] = dict.fromkeys(types, rs / 2.0)
                self.deficit[js.id] = dict.fromkeys(types, 0.0)
            seen = self.seen_time.setdefault(js.id, {})
            for t, total in js.time_on_type.items():
                d = total - seen.get(t, 0.0)
                if d > 0 and js.id in self.job_time:
                    self.job_time[js.id][t] = self.job_time[js.id].get(t, 0.0) + d
                    self.worker_time[t] = self.worker_time.get(t, 0.0) + d
                seen[t] = total

    def _reset(self, state: Any, types: list[str], now: float, rs: float) -> None:
        elapsed = now - self.last_reset
        self.worker_time = dict.fromkeys(types, 0.0)
        ids = {js.id for js in state.jobs}
        for gone in [k for k in self.job_time if k not in ids]:  # finished since the last reset
            self.job_time.pop(gone, None)
            self.deficit.pop(gone, None)
        for js in state.jobs:
            jt = self.job_time.get(js.id)
            de = self.deficit.setdefault(js.id, dict.fromkeys(types, 0.0))
            for t in types:
                received = (jt[t] - rs / 2.0) if jt and t in jt else 0.0
                should = self.X.get(js.id, {}).get(t, 0.0) * elapsed
                de[t] = de.get(t, 0.0) + should - received
            self.job_time[js.id] = dict.fromkeys(types, rs / 2.0)
            for t in types:
                self.worker_time[t] += rs / 2.0
        self.last_reset = now

    # -- one round -----------------------------------------------------------------------
    def decide(self, state: View) -> Decision:
        now = state.now
        t0 = time.perf_counter()
        rs = self.round_s or state.interval_s
        types = type_order(state.cluster)
        self._account(state, types, rs)
        self._reset_if_changed(state, types, now, rs)
        prio = self._priorities(state, types)
        by_id = {js.id: js for js in state.jobs}
        picked = self._picked(state, types, prio, by_id)
        chosen = _placed(state, picked, by_id)
        reasons = {jid: self._why_not(state, by_id[jid], types) for jid in by_id
                   if jid not in chosen}
        objective, bound, gap = self._rounding(types, {j: c.gpu_type for j, c in chosen.items()},
                                               now, rs)
        status = "optimal" if self.lp_solver and gap is not None and gap <= 1e-9 else "feasible"
        rep = SolveReport(f"cvxpy/{self.lp_solver}" if self.lp_solver else self.name, status,
                          objective, bound, gap, time.perf_counter() - t0, False)
        dec = build_decision(state, chosen, self.name, t0, reasons, rep, formulation="gavel")
        if bound is not None:
            dec.meta.update(lp_optimum=bound, rounding_loss=gap)
        return dec

    def _reset_if_changed(self, state: View, types: list[str], now: float, rs: float) -> None:
        """Recompute the allocation ``X`` at a reset, when the jobs or their throughputs
        changed.

        Gavel recomputes its allocation when the jobs or their throughputs change: a
        configuration seen to make no progress (``stalled_on``) or measured off its
        estimate (``rate_factor``) is such a change. It does so at a reset, and resets no
        more often than every ``reset_interval_s`` (a last reset at time 0 does not count:
        Gavel's ``_last_reset_time == 0`` test)."""
        key = frozenset((js.id, frozenset(js.stalled_on), frozenset(js.rate_factor.items()))
                        for js in state.jobs)
        due = now - self.last_reset >= self.reset_interval_s or self.last_reset == 0.0
        if key != self.members and due:
            self._reset(state, types, now, rs)
            self.members = key
            tl = time.perf_counter()
            T = self._throughputs(state, state.jobs, types)
            sf = np.array([float(js.spec.requested_gpus) for js in state.jobs])
            w = np.array([float(js.spec.priority_weight) for js in state.jobs])
            X = self.allocation(state, state.jobs, types, T, sf, w)
            self.lp_s = time.perf_counter() - tl
            self.X = {js.id: {t: float(X[i, k]) for k, t in enumerate(types)}
                      for i, js in enumerate(state.jobs)}
            self.lp_jobs = [js.id for js in state.jobs]

    def _priorities(self, state: View, types: list[str]) -> dict[str, dict[str, float]]:
        """Per type and job: its allocation share over the time it has had there (Gavel's
        priority); a job never given time there comes first."""
        prio: dict[str, dict[str, float]] = {}
        for t in types:
            prio[t] = {}
            for js in state.jobs:
                x = self.X.get(js.id, {}).get(t, 0.0)
                wt = self.worker_time.get(t, 0.0)
                frac = self.job_time[js.id][t] / wt if wt > 0 else 0.0
                if x == 0.0 or state.rate(js, t, js.spec.requested_gpus) <= 0:
                    p = 0.0
                elif frac > 0:
                    p = x / frac
                else:
                    p = x * 1e9
                prio[t][js.id] = p
        return prio

    def _picked(self, state: View, types: list[str], prio: dict[str, dict[str, float]],
                by_id: dict[str, Any]) -> dict[str, str]:
        """Each job's type this round: by type (in a random order unless ``perf``), the
        highest priorities first, while the type has GPUs for the whole request."""
        order = list(types)
        if not self.perf:
            state.rng.shuffle(order)
        queue = []
        for t in order:
            entries = [(jid, t, p, self.deficit.get(jid, {}).get(t, 0.0),
                        self.X.get(jid, {}).get(t, 0.0)) for jid, p in prio[t].items()]
            queue += sorted(entries, key=lambda e: (e[2], e[3], e[4]), reverse=True)
        left = dict(state.capacity)
        picked: dict[str, str] = {}
        for jid, t, p, _, _ in queue:
            js = by_id[jid]
            if left.get(t, 0) == 0 or jid in picked or state.rate(js, t, js.spec.requested_gpus) <= 0:
                continue
            if self.fifo and p <= 0.0:
                continue
            if js.spec.requested_gpus > left[t]:
                continue
            # a job that arrived since the last reset is outside the allocation: it waits
            # for the next reset (Gavel assigns no workers to a job not in ``_allocation``)
            if jid not in self.X:
                continue
            left[t] -= js.spec.requested_gpus
            picked[jid] = t
        return picked

    def _why_not(self, state: Any, js: Any, types: list[str]) -> tuple[Reason, str]:
        """Why a job has no GPUs this round: it runs on no type that has its scale factor
        of GPUs (a rate of 0 on each: its memory fits none, or it made no progress on each
        it tried; no later round changes that, :data:`~apportion.decision.UNRESOLVABLE`),
        it arrived after the allocation was computed (it waits for the next reset), or
        its priority was lower this round."""
        sf = js.spec.requested_gpus
        room = [t for t in types if state.capacity.get(t, 0) >= sf]
        if not room:
            largest = max((state.capacity.get(t, 0) for t in types), default=0)
            return (Reason.TOO_LARGE,
                    f"asks for {sf} GPUs of one type; the largest type here has {largest}")
        if not any(state.rate(js, t, sf) > 0 for t in room):
            rated = ", ".join(room)
            return (Reason.NO_FIT_MEMORY,
                    f"runs on no GPU type at its {sf} GPUs (a rate of 0 on each of {rated})")
        if js.id not in self.X:
            return (Reason.NO_CAPACITY, _ARRIVED_LATE)
        return (Reason.NO_CAPACITY, "Gavel round: lower priority this round")

    def _rounding(self, types: list[str], placed: dict[str, str], now: float, rs: float
                  ) -> tuple[float | None, float | None, float | None]:
        """(the LP's objective at the realised time shares, the LP's optimum, the relative
        gap between them: the rounding loss); Nones where the allocation is no LP."""
        if self.lp_value is None or not self.lp_jobs or self.lp_solver in ("", "none"):
            return None, None, None
        col = {t: k for k, t in enumerate(types)}
        x_lp = np.zeros((len(self.lp_jobs), len(types)))
        real = np.zeros_like(x_lp)
        span = max(0.0, now - self.last_reset) + rs
        for i, jid in enumerate(self.lp_jobs):
            got = self.job_time.get(jid, {})
            for t, k in col.items():
                x_lp[i, k] = self.X.get(jid, {}).get(t, 0.0)
                # time received since the reset (counters restart at half a round)
                received = max(0.0, got.get(t, rs / 2.0) - rs / 2.0)
                real[i, k] = (received + (rs if placed.get(jid) == t else 0.0)) / span
        bound = self.lp_value(x_lp)
        if self.min_over_jobs and any(real[i].sum() <= 0 < x_lp[i].sum()
                                      for i in range(len(self.lp_jobs))):
            # a minimum over jobs is 0 while any job of the allocation still waits for its
            # first turn: no measure of the rounding yet (not a 100 % loss)
            return None, bound, None
        objective = self.lp_value(real)
        gap = max(0.0, bound - objective) / max(abs(bound), 1e-12) if bound else 0.0
        return objective, bound, gap


class MaxSumThroughput(GavelRound):
    name = "gavel-max-sum-throughput"

    def allocation(self, state: Any, jobs: list[Any], types: list[str], T: np.ndarray,
                   sf: np.ndarray, w: np.ndarray) -> np.ndarray:
        cap = np.array([state.capacity[t] for t in types], dtype=float)
        X, self.lp_solver = solve_cvxpy(*max_sum_throughput(T, sf, cap), self.solvers)
        self.lp_value = lambda x: sum_throughput_value(T, x)
        return X


class MaxMinFairness(GavelRound):
    """A job that runs on no type (throughput 0 on each: its memory fits none, or it stalled
    on each) is left out of the LP: its share would be 0 whatever the allocation, so with it
    the minimum, the LP's optimum and its bound are 0 and every allocation is optimal
    (Gavel's measured throughputs are never 0). It gets no time."""

    name = "gavel-max-min-fairness"
    min_over_jobs = True

    def allocation(self, state: Any, jobs: list[Any], types: list[str], T: np.ndarray,
                   sf: np.ndarray, w: np.ndarray) -> np.ndarray:
        cap = np.array([state.capacity[t] for t in types], dtype=float)
        runs = T.sum(axis=1) > 0
        X = np.zeros(T.shape)
        x_eq = equal_share(cap, int(runs.sum()))
        if runs.any():
            X[runs], self.lp_solver = solve_cvxpy(
                *max_min_fairness(T[runs], sf[runs], cap, w[runs], x_eq), self.solvers)
        else:
            self.lp_solver = "none"
        self.lp_value = lambda x: max_min_value(T[runs], sf[runs], w[runs], x_eq, x[runs])
        return X


class GavelFIFO(GavelRound):
    """Gavel's FIFO (base mode): a random feasible type per job, kept until it finishes."""

    name = "fifo"
    perf = False
    fifo = True

    def __init__(self, time_per_round: float | None = None, **kw: Any) -> None:
        super().__init__(time_per_round, **kw)
        self.assigned: dict[str, str] = {}

    def allocation(self, state: Any, jobs: list[Any], types: list[str], T: np.ndarray,
                   sf: np.ndarray, w: np.ndarray) -> np.ndarray:
        runs = {js.id: {t for k, t in enumerate(types) if T[i, k] > 0}
                for i, js in enumerate(jobs)}  # an assigned type seen to stall is given up
        self.assigned = {k: v for k, v in self.assigned.items() if v in runs.get(k, ())}
        avail = dict(state.capacity)
        for jid, t in self.assigned.items():
            avail[t] -= next(js.spec.requested_gpus for js in jobs if js.id == jid)
        rng = np.random.default_rng([state.seed, 7, len(self.assigned), state.round_index])
        for i, js in sorted(enumerate(jobs), key=lambda ij: (ij[1].spec.submit_time_s, ij[1].id)):
            if js.id in self.assigned:
                continue
            need = js.spec.requested_gpus
            # deviation: a job no type can ever hold is passed over: its rate is 0 on every
            # type with ``need`` GPUs in all (it fits no type's memory, or it was seen to
            # make no progress on each it tried: ``JobView.stalled_on``). Gavel's FIFO
            # stops at the first job with no free type, which for such a job is for ever
            # (Gavel's measured throughputs are never 0). A job that fits once GPUs free
            # up still blocks everything behind it, as in Gavel's FIFO.
            if not any(state.capacity.get(t, 0) >= need and T[i, k] > 0
                       for k, t in enumerate(types)):
                continue
            if not any(avail.get(t, 0) >= need for t in types):
                break
            # deviation: only types the job can run on (Gavel draws among all free types)
            ok = sorted(t for k, t in enumerate(types) if avail.get(t, 0) >= need and T[i, k] > 0)
            if not ok:
                break
            t = ok[int(rng.integers(len(ok)))]
            self.assigned[js.id] = t
            avail[t] -= js.spec.requested_gpus
        X = np.zeros(T.shape)
        for i, js in enumerate(jobs):
            if js.id in self.assigned:
                X[i, types.index(self.assigned[js.id])] = 1.0
        return X


class GandivaShare(GavelRound):
    """Gavel's Gandiva allocation without packing: equal time share, heterogeneity-blind."""

    name = "gandiva"
    perf = True

    def allocation(self, state: Any, jobs: list[Any], types: list[str], T: np.ndarray,
                   sf: np.ndarray, w: np.ndarray) -> np.ndarray:
        m = len(jobs)
        cap = np.array([state.capacity[t] for t in types], dtype=float)
        X = np.tile(cap / max(1, m), (m, 1)) / sf.reshape(m, 1)
        rows = np.maximum(X.sum(axis=1), 1.0)
        return X / rows[:, None]


def _placed(state: View, picked: dict[str, str], by_id: dict[str, Any]) -> dict[str, Choice]:
    """The picked jobs on nodes: keepers first, then the largest jobs first (least
    fragmentation); a job that does not fit waits."""
    pk = Packer(state.cluster)
    chosen: dict[str, Choice] = {}
    for jid, t in picked.items():
        a = by_id[jid].alloc
        if a is not None and a.gpu_type == t and pk.fits(a.placement):
            pk.take(a.placement)
            chosen[jid] = Choice(t, a.gpus, dict(a.placement), state.rate(by_id[jid], t, a.gpus))
    for jid, t in sorted(picked.items(), key=lambda kv: (-by_id[kv[0]].spec.requested_gpus, kv[0])):
        if jid in chosen:
            continue
        js = by_id[jid]
        p = pk.place(t, js.spec.requested_gpus)
        if p is not None:
            chosen[jid] = Choice(t, js.spec.requested_gpus, p, state.rate(js, t, js.spec.requested_gpus, p))
    return chosen
