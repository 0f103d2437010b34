"""Morphling's slope rule (its section 5 and algorithm 1), written once: a job's *resource
sensitivity curve* and the slope between two of its points; and the slope heuristic on a
plans candidate graph.

:class:`SensitivityCurve` is what both users of the rule read: the plans formulation's
heuristic here (:class:`SlopeGreedy`, the points its candidate cells) and the Morphling
baseline (:class:`apportion.policies.morphling.MorphlingSlope`, the points a view's rates).

:class:`SlopeGreedy` takes each job's curve as the best option value at each GPU count it
has candidates for. Then:

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
from collections.abc import Iterator, Mapping

import networkx as nx
from apportion.formulations.cells import CellChoice
from apportion.formulations.schema import cells_of, job_node, jobs_in
from apportion.solvers.greedy import Ledger, as_choices


class SensitivityCurve:
    """A job's resource sensitivity curve: its rate (or value) at each GPU count it can run
    at; no GPUs are worth nothing. Morphling's *slope* between two counts is the rate gained
    per GPU moving from one to the other (:meth:`slope`)."""

    def __init__(self, points: Mapping[int, float]) -> None:
        self.rate = dict(points)
        self.counts = sorted(self.rate)

    def __bool__(self) -> bool:
        return bool(self.counts)

    def at(self, gpus: int) -> float:
        """The curve's rate at ``gpus`` (0 without GPUs, and off the curve)."""
        return self.rate.get(gpus, 0.0) if gpus else 0.0

    def slope(self, lower: int, upper: int) -> float:
        """Morphling's slope: the rate gained per GPU from ``lower`` to ``upper`` GPUs."""
        return (self.at(upper) - self.at(lower)) / (upper - lower)

    def above(self, gpus: int) -> int | None:
        """The next count of the curve above ``gpus``; None at its top."""
        return next((c for c in self.counts if c > gpus), None)

    def below(self, gpus: int) -> int:
        """The count of the curve just below ``gpus``; 0 at its bottom."""
        lower = [c for c in self.counts if c < gpus]
        return lower[-1] if lower else 0

    def beyond(self, gpus: int) -> Iterator[int]:
        """Every count of the curve above ``gpus``, ascending."""
        return (c for c in self.counts if c > gpus)

    def steepest(self, gpus: int) -> tuple[float, int] | None:
        """The point above ``gpus`` reached with the highest positive slope (the lowest
        count among equals) and that slope; None when no point gains."""
        best = None
        for c in self.beyond(gpus):
            gain = self.slope(gpus, c)
            if gain > 0 and (best is None or gain > best[0]):
                best = (gain, c)
        return best

    def without(self, gpus: int) -> SensitivityCurve:
        """The curve with the point at ``gpus`` taken out."""
        return SensitivityCurve({c: r for c, r in self.rate.items() if c != gpus})


class SlopeGreedy:
    name = "slope"

    def __init__(self, value_attr: str = "value") -> None:
        self.value_attr = value_attr

    def solve(self, g: nx.DiGraph) -> tuple[list[CellChoice], float, float]:
        t0 = time.perf_counter()
        val = self.value_attr
        ledger = Ledger(g)
        chosen: dict[str, tuple[str, dict[str, int]]] = {}
        options: dict[str, dict[int, list[str]]] = {}  # job -> GPU count -> cells, best first
        curves: dict[str, SensitivityCurve] = {}
        for j in jobs_in(g):
            by_count: dict[int, list[str]] = {}
            for cn in cells_of(g, j):
                by_count.setdefault(int(g.nodes[cn]["gpus"]), []).append(cn)
            options[j] = {n: sorted(cs, key=lambda c: -g.nodes[c][val])
                          for n, cs in by_count.items()}
            curves[j] = SensitivityCurve({n: max(g.nodes[c][val] for c in cs)
                                          for n, cs in by_count.items()})

        def guaranteed(j: str) -> bool:
            return bool(g.nodes[job_node(j)].get("guaranteed"))

        def try_step(j: str, gpus: int) -> bool:
            """Move job j to its curve's point at ``gpus`` (any of its options there that
            fits)."""
            old = chosen.pop(j, None)
            if old is not None:
                ledger.take(old[0], old[1], -1)
            for cn in options[j][gpus]:
                p = ledger.fit(cn)
                if p is not None:
                    chosen[j] = (cn, p)
                    ledger.take(cn, p, +1)
                    return True
            if old is not None:
                chosen[j] = old
                ledger.take(old[0], old[1], +1)
            return False

        level: dict[str, int] = {}  # job -> the GPU count it holds (absent: none)
        first = sorted((j for j in curves if guaranteed(j) and curves[j]),
                       key=lambda j: (g.nodes[job_node(j)]["running"] is None, j))
        for j in first:  # minimum demands of guaranteed jobs
            for n in curves[j].counts:
                if try_step(j, n):
                    level[j] = n
                    break

        heap: list[tuple[float, str, int]] = []  # at most one step per job at a time
        for j, curve in curves.items():
            s = curve.steepest(level.get(j, 0))
            if s is not None:
                heapq.heappush(heap, (-s[0], j, s[1]))
        while heap:
            _, j, n = heapq.heappop(heap)
            if level.get(j, 0) >= n:
                continue
            if try_step(j, n):
                level[j] = n
            else:  # that step does not fit: later points of the curve may still
                curves[j] = curves[j].without(n)
            s = curves[j].steepest(level.get(j, 0))
            if s is not None:
                heapq.heappush(heap, (-s[0], j, s[1]))
        obj = float(sum(g.nodes[c][val] for c, _ in chosen.values()))
        return as_choices(chosen), obj, time.perf_counter() - t0
