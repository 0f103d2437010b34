"""The independent validator: checks a decision against the cluster and the jobs.

Written without reference to any formulation: it reads only the decision, the
cluster and the job list, so a bug in a model or a decoder cannot hide here.
An invalid decision is never acted on.

Per-GPU memory is checked from the plan with the validator's own ledger
(:mod:`apportion.plan_memory`: a lower bound on what each GPU holds, from the
job's model and the plan's degrees, ZeRO stage, offload, recomputation,
micro-batches and spilling), against what each node's GPUs allow (the node
group's ``gpu_memory_gib``, else the catalog's memory). A job whose model has no
layer graph (not in the catalog) is not memory-checked: nothing says what it holds.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from apportion.cluster import Cluster
from apportion.decision import Decision
from apportion.jobs import JobSpec
from apportion.plan_memory import memory_violation
from apportion.plans import ExecutionPlan


@dataclass
class ValidationResult:
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def __bool__(self) -> bool:
        return self.ok


class InvalidDecision(RuntimeError):
    pass


def validate(decision: Decision, cluster: Cluster, jobs: list[JobSpec]) -> ValidationResult:
    """Capacity, types, one cell per job, sizes, plans, TP groups inside nodes and each GPU's
    memory."""
    v: list[str] = []
    specs = {j.id: j for j in jobs}
    known = set(specs)
    used: Counter[str] = Counter()
    seen: Counter[str] = Counter(a.job for a in decision.allocations)
    for job, n in seen.items():
        if n > 1:
            v.append(f"job {job}: {n} allocations (at most one cell per job)")
    for a in decision.allocations:
        tag = f"job {a.job}"
        if a.job not in known:
            v.append(f"{tag}: not a submitted job")
        if a.gpus <= 0:
            v.append(f"{tag}: non-positive GPU count {a.gpus}")
        if sum(a.placement.values()) != a.gpus:
            v.append(f"{tag}: placement holds {sum(a.placement.values())} GPUs, cell has {a.gpus}")
        p = a.plan
        if p.dp * p.tp * p.pp != a.gpus:
            v.append(f"{tag}: plan dp*tp*pp = {p.dp * p.tp * p.pp} != {a.gpus} GPUs")
        if p.pp != a.stages or a.stages <= 0 or a.gpus % a.stages:
            v.append(f"{tag}: {a.stages} stages inconsistent with pp={p.pp} and {a.gpus} GPUs")
        if p.spilled:
            v += _spill_violations(tag, a.gpu_type, p, cluster)
        spec = specs.get(a.job)
        if spec is not None and a.gpus > 0:
            why = memory_violation(spec, p, a.placement, cluster)
            if why is not None:
                v.append(f"{tag}: {why}")
        for node, k in a.placement.items():
            if node not in cluster.nodes:
                v.append(f"{tag}: unknown node {node}")
                continue
            if k <= 0:
                v.append(f"{tag}: non-positive count {k} on {node}")
            nd = cluster.nodes[node]
            if nd.gpu_type != a.gpu_type:
                v.append(f"{tag}: node {node} has {nd.gpu_type}, cell wants {a.gpu_type}")
            if p.tp > 1 and k % p.tp:
                v.append(f"{tag}: {k} GPUs on {node} split a TP group of {p.tp}")
            if p.tp > nd.gpus:
                v.append(f"{tag}: TP degree {p.tp} larger than node {node} ({nd.gpus} GPUs)")
            used[node] += k
    cpu_used: Counter[str] = Counter()
    mem_used: dict[str, float] = {}
    for a in decision.allocations:  # CPUs and memory follow the GPUs across nodes
        if a.gpus <= 0:
            continue
        for node, k in a.placement.items():
            cpu_used[node] += a.cpus * k / a.gpus
            mem_used[node] = mem_used.get(node, 0.0) + a.host_memory_gib * k / a.gpus
    for node, k in used.items():
        if node in cluster.nodes and k > cluster.nodes[node].gpus:
            v.append(f"node {node}: {k} GPUs allocated, capacity {cluster.nodes[node].gpus}")
    for node, c in cpu_used.items():
        if node in cluster.nodes and c > cluster.nodes[node].cpus + 0.01:
            v.append(f"node {node}: {c:g} CPUs allocated, capacity {cluster.nodes[node].cpus}")
    for node, mgib in mem_used.items():
        if node in cluster.nodes and mgib > cluster.nodes[node].host_memory_gib + 0.01:  # rounding
            v.append(f"node {node}: {mgib:g} GiB host memory allocated, "
                     f"capacity {cluster.nodes[node].host_memory_gib:g}")
    pend = Counter(p.job for p in decision.pending)
    for job in pend:
        if job in seen:
            v.append(f"job {job}: both allocated and pending")
        if pend[job] > 1:
            v.append(f"job {job}: pending {pend[job]} times")
    missing = known - set(seen) - set(pend)
    for job in sorted(missing):
        v.append(f"job {job}: neither allocated nor pending")
    v += _merged_violations(decision, set(seen))
    return ValidationResult(v)


def _merged_violations(decision: Decision, allocated: set[str]) -> list[str]:
    """A merged job (``meta["merged"]``: lead -> members, fine-tuning siblings trained as
    one) runs in its lead's allocation: the lead holds GPUs, each member none, and no job
    is inside two merged jobs."""
    merged = (decision.meta or {}).get("merged") or {}
    out: list[str] = []
    inside: Counter[str] = Counter()
    for lead, members in merged.items():
        if lead not in allocated:
            out.append(f"job {lead}: the lead of merged members {list(members)} holds no GPUs")
        for m in members:
            inside[m] += 1
            if m in allocated:
                out.append(f"job {m}: merged into {lead} but allocated on its own")
            if m == lead or m in merged:
                out.append(f"job {m}: merged into {lead} and itself a merged job's lead")
    out += [f"job {m}: merged into {n} jobs" for m, n in sorted(inside.items()) if n > 1]
    return out


def _spill_violations(tag: str, gpu_type: str, p: ExecutionPlan, cluster: Cluster) -> list[str]:
    """A spilled plan (Hydra) trains shard by shard on one GPU under a device budget."""
    out = []
    if p.gpus != 1 or p.zero_stage or p.offload or p.accumulation != 1:
        out.append(f"{tag}: spilled plan {p.label()} must run on one GPU without ZeRO, "
                   "offload or accumulation")
    if p.spill_budget_mib <= 0:
        out.append(f"{tag}: spilled plan {p.label()} names no device-memory budget")
    elif gpu_type in cluster.gpu_types:
        device = cluster.gpu_memory_bytes(gpu_type) or cluster.gpu_spec(gpu_type).memory_bytes
        if p.spill_budget_mib * 2**20 > device:
            out.append(f"{tag}: spilled plan's budget {p.spill_budget_mib} MiB exceeds the "
                       f"{device / 2**20:.0f} MiB a job may use on {gpu_type}")
    return out


def check(decision: Decision, cluster: Cluster, jobs: list[JobSpec]) -> None:
    """Raise :class:`InvalidDecision` listing every violation."""
    res = validate(decision, cluster, jobs)
    if not res.ok:
        raise InvalidDecision("; ".join(res.violations))
