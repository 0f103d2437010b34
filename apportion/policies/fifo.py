"""FCFS and SRTF: the two classic baselines.

* ``fcfs`` — first come, first served, non-preemptive, strict: jobs start in
  submit order on their requested GPU type and count (the best type when none
  is requested or the requested one is missing); when the head of the queue
  does not fit, nobody behind it starts (head-of-line blocking, as in
  Kubernetes/YARN FIFO queues). A job that runs nowhere is skipped with
  ``no-fit-memory``. ``fcfs-backfill`` lets later jobs start in the gaps.
* ``srtf`` — shortest remaining time first, preemptive: every round all jobs
  are ranked by remaining iterations / viewed rate on their request; running
  jobs keep their placement when they keep their place in the ranking.
"""

from __future__ import annotations

import time

from apportion.decision import Decision, Reason
from apportion.policies.base import Choice, Packer, build_decision, requested_type
from apportion.view import View


class FCFS:
    def __init__(self, backfill: bool = False) -> None:
        self.backfill = backfill
        self.name = "fcfs-backfill" if backfill else "fcfs"

    def decide(self, state: View) -> Decision:
        t0 = time.perf_counter()
        pk = Packer(state.cluster)
        chosen: dict[str, Choice] = {}
        reasons: dict[str, tuple[Reason, str]] = {}
        for js in state.jobs:  # running jobs keep exactly what they hold
            if js.alloc is not None:
                pk.take(js.alloc.placement)
                chosen[js.id] = Choice(js.alloc.gpu_type, js.alloc.gpus, dict(js.alloc.placement),
                                       js.est_rate, js.alloc.plan, js.plan_code)
        blocked = False
        for js in state.jobs:  # the simulator keeps them in submit order
            if js.id in chosen:
                continue
            if blocked:
                reasons[js.id] = (Reason.NO_CAPACITY, "behind the head of the FIFO queue")
                continue
            t, r = requested_type(state, js)
            if t is None:
                reasons[js.id] = (Reason.NO_FIT_MEMORY, "runs on no GPU type at its request")
                continue
            p = pk.place(t, js.spec.requested_gpus)
            if p is None:
                if not self.backfill:
                    blocked = True
                continue
            chosen[js.id] = Choice(t, js.spec.requested_gpus, p, r)
        return build_decision(state, chosen, self.name, t0, reasons)


class SRTF:
    name = "srtf"

    def decide(self, state: View) -> Decision:
        t0 = time.perf_counter()
        pk = Packer(state.cluster)
        ranked = []
        reasons: dict[str, tuple[Reason, str]] = {}
        for js in state.jobs:
            t, r = requested_type(state, js)
            if t is None:
                reasons[js.id] = (Reason.NO_FIT_MEMORY, "runs on no GPU type at its request")
                continue
            if js.alloc is not None and state.rate(js, js.alloc.gpu_type, js.alloc.gpus) > 0:
                t, r = js.alloc.gpu_type, state.rate(js, js.alloc.gpu_type, js.alloc.gpus)
            ranked.append((js.remaining / r, js.spec.submit_time_s, js.id, js, t, r))
        ranked.sort(key=lambda x: x[:3])
        chosen: dict[str, Choice] = {}
        keep = {}
        # first pass: who gets GPUs (by capacity per type), then place the keepers first
        budget = dict(state.capacity)
        winners = []
        for _, _, _, js, t, r in ranked:
            if budget.get(t, 0) >= js.spec.requested_gpus:
                budget[t] -= js.spec.requested_gpus
                winners.append((js, t, r))
        for js, t, r in winners:
            a = js.alloc
            if a is not None and a.gpu_type == t and a.gpus == js.spec.requested_gpus and pk.fits(a.placement):
                pk.take(a.placement)
                keep[js.id] = Choice(t, a.gpus, dict(a.placement), r, a.plan, js.plan_code)
        chosen.update(keep)
        for js, t, r in winners:
            if js.id in chosen:
                continue
            p = pk.place(t, js.spec.requested_gpus)
            if p is not None:
                chosen[js.id] = Choice(t, js.spec.requested_gpus, p, r)
        return build_decision(state, chosen, self.name, t0, reasons)
