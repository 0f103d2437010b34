r"""Execution plans x multi-resource allocation (Morphling), as a candidate graph.

Each job picks one *plan option*: a GPU type and count (``gpu_counts`` of its request and,
for an elastic job, its scale-up while it gains: :mod:`apportion.formulations.counts`), an
execution plan
(3D parallel dp x tp x pp, ZeRO-DP, ZeRO-Offload, gradient accumulation,
gradient checkpointing and their combinations) and the CPUs and host memory it
needs per GPU. Options come from a :class:`PlanSource`: estimated
(:class:`EstimatedPlans`, the analytic model over every plan family) or
measured (:class:`MeasuredPlans`, Morphling's per-plan iteration-time tables).

The options are written into the same candidate graph the cell formulation
reads (vertex kind ``cell``, with ``plan_*`` attributes, ``cpus_per_gpu`` and
``host_mem_gib_per_gpu``), so :func:`apportion.formulations.cells.build_cells_model`
builds the model, with per-node CPU and host-memory rows added
(``resources=True``):

    sum_c cpus_per_gpu_c * g_{c,n} <= cpus_n,   sum_c mem_per_gpu_c * g_{c,n} <= mem_n

SLAs (Morphling section 5): a *guaranteed* job within its tenant's quota must
run at least as fast as its requested resources under its requested (or best)
plan. Its options are filtered to those meeting that SLA (the minimum demand is
the smallest option that does: found by the search over options), and placing
it earns ``sla_weight``: more than any one job's value can be (a term is at most
about its speed-up, 2, times the largest JCT weight, 4, plus the place bonus),
so the solver places a guaranteed job before any single best-effort one (a soft
priority: the model is never infeasible). The weight was measured on
Morphling's MT workload, 3 seeds (experiments/results/quality/HISTORY.md): at
100 the average JCT was 0.658 h and 0.796 of the SLAs were kept, at 10 0.596 h
and 0.818 (fewer restarts of both kinds of job, best-effort jobs queued 0.54-0.59 h
against 0.65-0.68 h), at 3 0.43 h but 0.78 of the SLAs (2 seeds). How 100 costs is not
isolated: the relative tolerance on an objective that is mostly bonus explains a
little (100 at a 1e-5 tolerance: 0.641 h on seed 0). Quotas bound the GPUs of a
tenant's guaranteed jobs:

    sum_{j guaranteed in t} sum_c gpus_c x_c <= quota_t

Guaranteed jobs whose minimum demands no longer fit the quota (in submit
order) are treated as best-effort this round.

An SLA is a promised completion time: the job's work at its request's speed, times
``sla_slack`` (1.05), after its submission, plus ``sla_grace_s`` (one round: a job waits
for the next round). A guaranteed job that can no longer finish within it, even at its
promised speed from now on (it waited past its window, or ran slower), is best-effort
from then on (``sla_deadline``, the job vertex's ``sla_lost``): its priority could not
keep its SLA any more and only delays other jobs. Measured on Morphling's MT workload,
seed 0 (experiments/results/quality/HISTORY.md): without it the jobs that had lost
their SLA kept the priority, and best-effort jobs queued behind them (0.600 h average
JCT estimated, 0.531 oracle); with it 0.369 and 0.331 h, SLAs kept 0.804 and 0.814 (0.814
and 0.799 before). Best-effort jobs use what is
left and carry no keep bonus, so they are preempted first.

The SLA and quota rule is :mod:`apportion.formulations.sla`'s (the cells formulation
keeps the same one): here it judges each job's plan options as they are built.

Objective: total normalised throughput, each job's throughput divided by that
of its requested GPUs under its best plan (Morphling's figure-8 normalisation:
speed-up over the rigid plan on the requested resources).
"""

from __future__ import annotations

import csv
import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import networkx as nx
from apportion.estimation.base import Estimate
from apportion.estimation.models.analytic import (
    AnalyticEstimator,
    nominal_placement,
    powers_of_two_dividing,
)
from apportion.estimation.rate_estimator import rated_estimate
from apportion.formulations.candidates import add_topology, attach_cell_edges
from apportion.formulations.counts import MIN_GAIN, base_cap, grow, scale_ups
from apportion.formulations.objectives import (
    CELLS_ONLY,
    ObjectiveOptions,
    apply_objective,
    nested_objective,
    objective_of_options,
    options_dict,
    reference_throughput,
)
from apportion.formulations.schema import job_node
from apportion.formulations.sla import (
    SLA_WEIGHT,
    QuotaBook,
    judge,
    mark,
    sla_order,
    sla_reachable,
)

from apportion.cluster import Cluster
from apportion.decision import Reason
from apportion.errors import InputError
from apportion.formulations.spilled import spilled_cells
from apportion.jobs import JobSpec
from apportion.models import catalog_model, get_model
from apportion.plan_memory import fits_memory, type_memory_bytes
from apportion.plans import ExecutionPlan

log = logging.getLogger(__name__)

# PlanOptions.prune's default: dominated options are pruned on clusters larger than this
PRUNE_ABOVE_GPUS = 256

GiB = 2**30


@dataclass(frozen=True)
class PlanOption:
    """One way to run a job: type, GPUs, plan, and what it needs besides GPUs."""

    gpu_type: str
    gpus: int
    plan: ExecutionPlan
    family: str
    iter_time_s: float
    global_batch_size: int
    cpus_per_gpu: float = 4.0
    host_mem_gib_per_gpu: float = 8.0
    mem_per_gpu: float = 0.0

    @property
    def throughput(self) -> float:
        return self.global_batch_size / self.iter_time_s if self.iter_time_s > 0 else 0.0

    @property
    def label(self) -> str:
        return f"{self.family}:{self.plan.label()}:cpu{self.cpus_per_gpu:g}"


class PlanSource(Protocol):
    def options(self, job: JobSpec, gpu_type: str, gpus: int, cluster: Cluster) -> list[PlanOption]:
        ...


# ---------------------------------------------------------------------------
# Estimated options: the analytic model over every plan family
# ---------------------------------------------------------------------------
@dataclass
class EstimatedPlans:
    """Every plan family at a GPU count, timed by the analytic estimator.

    Families: ``3d`` (dp x tp x pp, TP inside a node), ``3d+gc``, ``zero-dp``
    (ZeRO stage 2 over all GPUs), ``zero-dp+gc``, ``zero-offload`` (stage 2 with
    the optimizer on the CPU; offered at several CPU counts, since the CPU Adam
    step scales with cores: ``adam_GBps_per_cpu`` of optimizer state per core).
    Gradient accumulation is implicit: the estimator adds micro-batches until
    memory fits, which is accumulation when pp = 1.
    """

    estimator: AnalyticEstimator = field(default_factory=AnalyticEstimator)
    base_cpus_per_gpu: float = 4.0
    base_host_mem_gib_per_gpu: float = 8.0
    offload_cpus_per_gpu: tuple[float, ...] = (8.0, 16.0)
    adam_GBps_per_cpu: float = 1.5
    max_pp: int = 8
    # options per (model, batch, type, count, cluster, estimator state): jobs of one model
    # and batch share them (a 1,000-job round has a few dozen such pairs), so a round costs
    # each pair once, not each job (issue 43 item 4: the estimates were most of its time)
    _memo: dict[tuple[Any, ...], list[PlanOption]] = field(default_factory=dict, repr=False,
                                                           compare=False)

    def options(self, job: JobSpec, gpu_type: str, gpus: int, cluster: Cluster) -> list[PlanOption]:
        key = (job.model, job.global_batch_size, gpu_type, gpus, cluster.fingerprint_hash,
               _fitted_state(self.estimator), self.base_cpus_per_gpu,
               self.base_host_mem_gib_per_gpu, self.offload_cpus_per_gpu,
               self.adam_GBps_per_cpu, self.max_pp)
        got = self._memo.get(key)
        if got is None:
            if len(self._memo) > 200_000:  # a long-lived source: never unbounded
                self._memo.clear()
            got = self._memo[key] = self._options(job, gpu_type, gpus, cluster)
        return list(got)

    def _options(self, job: JobSpec, gpu_type: str, gpus: int, cluster: Cluster
                 ) -> list[PlanOption]:
        placement = nominal_placement(cluster, gpu_type, gpus)
        if placement is None:
            return []
        model = get_model(job.model)
        intra, outer = self.estimator._links(placement, gpu_type, cluster)
        max_tp = cluster.max_gpus_per_node(gpu_type)
        limit = cluster.gpu_memory_bytes(gpu_type)  # the node group's, where it says one
        out: list[PlanOption] = []

        def add(plan: ExecutionPlan, family: str, cpus: float | None = None) -> None:
            e = self.estimator._evaluate(model, job.global_batch_size, plan, gpu_type, intra, outer,
                                         limit=limit)
            if not e.feasible:
                return
            t = e.iter_time_s
            mem = self.base_host_mem_gib_per_gpu
            if plan.offload:  # the CPU Adam step: 16 bytes per parameter held, over the cores
                per_gpu_params = model.params / max(1, plan.dp * plan.tp * plan.pp) * plan.dp
                state = 16.0 * per_gpu_params / max(1, plan.dp)
                t = t - e.breakdown["optimizer_s"] + state / (cpus * self.adam_GBps_per_cpu * 1e9)
                mem += state / GiB
            mem = math.ceil(mem * 8) / 8  # 1/8 GiB granularity keeps the rows integral for CP-SAT
            out.append(PlanOption(gpu_type, gpus, e.plan, family, t, job.global_batch_size,
                                  cpus if cpus is not None else self.base_cpus_per_gpu, mem,
                                  e.mem_per_gpu))

        for pp in powers_of_two_dividing(gpus, min(self.max_pp, len(model.layers))):
            for tp in powers_of_two_dividing(gpus // pp, max_tp):
                dp = gpus // (pp * tp)
                if dp > job.global_batch_size:
                    continue
                add(ExecutionPlan(dp=dp, tp=tp, pp=pp), "3d")
                add(ExecutionPlan(dp=dp, tp=tp, pp=pp, checkpointing=True), "3d+gc")
        if gpus <= job.global_batch_size:
            add(ExecutionPlan(dp=gpus, zero_stage=2), "zero-dp")
            add(ExecutionPlan(dp=gpus, zero_stage=2, checkpointing=True), "zero-dp+gc")
            for cpus in self.offload_cpus_per_gpu:
                add(ExecutionPlan(dp=gpus, zero_stage=2, offload=True, checkpointing=True),
                    "zero-offload", cpus)
        return out


def _fitted_state(estimator: Any) -> tuple[Any, ...]:
    """An estimator's identity and fitted state (scikit-learn's ``*_`` attributes and its
    parameters): what an option's estimate depends on besides the job and the cell."""
    return (id(estimator), repr(sorted((k, v) for k, v in vars(estimator).items()
                                       if not k.startswith("_")
                                       and isinstance(v, (dict, float, int, tuple, str,
                                                          bool, type(None))))))


@dataclass
class CalibratedPlans:
    """Another source's options, their times scaled so the best matches a measured rate.

    Where a rate source (a replay's view) says how fast a job's best plan runs on
    ``gpus`` GPUs of a type, the plan family's relative costs (and CPU/memory needs)
    still come from ``source``: every option's time is scaled by the same factor, so
    the fastest option runs at the measured rate; a size the rate source says cannot
    run has no options. With ``calibrate=False`` (a real cluster, whose rate source is
    the estimator ``source`` already reads) the source's times stand.

    A job whose model the catalog lacks has no plan family to cost: its one option is
    the data-parallel plan the rate stands for (:func:`rated_options`), in both cases.
    """

    source: PlanSource
    rate_fn: Any  # (job, gpu_type, gpus) -> iterations/s
    calibrate: bool = True

    def options(self, job: JobSpec, gpu_type: str, gpus: int, cluster: Cluster) -> list[PlanOption]:
        if catalog_model(job.model) is None:
            return rated_options(job, gpu_type, gpus, self.rate_fn, self.source)
        opts = self.source.options(job, gpu_type, gpus, cluster)
        if not self.calibrate:
            return opts
        r = float(self.rate_fn(job, gpu_type, gpus)) if opts else 0.0
        if r <= 0:
            return []
        scale = (1.0 / r) / min(o.iter_time_s for o in opts)
        return [replace(o, iter_time_s=o.iter_time_s * scale) for o in opts]


def rated_options(job: JobSpec, gpu_type: str, gpus: int, rate_fn: Any,
                  source: Any = None) -> list[PlanOption]:
    """The one option a rate gives a model the catalog lacks: its data-parallel plan at the
    rate (:func:`apportion.estimation.rate_estimator.rated_estimate`), with ``source``'s
    base CPUs and host memory per GPU (none where the rate is 0: it does not run there)."""
    r = float(rate_fn(job, gpu_type, gpus))
    e = rated_estimate(job, gpus, 1, 1.0 / r) if r > 0 else None
    if e is None:
        return []
    base = PlanOption(gpu_type, gpus, e.plan, "dp", e.iter_time_s, job.global_batch_size)
    return [replace(base, cpus_per_gpu=float(getattr(source, "base_cpus_per_gpu",
                                                     base.cpus_per_gpu)),
                    host_mem_gib_per_gpu=float(getattr(source, "base_host_mem_gib_per_gpu",
                                                       base.host_mem_gib_per_gpu)))]


# ---------------------------------------------------------------------------
# Measured options: Morphling's per-plan tables
# ---------------------------------------------------------------------------
def plan_from_code(code: str, gpus: int) -> tuple[ExecutionPlan, str] | None:
    """Morphling's ``exec_plan`` column: ga, gc, zero-dp, zero-offload, tp+ga or PP-TP-DP digits."""
    code = code.strip().lstrip("\ufeff")
    if code.isdigit() and len(code) == 3:
        pp, tp, dp = (int(c) for c in code)
        if pp * tp * dp != gpus:
            return None
        return ExecutionPlan(dp=dp, tp=tp, pp=pp, micro_batches=max(1, 4 * pp) if pp > 1 else 1), "3d"
    table = {
        "ga": (ExecutionPlan(dp=gpus, accumulation=2), "ga"),
        "gc": (ExecutionPlan(dp=gpus, checkpointing=True), "gc"),
        "zero-dp": (ExecutionPlan(dp=gpus, zero_stage=2), "zero-dp"),
        "zero-offload": (ExecutionPlan(dp=gpus, zero_stage=2, offload=True), "zero-offload"),
        "tp+ga": (ExecutionPlan(tp=gpus, accumulation=2), "tp+ga"),
    }
    return table.get(code)


def sized_to_fit(job: JobSpec, plan: ExecutionPlan, limit_bytes: float) -> ExecutionPlan | None:
    """A measured plan completed with the micro-batching its code does not record, so that
    it fits ``limit_bytes`` per GPU by the validator's ledger (:mod:`apportion.plan_memory`):
    ``plan`` itself where it fits, else its accumulation steps (one stage) or its pipeline
    micro-batches doubled, the fewest that fit; None where none does. A measured run went
    through *some* micro-batch size (Morphling's ``zero-offload`` of LLaMA-2-7B on one
    80 GB GPU cannot hold its 32 samples at once); the largest that fits is taken."""
    if fits_memory(job, plan, limit_bytes):
        return plan
    per_replica = max(1, job.global_batch_size // max(1, plan.dp))
    k = 2
    while k <= per_replica:
        grown = (replace(plan, accumulation=plan.accumulation * k) if plan.pp == 1
                 else replace(plan, micro_batches=plan.micro_batches * k))
        if fits_memory(job, grown, limit_bytes):
            return grown
        k *= 2
    return None


@dataclass
class MeasuredPlans:
    """Iteration times per plan and placement from Morphling's ``placements.csv`` tables.

    ``tables`` maps a catalog model name to a CSV path. A row's placement is a
    digit string of GPUs per node (``22``: two nodes with two GPUs); an option
    at G GPUs uses the most consolidated measured placement of that plan that
    the cluster can host (no node given more GPUs than it has).
    Offload plans ask for ``offload_cpus_per_gpu`` CPUs per GPU. A plan code records
    no micro-batch size: a plan that would not fit as written gets the fewest extra
    accumulation steps (pipeline micro-batches) that fit (:func:`sized_to_fit`).
    """

    tables: dict[str, Path]
    gpu_type: str = "A800-80GB"
    base_cpus_per_gpu: float = 4.0
    offload_cpus_per_gpu: float = 12.0
    base_host_mem_gib_per_gpu: float = 8.0
    offload_host_mem_gib_per_gpu: float = 64.0
    _rows: dict[str, list[tuple[str, str, float]]] = field(default_factory=dict, repr=False)

    def _load(self, model: str) -> list[tuple[str, str, float]]:
        if model not in self._rows:
            path = Path(self.tables[model])
            rows = []
            with path.open(newline="", encoding="utf-8-sig") as fh:
                for i, r in enumerate(csv.DictReader(fh)):
                    try:
                        t = float(r["iter_time"])
                    except (KeyError, ValueError):
                        raise InputError(str(path), f"row {i + 2}.iter_time", "not a number") from None
                    if not math.isfinite(t) or t <= 0:
                        continue
                    rows.append((r["exec_plan"].strip(), r["placement"].strip(), t))
            self._rows[model] = rows
        return self._rows[model]

    def options(self, job: JobSpec, gpu_type: str, gpus: int, cluster: Cluster) -> list[PlanOption]:
        if gpu_type != self.gpu_type or job.model not in self.tables:
            return []
        best: dict[str, tuple[int, float, ExecutionPlan, str]] = {}
        per_node = cluster.max_gpus_per_node(gpu_type)
        nodes = len(cluster.nodes_of_type(gpu_type))
        for code, placement, t in self._load(job.model):
            if not placement.isdigit() or sum(int(c) for c in placement) != gpus:
                continue
            if len(placement) > nodes or max(int(c) for c in placement) > per_node:
                continue  # a placement shape this cluster cannot host
            parsed = plan_from_code(code, gpus)
            if parsed is None:
                continue
            plan, family = parsed
            cur = best.get(code)
            if cur is None or (len(placement), t) < (cur[0], cur[1]):
                best[code] = (len(placement), t, plan, family)
        out = []
        limit = type_memory_bytes(cluster, gpu_type)
        for code, (_, t, measured, family) in sorted(best.items()):
            plan = sized_to_fit(job, measured, limit)
            if plan is None:
                continue
            off = plan.offload
            out.append(PlanOption(gpu_type, gpus, plan, family, t, job.global_batch_size,
                                  self.offload_cpus_per_gpu if off else self.base_cpus_per_gpu,
                                  self.offload_host_mem_gib_per_gpu if off
                                  else self.base_host_mem_gib_per_gpu))
        return out


# ---------------------------------------------------------------------------
# The candidate graph
# ---------------------------------------------------------------------------
@nested_objective(ObjectiveOptions)
@dataclass(frozen=True)
class PlanOptions:
    """Knobs of the plans formulation (documented in the module docstring) and its objective
    (``objective``, an :class:`ObjectiveOptions`: Crius's by default; a driver gives it the
    cells formulation's through :meth:`like`). As :class:`CandidateOptions`, every objective
    knob is also a keyword and an attribute of its own."""

    gpu_counts: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0)
    # ``elastic`` (apportion's): ``gpu_counts`` and, for an elastic job, the powers of two
    # above them while each gains ``min_gain`` (formulations/counts.py, the cells' rule; a
    # job that is not elastic gets its request alone); ``scales``: ``gpu_counts`` alone
    counts: str = "elastic"
    min_gain: float = MIN_GAIN
    sla_weight: float = SLA_WEIGHT  # see the module docstring (its measurement)
    # a guaranteed job's SLA is its promised time (its work at its request's speed) x
    # ``sla_slack`` after its submission, plus ``sla_grace_s`` (None: one round); once it
    # can no longer finish within that, even at its promised speed from now on, it is
    # best-effort (see the module docstring). False: guaranteed while it runs at all
    sla_deadline: bool = True
    sla_slack: float = 1.05
    sla_grace_s: float | None = None
    objective: ObjectiveOptions = field(default_factory=ObjectiveOptions)
    # options another option of the same type and count dominates are left out of the
    # model (:func:`prune_dominated`): they can never be chosen by an optimal answer. None:
    # on clusters of more than PRUNE_ABOVE_GPUS GPUs, where the model's size is what limits
    # the round; a smaller round keeps every option, so its ties break as they did when
    # Morphling's quality rows (64 GPUs) were measured
    prune: bool | None = None

    @classmethod
    def like(cls, candidates: Any, **kw: Any) -> PlanOptions:
        """Plan options with the objective of a :class:`CandidateOptions` (one objective for
        both formulations: a driver configures it once), but the cells formulation's own
        knobs (:data:`~apportion.formulations.objectives.CELLS_ONLY`: the tail share, the
        round's work cap, the trace's tail and its pinned band) at Crius's values: on
        Morphling's queue-bound workloads the tail's extra speed is GPUs a waiting job does
        not get (MT oracle 0.548 h against 0.531, SLAs kept 0.796 against 0.799;
        experiments/results/quality/HISTORY.md). Speed in shares of each job's fastest plan
        is taken (Morphling's base and BP 3.7-6.1 % lower, MT oracle 5 %, SLAs kept the
        same); with no tail share, ``best-outside-tail`` counts every job in
        shares."""
        crius = ObjectiveOptions()
        nested = replace(objective_of_options(candidates),
                         **{k: getattr(crius, k) for k in CELLS_ONLY})
        if isinstance(kw.get("objective"), str):  # a kind over the candidates' other knobs
            nested = replace(nested, kind=kw.pop("objective"))
        return cls(**{"objective": nested, **kw})

    def objective_options(self) -> ObjectiveOptions:
        return self.objective


def host_fits(o: PlanOption, cluster: Cluster,
              shapes: dict[str, list[tuple[int, float, float]]] | None = None) -> bool:
    """Whether some node of the option's GPU type can hold its smallest share: the whole cell
    where one node holds it (it is then placed on one node), else one tensor-parallel group,
    with the CPUs and host memory the option asks per GPU. ``shapes``: the cluster's
    :func:`node_shapes`, made once per round (a round asks this of every option)."""
    for gpus, cpus, mem in (shapes if shapes is not None else node_shapes(cluster)
                            ).get(o.gpu_type, ()):
        k = o.gpus if o.gpus <= gpus else max(1, o.plan.tp)
        if k <= gpus and k * o.cpus_per_gpu <= cpus and k * o.host_mem_gib_per_gpu <= mem:
            return True
    return False


def fits_gpu(job: JobSpec, o: PlanOption, cluster: Cluster) -> bool:
    """Whether an option fits each GPU of its type: its estimate within what the node group
    lets a job use (``gpu_memory_gib``, where it says), and its plan within the GPU by the
    validator's own ledger (:mod:`apportion.plan_memory`). Every source's options pass here:
    a measured table's plan (Morphling's, measured on 80 GB GPUs) names no memory of its own,
    and a cluster's smaller GPUs must still refuse it."""
    said = cluster.gpu_memory_bytes(o.gpu_type)
    if said is not None and o.mem_per_gpu > said:
        return False
    return fits_memory(job, o.plan, type_memory_bytes(cluster, o.gpu_type))


def node_shapes(cluster: Cluster) -> dict[str, list[tuple[int, float, float]]]:
    """The distinct (GPUs, CPUs, host memory) of each GPU type's nodes (with GPUs)."""
    out: dict[str, set[tuple[int, float, float]]] = {}
    for n in cluster.nodes.values():
        if n.gpus > 0:
            out.setdefault(n.gpu_type, set()).add((n.gpus, float(n.cpus),
                                                   float(n.host_memory_gib)))
    return {t: sorted(v) for t, v in out.items()}


def dominates(a: PlanOption, b: PlanOption, per_node: int) -> bool:
    """Whether option ``a`` is at least as good as ``b`` in every way the plans model sees:
    the same GPU type and count, at least the throughput, at most the CPUs, host memory and
    GPU memory per GPU, and placed at least as freely (a cell that fits one node is placed
    whole either way; a larger one in tensor-parallel groups: ``a``'s must divide ``b``'s)."""
    if (a.gpu_type, a.gpus) != (b.gpu_type, b.gpus):
        return False
    return _dominates(_traits(a), _traits(b), a.gpus <= per_node)


def _traits(o: PlanOption) -> tuple[float, float, float, float, int]:
    return (o.throughput, o.cpus_per_gpu, o.host_mem_gib_per_gpu, o.mem_per_gpu,
            max(1, o.plan.tp))


def _dominates(a: tuple[float, float, float, float, int],
               b: tuple[float, float, float, float, int], whole: bool) -> bool:
    return (a[0] >= b[0] and a[1] <= b[1] and a[2] <= b[2] and a[3] <= b[3]
            and (whole or b[4] % a[4] == 0))


def prune_dominated(opts: list[PlanOption], per_node: dict[str, int],
                    keep: Any = None) -> list[PlanOption]:
    """The options no other option of the same GPU type and count dominates
    (:func:`dominates`), in their order: the Pareto front in (throughput up; CPUs, host
    memory and GPU memory per GPU down; placement unit). Of options equal in all of them one
    stays. ``keep(o)``: an option kept whatever dominates it (a running job's present plan,
    whose keep bonus no other option has). A dominated option is never needed by an optimal
    answer of the plans model (whose value grows with throughput: the one it is dominated by
    takes its place at no cost), so the model loses nothing; on Crius's 1,280 GPUs it drops
    about two thirds of the options.

    Each (type, count) group is scanned best first (throughput down, then resources up), so
    an option's dominators come before it, and it is compared with the front kept so far
    only (dominance is transitive)."""
    by_cell: dict[tuple[str, int], list[int]] = {}
    for i, o in enumerate(opts):
        by_cell.setdefault((o.gpu_type, o.gpus), []).append(i)
    traits = [_traits(o) for o in opts]
    kept: list[int] = []
    for (t, gpus), idx in by_cell.items():
        whole = gpus <= per_node.get(t, 0)
        front: list[tuple[float, float, float, float, int]] = []
        for i in sorted(idx, key=lambda i: (-traits[i][0], *traits[i][1:], i)):
            tr = traits[i]
            if any(_dominates(f, tr, whole) for f in front) and not (keep and keep(opts[i])):
                continue
            front.append(tr)
            kept.append(i)
    return [opts[i] for i in sorted(kept)]


def _largest(cluster: Cluster, gpu_type: str) -> str:
    n = max((n for n in cluster.nodes.values() if n.gpu_type == gpu_type),
            key=lambda n: (n.cpus, n.host_memory_gib), default=None)
    return "none" if n is None else f"{n.cpus} CPUs and {n.host_memory_gib:g} GiB for {n.gpus} GPUs"


def _counts(n: int, scales: Iterable[float], cap: int) -> list[int]:
    return sorted({max(1, int(round(n * s))) for s in scales} & set(range(1, cap + 1)))


def _job_counts(job: JobSpec, opt: PlanOptions, cap: int,
                options_at: Callable[[int], list[PlanOption]]) -> list[PlanOption]:
    """A job's fitting options on one type over its counts: ``gpu_counts`` of its request
    (within ``max_gpus``; its request alone when it is not elastic) and, with
    ``counts="elastic"``, its scale-up above them while it gains (:mod:`.counts`, the cells'
    rule). ``options_at(g)``: the fitting options of ``g`` GPUs."""
    if opt.counts == "scales":
        base, ups = _counts(job.requested_gpus, opt.gpu_counts, cap), []
    elif not job.elastic:
        base, ups = ([job.requested_gpus] if job.requested_gpus <= cap else []), []
    else:
        base = _counts(job.requested_gpus, opt.gpu_counts, base_cap(job, cap))
        ups = scale_ups(job, max(base, default=0), cap)
    found: dict[int, list[PlanOption]] = {}

    def rate(g: int) -> float:
        found[g] = options_at(g)
        return max((o.throughput for o in found[g]), default=0.0)

    fastest = max((rate(g) for g in base), default=0.0)
    kept = grow(ups, fastest, rate, opt.min_gain) if ups else []
    return [o for g in base + kept for o in found[g]]


def build_plan_candidates(cluster: Cluster, jobs: list[JobSpec], now_s: float, source: PlanSource,
                          quotas: dict[str, int] | None = None,
                          options: PlanOptions | None = None,
                          accept: Any = None) -> nx.DiGraph:
    """The plans problem as a candidate graph for :func:`build_cells_model` (``resources=True``).

    ``accept`` (an executor's plan filter, ``(job, plan) -> None | reason``): the options
    it refuses are dropped before the dominated ones are pruned, so an option is never
    pruned for one its workers cannot run (a job whose every option is refused keeps them,
    for :func:`~apportion.formulations.plan_filter.drop_refused_plans` to say why)."""
    opt = options or PlanOptions()
    quotas = dict(quotas or {})
    g = nx.DiGraph(kind="candidates", formulation="plans", now_s=now_s, options=options_dict(opt),
                   quotas=quotas)
    add_topology(g, cluster)
    caps = cluster.capacity_by_type()
    shapes = node_shapes(cluster)
    per_node = {t: cluster.max_gpus_per_node(t) for t in caps}
    prune = opt.prune if opt.prune is not None else cluster.total_gpus > PRUNE_ABOVE_GPUS
    # the pruned options of each list of options (the source's memo hands jobs of one model
    # and batch the same option objects: their front is found once)
    fronts: dict[tuple[int, ...], tuple[list[PlanOption], list[PlanOption]]] = {}
    book = QuotaBook(quotas)
    # each option's memory verdict once a round: a source hands the jobs of one model and
    # batch the same option objects (held here with their verdict, so no id is reused)
    fits: dict[tuple[int, str, int], tuple[PlanOption, bool]] = {}

    def fitting(job: JobSpec, o: PlanOption) -> bool:
        key = (id(o), job.model, job.global_batch_size)
        got = fits.get(key)
        if got is None or got[0] is not o:
            got = fits[key] = (o, fits_gpu(job, o, cluster))
        return got[1]

    for job in sla_order(jobs):
        jn = job_node(job.id)
        wait = job.wait_s(now_s)
        g.add_node(jn, kind="job", job=job.id, requested_gpus=job.requested_gpus,
                   requested_gpu_type=job.requested_gpu_type, tenant=job.tenant,
                   reach_gpus=max(_counts(job.requested_gpus, opt.gpu_counts,
                                          10 * job.requested_gpus), default=0),
                   queue_bonus=opt.queue_weight * min(1.0, wait / opt.starvation_s),
                   running=list(job.running.cell_key) if job.running else None,
                   reason=None, ref_throughput=None, ref_basis=None, guaranteed=False,
                   sla_throughput=None)
        opts: list[PlanOption] = []
        for gpu_type, cap in sorted(caps.items()):
            opts += _job_counts(job, opt, cap, lambda gpus, t=gpu_type: [
                o for o in source.options(job, t, gpus, cluster) if fitting(job, o)])
        why = None
        if not opts:  # fits no GPU: Hydra's spilling, where it can (formulations/spilled.py)
            opts, why = spilled_options(job, cluster, source)
        elif accept is not None and all(accept(job, o.plan) is not None for o in opts):
            # what fits, its workload cannot run (the torch worker offloads nothing): spilled,
            # where that fits and runs
            spilled = [o for o in spilled_options(job, cluster, source)[0]
                       if accept(job, o.plan) is None]
            opts = spilled or opts
        if not opts:
            _unplaceable(g.nodes[jn], *_no_option(job, why))
            continue
        fit = [o for o in opts if host_fits(o, cluster, shapes)]
        if not fit:  # GPUs would do, the nodes' CPUs or memory never: say so, not capacity
            _unplaceable(g.nodes[jn], Reason.NO_FIT_HOST, _no_host(opts, cluster))
            continue
        opts = fit
        ref, basis = reference_throughput(opt.normalize, job.requested_gpus,
                                          job.requested_gpu_type,
                                          [(o.gpu_type, o.gpus, o.throughput) for o in opts])
        g.nodes[jn]["ref_throughput"] = ref
        g.nodes[jn]["ref_basis"] = basis + ", best plan"
        verdict = judge(job, now_s, [(o.gpu_type, o.gpus, o.throughput) for o in opts],
                        book, opt)
        mark(g.nodes[jn], verdict)
        guaranteed = verdict.guaranteed
        if guaranteed:
            opts = [o for o in opts if verdict.meets(o.throughput)]
        if accept is not None:
            opts = [o for o in opts if accept(job, o.plan) is None] or opts
        if prune and job.running is None:  # the same options give the same front
            key = tuple(map(id, opts))
            if key not in fronts:  # (the options are held, so no id is reused this round)
                fronts[key] = (opts, prune_dominated(opts, per_node))
            opts = list(fronts[key][1])
        elif prune and opt.restart_horizon != "cell":
            # a running job's value with the ``cell`` horizon is not monotone in throughput
            opts = prune_dominated(opts, per_node, keep=lambda o: _is_current(job, o))
        bonus = g.nodes[jn]["queue_bonus"] + (opt.sla_weight if guaranteed else 0.0)
        _add_option_cells(g, cluster, job, opts, ref, bonus, guaranteed)
    apply_objective(g, jobs, now_s, opt.objective_options())
    return g


def _no_option(job: JobSpec, why: str | None) -> tuple[Reason, str | None]:
    """Why a job has no plan on any GPU: rated only and 0 everywhere, or none fits."""
    if catalog_model(job.model) is None:
        return Reason.NO_ESTIMATE, (f"no rate for it on any GPU type ({job.model!r} has no "
                                    "layer graph, so its memory is unknown)")
    return Reason.NO_FIT_MEMORY, why


def _no_host(opts: list[PlanOption], cluster: Cluster) -> str:
    """What the leanest plan asks of a node that no node has."""
    o = min(opts, key=lambda o: (o.cpus_per_gpu, o.host_mem_gib_per_gpu))
    return (f"its leanest plan asks {o.cpus_per_gpu:g} CPUs and {o.host_mem_gib_per_gpu:g} "
            f"GiB of host memory per GPU; the largest {o.gpu_type} node has "
            f"{_largest(cluster, o.gpu_type)}")


def _unplaceable(jd: dict[str, Any], reason: Reason, detail: str | None) -> None:
    """A job vertex with no cell: its reason, and a reference throughput of 0."""
    jd["reason"] = reason.value
    jd["reason_detail"] = detail
    jd["ref_throughput"] = 0.0


def _add_option_cells(g: nx.DiGraph, cluster: Cluster, job: JobSpec, opts: list[PlanOption],
                      ref: float, bonus: float, guaranteed: bool) -> None:
    """A cell vertex per option, with its edges to the topology."""
    jn = job_node(job.id)
    for i, o in enumerate(opts):
        current = _is_current(job, o)
        cn = f"cell:{job.id}:{o.gpu_type}:{o.gpus}:{i}"
        g.add_node(cn, kind="cell", job=job.id, gpu_type=o.gpu_type, gpus=o.gpus,
                   stages=o.plan.pp, dp=o.plan.dp, tp=o.plan.tp,
                   micro_batches=o.plan.micro_batches, est_throughput=o.throughput,
                   iter_time_s=o.iter_time_s, mem_per_gpu=o.mem_per_gpu,
                   normalized=o.throughput / ref, value=o.throughput / ref + bonus,
                   bonus=bonus,
                   current=bool(current and job.running and job.running.placement),
                   family=o.family, plan=o.plan, cpus_per_gpu=o.cpus_per_gpu,
                   host_mem_gib_per_gpu=o.host_mem_gib_per_gpu,
                   quota_tenant=job.tenant if guaranteed else None,
                   single_node=not current and o.gpus <= cluster.max_gpus_per_node(o.gpu_type))
        g.add_edge(jn, cn)
        attach_cell_edges(g, cn, cluster, o.gpu_type, o.gpus, o.plan.tp,
                          g.nodes[cn]["single_node"],
                          job.running.placement if (g.nodes[cn]["current"] and job.running)
                          else None)


def _is_current(job: JobSpec, o: PlanOption) -> bool:
    """Whether ``o`` is the cell and TP degree the job runs on now."""
    return (job.running is not None
            and job.running.cell_key == (o.gpu_type, o.gpus, o.plan.pp)
            and job.running.tp == o.plan.tp)


def spilled_options(job: JobSpec, cluster: Cluster, source: PlanSource
                    ) -> tuple[list[PlanOption], str]:
    """A job no plan fits, spilled (one GPU, shard by shard) where it can be: the spilled
    cells' estimates as options, holding the model's weights and optimizer state in host
    memory (the rows this formulation keeps count it); else why not."""
    inner = getattr(source, "source", source)  # a calibrated source wraps the estimated one
    est = getattr(inner, "estimator", None) or AnalyticEstimator()
    cells, why = spilled_cells(job, cluster, est)
    out = [PlanOption(c.gpu_type, 1, e.plan, "spill", e.iter_time_s, job.global_batch_size,
                      getattr(inner, "base_cpus_per_gpu", 4.0),
                      math.ceil(e.breakdown["host_bytes"] / GiB * 8) / 8, e.mem_per_gpu)
           for c, e in cells]
    return out, ("no plan of any GPU type fits its memory, and it cannot be spilled: " +
                 ("; ".join(why) if why else "no GPU type here"))


def reestimate(option_plan: ExecutionPlan, job: JobSpec, placement: dict[str, int],
               cluster: Cluster, estimator: AnalyticEstimator | None = None) -> Estimate:
    """Topology feedback: the estimate of a plan on the placement actually chosen."""
    est = estimator or AnalyticEstimator()
    return est.predict(job, replace(option_plan), placement, cluster)


# sla_reachable lived here before apportion.formulations.sla: re-exported for compatibility
__all__ = ["CalibratedPlans", "EstimatedPlans", "MeasuredPlans", "PlanOption", "PlanOptions",
           "PlanSource", "build_plan_candidates", "dominates", "fits_gpu", "node_shapes",
           "plan_from_code", "prune_dominated", "rated_options", "reestimate", "sized_to_fit",
           "sla_reachable"]
