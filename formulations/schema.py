"""The candidate graph's schema: its vertex keys, attribute names and accessors.

The candidate graph is the one structure every stage after ``candidates``
reads: formulations build models from it, heuristics place cells on it,
decoders turn answers back into decisions. Its builders
(:mod:`apportion.formulations.candidates`, :mod:`apportion.formulations.plans`,
the cache in :mod:`apportion.formulations.incremental`) write it; everyone else
reads it through this module, which imports nothing but networkx, so a
heuristic can read a graph without loading a builder (or its estimators).

A ``networkx.DiGraph`` with graph attributes ``kind="candidates"``, ``now_s``
(the round's clock), ``options`` (the builder's knobs, as a dict),
``formulation`` (absent means ``"cells"``), ``quotas`` (tenant -> GPUs, the cells and
plans formulations) and ``objective`` (the objective's weights, written by
:func:`apportion.formulations.objectives.apply_objective`), and four kinds of
vertices, told apart by their ``kind`` attribute:

* ``job:<id>`` (:func:`job_node`): attrs ``kind="job"``, ``job`` (the id),
  ``requested_gpus``, ``requested_gpu_type``, ``ref_throughput`` (the
  throughput its cells are normalised by) and ``ref_basis``, ``queue_bonus``,
  ``running`` (its present cell key ``[gpu_type, gpus, stages]`` or None),
  ``reason`` (a :class:`apportion.decision.Reason` value when no cell is
  feasible, else None); optionally ``reason_detail``, ``jct_weight``,
  ``speed_weight``, ``soonest_s``, ``projected_jct_s``, ``tail`` (objective), ``tenant``,
  ``guaranteed``, ``sla_throughput``,
  ``min_demand``, ``over_quota``, ``sla_lost`` (cells and plans:
  :mod:`apportion.formulations.sla`), ``deadline_s``, ``admitted``
  (deadline), ``merged_into`` (a fine-tuning job inside a merged job: no cell of its own),
  ``awaits`` ([sibling, predicted end]: it waits for that sibling's weights)
  (:mod:`apportion.formulations.siblings`).
* ``cell:...``: attrs ``kind="cell"``, ``job``, ``gpu_type``, ``gpus``,
  ``stages``, ``dp``, ``tp``, ``micro_batches``, ``est_throughput``,
  ``iter_time_s``, ``mem_per_gpu`` (bytes), ``normalized``, ``bonus``,
  ``value`` (the objective coefficient), ``current`` (True for a running job's
  present cell: :func:`is_current`), ``single_node`` (its estimate assumed one
  node, so it is placed whole on one); optionally ``plan``, ``family``,
  ``cpus_per_gpu``, ``host_mem_gib_per_gpu`` (plans), ``quota_tenant`` (cells and
  plans),
  ``finish_s`` (deadline), and for fine-tuning siblings
  (:mod:`apportion.formulations.siblings`) ``source`` and ``transfer_gain`` (a transfer
  option: the job starts from that finished sibling's weights), ``members`` (a merged
  cell: it also sits in each member's one-cell row), ``merge_option`` (the pair is not
  merged yet) and ``member_values`` (the members' share of its ``value``). Its key is unique but opaque (the cells builder
  uses :attr:`apportion.plans.Cell.node_id`, the plans builder an option
  index): read a cell's attributes, never parse its key.
* ``group:<prefix>`` (:func:`group_node`): attrs ``kind="group"``,
  ``gpu_type``, ``node_gpus`` (GPUs per node), ``nodes`` (its node vertices:
  only those the cluster really has now) and ``capacity`` (all their GPUs).
* ``node:<name>`` (:func:`node_node`): attrs ``kind="node"``, ``gpu_type``,
  ``capacity`` (GPUs), ``cpus``, ``host_memory_gib``, ``group`` (its group
  vertex).

Edges: job -> cell (no attributes; :func:`cells_of`); cell -> group, for
every group of the cell's GPU type whose nodes can hold a placement unit of
it; and, for a running job's present cell only, cell -> node for each node it
holds GPUs on (keeping a job means keeping it exactly where it runs:
:func:`pinned_nodes`). Each cell edge carries ``max_gpus``: the most of the
cell's GPUs that may sit behind that successor, a multiple of the cell's TP
degree (a node holds whole tensor-parallel groups only), at most the cell's
GPUs; for a group it is what its nodes hold in whole TP groups, for a node
the GPUs the running job holds there. It bounds one edge, not a node: every
cell behind a node shares that node's ``capacity``, and the nodes behind an
edge are :func:`member_nodes`. Edges go to groups rather than to every node
to keep the graph small at cluster scale (1,000 jobs x 48 cells x 160 nodes
would be millions of edges).

A researcher may edit attributes (say, ``value``) between building the graph
and building a model from it; formulations read attributes by name.
"""

from __future__ import annotations

import networkx as nx

__all__ = ["cell_vertices", "cells_of", "current_cells", "group_node", "group_vertices",
           "is_current", "job_node", "jobs_in", "kind_of", "member_nodes", "name_of",
           "node_node", "node_vertices", "pinned_nodes"]


def job_node(job_id: str) -> str:
    """The vertex key of job ``job_id`` (decisions speak job ids, the graph keys)."""
    return f"job:{job_id}"


def node_node(name: str) -> str:
    """The vertex key of the cluster node ``name``."""
    return f"node:{name}"


def group_node(prefix: str) -> str:
    """The vertex key of the node group ``prefix``."""
    return f"group:{prefix}"


def name_of(vertex: str) -> str:
    """The name a job, node or group vertex key wraps (``node:a40-3`` -> ``a40-3``).

    The inverse of :func:`job_node`, :func:`node_node` and :func:`group_node`:
    placements and decisions speak node names, the graph speaks vertex keys.
    """
    return vertex.split(":", 1)[1]


def kind_of(g: nx.DiGraph, vertex: str) -> str | None:
    """The vertex's kind: ``job``, ``cell``, ``group`` or ``node`` (None for a foreign one)."""
    return g.nodes[vertex].get("kind")


def _of_kind(g: nx.DiGraph, kind: str) -> list[str]:
    return [v for v, d in g.nodes(data=True) if d.get("kind") == kind]


def jobs_in(g: nx.DiGraph) -> list[str]:
    """The ids (not vertex keys) of every job in the graph, in insertion order."""
    return [d["job"] for _, d in g.nodes(data=True) if d.get("kind") == "job"]


def cells_of(g: nx.DiGraph, job_id: str) -> list[str]:
    """The cell vertices of job ``job_id`` (empty when none was feasible)."""
    return list(g.successors(job_node(job_id)))


def cell_vertices(g: nx.DiGraph) -> list[str]:
    """Every cell vertex, of every job, in insertion order."""
    return _of_kind(g, "cell")


def node_vertices(g: nx.DiGraph) -> list[str]:
    """Every node vertex (one per cluster node that is up), in insertion order."""
    return _of_kind(g, "node")


def group_vertices(g: nx.DiGraph) -> list[str]:
    """Every node-group vertex, in insertion order."""
    return _of_kind(g, "group")


def is_current(g: nx.DiGraph, cell: str) -> bool:
    """Whether ``cell`` is a running job's present cell (choosing it keeps the job as it is)."""
    return bool(g.nodes[cell].get("current"))


def current_cells(g: nx.DiGraph) -> list[str]:
    """The present cells of every running job (at most one per job)."""
    return [v for v, d in g.nodes(data=True) if d.get("kind") == "cell" and d.get("current")]


def pinned_nodes(g: nx.DiGraph, cell: str) -> list[str]:
    """The node vertices a running job's present cell holds GPUs on (its cell -> node edges).

    Empty for every other cell: those reach nodes only through their groups.
    """
    return [s for s in g.successors(cell) if g.nodes[s].get("kind") == "node"]


def member_nodes(g: nx.DiGraph, vertex: str) -> list[str]:
    """Node vertices behind a cell's successor (a group's nodes, or the node itself)."""
    d = g.nodes[vertex]
    return list(d["nodes"]) if d.get("kind") == "group" else [vertex]
