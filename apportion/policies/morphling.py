"""Morphling's scheduling policy (Morphling section 5, Algorithm 1), GPU dimension.

Resource sensitivity curve of a job: for each valid GPU count, the best rate
over its execution plans (the policy's view of the measured plan table when
the ground truth is Morphling's; the best-plan rate otherwise), flat between
valid counts. Slope at ``g`` = gain of moving to the next valid count per GPU,
normalised by the job's rate on its original request (Morphling compares jobs
by speedup). The curve and its slope are :class:`apportion.solvers.slope.SensitivityCurve`,
which the plans formulation's slope heuristic reads too.

Algorithm 1 as implemented here, per round:
1. guaranteed jobs within their tenant's quota ("privileged") are scheduled
   first, at least at their minimum demand ``minRes``: the fewest GPUs whose
   best plan matches the rate of the original request and plan;
2. best-effort and running jobs, sorted by slope (highest first), then grow:
   free GPUs first, then one unit at a time from the lowest-slope job that is
   over its minimum (``GetLowestSlopeOverMin``), when the grower's slope is
   higher or it is still below its own minimum. A job shrunk to 0 is preempted.
3. GPU counts are placed (current placement kept when the count is unchanged)
   and the best plan for the placement is chosen (``GetBestPlan``).
CPUs and memory are not allocated: no ground truth available here measures
their effect (the A800 tables vary plans and placements only).
"""

from __future__ import annotations

import time
from typing import Any

from apportion.decision import Decision, Reason
from apportion.plans import is_dp_plan
from apportion.policies.base import Choice, Packer, build_decision, requested_type
from apportion.solvers.slope import SensitivityCurve
from apportion.view import View


def is_morphling(state: Any) -> bool:
    base = getattr(state.rates, "base", state.rates)
    return getattr(base, "name", "") == "morphling"


def plan_rate(state: Any, js: Any, t: str, g: int, plan: str | None = None,
              dp_only: bool = False, placement: dict[str, int] | None = None) -> float:
    """Viewed rate at ``g`` GPUs, for a fixed plan, DP-family plans only, or the best plan."""
    if is_morphling(state):
        return state.rate(js, t, g, placement, plan, plan_ok=is_dp_plan if dp_only else None)
    return state.rate(js, t, g, placement)


def best_plan(state: Any, js: Any, g: int, placement: dict[str, int] | None,
              dp_only: bool = False) -> str | None:
    """The plan code with the best measured time at this GPU count (Morphling truth only)."""
    if not is_morphling(state):
        return None
    base = state.rates.base
    shape = tuple(sorted((placement or {}).values(), reverse=True))
    rows = [(t, p) for p, pl, t in base.rows.get(js.key, [])
            if sum(pl) == g and (not dp_only or is_dp_plan(p))]
    exact = [(t, p) for p, pl, t in base.rows.get(js.key, [])
             if pl == shape and (not dp_only or is_dp_plan(p))]
    pick = exact or rows
    return min(pick)[1] if pick else None


def valid_counts(state: Any, js: Any, t: str, upto: int, dp_only: bool = False) -> list[int]:
    return [g for g in range(1, upto + 1) if plan_rate(state, js, t, g, dp_only=dp_only) > 0]


class MorphlingSlope:
    name = "morphling"

    def __init__(self, max_scale: int = 2, quota: dict[str, int] | None = None) -> None:
        self.max_scale = max_scale
        self.quota = quota if quota is not None else {"A": 64}

    def decide(self, state: View) -> Decision:
        t0 = time.perf_counter()
        info, reasons = self._curves(state)
        by_id = {js.id: js for js in state.jobs}
        slopes = _SlopeAllocation(info, dict(state.capacity))
        alloc = slopes.alloc
        quota_used: dict[str, int] = {}
        privileged = [jid for jid in info if by_id[jid].spec.guaranteed]
        for jid in sorted(privileged, key=lambda j: (by_id[j].spec.submit_time_s, j)):
            tenant = by_id[jid].spec.tenant
            q = self.quota.get(tenant, 0)
            if quota_used.get(tenant, 0) + info[jid][3] <= q:
                quota_used[tenant] = quota_used.get(tenant, 0) + info[jid][3]
                slopes.schedule(jid)
        rest = [jid for jid in info if jid not in privileged or alloc[jid] == 0]
        rest.sort(key=lambda j: (-slopes.slope(j, alloc[j]), by_id[j].spec.submit_time_s, j))
        for jid in rest:
            slopes.schedule(jid)
        chosen = _placed(state, alloc, info, by_id)
        return build_decision(state, chosen, self.name, t0, reasons)

    def _curves(self, state: View) -> tuple[dict[str, _Curve], dict[str, tuple[Reason, str]]]:
        """Each job's GPU type, sensitivity curve over its valid counts (up to
        ``max_scale`` times its request), reference rate and guaranteed minimum; or why
        it has none."""
        reasons: dict[str, tuple[Reason, str]] = {}
        info: dict[str, _Curve] = {}
        for js in state.jobs:
            t = js.alloc.gpu_type if js.alloc is not None else requested_type(state, js)[0]
            if t is None:
                reasons[js.id] = (Reason.NO_FIT_MEMORY, "runs on no GPU type")
                continue
            upto = min(state.capacity[t], max(js.spec.requested_gpus * self.max_scale, js.spec.requested_gpus))
            counts = valid_counts(state, js, t, upto)
            if not counts:
                reasons[js.id] = (Reason.NO_FIT_MEMORY, "no valid GPU count")
                continue
            curve = SensitivityCurve({g: plan_rate(state, js, t, g) for g in counts})
            ref = plan_rate(state, js, t, js.spec.requested_gpus, plan=js.plan_hint) or curve.rate[counts[0]]
            minres = 0
            if js.spec.guaranteed:
                minres = next((g for g in counts if curve.rate[g] >= ref * 0.999), js.spec.requested_gpus)
            info[js.id] = (t, curve, ref, minres)
        return info, reasons


#: a job's GPU type, sensitivity curve, reference rate and guaranteed minimum GPUs
_Curve = tuple[str, SensitivityCurve, float, int]


class _SlopeAllocation:
    """Morphling's slope rule: GPUs go up a job's curve while free, and are taken from
    the job losing least per GPU (its down slope) when the job gaining gains more, or is
    below its guaranteed minimum."""

    def __init__(self, info: dict[str, _Curve], free: dict[str, int]) -> None:
        self.info, self.free = info, free
        self.alloc: dict[str, int] = {jid: 0 for jid in info}

    def slope(self, jid: str, g: int) -> float:
        """Rate gained per GPU going up from ``g`` (relative to the reference); -1 at
        the top of the curve."""
        _, curve, ref, _ = self.info[jid]
        nxt = curve.above(g)
        if nxt is None:
            return -1.0
        return curve.slope(g, nxt) / ref

    def down_slope(self, jid: str, g: int) -> tuple[float, int]:
        """Rate lost per GPU going down from ``g``, and the count below."""
        _, curve, ref, _ = self.info[jid]
        lower = curve.below(g)
        return curve.slope(lower, g) / ref, lower

    def schedule(self, jid: str) -> None:
        """Move ``jid`` up its curve as far as free GPUs and the victims allow."""
        info, alloc, free = self.info, self.alloc, self.free
        t, curve, _, minres = info[jid]
        while True:
            nxt = curve.above(alloc[jid])
            if nxt is None:
                return
            need = nxt - alloc[jid]
            if free[t] >= need:
                free[t] -= need
                alloc[jid] = nxt
                continue
            victims = []
            for other, g in alloc.items():
                if other == jid or g == 0 or info[other][0] != t:
                    continue
                if g <= info[other][3]:
                    continue  # not over its minimum
                s, lower = self.down_slope(other, g)
                victims.append((s, other, lower))
            if not victims:
                return
            s, other, lower = min(victims)
            below_min = alloc[jid] < minres
            if not (below_min or self.slope(jid, alloc[jid]) > s):
                return
            free[t] += alloc[other] - lower
            alloc[other] = lower


def _placed(state: View, alloc: dict[str, int], info: dict[str, _Curve],
            by_id: dict[str, Any]) -> dict[str, Choice]:
    """The counts placed on nodes: a running job keeping its count and type stays where it
    is; the others are packed largest first (a job that does not fit is left out)."""
    pk = Packer(state.cluster)
    chosen: dict[str, Choice] = {}
    for jid, g in alloc.items():
        a = by_id[jid].alloc
        if g and a is not None and a.gpus == g and a.gpu_type == info[jid][0] and pk.fits(a.placement):
            pk.take(a.placement)
            chosen[jid] = Choice(a.gpu_type, g, dict(a.placement), info[jid][1].rate[g], a.plan,
                                 by_id[jid].plan_code)
    for jid, g in sorted(alloc.items(), key=lambda kv: -kv[1]):
        if not g or jid in chosen:
            continue
        t = info[jid][0]
        p = pk.place(t, g)
        if p is None:
            continue
        code = best_plan(state, by_id[jid], g, p)
        chosen[jid] = Choice(t, g, p, plan_rate(state, by_id[jid], t, g, code, placement=p),
                             code=code)
    return chosen
