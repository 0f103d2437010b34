"""A partitioned round, POP-style (Narayanan et al., SOSP'21): k sub-problems solved in
parallel, on this machine or on a Ray cluster, recombined, repaired, and judged
against the whole round's LP relaxation.

POP splits a granular allocation problem into k smaller copies, each with 1/k
of the jobs and 1/k of the resources, solves them independently and
concatenates the answers; it gets within a few percent of the exact answer
orders of magnitude faster on large rounds. Here, on the cell formulation's
candidate graph:

1. **split the resources**: per node group, nodes go to the part with the
   least of that group's GPUs so far (nodes holding one running job's present
   placement move together: a running job keeps exactly where it runs), so each
   part holds about 1/k of every GPU type and node shape;
2. **split the jobs**: a running job goes with its nodes; the rest, largest
   request first, to the part with the least requested GPUs so far (ties by
   part index): balanced load, deterministic;
   Tenants' quotas (the ``quota_tenant`` rows) span parts, so each is **split**:
   a part gets the minimum demands of its guaranteed jobs of that tenant, and what
   the quota has beyond them goes to the parts in proportion (:func:`split_quotas`);
   the shares sum to at most the quota, so the union of the parts' answers keeps it;
3. **solve** each part's sub-graph — the candidate graph restricted to the
   part's nodes and jobs, built into a model by the formulation's own builder
   (passed in, never imported here) — with the solver chain, in parallel: a
   child process each (``engine="local"``) or a Ray task each
   (``engine="ray"``), everything killed or cancelled at the deadline;
4. **recombine** (parts hold disjoint nodes, so the union of their answers
   respects every node's capacity) and **repair**: jobs a part left out are
   placed, best cell first, where the others left capacity over (the greedy's
   ledger and packing rule);
5. **bound**: meanwhile the whole round's LP relaxation (LP rounding on the
   full model) runs as one more task; its optimum bounds the round, so the gap
   POP reports is against the whole problem, never against its parts (its own
   rounded point is recorded, not offered as POP's answer).

**Deterministic** (``work_s``, ``solve-round --deterministic --partitions K``): each part's
chain gets a fixed share of the work budget, ``work_s / parts`` (so the parts together
spend what the whole round would: each holds about 1/K of it), the whole round's LP the
whole ``work_s`` (its relaxation runs to its optimum in any case), and the answers are
combined part by part in the parts' own order (never in the order they finished) and
repaired in a fixed order; so the same round gives the same answer on any engine, any
number of cores and under any load. The clock (the caller's ``budget_s``) is then only a
safety stop: a part it cut short makes the answer ``time_limited``, which the report says.

POP's answer is its choices with their real placements (``extra["choices"]``),
judged by the independent validator like any backend's answer.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import Any

import networkx as nx
import numpy as np
from apportion.formulations.cells import CellChoice, hint_from_choices
from apportion.formulations.model import LinearModel
from apportion.formulations.schema import (
    cells_of,
    current_cells,
    group_vertices,
    is_current,
    job_node,
    jobs_in,
    name_of,
    node_node,
    node_vertices,
    pinned_nodes,
)
from apportion.solvers.base import SolveResult, Status
from apportion.solvers.greedy import Ledger
from apportion.solvers.ray_engine import EngineUnavailable, RayEngine, RayProcessEngine

log = logging.getLogger(__name__)

ENGINES = ("local", "ray")
PART_BACKENDS = ("lp-round", "highs")


@dataclass
class Part:
    """One sub-problem: its node vertices and job ids."""

    nodes: list[str] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)
    gpus: int = 0
    load: int = 0


@dataclass
class PartAnswer:
    """What a part's worker returns: choices by node name, and its solver report."""

    choices: list[CellChoice]
    status: str
    objective: float | None
    bound: float | None
    wall_s: float
    variables: int
    message: str = ""
    work_s: float | None = None  # a deterministic budget's work spent (nominal seconds)
    time_limited: bool = False  # the clock (a deterministic budget's safety stop) cut it short


# ---------------------------------------------------------------------------------------
# 1-2: splitting the round
# ---------------------------------------------------------------------------------------
def _pinned_components(g: nx.DiGraph) -> list[list[str]]:
    """Node vertices that must stay together: those holding one running job's placement."""
    parent: dict[str, str] = {}

    def find(a: str) -> str:
        while parent.setdefault(a, a) != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for n in node_vertices(g):
        find(n)
    for cn in current_cells(g):
        for a, b in pairwise(pinned_nodes(g, cn)):
            parent[find(a)] = find(b)
    comps: dict[str, list[str]] = {}
    for n in parent:
        comps.setdefault(find(n), []).append(n)
    return sorted((sorted(c) for c in comps.values()), key=lambda c: c[0])


def partition_round(g: nx.DiGraph, k: int) -> list[Part]:
    """Split the candidate graph's nodes and jobs into ``k`` balanced parts (see above)."""
    from apportion.formulations.cells import natural_key

    parts = [Part() for _ in range(max(1, k))]
    node_part: dict[str, int] = {}
    per_group: dict[str, list[int]] = {}
    comps = _pinned_components(g)
    # the biggest components first, each to the part with the fewest GPUs of its group
    comps.sort(key=lambda c: (-sum(int(g.nodes[n]["capacity"]) for n in c), natural_key(c[0])))
    for comp in comps:
        grp = str(g.nodes[comp[0]].get("group"))
        have = per_group.setdefault(grp, [0] * len(parts))
        i = min(range(len(parts)), key=lambda p: (have[p], parts[p].gpus, p))
        cap = sum(int(g.nodes[n]["capacity"]) for n in comp)
        have[i] += cap
        parts[i].gpus += cap
        parts[i].nodes.extend(comp)
        for n in comp:
            node_part[n] = i
    queued: list[tuple[int, str]] = []
    for jid in jobs_in(g):
        cur = [c for c in cells_of(g, jid) if is_current(g, c)]
        held = [s for c in cur for s in pinned_nodes(g, c)]
        if held:
            i = node_part[held[0]]
            parts[i].jobs.append(jid)
            parts[i].load += int(g.nodes[job_node(jid)].get("requested_gpus") or 0)
        else:
            queued.append((int(g.nodes[job_node(jid)].get("requested_gpus") or 0), jid))
    for req, jid in sorted(queued, key=lambda t: (-t[0], natural_key(t[1]))):
        i = min(range(len(parts)), key=lambda p: (parts[p].load / max(1, parts[p].gpus), p))
        parts[i].jobs.append(jid)
        parts[i].load += req
    for p in parts:
        p.nodes.sort(key=natural_key)
    return parts


def split_quotas(g: nx.DiGraph, parts: list[Part]) -> list[dict[str, int]]:
    """Each part's share of every tenant's quota (the graph's ``quotas``), summing to at
    most the quota: the parts are solved apart, and their answers together must keep it.

    A part's need is the minimum demand of each of its guaranteed jobs of the tenant (the
    job's ``min_demand``, else its smallest quota cell); a part gets its need and the
    quota's slack beyond all needs in proportion to it (the remainder to the largest needs
    first, then by part index). Needs beyond the quota (a graph edited by hand) are scaled
    down to it, rounding down."""
    quotas: dict[str, int] = dict(g.graph.get("quotas") or {})
    shares: list[dict[str, int]] = [{} for _ in parts]
    if not quotas:
        return shares
    need: dict[str, list[int]] = {t: [0] * len(parts) for t in quotas}
    for i, p in enumerate(parts):
        for jid in p.jobs:
            sizes = [(int(g.nodes[c]["gpus"]), g.nodes[c]["quota_tenant"])
                     for c in cells_of(g, jid) if g.nodes[c].get("quota_tenant") in quotas]
            if sizes:
                t = sizes[0][1]
                need[t][i] += int(g.nodes[job_node(jid)].get("min_demand")
                                  or min(n for n, _ in sizes))
    for t, quota in sorted(quotas.items()):
        wants, total = need[t], sum(need[t])
        if not total:  # no guaranteed job of the tenant in any part: nothing to bind
            got = [0] * len(parts)
        elif total > quota:  # more than the quota: each part its proportion, rounded down
            got = [quota * w // total for w in wants]
        else:  # each its need, and the slack in proportion (the rest: one each, largest first)
            got = [w + (quota - total) * w // total for w in wants]
            for i in sorted(range(len(parts)), key=lambda i: (-wants[i], i))[:quota - sum(got)]:
                got[i] += 1
        for i, n in enumerate(got):
            shares[i][t] = n
    return shares


def subgraph(g: nx.DiGraph, part: Part, quotas: dict[str, int] | None = None) -> nx.DiGraph:
    """The candidate graph restricted to a part: its nodes, its groups' share, its jobs,
    and ``quotas`` (its share of the tenants' quotas: :func:`split_quotas`) for the
    graph's."""
    nodes = set(part.nodes)
    keep = {k: v for k, v in g.graph.items() if k not in ("specs", "estimator")}
    if quotas is not None:
        keep["quotas"] = dict(quotas)
    sg = nx.DiGraph(**keep)
    for n in part.nodes:
        sg.add_node(n, **g.nodes[n])
    for gv in group_vertices(g):
        d = g.nodes[gv]
        members = [n for n in d["nodes"] if n in nodes]
        if members:
            sg.add_node(gv, **{**d, "nodes": members,
                               "capacity": sum(int(g.nodes[n]["capacity"]) for n in members)})
    for jid in part.jobs:
        jn = job_node(jid)
        sg.add_node(jn, **g.nodes[jn])
        for cn in g.successors(jn):
            sg.add_node(cn, **g.nodes[cn])
            sg.add_edge(jn, cn)
            sg.add_edges_from((cn, s, a) for s, a in g.adj[cn].items() if s in sg)
    return sg


# ---------------------------------------------------------------------------------------
# 3: a part's worker (a child process or a Ray task)
# ---------------------------------------------------------------------------------------
def solve_part(sg: nx.DiGraph, build: Callable[[nx.DiGraph], LinearModel], backends: list[str],
               budget_s: float, gap: float, work_s: float | None = None) -> PartAnswer:
    """Build the part's model and solve it with the chain, in this process; ``work_s``: a
    deterministic budget (the clock, ``budget_s``, is then a safety stop)."""
    from apportion.solvers.chain import backends_for, solve_chain

    t0 = time.perf_counter()
    m = build(sg)
    left = max(0.05, budget_s - (time.perf_counter() - t0))
    chain = [b for b in backends_for("auto", False, m.num_vars) if b.name in backends]
    best, attempts = solve_chain(m, chain, left, gap=gap, work_s=work_s)
    wall = time.perf_counter() - t0
    msg = "; ".join(f"{a.backend}: {a.status.value}" for a in attempts)
    work = None if work_s is None else sum(float(a.extra.get("work_s") or 0.0) for a in attempts)
    limited = any(bool(a.extra.get("time_limited")) for a in attempts)
    if best is None or best.x is None or m.decode is None:
        return PartAnswer([], Status.ERROR.value, None, None, wall, m.num_vars, msg, work,
                          limited)
    bounds = [a.bound for a in attempts if a.bound is not None and a.x is not None]
    return PartAnswer(m.decode(best.x), best.status.value, best.objective,
                      min(bounds) if bounds else best.bound, wall, m.num_vars, msg, work,
                      limited)


def lp_bound(model: LinearModel, budget_s: float, work_s: float | None = None) -> SolveResult:
    """The whole round's LP relaxation, rounded (its bound is the honest one); ``work_s``:
    a deterministic budget for the rounding's restricted MIP (the relaxation runs to its
    optimum whatever the budget)."""
    from apportion.solvers.lpround import LpRoundBackend

    be = LpRoundBackend()
    be.work_s = work_s
    return be.solve(model, budget_s)


# ---------------------------------------------------------------------------------------
# engines: where the tasks run
# ---------------------------------------------------------------------------------------
class LocalEngine:
    """Tasks on a pool of child processes of this machine (one per core by default, each
    importing the solvers once); workers still busy at the deadline are killed."""

    name = "local"

    def __init__(self, workers: int | None = None) -> None:
        from apportion.solvers.isolation import WorkerPool

        self.pool = WorkerPool(workers or os.cpu_count() or 1,
                               warm=("highspy", "apportion.solvers.partition",
                                     "apportion.formulations.cells"))

    def start(self) -> LocalEngine:
        self.pool.start()
        return self

    def run(self, tasks: list[tuple[str, tuple[Any, ...]]], until: float
            ) -> list[tuple[bool, Any]]:
        return self.pool.run(tasks, until)

    def close(self) -> None:
        self.pool.close()


def make_engine(name: str, address: str | None = None,
                ready_timeout_s: float | None = None) -> LocalEngine | RayProcessEngine:
    """The engine ``name``; Ray's through a process of its own, so that its start and its
    answers keep the caller's budget (:mod:`apportion.solvers.ray_engine`)."""
    if name == "local":
        return LocalEngine().start()
    if name == "ray":
        return RayProcessEngine(address, ready_timeout_s=ready_timeout_s)
    raise ValueError(f"unknown engine {name!r}; choose {', '.join(ENGINES)}")


@contextmanager
def engine_session(name: str, address: str | None = None
                   ) -> Iterator[LocalEngine | RayProcessEngine]:
    eng = make_engine(name, address)
    try:
        yield eng
    finally:
        eng.close()


# ---------------------------------------------------------------------------------------
# 4-5: the whole partitioned solve
# ---------------------------------------------------------------------------------------
def repair(g: nx.DiGraph, choices: list[CellChoice], value_attr: str = "value"
           ) -> tuple[list[CellChoice], int]:
    """Place left-out jobs where capacity is left over, best cell first; (choices, placed)."""
    ledger = Ledger(g)
    out = list(choices)
    placed = {c.job for c in choices}
    for c in choices:
        ledger.take(c.cell, {node_node(n): k for n, k in c.placement.items()}, +1)
    left = [j for j in jobs_in(g) if j not in placed and cells_of(g, j)]
    left.sort(key=lambda j: (-max(float(g.nodes[c][value_attr]) for c in cells_of(g, j)), j))
    added = 0
    for jid in left:
        for cn in sorted(cells_of(g, jid), key=lambda c: -float(g.nodes[c][value_attr])):
            if float(g.nodes[cn][value_attr]) <= 0:
                break
            p = ledger.fit(cn)
            if p is not None:
                ledger.take(cn, p, +1)
                out.append(CellChoice(jid, cn, {name_of(n): k for n, k in p.items()}))
                added += 1
                break
    return out, added


def solve_partitioned(g: nx.DiGraph, model: LinearModel, k: int,
                      build: Callable[[nx.DiGraph], LinearModel], engine: Any,
                      budget_s: float, accept: Callable[[SolveResult], bool] | None = None,
                      gap: float = 1e-4, backends: tuple[str, ...] = PART_BACKENDS,
                      bound: bool = True, work_s: float | None = None
                      ) -> tuple[SolveResult | None, list[SolveResult]]:
    """POP-k on the round ``g`` (whose whole model is ``model``): (best accepted, attempts).

    The attempts are POP's recombined and repaired answer (backend ``pop-<k>``, its bound
    the whole round's LP optimum) and, with ``bound``, the whole round's rounded LP.
    ``build`` turns a sub-graph into its model (the formulation's builder, importable by
    reference so a worker can call it); ``engine`` is a :class:`LocalEngine` or
    :class:`RayProcessEngine`. ``work_s``: a deterministic budget (the module's
    docstring); ``budget_s`` is then the clock's safety stop.
    """
    start = time.perf_counter()
    deadline = start + budget_s
    parts = [p for p in partition_round(g, k) if p.jobs and p.nodes]
    reserve = 0.1 + 2e-5 * model.num_vars  # recombination, repair and the vector
    # the bound first (it is what makes the gap honest), then the parts, largest first
    left = max(0.05, deadline - reserve - time.perf_counter())
    part_work = None if work_s is None else work_s / max(1, len(parts))
    tasks: list[tuple[str, tuple[Any, ...]]] = []
    if bound:
        tasks.append((f"{lp_bound.__module__}:lp_bound",
                      (replace(model, decode=None, hint={}), left, work_s)))
    order = sorted(range(len(parts)), key=lambda i: -len(parts[i].jobs))
    shares = split_quotas(g, parts)
    tasks += [(f"{solve_part.__module__}:solve_part",
               (subgraph(g, parts[i], shares[i]), build, list(backends), left, gap, part_work))
              for i in order]
    results = engine.run(tasks, deadline - reserve)
    lp: SolveResult | None = None
    if bound:
        ok, val = results.pop(0)
        lp = val if ok else SolveResult("lp-round", Status.ERROR, message=f"whole-round LP: {val}")
        if not ok and work_s is not None:
            lp.extra["time_limited"] = True
    answers: list[PartAnswer | str] = [""] * len(parts)
    for i, (ok, val) in zip(order, results):
        answers[i] = val if ok else str(val)
    attempts: list[SolveResult] = []
    choices = [c for a in answers if isinstance(a, PartAnswer) for c in a.choices]
    choices, repaired = repair(g, choices)
    # the answer is its choices with their real placements (the validator judges them); the
    # vector is the whole model's columns for those choices (reporting and hints only: in
    # residual mode the whole model may not admit a placement a part freed and reused)
    x = np.zeros(model.num_vars)
    for col, v in hint_from_choices(model, choices).items():
        x[col] = v
    objective = float(sum(float(g.nodes[c.cell]["value"]) for c in choices))
    lp_bound_value = lp.bound if lp is not None and lp.x is not None else None
    ok_parts = sum(1 for a in answers if isinstance(a, PartAnswer) and a.status != "error")
    status = Status.FEASIBLE if ok_parts else Status.ERROR
    if lp_bound_value is not None and objective >= lp_bound_value - 1e-9 * max(1, abs(objective)):
        status = Status.OPTIMAL
    detail, extra = _parts_report(parts, answers, repaired, engine.name, choices, work_s)
    pop = SolveResult(f"pop-{k}", status, x if ok_parts else None, objective if ok_parts else None,
                      lp_bound_value, time.perf_counter() - start,
                      message=f"{engine.name} engine, {len(parts)} parts, {repaired} jobs placed "
                              f"by repair; bound: the whole round's LP; {detail}"
                              + ("" if part_work is None else
                                 f"; deterministic: {part_work:.3g} s of work a part"),
                      extra=extra)
    attempts.append(pop)
    if lp is not None:  # the bound's own record; its rounded point is not POP's answer
        if lp.x is not None:
            lp.message = (f"the whole round's LP relaxation (the bound); its rounded point "
                          f"{lp.objective:.6g} is not offered as an answer")
        lp.x, lp.objective = None, None
        attempts.append(lp)
    return _best_accepted(attempts, accept), attempts


__all__ = [
    "ENGINES",
    "EngineUnavailable",
    "LocalEngine",
    "Part",
    "PartAnswer",
    "RayEngine",
    "RayProcessEngine",
    "engine_session",
    "lp_bound",
    "make_engine",
    "partition_round",
    "repair",
    "solve_part",
    "solve_partitioned",
    "split_quotas",
    "subgraph",
]


def _parts_report(parts: list[Part], answers: list[PartAnswer | str], repaired: int,
                  engine_name: str, choices: list[CellChoice],
                  work_s: float | None) -> tuple[str, dict[str, Any]]:
    """Each part's outcome in words (for the attempt's message) and as the attempt's
    ``extra`` (parts, repaired jobs, engine, choices; with ``work_s`` the parts' work and
    whether the clock cut any part short)."""
    detail = "; ".join(
        f"part {i}: {len(p.jobs)} jobs, {p.gpus} GPUs, "
        + (f"{a.status} {a.objective:.6g} in {a.wall_s:.2f} s ({a.variables} variables)"
           if isinstance(a, PartAnswer) and a.objective is not None
           else (a.message if isinstance(a, PartAnswer) else a))
        for i, (p, a) in enumerate(zip(parts, answers)))
    extra: dict[str, Any] = {
        "parts": [{"jobs": len(p.jobs), "gpus": p.gpus,
                   **({"status": a.status, "objective": a.objective, "wall_s": a.wall_s,
                       "variables": a.variables}
                      | ({} if a.work_s is None else {"work_s": a.work_s})
                      if isinstance(a, PartAnswer) else {"error": a})}
                  for p, a in zip(parts, answers)],
        "repaired": repaired, "engine": engine_name, "choices": choices}
    if work_s is not None:  # the parts' work, and whether the clock cut any part short
        extra["work_s"] = sum(a.work_s or 0.0 for a in answers if isinstance(a, PartAnswer))
        extra["time_limited"] = any(not isinstance(a, PartAnswer) or a.time_limited
                                    for a in answers)
    return detail, extra


def _best_accepted(attempts: list[SolveResult],
                   accept: Callable[[SolveResult], bool] | None) -> SolveResult | None:
    """The best attempt with a solution the validator accepts; a rejected one is marked
    an error, saying so, so the report shows why it was not taken."""
    best: SolveResult | None = None
    for res in attempts:
        if res.x is None or not res.status.has_solution:
            continue
        if accept is not None and not accept(res):
            res.message += " (rejected by the validator)"
            res.status = Status.ERROR
            continue
        if best is None or (res.objective or 0.0) > (best.objective or 0.0) + 1e-9:
            best = res
    return best
