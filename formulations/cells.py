r"""The cell-allocation formulation (Crius cells solved exactly).

Sets: jobs J; candidate cells C_j of job j (from the candidate graph); nodes N;
``E`` the cell->node edges with ``max_gpus`` (a multiple of the cell's TP degree).

Variables:
    x_c in {0, 1}                    cell c chosen
    y_{c,n} in {0 .. max_gpus/u_c}   placement units of cell c on node n

Constraints:
    sum_{c in C_j} x_c <= 1                      at most one cell per job
    sum_n u_c * y_{c,n} = gpus_c * x_c           a chosen cell gets all its GPUs
    sum_{c} u_c * y_{c,n} <= capacity_n          node capacity
    (optional) sum_{j running} (1 - x_{cur(j)}) <= D   change budget (search depth)

Objective: maximise sum_c value_c * x_c, ``value`` read from the graph (see
:mod:`apportion.formulations.candidates` for its documented weights).

The placement unit ``u_c`` is the cell's TP degree, so a node holds whole
tensor-parallel groups only; for a ``single_node`` cell (one whose estimate
assumed intra-node links: it fits one node) the unit is the whole cell, so it
is placed on one node and the estimate stays true. Cell->node
edges exist only for nodes of the cell's GPU type, so types always match.

Symmetry: identical nodes (same type and capacity, no running job pinned to
them) are aggregated into one *class* with capacity ``k * c`` and one ``y``
per cell and class. This is exact, not a relaxation, whenever the TP sizes
using a class form a divisibility chain (1 | 2 | 4 ...) and divide the node
capacity: items of divisible sizes fit k bins of capacity c iff their total is
at most k*c, and first-fit decreasing finds the packing, which the decoder
does. Classes failing that test, and nodes holding a running job's current
placement, stay one node per class. Without aggregation CP-SAT cannot prove
optimality on 32 identical nodes in seconds; with it both backends do in well
under a second.

Residual mode: past ``PINNED_EXACT_LIMIT`` nodes holding running jobs (a busy
cluster), those nodes are grouped by the GPUs they have left if every running
job stays, and running jobs' present cells take no placement columns (they
stay exactly where they are when kept). The model stays the same size however
busy the cluster is. With ``REUSE_FREED`` (the default) what a running job
frees by moving or being stopped is usable in the same round: a class's
capacity row holds all its GPUs, and each running job's keep column takes its
GPUs there (``sum units + held_r * x_keep(r) <= capacity``), so the optimum can
move a job that gains little from a fast GPU type to a slower one and give its
GPUs to a job that gains much, in one round. (Without it a swap needs two
rounds, the first of which is a pure loss, so it never happens: on Crius's
Venus trace apportion then never moved a job to a slower type while Sia did
326 times, and long jobs waited for fast GPUs on slow ones.) The freed GPUs
sit on particular nodes, so a class's aggregate can over-promise; the decoder
places what does not fit its class on any other node the cell may use, and
leaves out a cell that still does not fit: a valid, slightly worse answer.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
import logging
import math
import re
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import networkx as nx
import numpy as np
from apportion.formulations.model import INF, LinearModel
from apportion.formulations.siblings import member_cover
from apportion.formulations.schema import (
    cells_of,
    current_cells,
    group_vertices,
    job_node,
    jobs_in,
    member_nodes,
    name_of,
    node_node,
    node_vertices,
    pinned_nodes,
)

log = logging.getLogger(__name__)


class DecodeError(RuntimeError):
    """An answer the decoder cannot turn into placements (the chain moves on)."""


@dataclass
class CellChoice:
    """A decoded choice: the cell vertex and its placement {node name: GPUs}."""

    job: str
    cell: str
    placement: dict[str, int]


@lru_cache(maxsize=1 << 16)
def natural_key(name: str) -> tuple[Any, ...]:
    """Sort ``a40-2`` before ``a40-10`` (memoised: every round sorts the same node names)."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def unit_of(d: dict[str, Any]) -> int:
    """GPUs per placement unit: the whole cell when it must sit on one node, else its TP group."""
    return int(d["gpus"]) if d.get("single_node") else int(d["tp"])


def _most_per_gpu(users: list[dict[str, Any]]) -> tuple[float, float]:
    """The most CPUs and host memory per GPU any of the cells ``users`` asks for."""
    return (max((float(u.get("cpus_per_gpu", 0.0)) for u in users), default=0.0),
            max((float(u.get("host_mem_gib_per_gpu", 0.0)) for u in users), default=0.0))


def _resources_never_bind(most: tuple[float, float], node: dict[str, Any], node_gpus: int) -> bool:
    """True when no cell could run out of a node's CPUs or memory before its GPUs (``most``:
    the most CPUs and memory per GPU a cell asks for, :func:`_most_per_gpu`; a product with
    the non-negative ``node_gpus`` keeps the order, so the largest decides for every cell).

    Then the per-node CPU and memory rows are redundant and nodes stay
    interchangeable; otherwise the group keeps one class per node.
    """
    cpus, mem = float(node.get("cpus", math.inf)), float(node.get("host_memory_gib", math.inf))
    return most[0] * node_gpus <= cpus + 1e-9 and most[1] * node_gpus <= mem + 1e-9


def _divisible_chain(sizes: set[int], capacity: int) -> bool:
    ordered = sorted(sizes)
    return all(b % a == 0 for a, b in zip(ordered, ordered[1:])) and capacity % ordered[-1] == 0


def held_by_running(g: nx.DiGraph, current: list[str] | None = None) -> dict[str, int]:
    """GPUs each node gives to running jobs' present placements (their keep cells;
    ``current``: :func:`current_cells` of ``g`` where the caller has them)."""
    held: dict[str, int] = {}
    for cn in current_cells(g) if current is None else current:
        for nn in pinned_nodes(g, cn):
            held[nn] = held.get(nn, 0) + int(g.edges[cn, nn]["max_gpus"])
    return held


def node_classes(g: nx.DiGraph, aggregate: bool = True,
                 held: dict[str, int] | None = None,
                 current: list[str] | None = None,
                 attrs: Mapping[str, dict[str, Any]] | None = None) -> list[list[str]]:
    """Node vertices grouped into interchangeable classes (see the module docstring).

    Per node group: the nodes holding no running job's present placement form
    one class when the TP sizes of the cells that may use the group form a
    divisibility chain dividing the node size; every other node is its own
    class. ``aggregate=False`` gives one class per node (the plain model).

    With ``held`` (residual mode), nodes holding running jobs are grouped too,
    by the GPUs they have left when every running job stays (nodes with none
    left drop out): other cells then use only what is left. ``current``:
    :func:`current_cells` of ``g`` and ``attrs``, its vertices' attribute dicts by vertex,
    where the caller has them.
    """
    if attrs is None:
        attrs = dict(g.nodes(data=True))
    pinned = {nn for cn in (current_cells(g) if current is None else current)
              for nn in pinned_nodes(g, cn)}
    classes: list[list[str]] = []
    groups = sorted(group_vertices(g), key=natural_key)
    for gv in groups:
        d = g.nodes[gv]
        members = sorted(d["nodes"], key=natural_key)
        users = [attrs[cn] for cn in g.pred[gv]]
        tps = {unit_of(u) for u in users}
        most = _most_per_gpu(users)
        buckets: dict[int, list[str]] = {}
        if held is None:
            classes.extend([m] for m in members if m in pinned)
            buckets[int(d["node_gpus"])] = [m for m in members if m not in pinned]
        else:
            for m in members:
                left = int(g.nodes[m]["capacity"]) - held.get(m, 0)
                if left > 0 or (REUSE_FREED and m in pinned):
                    buckets.setdefault(left, []).append(m)
        for size, nodes in sorted(buckets.items()):
            if aggregate and len(nodes) > 1 and (not tps or _divisible_chain(tps, size)) \
                    and _resources_never_bind(most, g.nodes[nodes[0]], size):
                classes.append(nodes)
            else:
                classes.extend([m] for m in nodes)
    grouped = {m for c in classes for m in c}
    loose = [n for n in node_vertices(g) if n not in grouped and (held is None or n not in pinned)]
    classes.extend([n] for n in sorted(loose, key=natural_key))
    return classes


# Past this many nodes holding running jobs, exact per-node classes for them make the model
# too big at cluster scale: residual mode aggregates them (capacity a running job frees by
# moving is then usable from the next round on).
PINNED_EXACT_LIMIT = 48
# Residual mode counts what a running job frees by moving (or being stopped) as usable in the
# same round, so the optimum can swap jobs between GPU types in one round (see the docstring).
REUSE_FREED = True


def build_cells_model(g: nx.DiGraph, value_attr: str = "value",
                      max_changes: int | None = None, aggregate: bool = True,
                      resources: bool | None = None) -> LinearModel:
    """Read the candidate graph by attribute names and build the neutral model.

    ``resources`` adds per-node CPU and host-memory rows from the cells'
    ``cpus_per_gpu`` / ``host_mem_gib_per_gpu`` and the nodes' ``cpus`` /
    ``host_memory_gib`` (default: when the cells carry them). Node groups whose
    CPUs or memory could bind keep one class per node (the divisibility
    argument covers GPUs only).
    Cells with a ``quota_tenant`` count against ``g.graph["quotas"]``.

    One helper per row family, in the model's order: the cells' columns with their
    ``size`` and ``one`` rows (:func:`_add_cell_columns`), the classes' ``cap`` rows
    (:func:`_add_capacity_rows`), the nodes' ``cpu`` and ``mem`` rows
    (:func:`_add_resource_rows`), then the ``quota`` and ``depth`` rows.
    """
    # the vertices' attribute dicts, read once (networkx's views build an object per lookup)
    attrs = dict(g.nodes(data=True))
    if resources is None:
        resources = any(d.get("kind") == "cell" and "cpus_per_gpu" in d for d in attrs.values())
    m = LinearModel(g.graph.get("formulation", "cells"), sense="max")
    nc = _node_classes_of(g, aggregate, attrs)
    cols = _add_cell_columns(m, g, nc, attrs, value_attr)
    _add_capacity_rows(m, nc, cols)
    if resources:  # rows only for one-node classes: aggregated ones can never bind (see above)
        _add_resource_rows(m, g, nc, cols)
    add_quota_and_change_rows(m, g, cols.cell_cols, max_changes)
    m.decode = _cells_decoder(g, nc, cols)
    # the relaxation of cells over GPUs alone is near-integral: the solver chain takes its
    # rounded answer as final (solvers.chain_rules.lp_rounding_final, measured on replays);
    # CPU and memory rows (the plans formulation) are not covered by that measurement
    m.meta.update(cell_cols=cols.cell_cols, place_cols=cols.place_cols, classes=nc.classes,
                  node_classes=len(nc.classes), residual_mode=nc.residual,
                  lp_rounding_final=not resources)
    return m


@dataclass
class _NodeClasses:
    """The round's node classes and what each may give a new cell: what every row family
    and the decoder read, so that they all count a class's GPUs the same way."""

    g: nx.DiGraph
    classes: list[list[str]]
    #: residual mode: GPUs each node's running jobs hold if they stay (else empty)
    held: dict[str, int]
    residual: bool
    #: residual mode with ``REUSE_FREED``: what a moved job frees is usable this round
    reuse: bool
    class_of: dict[str, int] = field(init=False)
    #: a class's name in variable keys and row names: the same class keeps it from round
    #: to round while its members come and go (a session kept across rounds matches by name)
    label: list[str] = field(init=False)
    _behind: dict[str, list[int]] = field(default_factory=dict)
    _usable: dict[tuple[int, int], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.class_of = {nn: i for i, members in enumerate(self.classes) for nn in members}
        self.label = [members[0] if len(members) == 1 else
                      f"{self.g.nodes[members[0]]['group']}/{self.cap_of(members[0])}"
                      for members in self.classes]

    def cap_of(self, n: str) -> int:
        """GPUs of node n nobody holds (residual mode: if every running job stays)."""
        return int(self.g.nodes[n]["capacity"]) - self.held.get(n, 0)

    def cap_max(self, n: str) -> int:
        """GPUs of node n a new cell may use: all of them if the running jobs there move."""
        return int(self.g.nodes[n]["capacity"]) if self.reuse else self.cap_of(n)

    def classes_behind(self, vertex: str) -> list[int]:
        """Classes of the nodes behind a group or node vertex (memoised: groups are big)."""
        if vertex not in self._behind:
            self._behind[vertex] = sorted({self.class_of[n] for n in member_nodes(self.g, vertex)
                                           if n in self.class_of})
        return self._behind[vertex]

    def usable(self, k: int, unit: int) -> int:
        """GPUs of class k usable in whole units of ``unit`` (memoised)."""
        if (k, unit) not in self._usable:
            self._usable[k, unit] = sum(self.cap_max(n) // unit * unit for n in self.classes[k])
        return self._usable[k, unit]


def _node_classes_of(g: nx.DiGraph, aggregate: bool,
                     attrs: Mapping[str, dict[str, Any]]) -> _NodeClasses:
    """The classes, residual mode past ``PINNED_EXACT_LIMIT`` busy nodes (module
    docstring): the model's size must not grow with how busy the cluster is."""
    current = current_cells(g)
    held_all = held_by_running(g, current)
    residual = aggregate and len(held_all) > PINNED_EXACT_LIMIT
    held = held_all if residual else {}
    classes = node_classes(g, aggregate, held if residual else None, current, attrs)
    return _NodeClasses(g, classes, held, residual, residual and REUSE_FREED)


@dataclass
class _CellColumns:
    """The cells' columns and where each may be placed, for the rows after them and the
    decoder."""

    #: a cell's x column
    cell_cols: dict[str, int]
    #: per cell: (class, column, unit, units per column value): y columns count units (1),
    #: a cell that fits one class wholly uses its x column (gpus / unit units when chosen)
    place_cols: dict[str, list[tuple[int, int, int, int]]]
    #: residual mode: keep cells stay where they are (node name: GPUs)
    fixed: dict[str, dict[str, int]]
    #: a class's capacity row, made when a column first uses the class (the rows' order)
    class_rows: defaultdict[int, dict[int, float]]


#: a placement shape: the one class that holds the cell whole, or its unit columns'
#: classes, bounds and labels
_Shape = tuple[int | None, tuple[int, ...], tuple[float, ...], tuple[str, ...]]


def _place_shape(nc: _NodeClasses, edges: Mapping[str, dict[str, Any]], tp: int,
                 gpus: int) -> _Shape:
    """Where a cell of ``gpus`` GPUs in units of ``tp`` may go over ``edges``: one class
    when one holds it whole (no y columns), else a column per class where a unit fits."""
    cap_by_class: dict[int, int] = {}
    for succ, ea in edges.items():
        edge_cap = int(ea["max_gpus"])
        for k in nc.classes_behind(succ):
            cap_by_class[k] = min(edge_cap, cap_by_class.get(k, 0) + nc.usable(k, tp))
    if len(cap_by_class) == 1 and next(iter(cap_by_class.values())) >= gpus:
        return (next(iter(cap_by_class)), (), (), ())
    # a column per class where a whole unit fits
    fit = [(k, float(min(cap, gpus) // tp), nc.label[k])
           for k, cap in sorted(cap_by_class.items()) if min(cap, gpus) // tp > 0]
    return (None, tuple(f[0] for f in fit), tuple(f[1] for f in fit),
            tuple(f[2] for f in fit))


def _add_cell_columns(m: LinearModel, g: nx.DiGraph, nc: _NodeClasses,
                      attrs: Mapping[str, dict[str, Any]], value_attr: str) -> _CellColumns:
    """Every cell's x column, its y columns per class, its ``size`` row and every job's
    ``one`` row (with the merged cells' member rows), added in bulk.

    The loop visits every cell: it reads the graph's own attribute and successor dicts
    (networkx's views build an object per lookup), collects the columns and rows in the
    order one call each would add them, and adds them in bulk after it (a replay builds
    this model every round: one call per column was a fifth of its Python)."""
    out = _CellColumns({}, {}, {}, defaultdict(dict))
    succ_of = dict(g.adjacency())
    base = m.num_vars
    # the new columns' keys, upper bounds and costs (every one is integer from 0)
    keys: list[Hashable] = []
    ubs: list[float] = []
    objs: list[float] = []
    new_rows: list[tuple[dict[int, float], float, float, str]] = []
    # where a cell may go depends only on its size, unit and edges: per build, each such
    # shape's one class (a cell it holds whole) or its unit columns' classes, bounds and
    # labels
    shapes: dict[tuple[Any, ...], _Shape] = {}
    for jid in jobs_in(g):
        cols = []
        for cn in cells_of(g, jid):
            d = attrs[cn]
            x = base + len(keys)
            keys.append(("x", cn))
            ubs.append(1.0)
            objs.append(float(d[value_attr]))
            out.cell_cols[cn] = x
            cols.append(x)
            tp, gpus = unit_of(d), int(d["gpus"])
            edges = succ_of[cn]
            if nc.residual and d.get("current"):
                out.fixed[cn] = {name_of(nn): int(ea["max_gpus"]) for nn, ea in edges.items()}
                out.place_cols[cn] = []
                continue
            if len(edges) == 1:  # the usual cell: one group's edge
                ((v, ea),) = edges.items()
                key: tuple[Any, ...] = (tp, gpus, v, ea["max_gpus"])
            else:
                key = (tp, gpus, *[(v, ea["max_gpus"]) for v, ea in edges.items()])
            shape = shapes.get(key)
            if shape is None:
                shape = shapes[key] = _place_shape(nc, edges, tp, gpus)
            whole, ks, bounds, labs = shape
            if whole is not None:
                # one class can hold the whole cell: its units there are x * gpus/unit, no y
                out.class_rows[whole][x] = float(gpus)
                out.place_cols[cn] = [(whole, x, tp, gpus // tp)]
                continue
            unit = float(tp)
            y0 = base + len(keys)
            ys = range(y0, y0 + len(ks))
            keys += zip(itertools.repeat("y"), itertools.repeat(cn), labs)  # ("y", cn, label)
            ubs += bounds
            objs += itertools.repeat(0.0, len(ks))
            link = {x: -float(gpus)}
            link.update(zip(ys, itertools.repeat(unit)))
            for k, y in zip(ks, ys):
                out.class_rows[k][y] = unit
            out.place_cols[cn] = list(zip(ks, ys, itertools.repeat(tp), itertools.repeat(1)))
            new_rows.append((link, 0.0, 0.0, f"size[{cn}]"))
        if cols:
            new_rows.append(({c: 1.0 for c in cols}, -INF, 1.0, f"one[{jid}]"))
    m.add_columns(keys, itertools.repeat(0.0), ubs, itertools.repeat(True), objs)
    if g.graph.get("siblings"):  # merged cells also sit in their members' rows
        cover_members(g, out.cell_cols, new_rows)
    m.add_rows(new_rows)
    return out


def _add_capacity_rows(m: LinearModel, nc: _NodeClasses, cols: _CellColumns) -> None:
    """Each class's ``cap`` row; with ``REUSE_FREED`` a kept cell holds its GPUs there and a
    moved or stopped one gives them to others (module docstring)."""
    if nc.reuse:  # a kept cell holds its GPUs; a moved or stopped one gives them to others
        for cn, place in cols.fixed.items():
            for name, k in place.items():
                kk = nc.class_of.get(node_node(name))
                if kk is not None and kk in cols.class_rows:
                    row = cols.class_rows[kk]
                    row[cols.cell_cols[cn]] = row.get(cols.cell_cols[cn], 0.0) + float(k)
    for k, row in cols.class_rows.items():
        cap = sum(nc.cap_max(nn) if nc.reuse else nc.cap_of(nn) for nn in nc.classes[k])
        m.add_row(row, ub=float(cap), name=f"cap[{nc.label[k]}]")


def _add_resource_rows(m: LinearModel, g: nx.DiGraph, nc: _NodeClasses,
                       cols: _CellColumns) -> None:
    """Each one-node class's ``cpu`` and ``mem`` rows, less what the kept cells hold there
    (aggregated classes' rows can never bind: :func:`node_classes`)."""
    cpu_rows: dict[int, dict[int, float]] = {}
    mem_rows: dict[int, dict[int, float]] = {}
    for cn, place_cols in cols.place_cols.items():
        d = g.nodes[cn]
        for k, y, tp, mult in place_cols:
            cpu_rows.setdefault(k, {})[y] = tp * mult * float(d.get("cpus_per_gpu", 0.0))
            mem_rows.setdefault(k, {})[y] = tp * mult * float(d.get("host_mem_gib_per_gpu", 0.0))
    held_cpu: dict[str, float] = {}
    held_mem: dict[str, float] = {}
    for cn, place in cols.fixed.items():
        d = g.nodes[cn]
        for name, k in place.items():
            held_cpu[name] = held_cpu.get(name, 0.0) + k * float(d.get("cpus_per_gpu", 0.0))
            held_mem[name] = held_mem.get(name, 0.0) + k * float(d.get("host_mem_gib_per_gpu", 0.0))
    for k in sorted(cpu_rows):
        if len(nc.classes[k]) != 1:
            continue
        (nn,) = nc.classes[k]
        name = name_of(nn)
        m.add_row(cpu_rows[k], ub=float(g.nodes[nn].get("cpus", math.inf)) - held_cpu.get(name, 0.0),
                  name=f"cpu[{nn}]")
        m.add_row(mem_rows[k], ub=float(g.nodes[nn].get("host_memory_gib", math.inf))
                  - held_mem.get(name, 0.0), name=f"mem[{nn}]")


def _cells_decoder(g: nx.DiGraph, nc: _NodeClasses,
                   cols: _CellColumns) -> Callable[[np.ndarray], list[CellChoice]]:
    """The model's decode: the chosen cells placed node by node, first fit decreasing per
    class (exact for divisible sizes, module docstring); in residual mode with reuse, a
    cell the freed GPUs cannot hold is left out (a valid, slightly worse answer)."""
    cell_cols, place_cols, fixed = cols.cell_cols, cols.place_cols, cols.fixed
    classes, reuse, cap_of = nc.classes, nc.reuse, nc.cap_of

    def decode(xv: np.ndarray) -> list[CellChoice]:
        chosen = [cn for cn, xc in cell_cols.items() if xv[xc] > 0.5]
        placements: dict[str, dict[str, int]] = {cn: dict(fixed.get(cn, {})) for cn in chosen}
        freed: dict[str, int] = {}
        for cn, place in fixed.items():
            if reuse and xv[cell_cols[cn]] <= 0.5:
                for name, k in place.items():
                    freed[name] = freed.get(name, 0) + k
        free = {nn: cap_of(nn) + freed.get(name_of(nn), 0)
                for members in classes for nn in members}

        # per (class, unit): the first node that may still take a unit. First fit fills a
        # class's nodes from the front and, while the classes are packed, free GPUs only
        # fall, so a node before it never takes one again: skipping them is the same first
        # fit, without walking a 20,480-GPU cluster's full nodes for every cell
        first: dict[tuple[int, int], int] = {}

        def pack(cn: str, tp: int, groups: int, nodes: list[str],
                 key: tuple[int, int] | None = None) -> int:
            """First fit of ``groups`` units of ``tp`` GPUs on ``nodes``; the units left.
            ``key`` (class, unit): the nodes only lose free GPUs until the next call with
            the same key (see ``first``)."""
            i = first.get(key, 0) if key is not None else 0
            while i < len(nodes) and free[nodes[i]] < tp:
                i += 1
            if key is not None:
                first[key] = i
            for nn in itertools.islice(nodes, i, None):
                if groups == 0:
                    break
                fit = min(groups, free[nn] // tp)
                if fit > 0:
                    free[nn] -= fit * tp
                    groups -= fit
                    name = name_of(nn)
                    placements[cn][name] = placements[cn].get(name, 0) + fit * tp
            return groups

        left_over: list[tuple[str, int, int]] = []
        for k, members in enumerate(classes):
            demand = [(tp, int(round(xv[y])) * mult, cn) for cn in chosen
                      for kk, y, tp, mult in place_cols[cn] if kk == k and round(xv[y]) > 0]
            # first-fit decreasing by TP size, then by cell size: exact for divisible sizes
            for tp, groups, cn in sorted(demand, key=lambda t: (-t[0], -t[1], t[2])):
                groups = pack(cn, tp, groups, members, (k, tp))
                if groups and not reuse:
                    raise DecodeError(f"class {k} could not pack {cn}: aggregation not exact")
                if groups:
                    left_over.append((cn, tp, groups))
        # reuse: the freed GPUs sit on particular nodes of a class, so its aggregate can
        # over-promise; what did not fit goes to any other node the cell may use, and a cell
        # that still does not fit is not placed (its GPUs go back): a valid, slightly
        # worse schedule, never a wrong one
        dropped: set[str] = set()
        for cn, tp, groups in left_over:
            if cn in dropped:
                continue
            nodes = [nn for succ in g.succ[cn] for nn in member_nodes(g, succ) if nn in free]
            if pack(cn, tp, groups, sorted(nodes, key=lambda nn: -free[nn])):
                for name, k in placements[cn].items():
                    if name not in fixed.get(cn, {}):
                        free[node_node(name)] += k
                dropped.add(cn)
        if dropped:
            log.info("residual decode: %d chosen cell(s) did not fit the nodes freed for them "
                     "and were left out", len(dropped))
        chosen = [cn for cn in chosen if cn not in dropped]
        return [CellChoice(g.nodes[cn]["job"], cn, placements[cn]) for cn in chosen]

    return decode


def cover_members(g: nx.DiGraph, cell_cols: dict[str, int],
                  rows: list[tuple[dict[int, float], float, float, str]]) -> None:
    """A merged cell (``members``: :mod:`apportion.formulations.siblings`) is one column
    serving several jobs: each member's ``one[...]`` row holds it beside the member's own
    cells (a row is made for a member with none), so every job gets at most one column."""
    cover = member_cover(g, list(cell_cols))
    if not cover:
        return
    at = {name: i for i, (_, _, _, name) in enumerate(rows) if name.startswith("one[")}
    for member, cells in sorted(cover.items()):
        cols = {cell_cols[cn]: 1.0 for cn in cells}
        i = at.get(f"one[{member}]")
        if i is None:
            rows.append((cols, -INF, 1.0, f"one[{member}]"))
        else:
            rows[i][0].update(cols)


def hint_from_choices(m: LinearModel, choices: list[CellChoice]) -> dict[int, float]:
    """A complete solution vector (as a hint) from decoded choices, e.g. the greedy's."""
    cell_cols: dict[str, int] = m.meta["cell_cols"]
    place_cols: dict[str, list[tuple[int, int, int, int]]] = m.meta["place_cols"]
    classes: list[list[str]] = m.meta["classes"]
    hint = {i: 0.0 for i in range(m.num_vars)}
    # each node's class, once: summing a placement over a class's every node was
    # choices x nodes (12 s of a 10,000-job round on 20,480 GPUs)
    class_of = {name_of(nn): k for k, members in enumerate(classes) for nn in members}
    for ch in choices:
        if ch.cell not in cell_cols:
            continue
        hint[cell_cols[ch.cell]] = 1.0
        per_class: dict[int, int] = {}
        for name, k_gpus in ch.placement.items():
            if name in class_of:
                per_class[class_of[name]] = per_class.get(class_of[name], 0) + k_gpus
        for k, y, tp, mult in place_cols[ch.cell]:
            if mult == 1:
                hint[y] = float(per_class.get(k, 0) // tp)
    return hint


def objective_of(g: nx.DiGraph, choices: list[CellChoice], value_attr: str = "value") -> float:
    return float(sum(g.nodes[c.cell][value_attr] for c in choices))


def describe(g: nx.DiGraph) -> dict[str, Any]:
    jobs = jobs_in(g)
    return {"jobs": len(jobs), "cells": sum(len(cells_of(g, j)) for j in jobs),
            "nodes": len(node_vertices(g)),
            "placeable_jobs": sum(1 for j in jobs if g.nodes[job_node(j)]["reason"] is None)}


def add_quota_and_change_rows(m: LinearModel, g: nx.DiGraph, cell_cols: dict[str, int],
                              max_changes: int | None) -> None:
    """The rows every model over cells shares whatever its resource rows: each tenant's
    guaranteed GPUs within its quota (``g.graph["quotas"]``, the cells' ``quota_tenant``),
    and at most ``max_changes`` running jobs moved off their present cell."""
    quotas: dict[str, int] = g.graph.get("quotas") or {}
    quota_rows: dict[str, dict[int, float]] = {}
    for cn, xc in cell_cols.items() if quotas else ():
        t = g.nodes[cn].get("quota_tenant")
        if t is not None and t in quotas:
            quota_rows.setdefault(t, {})[xc] = float(g.nodes[cn]["gpus"])
    for t, row in sorted(quota_rows.items()):
        m.add_row(row, ub=float(quotas[t]), name=f"quota[{t}]")
    if max_changes is not None:
        cur = [cell_cols[cn] for cn in current_cells(g) if cn in cell_cols]
        if cur:  # sum (1 - x_cur) <= D  <=>  sum x_cur >= |cur| - D
            m.add_row({c: 1.0 for c in cur}, lb=float(len(cur) - max_changes), name="depth")
