"""Greedy cell scheduling in the spirit of Crius's algorithm 1.

1. Visit running jobs first (keep them where they are if their current cell is
   still a candidate), then queued jobs by queue bonus (longest waiting first)
   and submit order; give each its best-valued cell at the requested N that fits
   the free capacity, else at N/2 (scale down), else leave it pending.
2. Local search with a search depth: up to ``search_depth`` times, apply the
   single best improving move among (a) moving or rescaling one placed job to
   another of its cells that fits the free capacity plus its own GPUs, and
   (b) placing a pending job after scaling one placed job down to a smaller cell
   (Crius: "selects jobs to downscale ... or moves them to another type").
Placement of a cell fills the nodes with the most free GPUs first, in whole
tensor-parallel groups, so TP groups never straddle nodes.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import networkx as nx

from apportion.formulations.schema import (cells_of, group_vertices, is_current, job_node, jobs_in,
                                           kind_of, member_nodes, name_of, node_vertices)
from apportion.placement import consolidate
from apportion.formulations.cells import CellChoice


def place(g: nx.DiGraph, cell: str, free: Mapping[str, int],
          group_free: Mapping[str, int] | None = None,
          cpu_free: Mapping[str, float] | None = None,
          mem_free: Mapping[str, float] | None = None) -> dict[str, int] | None:
    """Most-consolidated placement of ``cell`` into ``free`` GPUs per node vertex.

    ``group_free`` (free GPUs per group vertex) lets a hopeless cell be rejected
    without looking at its nodes, which keeps the greedy linear at cluster scale.
    """
    d = g.nodes[cell]
    need, tp = int(d["gpus"]), int(d["tp"])
    if d.get("single_node"):
        tp = need  # the whole cell on one node, as its estimate assumed
    succ = list(g.successors(cell))
    if group_free is not None:
        room = sum(group_free.get(s, 0) if kind_of(g, s) == "group" else free.get(s, 0)
                   for s in succ)
        if room < need:
            return None
    cpg = float(d.get("cpus_per_gpu", 0.0))
    mpg = float(d.get("host_mem_gib_per_gpu", 0.0))
    opts = []
    for s in succ:
        edge_cap = int(g.edges[cell, s]["max_gpus"])
        for nn in member_nodes(g, s):
            k = min(edge_cap, int(free.get(nn, 0)))
            if cpu_free is not None and cpg > 0:
                k = min(k, int(cpu_free.get(nn, 0.0) / cpg + 1e-9))
            if mem_free is not None and mpg > 0:
                k = min(k, int(mem_free.get(nn, 0.0) / mpg + 1e-9))
            k -= k % tp
            if k > 0:
                opts.append((k, nn))
    return consolidate(opts, need, tp)


class Ledger:
    """Free GPUs, CPUs, host memory and quota while a heuristic places cells one by one."""

    def __init__(self, g: nx.DiGraph) -> None:
        self.g = g
        nodes = [(n, g.nodes[n]) for n in node_vertices(g)]
        self.free = {n: int(d["capacity"]) for n, d in nodes}
        self.group_of = {n: d["group"] for n, d in nodes}
        self.gfree = {gv: int(g.nodes[gv]["capacity"]) for gv in group_vertices(g)}
        self.cpu = {n: float(d.get("cpus", float("inf"))) for n, d in nodes}
        self.mem = {n: float(d.get("host_memory_gib", float("inf"))) for n, d in nodes}
        self.quotas: dict[str, float] = dict(g.graph.get("quotas") or {})

    def take(self, cell: str, placement: dict[str, int], sign: int) -> None:
        """Book (+1) or release (-1) a cell's placement."""
        d = self.g.nodes[cell]
        for nn, k in placement.items():
            self.free[nn] -= sign * k
            self.gfree[self.group_of[nn]] -= sign * k
            self.cpu[nn] -= sign * k * float(d.get("cpus_per_gpu", 0.0))
            self.mem[nn] -= sign * k * float(d.get("host_mem_gib_per_gpu", 0.0))
        t = d.get("quota_tenant")
        if t is not None and t in self.quotas:
            self.quotas[t] -= sign * int(d["gpus"])

    def fit(self, cell: str) -> dict[str, int] | None:
        """Where the cell would go now (most consolidated), or None."""
        t = self.g.nodes[cell].get("quota_tenant")
        if t is not None and t in self.quotas and self.quotas[t] < int(self.g.nodes[cell]["gpus"]):
            return None
        return place(self.g, cell, self.free, self.gfree, self.cpu, self.mem)


def as_choices(chosen: dict[str, tuple[str, dict[str, int]]]) -> list[CellChoice]:
    return [CellChoice(j, c, {name_of(nn): k for nn, k in p.items()})
            for j, (c, p) in chosen.items()]


class GreedyCells:
    """The fallback and baseline: fast, always answers, never optimal by design."""

    name = "greedy"

    def __init__(self, search_depth: int = 3, value_attr: str = "value",
                 max_evaluations: int = 3000) -> None:
        self.search_depth = search_depth
        self.value_attr = value_attr
        self.max_evaluations = max_evaluations  # placement trials per local-search step

    def solve(self, g: nx.DiGraph) -> tuple[list[CellChoice], float, float]:
        """(choices with node-vertex placements stripped to names, objective, wall seconds)."""
        t0 = time.perf_counter()
        ledger = Ledger(g)
        chosen: dict[str, tuple[str, dict[str, int]]] = {}
        val = self.value_attr
        budget = [self.max_evaluations]
        take = ledger.take

        def fit(cell: str) -> dict[str, int] | None:
            budget[0] -= 1
            return ledger.fit(cell)

        jobs = jobs_in(g)
        order = sorted(jobs, key=lambda j: (g.nodes[job_node(j)]["running"] is None,
                                            -g.nodes[job_node(j)]["queue_bonus"], j))
        for jid in order:
            cells = cells_of(g, jid)
            if not cells:
                continue
            req = g.nodes[job_node(jid)]["requested_gpus"]
            current = [c for c in cells if is_current(g, c)]
            tiers = [current] if current else []
            tiers += [[c for c in cells if g.nodes[c]["gpus"] == req],
                      [c for c in cells if g.nodes[c]["gpus"] < req]]
            for tier in tiers:
                done = False
                for c in sorted(tier, key=lambda c: -g.nodes[c][val]):
                    p = fit(c)
                    if p is not None:
                        chosen[jid] = (c, p)
                        take(c, p, +1)
                        done = True
                        break
                if done:
                    break

        for _ in range(self.search_depth):
            best_gain, best_move = 1e-9, None
            budget[0] = self.max_evaluations  # bounded work per step: the answer is a fallback
            for jid, (c0, p0) in chosen.items():  # (a) move / rescale one job
                if budget[0] <= 0:
                    break
                take(c0, p0, -1)
                for c in cells_of(g, jid):
                    gain = g.nodes[c][val] - g.nodes[c0][val]
                    if c != c0 and gain > best_gain:
                        p = fit(c)
                        if p is not None:
                            best_gain, best_move = gain, [(jid, c, p)]
                take(c0, p0, +1)
            pending = [j for j in jobs if j not in chosen and cells_of(g, j)]
            for jp in pending:  # (b) shrink one job to make room for a pending one
                jp_types = {g.nodes[c]["gpu_type"] for c in cells_of(g, jp)}
                for jid, (c0, p0) in list(chosen.items()):
                    if budget[0] <= 0:
                        break
                    if g.nodes[c0]["gpu_type"] not in jp_types:
                        continue
                    take(c0, p0, -1)
                    for c in cells_of(g, jid):
                        if g.nodes[c]["gpus"] >= g.nodes[c0]["gpus"]:
                            continue
                        p = fit(c)
                        if p is None:
                            continue
                        take(c, p, +1)
                        for cp in sorted(cells_of(g, jp), key=lambda c: -g.nodes[c][val]):
                            gain = g.nodes[cp][val] + g.nodes[c][val] - g.nodes[c0][val]
                            if gain <= best_gain:
                                break
                            pp = fit(cp)
                            if pp is not None:
                                best_gain, best_move = gain, [(jid, c, p), (jp, cp, pp)]
                                break
                        take(c, p, -1)
                    take(c0, p0, +1)
            if best_move is None:
                break
            for jid, _, _ in best_move:
                if jid in chosen:
                    take(*chosen.pop(jid), -1)
            for jid, c, p in best_move:
                chosen[jid] = (c, p)
                take(c, p, +1)

        choices = as_choices(chosen)
        obj = float(sum(g.nodes[c][val] for c, _ in chosen.values()))
        return choices, obj, time.perf_counter() - t0
