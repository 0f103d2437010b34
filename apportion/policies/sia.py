"""Sia-like (Jayaram Subramanya et al., SOSP'23): goodput across GPU types, DP-only scaling.

Each round an integer program picks one configuration (GPU type, GPU count in
powers of two up to ``max_scale`` x the request) or none per job, maximising
the sum of normalised throughputs (rate / the job's rate on one GPU of its
slowest feasible type) plus a bonus per placed job, minus a restart penalty for
changing a running job's configuration, under per-type capacity; solved with
HiGHS through ``scipy.optimize.milp``. Sia's performance model knows data
parallelism only: rates come from DP-family plans (Morphling's footnote 2:
a job that cannot run with DP falls back to its feasible 3D plan at its
requested GPU count, scaling disabled). Batch size stays fixed (no goodput
adaptation: apportion never changes the global batch).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from scipy import sparse
from scipy.optimize import Bounds, LinearConstraint, milp

from apportion.decision import Decision, Reason, SolveReport
from apportion.policies.base import Choice, Packer, build_decision
from apportion.policies.morphling import best_plan, plan_rate
from apportion.view import View


class SiaLike:
    name = "sia"

    def __init__(self, max_scale: int = 2, place_bonus: float = 1.0, restart_penalty: float = 0.1,
                 time_limit_s: float = 5.0) -> None:
        self.max_scale = max_scale
        self.place_bonus = place_bonus
        self.restart_penalty = restart_penalty
        self.time_limit_s = time_limit_s

    def _options(self, state: Any, js: Any) -> list[tuple[str, int, float, bool]]:
        opts = []
        for t, cap in state.capacity.items():
            g = 1
            while g <= min(cap, self.max_scale * js.spec.requested_gpus):
                r = plan_rate(state, js, t, g, dp_only=True)
                if r > 0:
                    opts.append((t, g, r, True))
                g *= 2
        if not opts:  # no DP plan runs: the job's own (3D) plan, scaling disabled
            for t in state.capacity:
                r = plan_rate(state, js, t, js.spec.requested_gpus, plan=js.plan_hint)
                if r > 0:
                    opts.append((t, js.spec.requested_gpus, r, False))
        return opts

    def decide(self, state: View) -> Decision:
        t0 = time.perf_counter()
        types = sorted(state.capacity)
        cols: list[tuple[Any, str, int, float, bool]] = []
        reasons: dict[str, tuple[Reason, str]] = {}
        for js in state.jobs:
            opts = self._options(state, js)
            if not opts:
                reasons[js.id] = (Reason.NO_FIT_MEMORY, "runs on no GPU type")
                continue
            base = min(r / g for _, g, r, _ in opts)
            for t, g, r, dp in opts:
                cols.append((js, t, g, r / max(base, 1e-12) / max(1, js.spec.requested_gpus), dp))
        if not cols:
            return build_decision(state, {}, self.name, t0, reasons)
        n = len(cols)
        c = np.zeros(n)
        for i, (js, t, g, val, _) in enumerate(cols):
            a = js.alloc
            change = a is not None and (a.gpu_type != t or a.gpus != g)
            c[i] = -(val + self.place_bonus - (self.restart_penalty if change else 0.0))
        jobs = list(dict.fromkeys(col[0].id for col in cols))
        jidx = {j: k for k, j in enumerate(jobs)}
        # sparse: two entries per column (a dense matrix is gigabytes at 10,000 jobs)
        tidx = {t: len(jobs) + k for k, t in enumerate(types)}
        rows = np.fromiter((r for js, t, _, _, _ in cols for r in (jidx[js.id], tidx[t])),
                           int, 2 * n)
        vals = np.fromiter((v for _, _, g, _, _ in cols for v in (1.0, g)), float, 2 * n)
        A = sparse.csr_matrix((vals, (rows, np.repeat(np.arange(n), 2))),
                              shape=(len(jobs) + len(types), n))
        ub = np.concatenate([np.ones(len(jobs)), [state.capacity[t] for t in types]])
        # the limit is the round's: building the program above spent part of it
        left = max(0.01, self.time_limit_s - (time.perf_counter() - t0))
        res = milp(c, constraints=LinearConstraint(A, -np.inf, ub), integrality=np.ones(n),
                   bounds=Bounds(0, 1), options={"time_limit": left})
        pk = Packer(state.cluster)
        chosen: dict[str, Choice] = {}
        if res.x is None:
            # no answer in the limit (HiGHS's presolve and search on a 10,000-job round under
            # load): every running job stays where it is and the queue waits a round, said
            # as a fallback; an empty answer would stop every running job
            for js in state.jobs:
                _keep(js, pk, chosen)
            rep = SolveReport("highs-milp", "fallback", None, None, None,
                              time.perf_counter() - t0, True,
                              fallback_reason=f"the ILP found no answer in {left:.2f} s "
                              f"({res.message}); the running jobs kept")
            return build_decision(state, chosen, self.name, t0, reasons, rep)
        pick = [(cols[i][0], cols[i][1], cols[i][2], cols[i][4]) for i in range(n)
                if res.x[i] > 0.5]
        for js, t, g, dp in pick:
            a = js.alloc
            if a is not None and a.gpu_type == t and a.gpus == g:
                _keep(js, pk, chosen)
        for js, t, g, dp in sorted(pick, key=lambda p: -p[2]):
            if js.id in chosen:
                continue
            p = pk.place(t, g)
            if p is not None:
                code = best_plan(state, js, g, p, dp_only=True) if dp else js.plan_hint
                chosen[js.id] = Choice(t, g, p, plan_rate(state, js, t, g, code, placement=p),
                                       code=code)
        rep = SolveReport("highs-milp", "optimal" if res.status == 0 else "feasible",
                          float(-res.fun) if res.fun is not None else None, *_ilp_bound(res),
                          time.perf_counter() - t0, False)
        return build_decision(state, chosen, self.name, t0, reasons, rep)


def _keep(js: Any, pk: Packer, chosen: dict[str, Choice]) -> None:
    """``js`` where it runs now, if its placement is still free."""
    a = js.alloc
    if a is not None and pk.fits(a.placement):
        pk.take(a.placement)
        chosen[js.id] = Choice(a.gpu_type, a.gpus, dict(a.placement), js.est_rate, a.plan,
                               js.plan_code)


def _ilp_bound(res: Any) -> tuple[float | None, float | None]:
    """The integer program's proven bound and gap, as HiGHS reports them through scipy
    (the program minimises the negated objective: its dual bound, negated, bounds the
    objective from above); Nones where it proved none (no answer, or an older scipy)."""
    dual = getattr(res, "mip_dual_bound", None)
    if res.fun is None or dual is None or not np.isfinite(dual):
        return None, None
    bound = float(-dual)
    gap = getattr(res, "mip_gap", None)
    if gap is None or not np.isfinite(gap):
        gap = max(0.0, bound - float(-res.fun)) / max(1.0, abs(float(res.fun)))
    return bound, float(gap)
