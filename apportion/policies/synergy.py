"""Synergy (Mohan et al., OSDI'22): CPU/memory-sensitive allocation with fixed GPUs.

Synergy keeps each job's GPU count and execution plan as submitted and tunes
CPU and memory shares around a base GPU policy (FIFO with backfill here, as in
Synergy's evaluation of Synergy-Tune over FIFO). CPUs are given in proportion
to the job's GPU share of each node. The ground truths available
(Gavel, Crius, Morphling's placement tables) have no CPU or memory dimension,
so the CPU tuning cannot change a job's speed in these simulations; what
remains is fixed GPUs, fixed plan, FIFO with backfill.
"""

from __future__ import annotations

import time

from apportion.decision import Decision, Reason
from apportion.policies.base import Choice, Packer, build_decision, requested_type
from apportion.policies.morphling import plan_rate
from apportion.view import View


class Synergy:
    name = "synergy"

    def decide(self, state: View) -> Decision:
        t0 = time.perf_counter()
        pk = Packer(state.cluster)
        chosen: dict[str, Choice] = {}
        reasons: dict[str, tuple[Reason, str]] = {}
        for js in state.jobs:
            if js.alloc is not None:
                pk.take(js.alloc.placement)
                chosen[js.id] = Choice(js.alloc.gpu_type, js.alloc.gpus, dict(js.alloc.placement),
                                       js.est_rate, js.alloc.plan, js.plan_code, js.alloc.cpus)
        for js in state.jobs:
            if js.id in chosen:
                continue
            t, _ = requested_type(state, js)
            if t is None:
                reasons[js.id] = (Reason.NO_FIT_MEMORY, "runs on no GPU type")
                continue
            p = pk.place(t, js.spec.requested_gpus)
            if p is None:
                continue
            cpus = sum(state.cluster.nodes[n].cpus * k // state.cluster.nodes[n].gpus
                       for n, k in p.items())
            r = plan_rate(state, js, t, js.spec.requested_gpus, plan=js.plan_hint, placement=p)
            chosen[js.id] = Choice(t, js.spec.requested_gpus, p, r, code=js.plan_hint, cpus=cpus)
        return build_decision(state, chosen, self.name, t0, reasons)
