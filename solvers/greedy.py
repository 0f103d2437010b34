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

import heapq
import time
from bisect import bisect_left, insort
from collections.abc import Iterator, Mapping

import networkx as nx
from apportion.formulations.cells import CellChoice
from apportion.formulations.schema import (
    cells_of,
    group_vertices,
    is_current,
    job_node,
    jobs_in,
    kind_of,
    member_nodes,
    name_of,
    node_vertices,
)

from apportion.placement import consolidate, fill_fullest


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


class FreeIndex:
    """Each group vertex's nodes by their free GPUs (a sorted list of names per count), so
    a cell that needs only GPUs is placed by looking at a few counts instead of every node
    of its groups: :func:`place` walked all of them per trial (19 s of a 10,000-job round
    on 20,480 GPUs). :meth:`place` answers exactly as :func:`place` does."""

    def __init__(self, g: nx.DiGraph, free: Mapping[str, int]) -> None:
        self.g = g
        self.groups_of: dict[str, list[str]] = {}
        self.buckets: dict[str, dict[int, list[str]]] = {}
        for gv in group_vertices(g):
            b: dict[int, list[str]] = {}
            for nn in g.nodes[gv]["nodes"]:
                b.setdefault(int(free.get(nn, 0)), []).append(nn)
                self.groups_of.setdefault(nn, []).append(gv)
            for names in b.values():
                names.sort()
            self.buckets[gv] = b

    def moved(self, nn: str, before: int, after: int) -> None:
        """Node ``nn``'s free GPUs went from ``before`` to ``after``."""
        for gv in self.groups_of.get(nn, ()):
            b = self.buckets[gv]
            names = b[before]
            del names[bisect_left(names, nn)]
            if not names:
                del b[before]
            insort(b.setdefault(after, []), nn)

    def place(self, succ: list[str], caps: list[int], need: int, tp: int
              ) -> dict[str, int] | None:
        """:func:`apportion.placement.consolidate` over every node of the groups ``succ``
        (each capped at its edge's ``caps``), in whole ``tp`` groups."""
        by_k: dict[int, list[list[str]]] = {}
        for gv, cap in zip(succ, caps):
            for f, names in self.buckets[gv].items():
                k = min(cap, f)
                k -= k % tp
                if k > 0:
                    by_k.setdefault(k, []).append(names)
        fits = [k for k in by_k if k >= need]
        if fits:  # the one node that holds it all with the fewest GPUs to spare (then name)
            k = min(fits)
            return {min(names[0] for names in by_k[k]): need}
        if need % tp:
            return None  # whole groups never add up to it

        def ordered() -> Iterator[tuple[int, str]]:  # fullest first, then by name
            for k in sorted(by_k, reverse=True):
                for nn in heapq.merge(*by_k[k]):
                    yield k, nn

        return fill_fullest(ordered(), need, tp)


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
        self.index = FreeIndex(g, self.free)

    def take(self, cell: str, placement: dict[str, int], sign: int) -> None:
        """Book (+1) or release (-1) a cell's placement."""
        d = self.g.nodes[cell]
        for nn, k in placement.items():
            before = self.free[nn]
            self.free[nn] = before - sign * k
            self.index.moved(nn, before, self.free[nn])
            self.gfree[self.group_of[nn]] -= sign * k
            self.cpu[nn] -= sign * k * float(d.get("cpus_per_gpu", 0.0))
            self.mem[nn] -= sign * k * float(d.get("host_mem_gib_per_gpu", 0.0))
        t = d.get("quota_tenant")
        if t is not None and t in self.quotas:
            self.quotas[t] -= sign * int(d["gpus"])

    def fit(self, cell: str) -> dict[str, int] | None:
        """Where the cell would go now (most consolidated), or None."""
        g = self.g
        d = g.nodes[cell]
        t = d.get("quota_tenant")
        if t is not None and t in self.quotas and self.quotas[t] < int(d["gpus"]):
            return None
        if float(d.get("cpus_per_gpu", 0.0)) > 0 or float(d.get("host_mem_gib_per_gpu", 0.0)) > 0:
            return place(g, cell, self.free, self.gfree, self.cpu, self.mem)
        succ = list(g.successors(cell))
        if not all(kind_of(g, s) == "group" for s in succ):
            return place(g, cell, self.free, self.gfree, self.cpu, self.mem)
        need = int(d["gpus"])
        if sum(self.gfree.get(s, 0) for s in succ) < need:
            return None  # hopeless without looking at its nodes
        tp = need if d.get("single_node") else int(d["tp"])
        return self.index.place(succ, [int(g.edges[cell, s]["max_gpus"]) for s in succ],
                                need, max(1, tp))


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
        s = _Search(g, self.value_attr, self.max_evaluations)
        s.first_fit()
        for _ in range(self.search_depth):
            s.budget = self.max_evaluations  # bounded work per step: the answer is a fallback
            best_gain, best_move = s.best_rescale()
            best_move = s.best_shrink(best_gain, best_move)
            if best_move is None:
                break
            s.apply(best_move)
        choices = as_choices(s.chosen)
        obj = float(sum(g.nodes[c][s.val] for c, _ in s.chosen.values()))
        return choices, obj, time.perf_counter() - t0


#: a local-search move: (job, its new cell, the cell's placement) per job it changes
Move = list[tuple[str, str, dict[str, int]]]


class _Search:
    """The greedy's state: the ledger of free GPUs, the chosen cells and the placement
    trials left in this step (a work budget, so the answer does not depend on the clock).
    """

    def __init__(self, g: nx.DiGraph, val: str, budget: int) -> None:
        self.g, self.val, self.budget = g, val, budget
        self.ledger = Ledger(g)
        self.take = self.ledger.take
        self.chosen: dict[str, tuple[str, dict[str, int]]] = {}
        self.jobs = jobs_in(g)
        # a merged cell not merged yet (a fine-tuning pair's option) serves two jobs' rows:
        # the greedy places jobs one by one, so it leaves those to the solvers and its
        # answer stays within the model's rows (formulations.siblings)
        self.own = {j: [c for c in cells_of(g, j) if not g.nodes[c].get("merge_option")]
                    for j in self.jobs} if g.graph.get("siblings") else None

    def fit(self, cell: str) -> dict[str, int] | None:
        """A placement of ``cell`` on the free GPUs, or None; one trial of the budget."""
        self.budget -= 1
        return self.ledger.fit(cell)

    def offered(self, jid: str) -> list[str]:
        """The cells the greedy may give job ``jid``."""
        return self.own[jid] if self.own is not None else cells_of(self.g, jid)

    def first_fit(self) -> None:
        """Running jobs first, then by queue bonus: each its present cell if it still
        fits, else its most valuable cell of the requested size, else a smaller one."""
        g, val, take = self.g, self.val, self.take
        order = sorted(self.jobs, key=lambda j: (g.nodes[job_node(j)]["running"] is None,
                                                 -g.nodes[job_node(j)]["queue_bonus"], j))
        for jid in order:
            cells = self.offered(jid)
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
                    p = self.fit(c)
                    if p is not None:
                        self.chosen[jid] = (c, p)
                        take(c, p, +1)
                        done = True
                        break
                if done:
                    break

    def best_rescale(self) -> tuple[float, Move | None]:
        """The best move of one placed job to another of its cells (a type or size)."""
        g, val, take = self.g, self.val, self.take
        best_gain, best_move = 1e-9, None
        for jid, (c0, p0) in self.chosen.items():  # (a) move / rescale one job
            if self.budget <= 0:
                break
            take(c0, p0, -1)
            for c in self.offered(jid):
                gain = g.nodes[c][val] - g.nodes[c0][val]
                if c != c0 and gain > best_gain:
                    p = self.fit(c)
                    if p is not None:
                        best_gain, best_move = gain, [(jid, c, p)]
            take(c0, p0, +1)
        return best_gain, best_move

    def best_shrink(self, best_gain: float, best_move: Move | None) -> Move | None:
        """The best move found so far, or a better one shrinking a placed job to make room
        for a pending one of a GPU type it may use."""
        g, val, take, offered = self.g, self.val, self.take, self.offered
        pending = [j for j in self.jobs if j not in self.chosen and offered(j)]
        for jp in pending:  # (b) shrink one job to make room for a pending one
            if self.budget <= 0:  # (each pending job would copy every placed one to find it)
                break
            jp_types = {g.nodes[c]["gpu_type"] for c in offered(jp)}
            for jid, (c0, p0) in list(self.chosen.items()):
                if self.budget <= 0:
                    break
                if g.nodes[c0]["gpu_type"] not in jp_types:
                    continue
                take(c0, p0, -1)
                for c in offered(jid):
                    if g.nodes[c]["gpus"] >= g.nodes[c0]["gpus"]:
                        continue
                    p = self.fit(c)
                    if p is None:
                        continue
                    take(c, p, +1)
                    for cp in sorted(offered(jp), key=lambda c: -g.nodes[c][val]):
                        gain = g.nodes[cp][val] + g.nodes[c][val] - g.nodes[c0][val]
                        if gain <= best_gain:
                            break
                        pp = self.fit(cp)
                        if pp is not None:
                            best_gain, best_move = gain, [(jid, c, p), (jp, cp, pp)]
                            break
                    take(c, p, -1)
                take(c0, p0, +1)
        return best_move

    def apply(self, move: Move) -> None:
        """Make ``move``: its jobs' old cells freed first, then their new ones taken."""
        for jid, _, _ in move:
            if jid in self.chosen:
                self.take(*self.chosen.pop(jid), -1)
        for jid, c, p in move:
            self.chosen[jid] = (c, p)
            self.take(c, p, +1)
