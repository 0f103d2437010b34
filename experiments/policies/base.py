"""What every policy shares: placement into free GPUs and building a valid Decision.

Policies think in (job, GPU type, GPU count); the spine's decision format wants
node placements, a plan, an action and a typed reason for every job left out.
:class:`Packer` places GPUs (a job's current placement first, then the
tightest single node, then the fullest nodes first, TP groups never split) and
:func:`build_decision` turns a policy's choices into a
:class:`apportion.decision.Decision` that the validator accepts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from apportion.cluster import Cluster
from apportion.decision import (Action, Allocation, Decision, Pending, Reason, SolveReport,
                                derive_action)
from apportion.gpus import get_gpu
from apportion.plans import ExecutionPlan


@dataclass
class Choice:
    gpu_type: str
    gpus: int
    placement: dict[str, int]
    est_rate: float = 0.0  # iterations/s as the policy sees it
    plan: ExecutionPlan | None = None
    code: str | None = None  # a ground-truth plan code (Morphling's exec_plan)
    cpus: int | None = None


class Packer:
    """Free GPUs per node, and placement of k GPUs of one type."""

    _templates: dict[int, tuple[Cluster, dict[str, int], dict[str, list[str]], dict[str, str]]] = {}

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        tpl = self._templates.get(id(cluster))
        if tpl is None or tpl[0] is not cluster:
            by_type: dict[str, list[str]] = {}
            for n in cluster.nodes.values():
                by_type.setdefault(n.gpu_type, []).append(n.name)
            tpl = (cluster, {n.name: n.gpus for n in cluster.nodes.values()}, by_type,
                   {n.name: n.gpu_type for n in cluster.nodes.values()})
            self._templates[id(cluster)] = tpl
        self.free = dict(tpl[1])
        self.by_type = tpl[2]
        self.type_of = tpl[3]

    def free_of(self, gpu_type: str) -> int:
        return sum(self.free[n] for n in self.by_type.get(gpu_type, ()))

    def fits(self, placement: dict[str, int]) -> bool:
        return all(self.free.get(n, 0) >= k for n, k in placement.items())

    def take(self, placement: dict[str, int]) -> None:
        for n, k in placement.items():
            self.free[n] -= k

    def release(self, placement: dict[str, int]) -> None:
        for n, k in placement.items():
            self.free[n] += k

    def place(self, gpu_type: str, gpus: int, prefer: dict[str, int] | None = None,
              tp: int = 1, take: bool = True, spread: bool = False) -> dict[str, int] | None:
        """A placement of ``gpus`` GPUs of ``gpu_type`` (None when it does not fit)."""
        out: dict[str, int] | None = None
        if prefer and sum(prefer.values()) == gpus and all(
                self.type_of.get(n) == gpu_type for n in prefer) and self.fits(prefer):
            out = dict(prefer)
        else:
            names = self.by_type.get(gpu_type, [])
            if self.free_of(gpu_type) < gpus:
                return None
            single = sorted((self.free[n], n) for n in names if self.free[n] >= gpus)
            if single and not spread:
                out = {single[0][1]: gpus}
            else:
                out, need = {}, gpus
                for n in sorted(names, key=lambda n: (-self.free[n], n)):
                    k = min(self.free[n], need)
                    k -= k % tp
                    if k > 0:
                        out[n] = k
                        need -= k
                    if need == 0:
                        break
                if need:
                    return None
        if take:
            self.take(out)
        return out


def type_order(cluster: Cluster) -> list[str]:
    """GPU types fastest first (16-bit peak), a deterministic tie-break by name."""
    return sorted(cluster.gpu_types, key=lambda t: (-get_gpu(t).half_tflops, t))


def build_decision(state: Any, chosen: dict[str, Choice], name: str, t0: float | None = None,
                   reasons: dict[str, tuple[Reason, str]] | None = None,
                   report: SolveReport | None = None, formulation: str = "baseline") -> Decision:
    """Allocations for ``chosen``, typed pending reasons for everyone else."""
    allocs: list[Allocation] = []
    codes: dict[str, str] = {}
    by_id = {js.id: js for js in state.jobs}
    for jid, c in chosen.items():
        js = by_id[jid]
        plan = c.plan or ExecutionPlan(dp=c.gpus)
        a = Allocation(job=jid, gpu_type=c.gpu_type, gpus=c.gpus, stages=plan.pp, plan=plan,
                       placement=dict(c.placement), est_throughput=c.est_rate * max(1, js.spec.global_batch_size),
                       iter_time_s=(1.0 / c.est_rate) if c.est_rate > 0 else None,
                       cpus=int(c.cpus or 0))
        a.action = derive_action(js.alloc, c.gpu_type, c.gpus, plan.pp, a.placement, plan.tp)
        allocs.append(a)
        if c.code:
            codes[jid] = c.code
    pending = []
    reasons = reasons or {}
    for js in state.jobs:
        if js.id in chosen:
            continue
        if js.alloc is not None:
            pending.append(Pending(js.id, Reason.PREEMPTED, f"{name} gave its GPUs to others",
                                   Action.PREEMPT))
        else:
            r, d = reasons.get(js.id, (Reason.NO_CAPACITY, f"{name}: not enough free GPUs"))
            pending.append(Pending(js.id, r, d))
    wall = time.perf_counter() - t0 if t0 is not None else 0.0
    rep = report or SolveReport(name, "feasible", None, None, None, wall, False)
    return Decision(allocs, pending, rep, formulation=formulation,
                    meta={"now_s": state.now, "plan_codes": codes})


def best_type(state: Any, js: Any, gpus: int, types: list[str] | None = None) -> tuple[str | None, float]:
    """The GPU type with the highest viewed rate at ``gpus`` GPUs (None if it runs nowhere)."""
    best, rate = None, 0.0
    for t in types or type_order(state.cluster):
        r = state.rate(js, t, gpus)
        if r > rate:
            best, rate = t, r
    return best, rate


def requested_type(state: Any, js: Any) -> tuple[str | None, float]:
    """The job's requested type when the cluster has it and it runs there, else its best type."""
    t = js.spec.requested_gpu_type
    if t and t in state.capacity:
        r = state.rate(js, t, js.spec.requested_gpus)
        if r > 0:
            return t, r
    return best_type(state, js, js.spec.requested_gpus)


@dataclass
class Running:
    """Bookkeeping many baselines share: what each job held last round."""

    prev: dict[str, Choice] = field(default_factory=dict)
