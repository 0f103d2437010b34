"""What baselines share: the core's packer and decision assembly, a plan that fits the
GPUs' memory, and type choice by rate.

Policies think in (job, GPU type, GPU count); the decision format wants node
placements, a plan, an action and a typed reason for every job left out. The
packing rule (:class:`apportion.placement.Packer`) and the assembly
(:func:`apportion.assembly.build_decision`) are the core's, written once for
every policy; this module re-exports the packer and adds the type choices
baselines make from the view's rates.

**Memory.** A baseline's rates say how fast a job runs on so many GPUs of a type
(its best plan there, as the rate source measured or estimated it); the
decision must also say *how* it runs, and that plan must fit each GPU. Every
baseline's decision goes through :func:`build_decision` here, which gives each
placed job a plan before the core assembles it (:func:`fitting_plan`): the plan
it keeps, else plain data parallelism where that fits (every baseline's plan
before memory was checked, so a round where memory never binds is unchanged),
else the plan its measured table names (Morphling's code, with the micro-batching a
code does not record: :func:`~apportion.formulations.plans.sized_to_fit`), else the fastest of
the plan families the analytic model sizes (3D splits, recomputation, ZeRO-DP,
ZeRO-Offload: :class:`~apportion.formulations.plans.EstimatedPlans`, the plans
formulation's source; one the job's workload runs where the executor says which, the
view's plan filter) that fits the placement's GPUs by the estimate, by what
the node group allows and by the validator's own ledger
(:mod:`apportion.plan_memory`): the most a baseline could run there, whatever
plans its own performance model knows (its rates are the rate source's best plan
at that size); on one GPU, where nothing fits whole, Hydra's spilled plan where it fits
(as the cells and plans formulations spill; an operator's round rates it). A job no plan
fits on its placement is left out, pending ``no-fit-memory``, its
``can_ever_fit`` saying whether any GPU type of the cluster fits it at some count.
A job whose model is not in the catalog has no layer graph: its plan stays
data parallel and its rate is the only witness that it fits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from apportion import assembly
from apportion.assembly import Choice
from apportion.decision import Decision, Pending, Reason, SolveReport
from apportion.estimation.models.spill import spilled_on
from apportion.formulations.plans import EstimatedPlans, plan_from_code, sized_to_fit
from apportion.models import catalog_model
from apportion.placement import Packer, type_order
from apportion.plan_memory import GiB, device_memory_bytes, fits_memory, type_memory_bytes
from apportion.plans import ExecutionPlan

__all__ = ["Choice", "Packer", "Running", "best_type", "build_decision", "fitting_plan",
           "requested_type", "type_order"]

#: the plan families a baseline's plan is chosen from, sized by the analytic model (one
#: source for every baseline: its options are memoised per model, batch, type and count)
_PLANS = EstimatedPlans()
#: chosen plans per (model, batch, type, GPUs, placement by node group, kept plan, code,
#: what the plan filter reads of the job, cluster): a replay asks the same few shapes every
#: round
_CHOSEN: dict[tuple[Any, ...], ExecutionPlan | None] = {}


def _tp_fits(plan: ExecutionPlan, placement: Mapping[str, int], cluster: Any) -> bool:
    """Whether the plan's tensor-parallel groups sit inside the placement's nodes."""
    return all(k % plan.tp == 0 and plan.tp <= cluster.nodes[n].gpus
               for n, k in placement.items() if n in cluster.nodes)


def fitting_plan(view: Any, js: Any, c: Choice) -> ExecutionPlan | None:
    """The plan ``js`` runs with on ``c`` (module docstring), or None where none fits."""
    spec = js.spec
    if catalog_model(spec.model) is None:  # no layer graph: the rate is the only witness
        return c.plan or ExecutionPlan(dp=c.gpus)
    cluster = view.cluster
    groups = tuple(sorted((cluster.nodes[n].group if n in cluster.nodes else n, k)
                          for n, k in c.placement.items()))
    accept = getattr(view, "plan_filter", None)
    job_key = getattr(accept, "job_key", None)
    runs = (None if accept is None else
            (id(accept), job_key(spec) if callable(job_key) else spec.id))
    key = (spec.model, spec.global_batch_size, c.gpu_type, c.gpus, groups, c.plan, c.code,
           runs, cluster.fingerprint_hash)
    if key not in _CHOSEN:
        if len(_CHOSEN) > 100_000:  # a long-lived driver: never unbounded
            _CHOSEN.clear()
        _CHOSEN[key] = _choose(view, js, c)
    return _CHOSEN[key]


def _choose(view: Any, js: Any, c: Choice) -> ExecutionPlan | None:
    spec, cluster = js.spec, view.cluster
    known = [n for n in c.placement if n in cluster.nodes]
    limit = min((device_memory_bytes(cluster, n) for n in known),
                default=type_memory_bytes(cluster, c.gpu_type))

    def ok(plan: ExecutionPlan) -> bool:
        return (plan.gpus == c.gpus and _tp_fits(plan, c.placement, cluster)
                and fits_memory(spec, plan, limit))

    if c.plan is not None and ok(c.plan):  # what it runs with now
        return c.plan
    plain = ExecutionPlan(dp=c.gpus)
    est = _PLANS.estimator
    e = est.predict(spec, plain, {n: c.placement[n] for n in known}, cluster) if known else None
    if e is not None and e.feasible and e.plan == plain and ok(plain):
        return plain
    parsed = plan_from_code(c.code, c.gpus) if c.code else None
    measured = sized_to_fit(spec, parsed[0], limit) if parsed is not None else None
    if measured is not None and ok(measured):
        return measured
    said = cluster.gpu_memory_bytes(c.gpu_type)
    opts = [o for o in _PLANS.options(spec, c.gpu_type, c.gpus, cluster)
            if ok(o.plan) and (said is None or o.mem_per_gpu <= said)]
    if not opts:
        if c.gpus == 1:  # nothing fits whole: Hydra's spilling, where it fits
            spilled, _ = spilled_on(spec, cluster, c.gpu_type, _PLANS.estimator)
            if spilled is not None and ok(spilled.plan):
                return spilled.plan
        return None
    accept = getattr(view, "plan_filter", None)
    if accept is not None:  # what the job's workload runs, where one of them fits
        opts = [o for o in opts if accept(spec, o.plan) is None] or opts
    return min(opts, key=lambda o: (o.iter_time_s, o.plan.label())).plan


def fits_somewhere(view: Any, js: Any) -> bool:
    """Whether some plan of ``js`` fits some GPU type of the cluster at some count (powers of
    two and its request, up to the type's GPUs): ``can_ever_fit`` of a job no plan fits
    where the policy put it."""
    spec, cluster = js.spec, view.cluster
    for t, cap in sorted(view.capacity.items()):
        counts, g = {spec.requested_gpus}, 1
        while g <= cap:
            counts.add(g)
            g *= 2
        limit, said = type_memory_bytes(cluster, t), cluster.gpu_memory_bytes(t)
        for g in sorted(n for n in counts if n <= cap):
            for o in _PLANS.options(spec, t, g, cluster):
                if fits_memory(spec, o.plan, limit) and (said is None or o.mem_per_gpu <= said):
                    return True
        if spilled_on(spec, cluster, t, _PLANS.estimator)[0] is not None:
            return True
    return False


def build_decision(view: Any, chosen: dict[str, Choice], name: str, t0: float | None = None,
                   reasons: dict[str, tuple[Reason, str]] | None = None,
                   report: SolveReport | None = None, formulation: str = "baseline") -> Decision:
    """A baseline's decision (:func:`apportion.assembly.build_decision`), every placed job
    given a plan that fits its GPUs first (:func:`fitting_plan`); a job none fits is pending
    ``no-fit-memory``."""
    by_id = {js.id: js for js in view.jobs}
    fitted: dict[str, Choice] = {}
    unfit: dict[str, str] = {}
    for jid, c in chosen.items():
        plan = fitting_plan(view, by_id[jid], c)
        if plan is None:
            limit = min((device_memory_bytes(view.cluster, n) for n in c.placement
                         if n in view.cluster.nodes), default=0.0)
            unfit[jid] = (f"{name}: no plan of its {c.gpus} {c.gpu_type} GPUs fits their memory "
                          f"({limit / GiB:g} GiB each)")
            continue
        fitted[jid] = c if plan is c.plan else Choice(c.gpu_type, c.gpus, c.placement,
                                                      c.est_rate, plan, c.code, c.cpus,
                                                      c.global_batch_size)
    why = dict(reasons or {})
    why.update((jid, (Reason.NO_FIT_MEMORY, detail)) for jid, detail in unfit.items())
    dec = assembly.build_decision(view, fitted, name, t0, why, report, formulation)
    for i, p in enumerate(dec.pending):
        if p.reason is not Reason.NO_FIT_MEMORY:
            continue
        if p.job in unfit:
            p.can_ever_fit = fits_somewhere(view, by_id[p.job])
        elif catalog_model(by_id[p.job].spec.model) is None:
            # a rate of 0 everywhere says nothing of memory where the model has no layers
            # (a trace's own job type its measurements never saw): no estimate, not memory
            dec.pending[i] = Pending(p.job, Reason.NO_ESTIMATE,
                                     f"{p.detail}: no rate for it on any GPU type "
                                     f"({by_id[p.job].spec.model!r} has no layer graph, so "
                                     "its memory is unknown)", p.action, p.stage)
    return dec


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
