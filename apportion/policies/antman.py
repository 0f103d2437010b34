"""AntMan (Xiao et al., OSDI'20): guaranteed jobs within quota, opportunistic jobs in the gaps.

Guaranteed jobs (``SimJob.guaranteed``) get exactly their requested GPUs and
plan, in submit order, while their tenant's quota (``quota``, GPUs; Morphling's
MT trace: tenant A has 64) allows; they preempt opportunistic jobs when the
free GPUs do not suffice (most recently started first). Best-effort jobs run
opportunistically on whatever is left, FIFO with backfill, and are the first to
go. AntMan's GPU sharing between a guaranteed and an opportunistic job on one
GPU is not modelled (a decision gives a GPU to one job).
"""

from __future__ import annotations

import time
from typing import Any

from apportion.decision import Decision, Reason
from apportion.policies.base import Choice, Packer, build_decision, requested_type
from apportion.policies.morphling import plan_rate
from apportion.view import View


class AntMan:
    name = "antman"

    def __init__(self, quota: dict[str, int] | None = None) -> None:
        self.quota = quota if quota is not None else {"A": 64}

    def decide(self, state: View) -> Decision:
        t0 = time.perf_counter()
        pk = Packer(state.cluster)
        chosen: dict[str, Choice] = {}
        reasons: dict[str, tuple[Reason, str]] = {}
        used: dict[str, int] = {}

        def keep(js: Any) -> None:
            a = js.alloc
            pk.take(a.placement)
            chosen[js.id] = Choice(a.gpu_type, a.gpus, dict(a.placement), js.est_rate, a.plan,
                                   js.plan_code)

        for js in state.jobs:
            if js.alloc is not None and js.spec.guaranteed:
                keep(js)
                used[js.spec.tenant] = used.get(js.spec.tenant, 0) + js.alloc.gpus
        be_running = sorted((js for js in state.jobs if js.alloc is not None and not js.spec.guaranteed),
                            key=lambda js: -(js.first_start or 0.0))
        for js in be_running:
            keep(js)
        for js in state.jobs:
            if js.id in chosen or not js.spec.guaranteed:
                continue
            t, _ = requested_type(state, js)
            if t is None:
                reasons[js.id] = (Reason.NO_FIT_MEMORY, "runs on no GPU type")
                continue
            q = self.quota.get(js.spec.tenant, 0)
            if used.get(js.spec.tenant, 0) + js.spec.requested_gpus > q:
                reasons[js.id] = (Reason.QUOTA, f"tenant {js.spec.tenant} quota {q} GPUs in use")
                continue
            p = pk.place(t, js.spec.requested_gpus)
            while p is None and be_running:  # preempt opportunistic jobs, newest first
                victim = be_running.pop(0)
                if victim.id in chosen and chosen[victim.id].gpu_type == t:
                    pk.release(chosen.pop(victim.id).placement)
                    p = pk.place(t, js.spec.requested_gpus)
            if p is None:
                continue
            used[js.spec.tenant] = used.get(js.spec.tenant, 0) + js.spec.requested_gpus
            chosen[js.id] = Choice(t, js.spec.requested_gpus, p, plan_rate(state, js, t, js.spec.requested_gpus,
                                                                 plan=js.plan_hint, placement=p),
                                   code=js.plan_hint)
        for js in state.jobs:
            if js.id in chosen or js.spec.guaranteed or js.id in reasons:
                continue
            t, _ = requested_type(state, js)
            if t is None:
                reasons[js.id] = (Reason.NO_FIT_MEMORY, "runs on no GPU type")
                continue
            p = pk.place(t, js.spec.requested_gpus)
            if p is not None:
                chosen[js.id] = Choice(t, js.spec.requested_gpus, p, plan_rate(state, js, t, js.spec.requested_gpus,
                                                                     plan=js.plan_hint, placement=p),
                                       code=js.plan_hint)
        return build_decision(state, chosen, self.name, t0, reasons)
