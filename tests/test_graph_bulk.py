"""The bulk adds write what networkx's own calls write, in the same order, and refuse
what those calls would quietly merge (a vertex or edge already there, an edge to nowhere)."""

from __future__ import annotations

import gc
import weakref

import networkx as nx
import pytest
from apportion.formulations.graph_bulk import add_new_edges, add_new_vertices, drop_cached_views
from hypothesis import given, settings
from hypothesis import strategies as st


def _same(a: nx.DiGraph, b: nx.DiGraph) -> None:
    assert list(a.nodes(data=True)) == list(b.nodes(data=True))
    for n in a:
        assert list(a.succ[n].items()) == list(b.succ[n].items()), n
        assert list(a.pred[n].items()) == list(b.pred[n].items()), n
    assert a.number_of_edges() == b.number_of_edges()


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 6), st.lists(st.integers(0, 30), unique=True, max_size=12),
       st.data())
def test_bulk_adds_equal_networkx_adds(base: int, new: list[int], data: st.DataObject) -> None:
    """On a graph of ``base`` vertices, new vertices then edges among all of them give the
    graph networkx's ``add_nodes_from``/``add_edges_from`` give, predecessors' order too."""
    ours, theirs = nx.DiGraph(), nx.DiGraph()
    for g in (ours, theirs):
        g.add_nodes_from((("b", i), {"i": i}) for i in range(base))
    vertices = [(("n", k), {"k": k, "w": k / 3}) for k in new]
    add_new_vertices(ours, [(v, dict(a)) for v, a in vertices])
    theirs.add_nodes_from(vertices)
    every = list(theirs.nodes)
    pairs = data.draw(st.lists(st.tuples(st.sampled_from(every), st.sampled_from(every)),
                               unique=True, max_size=20)) if every else []
    edges = [(u, v, {"cap": i}) for i, (u, v) in enumerate(pairs)]
    add_new_edges(ours, [(u, v, dict(a)) for u, v, a in edges])
    theirs.add_edges_from(edges)
    _same(ours, theirs)


def test_bulk_adds_refuse_what_exists_or_is_missing_and_add_nothing() -> None:
    g = nx.DiGraph()
    add_new_vertices(g, [("a", {}), ("b", {})])
    with pytest.raises(ValueError, match="'a'"):
        add_new_vertices(g, [("c", {}), ("a", {})])
    assert list(g) == ["a", "b"]
    add_new_edges(g, [("a", "b", {"x": 1})])
    with pytest.raises(ValueError, match="'a' -> 'b'"):
        add_new_edges(g, [("b", "a", {}), ("a", "b", {})])
    with pytest.raises(ValueError, match="'z'"):
        add_new_edges(g, [("a", "z", {})])
    assert list(g.edges(data=True)) == [("a", "b", {"x": 1})]


def test_bulk_adds_clear_the_graphs_cache_as_networkx_adds_do() -> None:
    """networkx (3.3 on) keeps converted graphs and results in ``__networkx_cache__`` and
    clears it on every structural change: so do the bulk adds."""
    g = nx.DiGraph()
    if not hasattr(g, "__networkx_cache__"):
        pytest.skip("this networkx keeps no cache")
    g.__networkx_cache__["stale"] = 1
    add_new_vertices(g, [("a", {}), ("b", {})])
    assert not g.__networkx_cache__
    g.__networkx_cache__["stale"] = 1
    add_new_edges(g, [("a", "b", {})])
    assert not g.__networkx_cache__


def test_dropped_views_free_the_graph_without_the_cyclic_collector() -> None:
    """A graph whose views were used is freed by reference counting once its views are
    dropped (they are made again on their next use)."""
    g = nx.DiGraph()
    g.add_edge("a", "b", w=1)
    assert list(g.nodes) == ["a", "b"] and g.succ["a"] and list(g.edges) and g.pred["b"]
    drop_cached_views(g)
    assert list(g.nodes) == ["a", "b"] and g.edges["a", "b"]["w"] == 1  # made again
    drop_cached_views(g)
    gone = weakref.ref(g)
    was = gc.isenabled()
    gc.disable()
    try:
        del g
        assert gone() is None
    finally:
        if was:
            gc.enable()
