r"""Guaranteed jobs, their SLAs and tenants' quotas: one rule for every formulation that
keeps them (the plans formulation's options, the cells formulation's cells).

Morphling's section 5 semantics, written once. A job marked ``guaranteed`` is promised
the speed of what it requested: the best throughput among its candidates at its
requested GPU count (of its requested type, when it names one). Then, in the order
:func:`sla_order` gives (running jobs first, then by submission):

* its SLA is a promised completion time, its work at the promised speed times
  ``sla_slack`` after its submission plus ``sla_grace_s`` (one round: a job waits for
  the next round). A job that can no longer finish within it, even at its promised speed
  from now on, has *lost* its SLA (``sla_lost``) and is best-effort from then on: its
  priority could not keep its SLA any more and only delays other jobs
  (``sla_deadline=False``: guaranteed while it runs at all);
* otherwise its *minimum demand* is the fewest GPUs of a candidate that meets the
  promised speed; it stays guaranteed while its tenant's quota holds that demand besides
  the earlier guaranteed jobs' (:class:`QuotaBook`), else it is best-effort this round
  (``over_quota``, pending with reason ``quota`` when not placed);
* a guaranteed job keeps only the candidates that meet the promised speed (one at its
  request always does), and placing it earns ``sla_weight``: a soft priority over
  best-effort work (the model is never infeasible), and its candidates carry
  ``quota_tenant``, so the model's row binds the tenant:

      sum_{j guaranteed in t} sum_c gpus_c x_c <= quota_t

  (:func:`apportion.formulations.cells.build_cells_model` adds it from the graph's
  ``quotas``; the greedy's ledger keeps it too).

Jobs not marked guaranteed are untouched, and so is a graph with none: the rule changes
nothing for best-effort work. ``sla_weight`` (10) was measured on the plans formulation
(Morphling's MT workload: experiments/results/quality/HISTORY.md); the cells
formulation uses the same value, not separately tuned.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import networkx as nx
from apportion.formulations.objectives import ROUND_S
from apportion.formulations.schema import cells_of, job_node

from apportion.jobs import JobSpec

__all__ = ["SLA_WEIGHT", "QuotaBook", "SlaKnobs", "SlaOptions", "SlaVerdict", "apply_slas",
           "judge", "mark", "promised_speed", "sla_order", "sla_reachable"]

#: the priority a guaranteed job's placement earns (see the module docstring)
SLA_WEIGHT = 10.0
# a candidate meets the SLA at the promised speed less this relative tolerance (the
# promised speed is itself one candidate's: rounding must not drop it)
MEET_TOLERANCE = 1e-9


class SlaKnobs(Protocol):
    """What the SLA rule reads of a formulation's options (:class:`SlaOptions` has it, and
    so does :class:`apportion.formulations.plans.PlanOptions`)."""

    sla_weight: float
    sla_deadline: bool
    sla_slack: float
    sla_grace_s: float | None
    round_s: float | None


@dataclass(frozen=True)
class SlaOptions:
    """The SLA rule's knobs (see the module docstring); ``round_s`` is the round's length,
    the default grace."""

    sla_weight: float = SLA_WEIGHT
    sla_deadline: bool = True
    sla_slack: float = 1.05
    sla_grace_s: float | None = None
    round_s: float | None = ROUND_S  # (None or FromRound: the round's; ROUND_S without one)

    @classmethod
    def of(cls, options: Any, **kw: Any) -> SlaOptions:
        """The knobs ``options`` carries by name (a formulation's options), the rest at
        their defaults, ``kw`` over both."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{**{n: getattr(options, n) for n in names if hasattr(options, n)}, **kw})


def sla_reachable(job: JobSpec, now_s: float, promised: float, opt: SlaKnobs) -> bool:
    """Whether a guaranteed job can still finish within its SLA if it runs at its promised
    speed (samples/s) from ``now_s``: its promised time x ``sla_slack`` after submission,
    plus the grace (one round by default: a job waits for the next round)."""
    batch = job.global_batch_size
    grace = (ROUND_S if opt.round_s is None else opt.round_s) if opt.sla_grace_s is None \
        else opt.sla_grace_s
    deadline = job.submit_time_s + opt.sla_slack * job.iterations * batch / promised + grace
    return now_s + job.remaining_iterations * batch / promised <= deadline


def promised_speed(job: JobSpec, options: Iterable[tuple[str, int, float]]) -> float:
    """The speed a guaranteed job is promised: the best throughput among its candidates
    (GPU type, GPU count, samples/s) at its requested count, of its requested type when it
    names one; 0 when it has none there (then no SLA can be promised)."""
    req_type = job.requested_gpu_type
    return max((thr for t, n, thr in options if n == job.requested_gpus
                and (req_type is None or t == req_type)), default=0.0)


def sla_order(jobs: Iterable[JobSpec]) -> list[JobSpec]:
    """The order guaranteed jobs take their tenants' quotas in: running jobs first (a quota
    does not stop a guaranteed job that runs to start a queued one), then by submission."""
    return sorted(jobs, key=lambda j: (j.running is None, j.submit_time_s, j.id))


class QuotaBook:
    """GPUs of each tenant's quota taken by the guaranteed jobs judged so far (a tenant
    without a quota has no bound)."""

    def __init__(self, quotas: Mapping[str, int] | None) -> None:
        self.quotas = dict(quotas or {})
        self.used: dict[str, int] = {}

    def admit(self, tenant: str, demand: int) -> bool:
        """Take ``demand`` GPUs of ``tenant``'s quota if they fit; whether they did."""
        quota = self.quotas.get(tenant)
        if quota is not None and self.used.get(tenant, 0) + demand > quota:
            return False
        self.used[tenant] = self.used.get(tenant, 0) + demand
        return True


@dataclass(frozen=True)
class SlaVerdict:
    """What the rule makes of one job this round: ``guaranteed`` (it keeps its SLA's
    priority), its ``promised`` speed and minimum ``demand``, or why not (``sla_lost``,
    ``over_quota``; neither for a job not marked guaranteed or with no promise)."""

    guaranteed: bool = False
    promised: float = 0.0
    demand: int = 0
    sla_lost: bool = False
    over_quota: bool = False

    def meets(self, throughput: float) -> bool:
        """Whether a candidate of this throughput keeps the SLA."""
        return throughput >= self.promised * (1 - MEET_TOLERANCE)


def judge(job: JobSpec, now_s: float, options: list[tuple[str, int, float]], book: QuotaBook,
          opt: SlaKnobs) -> SlaVerdict:
    """The rule for one job (``options``: its candidates as (GPU type, GPU count,
    throughput)); takes its minimum demand from ``book`` when it stays guaranteed. Jobs
    must be judged in :func:`sla_order`."""
    promised = promised_speed(job, options) if job.guaranteed else 0.0
    if promised <= 0:
        return SlaVerdict()
    if opt.sla_deadline and not sla_reachable(job, now_s, promised, opt):
        return SlaVerdict(promised=promised, sla_lost=True)
    verdict = SlaVerdict(True, promised)
    demand = min(n for _, n, thr in options if verdict.meets(thr))
    if not book.admit(job.tenant, demand):
        return SlaVerdict(promised=promised, demand=demand, over_quota=True)
    return SlaVerdict(True, promised, demand)


def mark(jd: dict[str, Any], verdict: SlaVerdict) -> None:
    """Record a verdict on the job's vertex (the schema's ``guaranteed``,
    ``sla_throughput``, ``min_demand``, ``sla_lost``, ``over_quota``)."""
    jd["guaranteed"] = verdict.guaranteed
    if verdict.guaranteed:
        jd["sla_throughput"] = verdict.promised
        jd["min_demand"] = verdict.demand
    if verdict.sla_lost:
        jd["sla_lost"] = True
    if verdict.over_quota:
        jd["over_quota"] = True


def apply_slas(g: nx.DiGraph, jobs: list[JobSpec], now_s: float,
               quotas: Mapping[str, int] | None, opt: SlaKnobs) -> None:
    """The rule on a built candidate graph, in place (the cells formulation's: its cells are
    estimated before any job is judged, and cached across rounds, while a verdict depends
    on the clock and on the other jobs). A guaranteed job keeps the cells that meet its
    SLA, each earning ``sla_weight`` (added to its ``bonus`` and ``value``: the objective
    is linear in the bonus, :mod:`apportion.formulations.objectives`) and carrying its
    ``quota_tenant``; ``quotas`` become the graph's (the model's quota rows). A graph
    without guaranteed jobs, and without quotas, is left exactly as it was."""
    if quotas:
        g.graph["quotas"] = dict(quotas)
    book = QuotaBook(quotas)
    for job in sla_order(j for j in jobs if j.guaranteed):
        jn = job_node(job.id)
        if jn not in g:
            continue
        jd = g.nodes[jn]
        jd["tenant"] = job.tenant
        cells = cells_of(g, job.id)
        verdict = judge(job, now_s, [(g.nodes[c]["gpu_type"], int(g.nodes[c]["gpus"]),
                                      float(g.nodes[c]["est_throughput"])) for c in cells],
                        book, opt)
        mark(jd, verdict)
        if not verdict.guaranteed:
            continue
        for cn in cells:
            d = g.nodes[cn]
            if not verdict.meets(float(d["est_throughput"])):
                g.remove_node(cn)
                continue
            d["bonus"] = float(d.get("bonus", 0.0)) + opt.sla_weight
            d["value"] = float(d["value"]) + opt.sla_weight
            d["quota_tenant"] = job.tenant
