"""The SHARP makespan problem as a CP-SAT interval model (flexible job shop).

The model is read from the shard-unit graph (:mod:`apportion.shards_spec`): an
interval per unit vertex, an optional interval per ``runs-on`` edge with the
edge's ``duration``, chain precedence along the precedence edges.

The big-M MILP needs a binary per pair of units; CP-SAT's NoOverlap over
interval variables expresses the same disjunction without pairs, which is why
it scales to hundreds of units where the MILP stops at tens. This module only
*builds* the model (it may import ortools, as DESIGN.md allows for job-shop
formulations); :mod:`apportion.solvers.shards` runs it.

Time is scaled to integer ticks (``scale`` ticks per second, chosen so the
horizon is about 10^7 ticks) and durations are rounded *up*, so any tick
schedule is feasible in real time; :meth:`CpSatShardModel.decode` keeps only
each unit's device and the order on each device and rebuilds exact float times
with :func:`schedule_from_orders`.

Extras for rolling horizons: ``device_ready`` (a device is busy until then),
``model_ready`` (a chain's first unit may not start before then) and ``tails``
(work left after this window, added to each chain's end in the objective, which
is then ``max_i end_i + tail_i`` — the LRTF intuition made exact per window).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
from apportion.formulations.shards import (
    Placement,
    ShardProblem,
    makespan,
    orders_of,
    schedule_from_orders,
)
from ortools.sat.python import cp_model

from apportion.shards_spec import as_graph, chains, duration, runs_on, trivial_horizon, unit_key

_HORIZON_TICKS = 10_000_000


@dataclass
class CpSatShardModel:
    """A built CP-SAT model plus the handles needed to decode its solution."""

    model: cp_model.CpModel
    scale: float
    graph: nx.DiGraph
    starts: dict[tuple[int, int], cp_model.IntVar]
    presence: dict[tuple[tuple[int, int], int], Any]
    objective: cp_model.IntVar
    device_ready: list[float] = field(default_factory=list)
    model_ready: list[float] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def decode(self, solver: cp_model.CpSolver) -> list[Placement]:
        """Device and per-device order from the solver, exact times by left-shifting."""
        g = self.graph
        assignment: dict[tuple[int, int], int] = {}
        for u in self.starts:
            choices = [p for p, _ in runs_on(g, unit_key(*u))]
            if len(choices) == 1:
                assignment[u] = choices[0]
            else:
                assignment[u] = next(d for d in choices if solver.boolean_value(self.presence[u, d]))
        orders: list[list[tuple[int, int]]] = [[] for _ in g.graph["devices"]]
        for u in sorted(self.starts, key=lambda q: (solver.value(self.starts[q]), q)):
            orders[assignment[u]].append(u)
        return schedule_from_orders(g, assignment, orders, self.device_ready, self.model_ready)


def build_cpsat(
    problem: ShardProblem | nx.DiGraph,
    hint: Sequence[Placement] | None = None,
    horizon: float | None = None,
    device_ready: Sequence[float] | None = None,
    model_ready: Sequence[float] | None = None,
    tails: Sequence[float] | None = None,
) -> CpSatShardModel:
    """Interval variables per unit vertex, an optional interval per ``runs-on`` edge with
    ExactlyOne presence, NoOverlap per device, precedence along the chains, and the
    makespan (plus tails) minimised. ``hint`` (e.g. the Sharded-LRTF schedule) becomes
    CP-SAT solution hints and, when no horizon is given, the horizon."""
    g = as_graph(problem)
    model_chains = chains(g)
    n_dev = len(g.graph["devices"])
    dev_ready = list(device_ready) if device_ready is not None else [0.0] * n_dev
    mod_ready = list(model_ready) if model_ready is not None else [0.0] * len(model_chains)
    tail = list(tails) if tails is not None else [0.0] * len(model_chains)
    if horizon is None:
        horizon = makespan(hint) if hint else trivial_horizon(g)
        horizon += max(dev_ready + mod_ready + [0.0])
    horizon = max(horizon, 1e-9)
    scale = _HORIZON_TICKS / horizon

    def ticks(t: float) -> int:
        return math.ceil(t * scale - 1e-9)

    units = [u[1:] for c in model_chains for u in c]
    on = {u: runs_on(g, unit_key(*u)) for u in units}
    h = ticks(horizon) + ticks(max(tail + [0.0])) + len(units) + 1
    m = cp_model.CpModel()
    starts: dict[tuple[int, int], cp_model.IntVar] = {}
    ends: dict[tuple[int, int], cp_model.IntVar] = {}
    presence: dict[tuple[tuple[int, int], int], Any] = {}
    per_device: list[list[Any]] = [[] for _ in range(n_dev)]
    for p, t in enumerate(dev_ready):
        if t > 0:
            per_device[p].append(m.new_fixed_size_interval_var(0, ticks(t), f"busy{p}"))
    for u in units:
        s = m.new_int_var(0, h, f"s{u}")
        e = m.new_int_var(0, h, f"e{u}")
        starts[u], ends[u] = s, e
        choices = on[u]
        if len(choices) == 1:
            p, d = choices[0]
            per_device[p].append(m.new_interval_var(s, ticks(d), e, f"i{u}"))
            continue
        lits = []
        for p, d in choices:
            lit = m.new_bool_var(f"l{u}{p}")
            presence[u, p] = lit
            lits.append(lit)
            per_device[p].append(m.new_optional_interval_var(s, ticks(d), e, lit, f"o{u}{p}"))
        m.add_exactly_one(lits)
    for ivs in per_device:
        if len(ivs) > 1:
            m.add_no_overlap(ivs)
    obj = m.new_int_var(0, h, "makespan")
    for i, chain in enumerate(model_chains):
        if mod_ready[i] > 0:
            m.add(starts[i, 0] >= ticks(mod_ready[i]))
        for a, b in itertools.pairwise(chain):
            m.add(starts[b[1:]] >= ends[a[1:]])
        m.add(obj >= ends[chain[-1][1:]] + ticks(tail[i]))
    m.minimize(obj)
    if hint:
        _add_hints(m, g, hint, ticks, (dev_ready, mod_ready, tail), model_chains, on,
                   (starts, ends, presence, obj))
    return CpSatShardModel(m, scale, g, starts, presence, obj, dev_ready, mod_ready,
                           meta={"horizon": horizon, "ticks": h, "units": len(starts)})


def _add_hints(m: cp_model.CpModel, g: nx.DiGraph, hint: Sequence[Placement],
               ticks: Callable[[float], int],
               ready: tuple[list[float], list[float], list[float]],
               model_chains: list[Any], on: dict[tuple[int, int], list[tuple[int, float]]],
               variables: tuple[dict[tuple[int, int], Any], dict[tuple[int, int], Any],
                                dict[tuple[tuple[int, int], int], Any], Any]) -> None:
    """The hint schedule as CP-SAT solution hints: each unit's start and end, its device's
    presence literal, and the makespan it reaches. ``ready``: the devices' and models'
    ready times and the models' tails; ``variables``: starts, ends, presence, makespan."""
    dev_ready, mod_ready, tail = ready
    starts, ends, presence, obj = variables
    tick_start = _hint_ticks(g, hint, ticks, dev_ready, mod_ready)
    dev_of = {(pl.model, pl.unit): pl.device for pl in hint}
    last = {c[-1][1:] for c in model_chains}
    worst = 0
    for u, t0 in tick_start.items():
        t1 = t0 + ticks(dict(on[u])[dev_of[u]])
        m.add_hint(starts[u], t0)
        m.add_hint(ends[u], t1)
        for p, _ in on[u]:
            if (u, p) in presence:
                m.add_hint(presence[u, p], dev_of[u] == p)
        if u in last:
            worst = max(worst, t1 + ticks(tail[u[0]]))
    m.add_hint(obj, worst)


def _hint_ticks(g: nx.DiGraph, hint: Sequence[Placement], ticks: Callable[[float], int],
                dev_ready: Sequence[float], mod_ready: Sequence[float]
                ) -> dict[tuple[int, int], int]:
    """The hint's device orders replayed in integer ticks with rounded-up durations,
    so the hinted starts are feasible in the tick model (float starts converted
    one by one could overlap by a tick and make CP-SAT discard the hint)."""
    assignment, orders = orders_of(hint, len(g.graph["devices"]))
    real = sorted(schedule_from_orders(g, assignment, orders),
                  key=lambda q: (q.start, q.end, q.model, q.unit))  # topological
    dev_free = [ticks(t) for t in dev_ready]
    chain_free = [ticks(t) for t in mod_ready]
    out: dict[tuple[int, int], int] = {}
    pos = {u: k for order in orders for k, u in enumerate(order)}
    prev_end: dict[tuple[int, int], int] = {}
    for pl in real:
        u, p = (pl.model, pl.unit), pl.device
        k = pos[u]
        dev_prev = prev_end.get(orders[p][k - 1], 0) if k else dev_free[p]
        chain_prev = prev_end[u[0], u[1] - 1] if u[1] else chain_free[u[0]]
        out[u] = max(dev_prev, chain_prev)
        prev_end[u] = out[u] + ticks(duration(g, unit_key(*u), p))
    return out
