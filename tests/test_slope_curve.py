"""Morphling's slope rule, written once (:class:`apportion.solvers.slope.SensitivityCurve`):
what the plans formulation's slope heuristic and the Morphling baseline both read."""

from __future__ import annotations

from apportion.solvers.slope import SensitivityCurve
from hypothesis import given
from hypothesis import strategies as st

POINTS = st.dictionaries(st.integers(1, 64), st.floats(0.0, 1e4, allow_nan=False), max_size=8)


@given(POINTS, st.integers(0, 64))
def test_the_steepest_step_is_the_best_slope_and_the_fewest_gpus(points: dict[int, float],
                                                                 at: int) -> None:
    """Above any count, the step taken is the one gaining most per GPU (0 GPUs worth 0),
    the fewest GPUs among equals, and none when nothing gains."""
    curve = SensitivityCurve(points)
    base = points.get(at, 0.0) if at else 0.0
    gains = [((points[c] - base) / (c - at), c) for c in sorted(points) if c > at]
    best = max((g for g, _ in gains), default=0.0)
    step = curve.steepest(at)
    if best <= 0:
        assert step is None
    else:
        assert step == (best, min(c for g, c in gains if g == best))


@given(POINTS)
def test_neighbours_and_removal(points: dict[int, float]) -> None:
    curve = SensitivityCurve(points)
    counts = sorted(points)
    assert bool(curve) == bool(points)
    for i, c in enumerate(counts):
        assert curve.above(c) == (counts[i + 1] if i + 1 < len(counts) else None)
        assert curve.below(c) == (counts[i - 1] if i else 0)
        assert curve.slope(curve.below(c), c) == (points[c] - (points[counts[i - 1]] if i
                                                               else 0.0)) / (c - curve.below(c))
        rest = curve.without(c)
        assert rest.counts == counts[:i] + counts[i + 1:] and c not in rest.rate
