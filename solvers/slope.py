"""Morphling's slope-based heuristic (its algorithm 1) on a plans candidate graph.

Each job's *resource sensitivity curve* is the best option value at each GPU
count it has candidates for. Then:

1. guaranteed jobs (their options carry the SLA priority) get their minimum
   demand first: the smallest option that meets the SLA (every option left in
   the graph for them does), running jobs before queued ones;
2. the other jobs start at nothing and grow greedily by *slope*: the next step
   on a job's curve is taken by the job whose gain per extra GPU is highest,
   as long as it fits the free GPUs, CPUs, memory and quota (GPUs first, then
   CPUs and memory, as Morphling allocates them); a step that does not fit is
   skipped for that job;
3. placement is the greedy's most consolidated placement.

The same interface as :class:`apportion.solvers.greedy.GreedyCells`: it is the
plans formulation's fallback and warm start, and a baseline of its own.
"""

from __future__ import annotations

import heapq
import time

import networkx as nx

from apportion.formulations.cells import CellChoice
from apportion.formulations.schema import cells_of, job_node, jobs_in
from apportion.solvers.greedy import Ledger, as_choices


class SlopeGreedy:
    name = "slope"

    def __init__(self, value_attr: str = "value") -> None:
        self.value_attr = value_attr

    def solve(self, g: nx.DiGraph) -> tuple[list[CellChoice], float, float]:
        t0 = time.perf_counter()
        val = self.value_attr
        ledger = Ledger(g)
        chosen: dict[str, tuple[str, dict[str, int]]] = {}
        curves: dict[str, list[tuple[int, list[str]]]] = {}
        for j in jobs_in(g):
            by_count: dict[int, list[str]] = {}
            for cn in cells_of(g, j):
                by_count.setdefault(int(g.nodes[cn]["gpus"]), []).append(cn)
            curves[j] = [(n, sorted(cs, key=lambda c: -g.nodes[c][val]))
                         for n, cs in sorted(by_count.items())]

        def guaranteed(j: str) -> bool:
            return bool(g.nodes[job_node(j)].get("guaranteed"))

        def try_step(j: str, idx: int) -> bool:
            """Move job j to curve point idx (any of its options there that fits)."""
            old = chosen.pop(j, None)
            if old is not None:
                ledger.take(old[0], old[1], -1)
            for cn in curves[j][idx][1]:
                p = ledger.fit(cn)
                if p is not None:
                    chosen[j] = (cn, p)
                    ledger.take(cn, p, +1)
                    return True
            if old is not None:
                chosen[j] = old
                ledger.take(old[0], old[1], +1)
            return False

        level: dict[str, int] = {}
        first = sorted((j for j in curves if guaranteed(j) and curves[j]),
                       key=lambda j: (g.nodes[job_node(j)]["running"] is None, j))
        for j in first:  # minimum demands of guaranteed jobs
            for idx in range(len(curves[j])):
                if try_step(j, idx):
                    level[j] = idx
                    break

        def best_value(j: str, idx: int) -> float:
            return max(g.nodes[c][val] for c in curves[j][idx][1])

        def next_slope(j: str) -> tuple[float, int] | None:
            cur = level.get(j, -1)
            base_gpus = curves[j][cur][0] if cur >= 0 else 0
            base_val = best_value(j, cur) if cur >= 0 else 0.0
            best = None
            for idx in range(cur + 1, len(curves[j])):
                gain = (best_value(j, idx) - base_val) / max(1, curves[j][idx][0] - base_gpus)
                if gain > 0 and (best is None or gain > best[0]):
                    best = (gain, idx)
            return best

        heap: list[tuple[float, str, int]] = []
        for j in curves:
            s = next_slope(j) if curves[j] else None
            if s is not None:
                heapq.heappush(heap, (-s[0], j, s[1]))
        while heap:
            _, j, idx = heapq.heappop(heap)
            if level.get(j, -1) >= idx:
                continue
            if try_step(j, idx):
                level[j] = idx
            else:  # that step does not fit: later points of the curve may still
                curves[j] = curves[j][: idx] + curves[j][idx + 1:]
            s = next_slope(j) if curves[j] else None
            if s is not None:
                heapq.heappush(heap, (-s[0], j, s[1]))
        obj = float(sum(g.nodes[c][val] for c, _ in chosen.values()))
        return as_choices(chosen), obj, time.perf_counter() - t0
