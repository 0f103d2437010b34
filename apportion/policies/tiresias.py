"""Tiresias (Gu et al., NSDI'19): discretised two-dimensional least-attained-service.

A job's attained service is GPUs x time it has run (the simulator's
``gpu_seconds``). Jobs sit in ``K`` priority queues by attained service
(thresholds in GPU-hours, default 1 and 10: Tiresias uses few queues with
exponentially spaced thresholds); higher queues first, FIFO inside a queue;
preemptive every round. A job waiting longer than ``starvation_factor`` times
its run time is promoted to the top queue (Tiresias' starvation guard). GPU
type: the requested one (heterogeneity-unaware), else the first type with
room. Running jobs keep their GPUs when they stay in the winning set.
"""

from __future__ import annotations

import time
from typing import Any

from apportion.decision import Decision, Reason
from apportion.policies.base import Choice, Packer, build_decision, requested_type
from apportion.view import View


class Tiresias:
    name = "tiresias"

    def __init__(self, thresholds_gpu_h: tuple[float, ...] = (1.0, 10.0),
                 starvation_factor: float = 4.0) -> None:
        self.thresholds = [h * 3600.0 for h in thresholds_gpu_h]
        self.starvation = starvation_factor

    def queue_of(self, js: Any, now: float) -> int:
        waited = now - js.spec.submit_time_s - js.run_seconds
        if js.run_seconds > 0 and waited > self.starvation * js.run_seconds:
            return 0
        return sum(1 for th in self.thresholds if js.gpu_seconds >= th)

    def decide(self, state: View) -> Decision:
        now = state.now
        t0 = time.perf_counter()
        order = sorted(state.jobs, key=lambda js: (self.queue_of(js, now), js.spec.submit_time_s, js.id))
        budget = dict(state.capacity)
        winners, reasons = [], {}
        for js in order:
            if js.alloc is not None:
                t, r = js.alloc.gpu_type, js.est_rate
            else:
                t, r = requested_type(state, js)
            if t is None:
                reasons[js.id] = (Reason.NO_FIT_MEMORY, "runs on no GPU type at its request")
                continue
            if budget.get(t, 0) < js.spec.requested_gpus:
                alt = [x for x in sorted(budget) if budget[x] >= js.spec.requested_gpus
                       and state.rate(js, x, js.spec.requested_gpus) > 0] if js.alloc is None else []
                if not alt:
                    continue
                t = alt[0]
                r = state.rate(js, t, js.spec.requested_gpus)
            budget[t] -= js.spec.requested_gpus
            winners.append((js, t, r))
        pk = Packer(state.cluster)
        chosen: dict[str, Choice] = {}
        for js, t, r in winners:
            a = js.alloc
            if a is not None and a.gpu_type == t and pk.fits(a.placement):
                pk.take(a.placement)
                chosen[js.id] = Choice(t, a.gpus, dict(a.placement), r, a.plan, js.plan_code)
        for js, t, r in winners:
            if js.id not in chosen:
                p = pk.place(t, js.spec.requested_gpus)
                if p is not None:
                    chosen[js.id] = Choice(t, js.spec.requested_gpus, p, r)
        return build_decision(state, chosen, self.name, t0, reasons)
