"""Candidate cells per job, held as a networkx graph the formulation reads.

Per job (Crius 6.1): each GPU type in the cluster, GPU counts {N/2, N, 2N}
around the requested N (bounded by what exists of that type) and, for an elastic job
(``counts="elastic"``, the default), the powers of two above them up to the most GPUs the
job may be given, kept while its rate still gains (:mod:`apportion.formulations.counts`);
a job that must keep its size (``elastic: false``) gets N alone. Stage counts 1, 2, 4,
... up to the GPU count (dividing it); each estimated by the estimator's best DP/TP split
inside the cell; infeasible cells dropped.

The graph's schema (vertex kinds and keys, their attributes, the edges and
their ``max_gpus``) and the accessors that read it live in
:mod:`apportion.formulations.schema`: readers import them from there, never from
this builder.

Each cell carries its estimate (``est_throughput``), its normalised throughput
(``normalized = est_throughput / ref_throughput``, ``ref_throughput`` the job's reference
under the objective's ``normalize``:
:func:`apportion.formulations.objectives.reference_throughput`) and the job's queue bonus;
its ``value``, the objective's coefficient, is set by
:func:`apportion.formulations.objectives.apply_objective` (apportion's default: the JCT
seconds the job saves on the cell this round; Crius's: the normalised throughput plus a
keep bonus, less a move's restart; ``docs/objective.md``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
from apportion.estimation.models.analytic import AnalyticEstimator
from apportion.formulations.objectives import (
    ObjectiveOptions,
    apply_objective,
    nested_objective,
    options_dict,
    reference_throughput,
)
from apportion.formulations.batch_options import best_in_cell
from apportion.formulations.counts import MIN_GAIN, base_counts, grow, ladder
from apportion.formulations.graph_bulk import add_new_edges, add_new_vertices
from apportion.formulations.schema import (
    cells_of,
    group_node,
    group_vertices,
    job_node,
    jobs_in,
    kind_of,
    member_nodes,
    name_of,
    node_node,
    node_vertices,
    pinned_nodes,
)

from apportion.cluster import Cluster
from apportion.decision import Reason
from apportion.formulations.spilled import fits_device, spilled_candidates
from apportion.jobs import JobSpec
from apportion.models import catalog_model
from apportion.plan_memory import device_memory_bytes, type_memory_bytes
from apportion.plans import Cell

log = logging.getLogger(__name__)

# cells_of, group_node, job_node, jobs_in, member_nodes and node_node lived here before
# apportion.formulations.schema: re-exported for compatibility (readers import the schema)
__all__ = ["CandidateOptions", "add_topology", "asks_beyond_capacity", "attach_cell_edges",
           "build_candidates", "cells_of",
           "gpu_memory_limits", "group_node", "job_node", "jobs_in", "member_nodes", "node_node",
           "problem_dump",
           "prune_dominated", "queue_bonus", "requests_beyond", "trim_scale_up"]


@nested_objective(lambda: ObjectiveOptions.preset("apportion"))
@dataclass(frozen=True)
class CandidateOptions:
    """Knobs of candidate generation, and the objective (:class:`ObjectiveOptions`, nested
    as ``objective``: apportion's preset by default; why each of its values,
    :data:`apportion.formulations.objectives.PRESETS`). Every objective knob is still a
    keyword of its own and reads as an attribute (``CandidateOptions(keep_bonus=0.3)``,
    ``opts.keep_bonus``), and ``objective`` may be the kind's name over apportion's other
    knobs (``CandidateOptions(objective="normalized")``) or a whole objective
    (``CandidateOptions(objective=ObjectiveOptions.preset("crius"))``). The round length
    and restart cost (``round_s``, ``restart_s``) are the round's unless set
    (:class:`~apportion.formulations.objectives.FromRound`)."""

    # GPU counts as fractions of the request (Sia's reach one GPU; apportion's smaller
    # counts lost on Philly day 1 by doubling the restarts: experiments/results/quality)
    scales: tuple[float, ...] = (0.5, 1.0, 2.0)
    # COUNT_RULES: ``elastic`` (apportion's): the scales' counts and, for a job that is
    # elastic (JobSpec.elastic), the powers of two above them up to its limit while each
    # is at least ``1 + min_gain`` times as fast as the fastest below it; a job that is not
    # gets its request alone. ``scales``: the scales' counts for every job (Crius's, the
    # crius-greedy baseline's: what it was measured with)
    counts: str = "elastic"
    min_gain: float = MIN_GAIN
    max_stages: int = 16
    stage_counts: str = "powers"  # or "divisors"
    # a round whose jobs ask for more GPUs than the cluster has up offers no job more GPUs
    # than it asked for (its running cell aside): every GPU beyond a request is one a
    # waiting job asked for, and the scale-up cells were 40 % of a 700-job round's columns,
    # the share that kept its LP from answering in the budget (Philly day 1's burst fell
    # back to the greedy). True keeps them in every round.
    scale_up_when_full: bool = False
    objective: ObjectiveOptions = field(default_factory=lambda: ObjectiveOptions.preset(
        "apportion"))

    def __post_init__(self) -> None:
        if self.counts not in COUNT_RULES:
            raise ValueError(f"unknown counts {self.counts!r}; choose {', '.join(COUNT_RULES)}")
        if not self.min_gain >= 0.0:
            raise ValueError(f"min_gain must be at least 0, not {self.min_gain!r}")

    def objective_options(self) -> ObjectiveOptions:
        return self.objective


#: how a job's GPU counts are chosen (``CandidateOptions.counts``)
COUNT_RULES = ("elastic", "scales")


def reach_gpus(job: JobSpec, scales: tuple[float, ...]) -> int:
    """The largest count of the request's scales (``2N``): cells above it are a job's
    elastic scale-up, whose speed the objective counts beyond its best within the reach
    (:func:`~apportion.formulations.objectives.apply_objective`)."""
    return max((int(job.requested_gpus * s) for s in scales), default=job.requested_gpus)


def _stage_counts(gpus: int, max_stages: int, layers: int, mode: str = "powers") -> list[int]:
    """Crius's log N choices (1, 2, 4, ...) or, with ``divisors``, every divisor of the size
    (Morphling's plans use 3 or 6 stages on 24 or 48 GPUs)."""
    top = min(gpus, max_stages, layers)
    if mode == "divisors":
        return [s for s in range(1, top + 1) if gpus % s == 0]
    out, s = [], 1
    while s <= top:
        if gpus % s == 0:
            out.append(s)
        s *= 2
    return out


def queue_bonus(job: JobSpec, now_s: float, opt: CandidateOptions) -> float:
    """The bonus of a job waiting since its submission: rises to ``queue_weight`` at
    ``starvation_s`` (the one time-dependent part of a job's candidates)."""
    return opt.queue_weight * min(1.0, job.wait_s(now_s) / opt.starvation_s)


def build_candidates(cluster: Cluster, jobs: list[JobSpec], now_s: float,
                     estimator: AnalyticEstimator | None = None,
                     options: CandidateOptions | None = None,
                     seen: MutableMapping[str, float] | None = None,
                     accept: Callable[[JobSpec, Any], str | None] | None = None,
                     objective: bool = True, scale_up: bool = True) -> nx.DiGraph:
    """Estimate every job's cells and return the candidate graph (``seen``: the policy's
    memory of projected JCTs, for ``tail_quantile``; ``objective=False`` leaves the
    objective's weights to the caller, who applies them over more jobs: the incremental
    cache, :func:`~apportion.formulations.objectives.apply_objective` sets every weight it
    reads). ``accept`` (the executor's plan
    filter, ``(job, plan) -> None | reason``) refuses a cell's plan before dominated cells
    are pruned: a cell kept only because it beat a refused one is still there, so a job
    whose workload runs one plan of a size is offered it.

    A job whose model the catalog lacks gets one-stage cells only: its estimator's times
    come from a rate source whose rate stands for the job's data-parallel plan
    (:func:`apportion.models.catalog_model`), which has no pipeline stages to choose.

    ``scale_up=False`` (a round :func:`trim_scale_up` will trim: its jobs ask for more GPUs
    than it has) leaves out the elastic scale-up of every job with a cell of at most its
    request, which the trim would drop: they are not estimated at all. The cells kept, and
    their values, are those of a build with them (the objective reads a job's best within
    its reach), so the trimmed round is the same."""
    est = estimator or AnalyticEstimator()
    opt = options or CandidateOptions()
    g = nx.DiGraph(kind="candidates", now_s=now_s, options=options_dict(opt))
    caps = cluster.capacity_by_type()
    add_topology(g, cluster)
    # jobs of one shape (model, batch, request, what the filter reads) that are not running
    # get the same cells: estimated, filtered and pruned once per shape (a 10,000-job round
    # holds a few dozen shapes)
    shapes: dict[Hashable, tuple[int, str | None, list[tuple[str, int, int, Any]],
                                 list[tuple[str, int, int, Any]]]] = {}
    spills: dict[Hashable, tuple[list[tuple[str, int, int, Any]], Any]] = {}
    edge_memo: dict[tuple[str, int, int, bool], list[tuple[str, dict[str, Any]]]] = {}
    # a shape's reference throughput per requested type: the jobs sharing a shape share
    # the cells it is read from, so it is computed once, not from fresh cell objects each
    refs: dict[tuple[Hashable, str | None], tuple[float, str]] = {}
    for job in jobs:
        jn = job_node(job.id)
        g.add_node(jn, kind="job", job=job.id, requested_gpus=job.requested_gpus,
                   requested_gpu_type=job.requested_gpu_type,
                   reach_gpus=reach_gpus(job, opt.scales),
                   queue_bonus=queue_bonus(job, now_s, opt),
                   running=list(job.running.cell_key) if job.running else None,
                   reason=None, ref_throughput=None, ref_basis=None)
        key = shape_key(job, est, accept)
        got = shapes.get(key) if key is not None else None
        ref: tuple[float, str] | None = None
        found_n: int | None = None  # the cells before pruning, where only their count is read
        if got is None:
            cells, tried, refused = _estimate_cells(job, cluster, caps, est, opt, accept,
                                                    scale_up)
            pruned: list[tuple[Cell, Any]] | None = None
            if key is not None:
                pruned = prune_dominated(job, cells, cluster)
                shapes[key] = (tried, refused, [(*c.key, e) for c, e in cells],
                               [(*c.key, e) for c, e in pruned])
        else:
            tried, refused, found, kept = got
            # the pruned cells stand for the found ones (empty exactly when they are: pruning
            # keeps every undominated cell); the found ones give only their count and ref
            pruned = [(Cell(job.id, t, n, st), e) for t, n, st, e in kept]
            cells, found_n = pruned, len(found)
            if found:
                rkey = (key, job.requested_gpu_type)
                ref = refs.get(rkey)
                if ref is None:
                    ref = refs[rkey] = reference_throughput(
                        opt.normalize, job.requested_gpus, job.requested_gpu_type,
                        [(t, n, e.throughput) for t, n, _, e in found])
        attrs = g.nodes[jn]
        if tried:
            attrs["cells_tried"] = tried
        if refused is not None:
            attrs["refused_plan"] = refused
        if job.running is not None:
            cur = _current_cell(job, cluster, est)
            if cur is not None:
                cells = [(c, e) for c, e in cells if c.key != cur[0].key] + [cur]
        if (not cells and g.nodes[jn].get("cells_tried")
                and "refused_plan" not in g.nodes[jn]):  # fits no GPU: Hydra's spilling
            spilled = spills.get(key) if key is not None else None
            if spilled is None:
                found = spilled_candidates(g, jn, job, cluster, est)
                spilled = ([(*c.key, e) for c, e in found], g.nodes[jn].get("reason_detail"))
                if key is not None:
                    spills[key] = spilled
            elif spilled[1] is not None:
                g.nodes[jn]["reason_detail"] = spilled[1]
            cells = [(Cell(job.id, t, n, st), e) for t, n, st, e in spilled[0]
                     if accept is None or accept(job, e.plan) is None]
            pruned, ref, found_n = None, None, None
        _attach(g, job, cells, caps, cluster, opt, est, pruned, edge_memo, ref, found_n)
    if objective:
        apply_objective(g, jobs, now_s, opt.objective_options(), seen)
    return g


def shape_key(job: JobSpec, est: Any, accept: Callable[[JobSpec, Any], str | None] | None
              ) -> Hashable | None:
    """What a job's cells depend on, where jobs of one key get the same cells (None: this
    job's are its own). Only a job that is not running, under an estimator that says what
    its estimates read of a job (``shape_of``) and a plan filter that says what it reads
    (``job_key``; none at all without a filter): a researcher's estimator or filter that
    says nothing is asked job by job, as before."""
    if job.running is not None:
        return None
    shape_of = getattr(est, "shape_of", None)
    est_key = shape_of(job) if callable(shape_of) else None
    if est_key is None:
        return None
    size = (job.requested_gpus, job.max_gpus, job.elastic)  # what its counts read
    if accept is None:
        return (est_key, size)
    job_key = getattr(accept, "job_key", None)
    filter_key = job_key(job) if callable(job_key) else None
    return None if filter_key is None else (est_key, size, filter_key)


def _estimate_cells(job: JobSpec, cluster: Cluster, caps: dict[str, int], est: Any,
                    opt: CandidateOptions, accept: Callable[[JobSpec, Any], str | None] | None,
                    scale_up: bool = True) -> tuple[list[tuple[Cell, Any]], int, str | None]:
    """Every cell of ``job`` the estimator says fits and the filter accepts, how many were
    tried and the first filter's refusal. The counts per type: the request's scales and,
    with ``counts="elastic"``, the job's elastic ladder above them while it gains
    (:mod:`apportion.formulations.counts`): a scale-up count is estimated only while the
    one below it gained, so a job whose curve is flat costs one estimate more than before.
    Without ``scale_up`` the ladder is left out where the job has a cell of at most its
    request (:func:`build_candidates`)."""
    spec = catalog_model(job.model)
    layers = len(spec.layers) if spec is not None else 1
    cells: list[tuple[Cell, Any]] = []
    tried, refused = 0, None

    def size(gpu_type: str, gpus: int, found: dict[int, list[tuple[Cell, Any]]],
             depths: list[int] | None = None) -> float:
        """Estimate every stage count of one size (``depths`` where given and dividing it)
        into ``found``; its fastest accepted cell's speed."""
        nonlocal tried, refused
        best, got = 0.0, []
        every = _stage_counts(gpus, opt.max_stages, layers, opt.stage_counts)
        for stages in [d for d in depths or () if d in every] or every:
            tried += 1
            cell = Cell(job.id, gpu_type, gpus, stages)
            e = best_in_cell(est, job, cell, cluster)  # at its best batch, where it has one
            if e is None or not fits_device(cluster, gpu_type, e, job):
                continue
            why = accept(job, e.plan) if accept is not None else None
            if why is None:
                got.append((cell, e))
                best = max(best, float(e.throughput))
            elif refused is None:
                refused = why
        found[gpus] = got
        return best

    # per type: its base counts' cells, then its scale-up's (the order cells are added in)
    per_type: list[tuple[str, list[int], list[int], float, dict[int, list[Any]]]] = []
    for gpu_type, cap in sorted(caps.items()):
        if opt.counts == "scales":
            base, ups = base_counts(job.requested_gpus, opt.scales, cap), []
        else:
            base, ups = ladder(job, opt.scales, cap)
        found: dict[int, list[tuple[Cell, Any]]] = {}
        fastest = max((size(gpu_type, g, found) for g in base), default=0.0)
        per_type.append((gpu_type, base, ups, fastest, found))
    # a round the trim trims offers no scale-up to a job with a cell of at most its request
    grown = scale_up or not any(c.gpus <= job.requested_gpus for *_, found in per_type
                                for got in found.values() for c, _ in got)
    for gpu_type, base, ups, fastest, found in per_type:
        kept: list[int] = []
        if ups and grown:
            # a scale-up keeps the pipeline depth of the job's fastest cell at its largest
            # base count and grows its data parallelism: one estimate a size, not one per
            # stage count (a replay's rates are the same at every depth; the depths left out
            # were pruned there)
            top = [(float(e.throughput), -c.stages, c.stages) for c, e in found[max(base)]] \
                if base else []
            depth = [max(top)[2]] if top else None
            kept = grow(ups, fastest, lambda g, t=gpu_type, f=found, d=depth: size(t, g, f, d),
                        opt.min_gain)
        cells += [c for g in base + kept for c in found[g]]
    return cells, tried, refused


def trim_scale_up(g: nx.DiGraph) -> int:
    """Drop every cell with more GPUs than its job requested, but a running job's present
    cell, when the graph's jobs ask for more GPUs than its nodes have; the count dropped.
    A job only larger cells can hold keeps its cells within its reach (``reach_gpus``, the
    request's ``2N``) and, on a type where only its elastic scale-up holds it, the cells of
    the fewest GPUs that do: as many columns as before elasticity, and a job whose memory
    needs more than ``2N`` GPUs of a type can still run there.

    A step after the candidates are built (not inside the builder): the incremental cache
    keeps each job's fragment whole, since the same job's scale-up cells are back in a round
    with room. The objective's weights stay as the builder set them (a job's soonest finish
    counts its fastest cell, offered or not): only columns go.
    """
    offered = {j: cells for j in jobs_in(g) if (cells := cells_of(g, j))}
    want = {j: int(g.nodes[job_node(j)]["requested_gpus"]) for j in offered}
    if not asks_beyond_capacity(g):
        return 0
    drop = []
    for j, cells in offered.items():
        up = [c for c in cells
              if int(g.nodes[c]["gpus"]) > want[j] and not g.nodes[c].get("current")]
        if len(up) < len(cells):
            drop += up
            continue
        # a job only larger cells can hold: its reach, or per type the fewest GPUs beyond
        reach = g.nodes[job_node(j)].get("reach_gpus") or want[j]
        fewest: dict[str, int] = {}
        for c in cells:
            d = g.nodes[c]
            fewest[d["gpu_type"]] = min(fewest.get(d["gpu_type"], 1 << 30), int(d["gpus"]))
        drop += [c for c in up if int(g.nodes[c]["gpus"]) > max(
            reach, fewest[g.nodes[c]["gpu_type"]])]
    g.remove_nodes_from(drop)
    g.graph["scale_up_trimmed"] = len(drop)
    return len(drop)


def asks_beyond_capacity(g: nx.DiGraph) -> bool:
    """Whether the graph's jobs that have cells ask for more GPUs than its nodes have (the
    round :func:`trim_scale_up` trims)."""
    want = sum(int(g.nodes[job_node(j)]["requested_gpus"]) for j in jobs_in(g)
               if next(iter(g.successors(job_node(j))), None) is not None)
    return want > sum(int(g.nodes[n]["capacity"]) for n in node_vertices(g))


def requests_beyond(cluster: Cluster, jobs: list[JobSpec]) -> bool:
    """Whether ``jobs`` ask for more GPUs than ``cluster`` has, before any is estimated: a
    round :func:`trim_scale_up` will trim unless jobs without any cell bring it back
    within (then :func:`asks_beyond_capacity` on the built graph says so)."""
    return sum(j.requested_gpus for j in jobs) > cluster.total_gpus


def _current_cell(job: JobSpec, cluster: Cluster, est: AnalyticEstimator) -> tuple[Cell, Any] | None:
    r = job.running
    assert r is not None
    cell = Cell(job.id, r.gpu_type, r.gpus, r.stages)
    e = best_in_cell(est, job, cell, cluster)
    if e is None or not fits_device(cluster, cell.gpu_type, e, job):
        return None
    return cell, e


def _has_data(est: Any, job: JobSpec) -> bool:
    """Whether the estimator can say anything of ``job`` (a table of measured times knows
    only the models it measured; a model-based estimator knows every catalog model)."""
    has = getattr(est, "has_data", None)
    return bool(has(job)) if callable(has) else True


def _attach(g: nx.DiGraph, job: JobSpec, cells: list[tuple[Cell, Any]], caps: dict[str, int],
            cluster: Cluster, opt: CandidateOptions, est: Any = None,
            pruned: list[tuple[Cell, Any]] | None = None,
            edge_memo: dict[tuple[str, int, int, bool], list[tuple[str, dict[str, Any]]]]
            | None = None, ref: tuple[float, str] | None = None,
            found_n: int | None = None) -> None:
    """``ref``: the job's reference throughput and basis when the caller has them (a shared
    shape's); ``found_n``: how many cells were found before ``pruned`` (then ``cells`` may
    be ``pruned`` itself)."""
    jn = job_node(job.id)
    if not cells:
        if job.requested_gpu_type and job.requested_gpu_type not in caps:
            g.nodes[jn]["reason"] = Reason.NO_GPU_TYPE.value
        elif g.nodes[jn].get("refused_plan"):  # cells fit, their workload runs none
            g.nodes[jn]["reason"] = Reason.NO_PLAN.value
            g.nodes[jn]["reason_detail"] = g.nodes[jn]["refused_plan"]
        elif not g.nodes[jn].get("cells_tried"):  # nothing of any type is big enough now
            g.nodes[jn]["reason"] = Reason.NO_CAPACITY.value
        elif not _has_data(est, job):  # measured times only, and none for this job
            g.nodes[jn]["reason"] = Reason.NO_ESTIMATE.value
            g.nodes[jn]["reason_detail"] = (f"no measured iteration time for {job.model} at "
                                            f"batch {job.global_batch_size} in the tables")
        elif catalog_model(job.model) is None:  # rated only, and rated 0 everywhere
            g.nodes[jn]["reason"] = Reason.NO_ESTIMATE.value
            g.nodes[jn]["reason_detail"] = (f"no rate for it on any GPU type ({job.model!r} "
                                            "has no layer graph, so its memory is unknown)")
        else:
            g.nodes[jn]["reason"] = Reason.NO_FIT_MEMORY.value
        g.nodes[jn]["ref_throughput"] = 0.0
        return
    if ref is None:
        ref = reference_throughput(opt.normalize, job.requested_gpus, job.requested_gpu_type,
                                   [(c.gpu_type, c.gpus, e.throughput) for c, e in cells])
    _attach_cells(g, job, cells, cluster, opt, ref[0], ref[1], pruned, edge_memo, found_n)


def _attach_cells(g: nx.DiGraph, job: JobSpec, cells: list[tuple[Cell, Any]], cluster: Cluster,
                  opt: CandidateOptions, ref: float, basis: str,
                  pruned: list[tuple[Cell, Any]] | None = None,
                  edge_memo: dict[tuple[str, int, int, bool], list[tuple[str, dict[str, Any]]]]
                  | None = None, found_n: int | None = None) -> None:
    """``pruned``: ``cells`` less the dominated ones, when the caller has them already;
    ``edge_memo``: the group edges of a cell shape, shared over one build's jobs;
    ``found_n``: how many cells there were before pruning (default ``len(cells)``)."""
    jn = job_node(job.id)
    g.nodes[jn]["ref_throughput"] = ref
    g.nodes[jn]["ref_basis"] = basis
    bonus = g.nodes[jn]["queue_bonus"]
    before = len(cells) if found_n is None else found_n
    cells = prune_dominated(job, cells, cluster) if pruned is None else pruned
    g.nodes[jn]["pruned_cells"] = before - len(cells)
    # the job's vertices and edges in one call each (networkx clears its caches per call),
    # in the order one call per vertex and edge would add them
    vertices: list[tuple[str, dict[str, Any]]] = []
    edges: list[tuple[str, str, dict[str, Any]]] = []
    for cell, e in cells:
        current = job.is_current(cell)
        cn = cell.node_id
        plan = e.plan
        throughput = e.throughput
        norm = throughput / ref
        single = not current and cell.gpus <= cluster.max_gpus_per_node(cell.gpu_type)
        attrs = {"kind": "cell", "job": job.id, "gpu_type": cell.gpu_type, "gpus": cell.gpus,
                 "stages": cell.stages, "dp": plan.dp, "tp": plan.tp,
                 "micro_batches": plan.micro_batches, "est_throughput": throughput,
                 "iter_time_s": e.iter_time_s, "mem_per_gpu": e.mem_per_gpu,
                 "normalized": norm, "bonus": bonus,
                 "value": norm + bonus + (opt.keep_bonus if current else 0.0),
                 "current": current}
        if plan.spilled or plan.zero_stage or plan.offload or plan.accumulation > 1 \
                or plan.checkpointing:
            # the whole plan where it says more than the cell's split (a spilled plan,
            # formulations/spilled.py; an estimator's accumulation, ZeRO, offload or
            # recomputation, which the plan's memory depends on): the decoder reads it
            attrs["plan"] = plan
        attrs["single_node"] = single
        if e.batch is not None:  # the global batch chosen for the cell (batch_options)
            attrs["global_batch_size"] = e.batch
        vertices.append((cn, attrs))
        edges.append((jn, cn, {}))
        pinned = job.running.placement if (current and job.running) else None
        if pinned or edge_memo is None:
            edges += cell_edges(g, cn, cluster, cell.gpu_type, cell.gpus, plan.tp, single,
                                pinned)
        else:  # the shape's memoised edges, each attribute dict a copy (they are shared)
            edges += [(cn, v, dict(a)) for v, a in group_edges(g, cluster, cell.gpu_type,
                                                               cell.gpus, plan.tp, single,
                                                               edge_memo)]
    add_new_vertices(g, vertices)
    add_new_edges(g, edges)


def add_topology(g: nx.DiGraph, cluster: Cluster) -> None:
    """Node and node-group vertices (a group lists the nodes it really has: some may be
    down), from their attributes made once per cluster (memoised on it: a Cluster is
    treated as immutable once built) and copied into each graph (a replay builds one a
    round)."""
    memo = cluster.__dict__.get("_topology_vertices")
    if memo is None:
        members: dict[str, list[str]] = {}
        capacity: dict[str, int] = {}
        memo = []
        for n in cluster.nodes.values():
            nn = node_node(n.name)
            memo.append((nn, dict(kind="node", gpu_type=n.gpu_type, capacity=n.gpus,
                                  cpus=n.cpus, host_memory_gib=n.host_memory_gib,
                                  group=group_node(n.group))))
            members.setdefault(n.group, []).append(nn)
            capacity[n.group] = capacity.get(n.group, 0) + int(n.gpus)
        memo += [(group_node(grp.prefix),
                  dict(kind="group", gpu_type=grp.gpu_type, node_gpus=grp.gpus_per_node,
                       nodes=members.get(grp.prefix, []),
                       capacity=capacity.get(grp.prefix, 0)))
                 for grp in cluster.groups]
        cluster.__dict__["_topology_vertices"] = memo
    add_new_vertices(g, [(v, {**a, "nodes": list(a["nodes"])} if "nodes" in a else dict(a))
                         for v, a in memo])
    g.graph["gpu_memory"] = gpu_memory_limits(cluster)


def gpu_memory_limits(cluster: Cluster) -> dict[str, Any]:
    """What a job may use on each GPU, per type and per node, as the validator checks it
    (:mod:`apportion.plan_memory`): the node group's ``gpu_memory_gib`` where it says, else
    the catalog's memory; for the problem dump (memoised on the cluster)."""
    memo = cluster.__dict__.get("_gpu_memory_limits")
    if memo is None:
        types = {t: {"memory_gib": type_memory_bytes(cluster, t) / 2**30,
                     "from": "catalog" if cluster.gpu_memory_bytes(t) is None else "node group"}
                 for t in cluster.gpu_types}
        nodes = {n: device_memory_bytes(cluster, n) / 2**30 for n in cluster.nodes}
        memo = cluster.__dict__["_gpu_memory_limits"] = {"types": types, "nodes": nodes}
    return memo


def attach_cell_edges(g: nx.DiGraph, cn: str, cluster: Cluster, gpu_type: str, gpus: int, tp: int,
                      single: bool, pinned: dict[str, int] | None) -> None:
    """Cell -> group edges (or cell -> node edges for a running job's present placement)."""
    g.add_edges_from(cell_edges(g, cn, cluster, gpu_type, gpus, tp, single, pinned))


def cell_edges(g: nx.DiGraph, cn: str, cluster: Cluster, gpu_type: str, gpus: int, tp: int,
               single: bool, pinned: dict[str, int] | None
               ) -> list[tuple[str, str, dict[str, Any]]]:
    """The edges :func:`attach_cell_edges` adds, in its order, each with its own attribute
    dict (a build shares a shape's group edges through :func:`group_edges`)."""
    out: list[tuple[str, str, dict[str, Any]]] = []
    if pinned:
        for name, k in pinned.items():  # keep means: exactly where it runs
            if name in cluster.nodes and cluster.nodes[name].gpu_type == gpu_type:
                cap = min(k, cluster.nodes[name].gpus, gpus)
                if cap - cap % tp > 0:
                    out.append((cn, node_node(name), {"max_gpus": cap - cap % tp}))
        return out
    unit = gpus if single else tp
    for grp in cluster.groups:
        gv = group_node(grp.prefix)
        if grp.gpu_type != gpu_type or grp.gpus_per_node < unit:
            continue
        members = g.nodes[gv]["nodes"]
        if not members:
            continue
        per_node = grp.gpus_per_node - grp.gpus_per_node % tp
        cap = min(len(members) * per_node, gpus)
        if cap - cap % tp > 0:
            out.append((cn, gv, {"max_gpus": cap - cap % tp}))
    return out


def group_edges(g: nx.DiGraph, cluster: Cluster, gpu_type: str, gpus: int, tp: int,
                single: bool,
                memo: dict[tuple[str, int, int, bool], list[tuple[str, dict[str, Any]]]]
                ) -> list[tuple[str, dict[str, Any]]]:
    """A cell's group edges as (group vertex, attributes), which depend on its shape alone:
    one build computes them once a shape in ``memo``. The attribute dicts are shared: a
    caller adding them to a graph copies each (networkx would keep the dict itself)."""
    key = (gpu_type, gpus, tp, single)
    found = memo.get(key)
    if found is None:
        found = memo[key] = [(v, a) for _, v, a in cell_edges(g, "", cluster, gpu_type, gpus,
                                                               tp, single, None)]
    return found


def prune_dominated(job: JobSpec, cells: list[tuple[Cell, Any]], cluster: Cluster
                    ) -> list[tuple[Cell, Any]]:
    """Drop cells another cell of the job beats on every count, keeping the optimum exact.

    Cell a dominates b when both have the same GPU type and count, a is at
    least as fast, and a's placement unit divides b's (so every placement of b
    is one of a): then no optimal answer needs b. A running job's present
    cell is never dropped. Typically removes two thirds of the cells (the
    slower stage counts of each size).
    """
    def unit(c: Cell, e: Any) -> int:
        single = c.gpus <= cluster.max_gpus_per_node(c.gpu_type)
        return c.gpus if single else int(e.plan.tp)

    # each cell's facts once: a job has a few dozen cells, compared pairwise within a size
    rows = [(c, e, job.is_current(c), unit(c, e), e.throughput) for c, e in cells]
    by_size: dict[tuple[str, int], list[tuple[Cell, int, float]]] = {}
    for c, _, current, u, tput in rows:
        if not current:
            by_size.setdefault((c.gpu_type, c.gpus), []).append((c, u, tput))
    keep: list[tuple[Cell, Any]] = []
    for c, e, current, u, tput in rows:
        if not current and any(
                o is not c and u % ou == 0
                and (ot > tput or (ot == tput and (o.stages, ou) < (c.stages, u)))
                for o, ou, ot in by_size[(c.gpu_type, c.gpus)]):
            continue
        keep.append((c, e))
    return keep


def problem_dump(g: nx.DiGraph) -> dict[str, Any]:
    """Everything needed to re-solve the round independently, as plain JSON."""
    jobs_out = []
    for jid in jobs_in(g):
        jd = g.nodes[job_node(jid)]
        cands = []
        for cn in cells_of(g, jid):
            c = g.nodes[cn]
            plan = c.get("plan")
            cands.append({
                "gpu_type": c["gpu_type"], "gpus": c["gpus"], "stages": c["stages"],
                # the whole plan where the formulation chose one (ZeRO, offload, accumulation,
                # recomputation: the plans formulation), else the cell's split
                "plan": plan.as_dict() if plan is not None else
                {"dp": c["dp"], "tp": c["tp"], "pp": c["stages"],
                 "micro_batches": c["micro_batches"]},
                # the host resources its rows count (the plans formulation's CPU and memory
                # rows; 0 where the formulation has none) and the quota it draws on
                "cpus_per_gpu": float(c.get("cpus_per_gpu", 0.0)),
                "host_mem_gib_per_gpu": float(c.get("host_mem_gib_per_gpu", 0.0)),
                "quota_tenant": c.get("quota_tenant"),
                "est_throughput": c["est_throughput"], "iter_time_s": c["iter_time_s"],
                "mem_per_gpu_gib": c["mem_per_gpu"] / 2**30, "normalized": c["normalized"],
                "value": c["value"], "current": c["current"],
                "groups": {name_of(n): g.edges[cn, n]["max_gpus"]
                           for n in g.successors(cn) if kind_of(g, n) == "group"},
                "nodes": {name_of(n): g.edges[cn, n]["max_gpus"] for n in pinned_nodes(g, cn)},
            })
        jobs_out.append({
            "job": jid, "requested_gpus": jd["requested_gpus"],
            "requested_gpu_type": jd["requested_gpu_type"],
            "normalization": {"ref_throughput": jd["ref_throughput"], "basis": jd["ref_basis"]},
            "queue_bonus": jd["queue_bonus"], "running": jd["running"], "reason": jd["reason"],
            "candidates": cands,
        })
    memory = g.graph.get("gpu_memory") or {"types": {}, "nodes": {}}
    nodes = [{"name": name_of(n), "gpu_type": d["gpu_type"], "capacity": d["capacity"],
              "group": name_of(d["group"]), "cpus": d.get("cpus"),
              "host_memory_gib": d.get("host_memory_gib"),
              "gpu_memory_gib": memory["nodes"].get(name_of(n))}
             for n in node_vertices(g) for d in (g.nodes[n],)]
    groups = [{"name": name_of(n), "gpu_type": d["gpu_type"], "gpus_per_node": d["node_gpus"],
               "nodes": [name_of(m) for m in d["nodes"]]}
              for n in group_vertices(g) for d in (g.nodes[n],)]
    return {"now_s": g.graph.get("now_s"), "objective_weights": g.graph.get("options"),
            "nodes": nodes, "groups": groups, "jobs": jobs_out,
            # each GPU type's memory limit the round kept (a candidate's mem_per_gpu_gib is
            # within it, and the validator checks each plan against it)
            "gpu_types": dict(memory["types"]),
            "quotas": dict(g.graph.get("quotas") or {}),
            "formulation": g.graph.get("formulation", "cells")}
