"""Pipeline stage partitioning of a chain of layers.

Balance the stages' FLOPs first (minimise the slowest stage), then, among
partitions within ``tolerance`` of that optimum, cut where the layers' outputs
are smallest (least pipeline traffic). Solved exactly by dynamic programming
over cut positions: O(S * L^2) for S stages and L layers, each stage one array step
(the same floating-point operations as a scalar loop, so the same cuts).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np


def balanced_cuts(flops: Sequence[float], cut_bytes: Sequence[float], stages: int,
                  tolerance: float = 0.1) -> list[tuple[int, int]]:
    """Stage ranges ``[(start, end), ...]`` (end exclusive) for ``stages`` stages.

    ``cut_bytes[i]`` is the traffic of a cut after layer ``i``. Raises
    ``ValueError`` when there are fewer layers than stages.
    """
    n = len(flops)
    if stages < 1:
        raise ValueError("stages must be >= 1")
    if stages > n:
        raise ValueError(f"{stages} stages but only {n} layers")
    prefix = [0.0]
    for f in flops:
        prefix.append(prefix[-1] + float(f))
    pre = np.array(prefix)
    # seg[i, j]: the FLOPs of layers i..j-1 (the same subtraction as one pair at a time),
    # infinite where no stage can run from i to j (j <= i)
    nonempty = np.arange(n + 1)[:, None] < np.arange(n + 1)[None, :]
    seg = np.where(nonempty, pre[None, :] - pre[:, None], math.inf)
    # cut[i]: the traffic of a cut before layer i (a stage starts at i <= n - 1)
    cut = np.array([0.0] + [float(c) for c in cut_bytes[:n - 1]] + [0.0])

    # 1) the optimal bottleneck (min over partitions of the max stage FLOPs): best[i] is
    # the least bottleneck of the first i layers in s - 1 stages, infinite where there is
    # none (i < s - 1), so stage s ending at j takes the best start i < j
    best = np.full(n + 1, math.inf)
    best[0] = 0.0
    for _ in range(stages):
        best = np.maximum(best[:, None], seg).min(axis=0)
    limit = float(best[n]) * (1 + tolerance) + 1e-12

    # 2) among partitions with every stage under the limit, least cut traffic; the first
    # best start i wins a tie, as a scan in increasing i keeping strict improvements would
    barred = np.where(seg <= limit, 0.0, math.inf)
    cost = np.full(n + 1, math.inf)
    cost[0] = 0.0
    back = np.full((stages + 1, n + 1), -1)
    every = np.arange(n + 1)
    for s in range(1, stages + 1):
        with_cut = (cost + cut)[:, None] + barred
        start = with_cut.argmin(axis=0)
        cost = with_cut[start, every]
        back[s] = np.where(cost < math.inf, start, -1)
    ranges: list[tuple[int, int]] = []
    j = n
    for s in range(stages, 0, -1):
        i = int(back[s][j])
        ranges.append((i, j))
        j = i
    return ranges[::-1]


@lru_cache(maxsize=4096)
def cached_cuts(flops: tuple[float, ...], cut_bytes: tuple[float, ...], stages: int,
                tolerance: float = 0.1) -> tuple[tuple[int, int], ...]:
    """:func:`balanced_cuts` memoised: estimators ask for the same model and stage count often."""
    return tuple(balanced_cuts(flops, cut_bytes, stages, tolerance))
