"""A round's candidate graph on networkx: many new vertices and edges added at once, and
the graph's cached views dropped when its round is done (:func:`drop_cached_views`).

A replay builds a candidate graph every round: the cluster's nodes and groups, then each
job's vertex, cells and edges (fresh, or copied from the incremental cache). networkx's
``add_nodes_from`` and ``add_edges_from`` check every item (is it there already? is it
None?), copy its attributes into a dict of their own and clear the graph's caches, about
0.8 us a vertex: a 1,280-GPU cluster's 424 vertices cost 0.35 ms a round that way and
0.06 ms here, and the copied fragments were 8 % of a 14-day replay's CPU.

These helpers write straight into the graph's adjacency dicts (networkx's documented
dict-of-dict-of-dict: ``_node``, ``_succ``, ``_pred``, which its own methods fill the same
way), for what the builders know to hold: the vertices are new to the graph, the edges
join vertices already in it, and each attribute dict is handed over (the caller made it
for this graph and keeps no reference). The result equals what networkx's own calls
would make, in the same order, predecessors included (``tests/test_graph_bulk.py``).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from functools import cache, cached_property
from typing import Any

import networkx as nx


def _forget_cached(g: nx.DiGraph) -> None:
    """What networkx's own adds do last: clear the graph's cache of converted graphs and
    computed results (``__networkx_cache__``, networkx 3.3 and later; none before)."""
    cache = getattr(g, "__networkx_cache__", None)
    if cache:
        cache.clear()


def add_new_vertices(g: nx.DiGraph, vertices: Iterable[tuple[Hashable, dict[str, Any]]]) -> None:
    """Add vertices new to ``g``, each with its attribute dict (taken, not copied), in
    order, as ``g.add_nodes_from(vertices)`` would. A vertex already in ``g`` is refused
    (ValueError) before anything is added."""
    items = list(vertices)
    node, succ, pred = g._node, g._succ, g._pred
    for v, _ in items:
        if v in node or v is None:
            raise ValueError(f"vertex {v!r} is in the graph already (or None)")
    for v, attrs in items:
        node[v] = attrs
        succ[v] = {}
        pred[v] = {}
    _forget_cached(g)


def add_new_edges(g: nx.DiGraph, edges: Iterable[tuple[Hashable, Hashable, dict[str, Any]]]
                  ) -> None:
    """Add edges ``(u, v, attrs)`` between vertices already in ``g`` that no edge joins yet
    (``attrs`` taken, not copied), in order, as ``g.add_edges_from(edges)`` would. An edge
    whose end is not a vertex, or that is there already, is refused (ValueError) before
    anything is added."""
    items = list(edges)
    succ, pred = g._succ, g._pred
    for u, v, _ in items:
        if u not in succ or v not in succ or v in succ[u]:
            raise ValueError(f"edge {u!r} -> {v!r}: an end is not in the graph, or the edge is")
    for u, v, attrs in items:
        succ[u][v] = attrs
        pred[v][u] = attrs
    _forget_cached(g)


__all__ = ["add_new_edges", "add_new_vertices"]


@cache
def _cached_views(cls: type) -> tuple[str, ...]:
    """The attributes a graph class caches on its instances (``nodes``, ``succ``, ``pred``,
    ``edges``, ...: networkx's views, each holding the graph)."""
    return tuple(sorted({name for klass in cls.__mro__ for name, value in vars(klass).items()
                         if isinstance(value, cached_property)}))


def drop_cached_views(g: nx.Graph) -> None:
    """Forget the views ``g`` caches on itself (made again on their next use).

    Each view holds the graph and the graph holds the view: a cycle, so a round's graph
    (a hundred thousand attribute dicts) outlived the round until the cyclic collector
    found it, and every collection until then scanned it. A replay collected 1.3 million
    such objects in a half day (3.6 of its 52 CPU-s) and peaked at 491 MiB; without the
    cycle the graph is freed when its round lets go of it (0.8 s, 292 MiB)."""
    state = g.__dict__
    for name in _cached_views(type(g)):
        state.pop(name, None)
