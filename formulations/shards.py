"""Hydra's shard-unit scheduling problem (SHARP, section 5.3 of the Hydra paper) as math.

The problem types and the shard-unit graph live in the core
(:mod:`apportion.shards_spec`, re-exported here so existing imports keep
working). This module reads the graph — unit vertices with ``runtime`` and
``memory``, precedence edges inside a model, ``runs-on`` edges to the device
vertices that hold a unit, with its ``duration`` there — and holds the
solver-free part:

* lower bounds (fluid work bound and longest chain), reported with every solve;
* the paper's big-M MILP as a neutral :class:`LinearModel` with a decoder,
  variables keyed by the graph's vertex keys, coefficients read from its
  attributes;
* :func:`schedule_from_orders`, which turns any solver's (device, order) answer
  into a left-shifted schedule in exact float time, so integer rounding in
  CP-SAT or tolerances in HiGHS can never produce an overlapping schedule.

Every entry point takes the graph (:func:`~apportion.shards_spec.shard_graph`)
or a :class:`ShardProblem`, which it encodes first.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence

import networkx as nx
import numpy as np
from apportion.formulations.model import LinearModel

from apportion.shards_spec import (
    DEFAULT_BUFFER_FRACTION,
    PRECEDENCE,
    Placement,
    ShardDevice,
    ShardModel,
    ShardProblem,
    UnitKey,
    as_graph,
    chain_runtimes,
    chains,
    duration,
    load_problem,
    lower_bound,
    problem_from_dict,
    problem_to_dict,
    runs_on,
    shard_graph,
    trivial_horizon,
    unit_key,
    units_of,
)

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_BUFFER_FRACTION", "MILP_MAX_UNITS", "Placement", "ShardDevice", "ShardModel",
           "ShardProblem", "build_milp", "chain_runtimes", "load_problem", "makespan",
           "orders_of", "problem_from_dict", "problem_to_dict", "schedule_from_orders",
           "shard_graph", "unit_graph"]

#: Above this many units the big-M MILP is not built: its order binaries grow as
#: L^2/2 and its rows as L^2 * |P|; at 60 units on 4 devices that is ~1,500
#: binaries and ~12,000 rows, where HiGHS no longer closes the gap in seconds.
MILP_MAX_UNITS = 60


def unit_graph(problem: ShardProblem | nx.DiGraph) -> nx.DiGraph:
    """The shard-unit graph of ``problem`` (:func:`apportion.shards_spec.shard_graph`)."""
    return as_graph(problem)


# -- schedules ------------------------------------------------------------------------------
def makespan(schedule: Sequence[Placement]) -> float:
    return max((p.end for p in schedule), default=0.0)


def schedule_from_orders(
    problem: ShardProblem | nx.DiGraph, assignment: dict[tuple[int, int], int],
    device_orders: Sequence[Sequence[tuple[int, int]]],
    device_ready: Sequence[float] | None = None, model_ready: Sequence[float] | None = None,
) -> list[Placement]:
    """Left-shifted schedule from a device per unit and a unit order per device.

    Units are named ``(model, unit)`` (the indices of their graph keys). Each unit
    starts when both its chain predecessor (the graph's precedence edge) and its
    device predecessor have ended (and not before its device's or chain's ready time,
    if given), in exact float durations read from the graph's ``runs-on`` edges.
    Solvers decode through this so their rounding never leaks into the schedule; the
    makespan can only shrink versus the solver's own times. Raises ValueError if the
    orders form a cycle.
    """
    g = as_graph(problem)
    order = nx.DiGraph()
    for u, v, d in g.edges(data=True):
        if d.get("kind") == PRECEDENCE:
            order.add_edge(u[1:], v[1:])
    order.add_nodes_from(u[1:] for u in units_of(g))
    for dev_order in device_orders:
        for a, b in itertools.pairwise(dev_order):
            order.add_edge(a, b)
    try:
        topo = list(nx.topological_sort(order))
    except nx.NetworkXUnfeasible as exc:
        raise ValueError("device orders contradict the chains (cycle)") from exc
    end: dict[tuple[int, int], float] = {}
    first_on: dict[tuple[int, int], int] = {o[0]: p for p, o in enumerate(device_orders) if o}
    out = []
    for u in topo:
        start = max((end[v] for v in order.predecessors(u)), default=0.0)
        if model_ready is not None and u[1] == 0:
            start = max(start, model_ready[u[0]])
        if device_ready is not None and u in first_on:
            start = max(start, device_ready[first_on[u]])
        p = assignment[u]
        end[u] = start + duration(g, unit_key(*u), p)
        out.append(Placement(u[0], u[1], p, start, end[u]))
    out.sort(key=lambda pl: (pl.start, pl.end, pl.model, pl.unit))
    return out


def orders_of(schedule: Sequence[Placement], num_devices: int
              ) -> tuple[dict[tuple[int, int], int], list[list[tuple[int, int]]]]:
    """Inverse of :func:`schedule_from_orders`: device per unit and order per device."""
    assignment = {(p.model, p.unit): p.device for p in schedule}
    orders: list[list[tuple[int, int]]] = [[] for _ in range(num_devices)]
    for p in sorted(schedule, key=lambda q: (q.start, q.end, q.model, q.unit)):
        orders[p.device].append((p.model, p.unit))
    return assignment, orders


# -- the big-M MILP of section 5.3.1 ------------------------------------------------------------
def build_milp(problem: ShardProblem | nx.DiGraph, horizon: float | None = None,
               hint: Sequence[Placement] | None = None) -> LinearModel:
    """The paper's makespan MILP with explicit device choice, as a neutral model read
    from the shard-unit graph.

    Variables, keyed by graph keys: start ``s[u]`` per unit vertex, device choice
    ``a[u,p]`` per ``runs-on`` edge (binary), order ``y[u,v]`` (binary, u before v, for
    units of different models that share a device; one y per pair serves every
    device, since two units share at most one device) and the makespan ``C``. Rows:
    one device per unit; chain precedence along the precedence edges (a); the
    disjunctive pair (b)/(c), switched off by big-M unless both units sit on p; the
    makespan (e). Durations are the ``runs-on`` edges' ``duration``. U = horizon +
    longest duration, where horizon is an upper bound on the optimal makespan (the
    greedy makespan when a hint is given). The paper's X_{t,p,j} duplicates the start
    per device without saying where a unit runs; a start per unit plus a[u,p] is the
    standard repair.
    """
    g = as_graph(problem)
    units = units_of(g)
    if len(units) > MILP_MAX_UNITS:
        raise ValueError(f"{len(units)} units exceed the MILP limit of {MILP_MAX_UNITS}")
    if horizon is None:
        horizon = makespan(hint) if hint else trivial_horizon(g)
    on = {u: runs_on(g, u) for u in units}
    dmax = max(t for u in units for _, t in on[u])
    big = horizon + dmax + 1.0
    lm = LinearModel(name="hydra-sharp-makespan", sense="min")
    s = {u: lm.add_var(("s", u), 0.0, horizon) for u in units}
    a = {(u, p): lm.binary(("a", u, p)) for u in units for p, _ in on[u]}
    c = lm.add_var(("C",), lower_bound(g), horizon + 1e-6 * max(1.0, horizon), obj=1.0)

    def dur(u: tuple[str, int, int]) -> list[tuple[int, float]]:
        return [(a[u, p], t) for p, t in on[u]]

    for u in units:
        lm.add_row([(a[u, p], 1.0) for p, _ in on[u]], 1.0, 1.0, f"assign{u[1:]}")
    for chain in chains(g):
        for u, v in itertools.pairwise(chain):
            lm.add_row([(s[v], 1.0), (s[u], -1.0)] + [(k, -d) for k, d in dur(u)], 0.0,
                       name=f"chain{v[1:]}")
        last = chain[-1]
        lm.add_row([(c, 1.0), (s[last], -1.0)] + [(k, -d) for k, d in dur(last)], 0.0,
                   name=f"makespan{last[1]}")
    y = _disjunctive_rows(lm, units, on, s, a, big)
    lm.meta.update(kind="hydra-milp", big_m=big, horizon=horizon, units=len(units), pairs=len(y))
    n_dev = len(g.graph["devices"])

    def decode(xv: np.ndarray) -> list[Placement]:
        assignment = {u[1:]: max((p for p, _ in on[u]), key=lambda p: xv[a[u, p]])
                      for u in units}
        orders: list[list[tuple[int, int]]] = [[] for _ in range(n_dev)]
        for u in sorted(units, key=lambda q: (xv[s[q]], q)):
            orders[assignment[u[1:]]].append(u[1:])
        return schedule_from_orders(g, assignment, orders)

    lm.decode = decode
    if hint:
        lm.set_hint(_milp_hint(hint, units, on, s, a, y, c))
    return lm


def _disjunctive_rows(lm: LinearModel, units: list[UnitKey],
                      on: dict[UnitKey, list[tuple[int, float]]], s: dict[UnitKey, int],
                      a: dict[tuple[UnitKey, int], int],
                      big: float) -> dict[tuple[UnitKey, UnitKey], int]:
    """The order variable ``y[u,v]`` of every pair of units of different models that may
    share a device, and its disjunctive rows (b)/(c) per shared device, switched off by
    big-M unless both units sit there."""
    y: dict[tuple[UnitKey, UnitKey], int] = {}
    for x, u in enumerate(units):
        tu = dict(on[u])
        for v in units[x + 1:]:
            if u[1] == v[1]:
                continue
            tv = dict(on[v])
            common = set(tu) & set(tv)
            if not common:
                continue
            y[u, v] = yv = lm.binary(("y", u, v))
            for p in sorted(common):
                du, dv = tu[p], tv[p]
                # y=1 (u first) and both on p: s_v >= s_u + du
                lm.add_row([(s[v], 1.0), (s[u], -1.0), (yv, -big), (a[u, p], -big),
                            (a[v, p], -big)], du - 3 * big, name=f"b{u[1:]}{v[1:]}{p}")
                # y=0 (v first) and both on p: s_u >= s_v + dv
                lm.add_row([(s[u], 1.0), (s[v], -1.0), (yv, big), (a[u, p], -big),
                            (a[v, p], -big)], dv - 2 * big, name=f"c{u[1:]}{v[1:]}{p}")
    return y


def _milp_hint(hint: Sequence[Placement], units: list[UnitKey],
               on: dict[UnitKey, list[tuple[int, float]]], s: dict[UnitKey, int],
               a: dict[tuple[UnitKey, int], int], y: dict[tuple[UnitKey, UnitKey], int],
               c: int) -> dict[int, float]:
    """The hint schedule as column values: its makespan, starts, devices and orders."""
    values: dict[int, float] = {c: makespan(hint)}
    by_unit = {unit_key(pl.model, pl.unit): pl for pl in hint}
    for u in units:
        values[s[u]] = by_unit[u].start
        for p, _ in on[u]:
            values[a[u, p]] = 1.0 if by_unit[u].device == p else 0.0
    for (u, v), k in y.items():
        values[k] = 1.0 if (by_unit[u].start, u) < (by_unit[v].start, v) else 0.0
    return values
