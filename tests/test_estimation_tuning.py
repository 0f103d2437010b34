"""Cell-guided tuning (Crius 5.2): favoured halves, pruned vs full space."""

from __future__ import annotations

from apportion.estimation.models.tuning import favoured_half, layouts, tune_cell

from apportion.cluster import Cluster, NodeGroup
from apportion.jobs import JobSpec
from apportion.plans import Cell


def test_halves_meet_at_the_half_hybrid_point_and_cover_the_range():
    full = layouts(16, 8)
    assert full == [(16, 1), (8, 2), (4, 4), (2, 8)]
    dp, tp = favoured_half(16, 8, "dp"), favoured_half(16, 8, "tp")
    assert dp == [(16, 1), (8, 2), (4, 4)] and tp == [(4, 4), (2, 8)]
    assert set(dp) | set(tp) == set(full) and set(dp) & set(tp) == {(4, 4)}


def test_tuning_prunes_the_space_and_stays_near_the_full_optimum():
    cl = Cluster("t", [NodeGroup("a", 4, "A100-40GB", 8)])
    job = JobSpec("j", "bert-6.7b", 256, 10, 16)
    cell = Cell("j", "A100-40GB", 16, 4)
    pruned = tune_cell(job, cell, cl)
    full = tune_cell(job, cell, cl, prune=False)
    assert pruned is not None and full is not None
    assert pruned.pruned_space < pruned.full_space == full.full_space
    assert full.iter_time_s <= pruned.iter_time_s <= 1.1 * full.iter_time_s
    for (d, t), fav, n in zip(pruned.stage_layouts, pruned.favours,
                              [d * t for d, t in pruned.stage_layouts]):
        assert (d, t) in favoured_half(n, 8, fav)
        assert d * t == n
