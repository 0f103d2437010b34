"""ElasticFlow (Gu et al., ASPLOS'23): deadline-aware elastic scaling, and its -LS variant.

Every round, for each job on its GPU type (the requested one; ElasticFlow is
heterogeneity-unaware), the *minimum satisfactory share* is the fewest GPUs
(powers of two up to ``max_scale`` x the request) whose throughput finishes
the remaining iterations by the deadline. Admission control in
earliest-deadline-first order: a job whose minimum share does not fit (or that
cannot meet its deadline at all) is dropped (``Action.DROP``). Left-over GPUs
go, one doubling at a time, to the job with the largest throughput gain per
added GPU (ElasticFlow's resource-efficiency step).

``loosened=True`` (ElasticFlow-LS, as Crius section 8 uses it): deadlines are
loosened so nobody is dropped; minimum share 1 GPU; jobs wait (EDF then
submit order) when even that does not fit; the rest is the same throughput-
greedy scaling. Throughputs are the DP-style profile the policy is given
(its view), as ElasticFlow profiles data-parallel jobs.
"""

from __future__ import annotations

import time
from typing import Any

from apportion.decision import Action, Decision, Pending, Reason
from apportion.policies.base import Choice, Packer, build_decision, requested_type
from apportion.view import View


def _powers(upto: int) -> list[int]:
    out, g = [], 1
    while g <= upto:
        out.append(g)
        g *= 2
    return out


class ElasticFlow:
    def __init__(self, loosened: bool = False, max_scale: int = 4, default_slack: float = 2.0) -> None:
        self.loosened = loosened
        self.max_scale = max_scale
        self.default_slack = default_slack
        self.name = "elasticflow-ls" if loosened else "elasticflow"

    def _deadline(self, js: Any) -> float:
        if js.spec.deadline_s is not None:
            return js.spec.deadline_s
        duration = getattr(js.trace, "duration_s", None) or 86400.0  # the trace's, where known
        return js.spec.submit_time_s + self.default_slack * duration

    def decide(self, state: View) -> Decision:
        now = state.now
        t0 = time.perf_counter()
        cap = dict(state.capacity)
        plan: dict[str, tuple[str, int, list[int]]] = {}
        drops: list[str] = []
        reasons: dict[str, tuple[Reason, str]] = {}
        order = sorted(state.jobs, key=lambda js: (self._deadline(js), js.spec.submit_time_s, js.id))
        for js in order:
            t = js.alloc.gpu_type if js.alloc is not None else requested_type(state, js)[0]
            if t is None:
                reasons[js.id] = (Reason.NO_FIT_MEMORY, "runs on no GPU type")
                continue
            sizes = [g for g in _powers(min(cap[t], self.max_scale * js.spec.requested_gpus))
                     if state.rate(js, t, g) > 0]
            if not sizes:
                reasons[js.id] = (Reason.NO_FIT_MEMORY, f"runs on no GPU count of {t}")
                continue
            if self.loosened:
                need = sizes[0]
            else:
                left = self._deadline(js) - now
                ok = [g for g in sizes if left > 0 and js.remaining / state.rate(js, t, g) <= left]
                if not ok:
                    drops.append(js.id)
                    continue
                need = ok[0]
            if cap[t] >= need:
                cap[t] -= need
                plan[js.id] = (t, need, sizes)
            elif not self.loosened and js.alloc is None:
                drops.append(js.id)  # admission control: the deadline cannot be guaranteed
        # throughput-greedy doubling with the left-over GPUs
        by_id = {js.id: js for js in state.jobs}
        while True:
            best, gain = None, 0.0
            for jid, (t, g, sizes) in plan.items():
                bigger = [s for s in sizes if s > g]
                if not bigger or cap[t] < bigger[0] - g:
                    continue
                js = by_id[jid]
                d = (state.rate(js, t, bigger[0]) - state.rate(js, t, g)) / (bigger[0] - g)
                d /= max(state.rate(js, t, sizes[0]), 1e-12)
                if d > gain:
                    best, gain = jid, d
            if best is None:
                break
            t, g, sizes = plan[best]
            ng = [s for s in sizes if s > g][0]
            cap[t] -= ng - g
            plan[best] = (t, ng, sizes)
        pk = Packer(state.cluster)
        chosen: dict[str, Choice] = {}
        for jid, (t, g, _) in plan.items():
            a = by_id[jid].alloc
            if a is not None and a.gpu_type == t and a.gpus == g and pk.fits(a.placement):
                pk.take(a.placement)
                chosen[jid] = Choice(t, g, dict(a.placement), state.rate(by_id[jid], t, g))
        for jid, (t, g, _) in sorted(plan.items(), key=lambda kv: -kv[1][1]):
            if jid in chosen:
                continue
            p = pk.place(t, g)
            if p is not None:
                chosen[jid] = Choice(t, g, p, state.rate(by_id[jid], t, g))
        dec = build_decision(state, chosen, self.name, t0, reasons)
        if drops:
            drop = set(drops) - set(chosen)
            dec.pending = [p for p in dec.pending if p.job not in drop]
            dec.pending += [Pending(j, Reason.DEADLINE_UNMEETABLE, "deadline cannot be met",
                                    Action.DROP) for j in sorted(drop)]
        return dec
