"""Incremental candidates: only new or changed jobs are estimated again.

A replay (or ``apportion run``) makes a round every few minutes, and between two
rounds most jobs are exactly as they were: same model, batch, request and
running cell. Their candidate cells — the estimator's answers, the dominance
pruning, the cell->group edges — are the same too; only the queue bonus of a
waiting job moves with the clock. :class:`CandidateCache` keeps each job's
fragment of the candidate graph (its job vertex, cell vertices and their
edges) as :func:`~apportion.formulations.candidates.build_candidates` made it,
keyed by everything the fragment depends on, and builds a round's graph from

* the builder itself, for the jobs whose key changed (arrivals, a job that was
  started, moved or preempted, a cell blacklisted after a stall, a refit);
* the cached fragments, copied, for every other job, with the queue bonus
  recomputed for the round's clock (:func:`queue_bonus`, the builder's rule);

then the objective over every job (:func:`apply_objective`, as the builder
ends). The result equals a fresh ``build_candidates`` of all jobs — same
vertices in the same order, same attributes, same edges — which
``tests/test_incremental.py`` checks over a replay. The builder is the one
algorithm; this is a cache around it, so a change to the builder is picked up
(a new time-dependent attribute would make that test fail, not the schedule
drift silently).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, MutableMapping
from dataclasses import fields
from typing import Any

import networkx as nx
from apportion.formulations.candidates import CandidateOptions, build_candidates, queue_bonus
from apportion.formulations.graph_bulk import add_new_edges, add_new_vertices
from apportion.formulations.objectives import apply_objective
from apportion.formulations.schema import job_node

from apportion.cluster import Cluster
from apportion.jobs import JobSpec

# one job's piece of the graph: its vertex's attributes and, per cell in order, the
# cell's attributes and its out-edges (successor, edge attributes) in order
Fragment = tuple[dict[str, Any], list[tuple[str, dict[str, Any], list[tuple[str, dict[str, Any]]]]]]


# every field of a job spec but its progress, in declaration order
_KEY_FIELDS = tuple(f.name for f in fields(JobSpec) if f.name != "iterations_done")


def job_key(job: JobSpec) -> tuple[Any, ...]:
    """Everything of a job its candidates depend on: the spec but its progress, compared
    field by field (a tuple of the fields, not a copy's ``repr``: every job's key is made
    every round)."""
    return tuple(map(job.__getattribute__, _KEY_FIELDS))


def fragment_of(g: nx.DiGraph, job_id: str) -> Fragment:
    """A copy of ``job_id``'s vertex, cells and cell edges in ``g``."""
    jn = job_node(job_id)
    cells = []
    for cn in g.successors(jn):
        edges = [(s, dict(a)) for s, a in g.adj[cn].items()]
        cells.append((cn, dict(g.nodes[cn]), edges))
    return dict(g.nodes[jn]), cells


def add_fragment(g: nx.DiGraph, job_id: str, frag: Fragment, bonus: float | None = None) -> None:
    """Copy a fragment into ``g`` (its attribute dicts are copied, never shared): the job's
    vertex, then its cell vertices and their edges, in the order the builder adds them
    (``candidates._attach_cells``), so the graph equals a fresh build's. The vertices are
    new and the edges end at the topology's, so they go in through
    :mod:`~apportion.formulations.graph_bulk` (a replay copies every waiting job's fragment
    every round)."""
    attrs, cells = frag
    jn = job_node(job_id)
    vertices: list[tuple[str, dict[str, Any]]] = [
        (jn, {**attrs, "queue_bonus": bonus} if bonus is not None else dict(attrs))]
    edges: list[tuple[str, str, dict[str, Any]]] = []
    for cn, cattrs, out in cells:
        vertices.append((cn, {**cattrs, "bonus": bonus} if bonus is not None else dict(cattrs)))
        edges.append((jn, cn, {}))
        edges += [(cn, s, dict(a)) for s, a in out]
    add_new_vertices(g, vertices)
    add_new_edges(g, edges)


class CandidateCache:
    """Per-job fragments of the candidate graph across rounds (see the module docstring).

    ``extra(job)`` adds what the estimator's answers depend on beyond the spec
    (a blacklisted cell, a pinned type, a refit); ``hits`` and ``misses`` count
    jobs served from the cache and estimated again.
    """

    def __init__(self) -> None:
        # per job: its key, its fragment, and whether the fragment holds its scale-up (a
        # fragment built for a round the trim trims leaves it out: build's ``scale_up``)
        self.frags: dict[str, tuple[Hashable, Fragment, bool]] = {}
        self.hits = 0
        self.misses = 0

    def clear(self) -> None:
        self.frags.clear()

    def build(self, cluster: Cluster, jobs: list[JobSpec], now_s: float, estimator: Any,
              options: CandidateOptions | None = None,
              extra: Callable[[JobSpec], Hashable] | None = None,
              seen: MutableMapping[str, float] | None = None,
              accept: Callable[[JobSpec, Any], str | None] | None = None,
              scale_up: bool = True) -> nx.DiGraph:
        """The candidate graph of ``jobs`` at ``now_s``: equal to ``build_candidates``
        (``seen``: the policy's memory of projected JCTs, for ``tail_quantile``;
        ``accept``: the executor's plan filter, fixed for the cache's life). A fragment made
        with ``scale_up`` serves only rounds with it, one made without it (a round the trim
        trims) only rounds without it: a replay's rounds change between the two seldom."""
        opt = options or CandidateOptions()
        base = (cluster.fingerprint_hash, opt)
        keys = {j.id: (base, job_key(j), extra(j) if extra else None) for j in jobs}
        stale = [j for j in jobs if (got := self.frags.get(j.id)) is None
                 or got[0] != keys[j.id] or got[2] != scale_up]
        if stale:
            # the objective is applied below, over every job
            fresh = build_candidates(cluster, stale, now_s, estimator, opt, accept=accept,
                                     objective=False, scale_up=scale_up)
            for j in stale:
                self.frags[j.id] = (keys[j.id], fragment_of(fresh, j.id), scale_up)
        self.misses += len(stale)
        self.hits += len(jobs) - len(stale)
        for jid in [k for k in self.frags if k not in keys]:  # jobs gone: forget them
            del self.frags[jid]
        g = build_candidates(cluster, [], now_s, estimator, opt,  # topology, graph attributes
                             objective=False)
        for j in jobs:
            add_fragment(g, j.id, self.frags[j.id][1], queue_bonus(j, now_s, opt))
        apply_objective(g, jobs, now_s, opt.objective_options(), seen)
        return g


__all__ = ["CandidateCache", "Fragment", "add_fragment", "fragment_of", "job_key"]
