"""Pipeline stage partitioning of a chain of layers.

Balance the stages' FLOPs first (minimise the slowest stage), then, among
partitions within ``tolerance`` of that optimum, cut where the layers' outputs
are smallest (least pipeline traffic). Solved exactly by dynamic programming
over cut positions: O(S * L^2) for S stages and L layers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache


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

    def seg(i: int, j: int) -> float:
        return prefix[j] - prefix[i]

    # 1) the optimal bottleneck (min over partitions of the max stage FLOPs)
    best = [[math.inf] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        for j in range(s, n + 1):
            best[s][j] = min(max(best[s - 1][i], seg(i, j)) for i in range(s - 1, j))
    limit = best[stages][n] * (1 + tolerance) + 1e-12

    # 2) among partitions with every stage under the limit, least cut traffic
    cost = [[math.inf] * (n + 1) for _ in range(stages + 1)]
    back = [[-1] * (n + 1) for _ in range(stages + 1)]
    cost[0][0] = 0.0
    for s in range(1, stages + 1):
        for j in range(s, n + 1):
            for i in range(s - 1, j):
                if cost[s - 1][i] == math.inf or seg(i, j) > limit:
                    continue
                c = cost[s - 1][i] + (float(cut_bytes[i - 1]) if i > 0 else 0.0)
                if c < cost[s][j]:
                    cost[s][j], back[s][j] = c, i
    ranges: list[tuple[int, int]] = []
    j = n
    for s in range(stages, 0, -1):
        i = back[s][j]
        ranges.append((i, j))
        j = i
    return ranges[::-1]


@lru_cache(maxsize=4096)
def cached_cuts(flops: tuple[float, ...], cut_bytes: tuple[float, ...], stages: int,
                tolerance: float = 0.1) -> tuple[tuple[int, int], ...]:
    """:func:`balanced_cuts` memoised: estimators ask for the same model and stage count often."""
    return tuple(balanced_cuts(flops, cut_bytes, stages, tolerance))
