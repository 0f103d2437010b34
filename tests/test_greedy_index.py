"""The greedy's placement by free-GPU buckets (``solvers.greedy.FreeIndex``) answers exactly
as the walk over every node of a cell's groups (``solvers.greedy.place``) it replaces: the
same node for a cell one node holds, the same fullest-first spread otherwise, None where
neither fits, through any sequence of bookings and releases. Exactness is the point: a
replay's schedules (and the quality tables) must not move with it."""

from __future__ import annotations

import networkx as nx
from apportion.solvers.greedy import Ledger, place
from hypothesis import given, settings
from hypothesis import strategies as st


def _graph(groups: list[list[int]], cells: list[tuple[int, int, bool, list[int]]]
           ) -> nx.DiGraph:
    """Groups of nodes (each node's GPU count) and cells (GPUs, TP width, single node,
    per-group edge caps, 0: no edge)."""
    g = nx.DiGraph()
    for gi, sizes in enumerate(groups):
        names = [f"n{gi}-{i}" for i in range(len(sizes))]
        g.add_node(f"grp{gi}", kind="group", nodes=names, capacity=sum(sizes))
        for nn, k in zip(names, sizes):
            g.add_node(nn, kind="node", capacity=k, group=f"grp{gi}")
    for ci, (gpus, tp, single, caps) in enumerate(cells):
        c = f"c{ci}"
        g.add_node(c, kind="cell", gpus=gpus, tp=tp, single_node=single)
        for gi, cap in enumerate(caps[:len(groups)]):
            if cap:
                g.add_edge(c, f"grp{gi}", max_gpus=cap)
    return g


groups_st = st.lists(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=6),
                     min_size=1, max_size=3)
cells_st = st.lists(st.tuples(st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16]),
                              st.sampled_from([1, 2, 4]), st.booleans(),
                              st.lists(st.sampled_from([0, 1, 2, 4, 8, 16]), min_size=3,
                                       max_size=3)),
                    min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(groups=groups_st, cells=cells_st, releases=st.lists(st.integers(0, 11), max_size=4))
def test_the_index_places_every_cell_as_the_walk_does(
        groups: list[list[int]], cells: list[tuple[int, int, bool, list[int]]],
        releases: list[int]) -> None:
    g = _graph(groups, cells)
    ledger = Ledger(g)
    booked: dict[str, dict[str, int]] = {}
    for c in [f"c{i}" for i in range(len(cells))]:
        walked = place(g, c, ledger.free, ledger.gfree, ledger.cpu, ledger.mem) \
            if list(g.successors(c)) else None
        indexed = ledger.fit(c) if list(g.successors(c)) else None
        assert indexed == walked, c
        if indexed is not None:
            ledger.take(c, indexed, +1)
            booked[c] = indexed
    for i in releases:  # releases move nodes back between buckets
        c = f"c{i}"
        if c in booked:
            ledger.take(c, booked.pop(c), -1)
    for c in [f"c{i}" for i in range(len(cells))]:
        if list(g.successors(c)):
            assert ledger.fit(c) == place(g, c, ledger.free, ledger.gfree, ledger.cpu,
                                          ledger.mem), c
