"""Gandiva (Xiao et al., OSDI'18) with introspection, heterogeneity-blind.

* Jobs get their requested GPU count on whichever type has room, visiting
  types in a fixed name order (Gandiva does not model GPU heterogeneity).
* Time slicing: when jobs wait, running jobs that have held their GPUs for
  ``slice_rounds`` rounds are suspended so waiting jobs take turns
  (suspend/resume at round granularity, oldest waiting first).
* Introspective migration: a running job spread over several nodes is
  migrated onto one node of its type when one has room (at most
  ``migrations_per_round`` per round), Gandiva's defragmentation.
Co-location (packing two jobs on a GPU) is not modelled: a decision gives a
GPU to one job (see GAVEL_FIDELITY.md).
"""

from __future__ import annotations

import time

from apportion.decision import Decision, Reason
from apportion.policies.base import Choice, Packer, build_decision
from apportion.view import View


class GandivaIntrospective:
    name = "gandiva-migrate"

    def __init__(self, slice_rounds: int = 6, migrations_per_round: int = 1) -> None:
        self.slice_rounds = slice_rounds
        self.migrations = migrations_per_round

    def decide(self, state: View) -> Decision:
        now = state.now
        t0 = time.perf_counter()
        types = sorted(state.capacity)
        waiting = [js for js in state.jobs if js.alloc is None]
        pk = Packer(state.cluster)
        chosen: dict[str, Choice] = {}
        suspended = set()
        if waiting:
            for js in state.jobs:
                if js.alloc is not None and js.memo.get("held", 0) >= self.slice_rounds:
                    suspended.add(js.id)
        moved = 0
        kept = [js for js in state.jobs if js.alloc is not None and js.id not in suspended]
        for js in kept:
            pk.take(js.alloc.placement)
        for js in kept:
            a = js.alloc
            place = dict(a.placement)
            if len(place) > 1 and moved < self.migrations:
                pk.release(place)
                single = [n for n in pk.by_type[a.gpu_type] if pk.free[n] >= a.gpus]
                if single:
                    place = {single[0]: a.gpus}
                    moved += 1
                pk.take(place)
            chosen[js.id] = Choice(a.gpu_type, a.gpus, place, js.est_rate, a.plan, js.plan_code)
        reasons = {}
        queue = sorted(waiting, key=lambda j: (j.memo.get("last_run", -1.0), j.spec.submit_time_s, j.id))
        queue += [js for js in state.jobs if js.id in suspended]
        for js in queue:
            for t in types:
                if state.rate(js, t, js.spec.requested_gpus) <= 0:
                    continue
                p = pk.place(t, js.spec.requested_gpus)
                if p is not None:
                    chosen[js.id] = Choice(t, js.spec.requested_gpus, p, state.rate(js, t, js.spec.requested_gpus))
                    break
            else:
                if not any(state.rate(js, t, js.spec.requested_gpus) > 0 for t in types):
                    reasons[js.id] = (Reason.NO_FIT_MEMORY, "runs on no GPU type")
        for js in state.jobs:
            if js.id in chosen:
                prev = js.alloc
                same = prev is not None and prev.placement == chosen[js.id].placement
                js.memo["held"] = js.memo.get("held", 0) + 1 if same else 1
                js.memo["last_run"] = now
            else:
                js.memo["held"] = 0
        return build_decision(state, chosen, self.name, t0, reasons)
