"""Solving Hydra's shard-unit job shop: greedy list schedulers, CP-SAT, the MILP.

Every entry point reads the shard-unit graph (:mod:`apportion.shards_spec`:
unit vertices with runtime and memory, precedence edges, ``runs-on`` edges to
the devices a unit fits, with its duration there) or encodes a
:class:`ShardProblem` into it first; the independent validator checks every
answer against the raw problem.

* :func:`list_schedule` is event driven: whenever a device frees up it takes the
  best eligible model (front unit ready, no unit of that model running, unit
  fits the device) by a priority rule, scanning the models once — linear per
  decision, as Hydra's Sharded-LRTF (Algorithm 2) is. ``lrtf`` ranks models by
  longest remaining train time (suffix sum of unit runtimes, so mini-batch and
  epoch structure come for free); ``random`` picks uniformly (the paper's
  baseline). Free devices choose fastest first.
* ``cp-sat`` and ``milp`` are warm-started from the Sharded-LRTF schedule and
  never return anything worse than it: the hint is an answer. If a backend
  fails or finds nothing in the budget, the LRTF schedule is returned with
  status ``fallback``.
* Scale. CP-SAT's interval model is solved whole up to
  :data:`CPSAT_DIRECT_MAX_UNITS`; beyond that a scheme takes over:
  ``aggregate`` (default) merges runs of consecutive units of a chain into
  blocks of about equal work, at most ``max_blocks`` in all, solves the block
  problem and expands it; ``rolling`` solves windows of the next K units per
  model with tails (remaining work) in the objective and commits the part
  before a cut. The MILP aggregates to at most ``MILP_MAX_UNITS`` units.
  Both are kept because they lose in different places (see the figure-6 README).
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import math
import random as _random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
from apportion.formulations.shards import (
    MILP_MAX_UNITS,
    Placement,
    ShardModel,
    ShardProblem,
    build_milp,
    load_problem,
    makespan,
    orders_of,
    schedule_from_orders,
)
from apportion.solvers.base import Status
from apportion.solvers.shards_validator import check_schedule

from apportion.errors import InputError
from apportion.shards_spec import (
    as_graph,
    chains,
    lower_bound,
    problem_from_graph,
    runs_on,
    shard_graph,
    speed,
)

log = logging.getLogger(__name__)

METHODS = ("cp-sat", "milp", "lrtf", "random")
#: Largest unit count given to CP-SAT whole; measured crossover (see
#: experiments/results/hydra_fig6/README.md): with a 10 s budget CP-SAT whole still
#: improves its LRTF hint at 800 units (2 of 3 seeds) and no longer at 1,600.
CPSAT_DIRECT_MAX_UNITS = 800
#: Default block count for the aggregation scheme.
DEFAULT_MAX_BLOCKS = 200


@dataclass
class ShardSolution:
    """A schedule with its makespan, lower bound, canonical status and provenance."""

    schedule: list[Placement]
    makespan: float
    lower_bound: float
    status: Status
    method: str
    wall_s: float
    greedy_makespan: float | None = None
    bound: float | None = None  # best bound a solver proved (>= lower_bound when given)
    message: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def gap(self) -> float:
        """Relative distance to the best bound known: makespan / bound - 1."""
        b = max(self.lower_bound, self.bound or 0.0)
        return self.makespan / b - 1.0 if b > 0 else 0.0


# -- greedy list scheduling -------------------------------------------------------------------
def list_schedule(
    problem: ShardProblem | nx.DiGraph, rule: str = "lrtf", seed: int = 0,
    device_ready: Sequence[float] | None = None, model_ready: Sequence[float] | None = None,
    tails: Sequence[float] | None = None,
) -> list[Placement]:
    """Event-driven non-delay list scheduling with the ``lrtf`` or ``random`` rule.

    At each event time the units that finished release their devices and chains;
    each idle device (fastest first) then takes the eligible model with the
    highest priority in one linear scan. ``tails`` (work after this horizon) is
    added to the remaining time, so rolling windows rank models globally.
    Runtimes, speeds and which devices hold a unit are read from the graph once.
    """
    if rule not in ("lrtf", "random"):
        raise ValueError(f"unknown rule {rule!r}")
    g = as_graph(problem)
    rng = _random.Random(seed)
    model_chains = chains(g)
    n_mod, n_dev = len(model_chains), len(g.graph["devices"])
    runtimes = [[g.nodes[u]["runtime"] for u in c] for c in model_chains]
    on = [[dict(runs_on(g, u)) for u in c] for c in model_chains]
    tail = list(tails) if tails is not None else [0.0] * n_mod
    remaining = [sum(r) + tail[i] for i, r in enumerate(runtimes)]
    nxt = [0] * n_mod
    busy = [False] * n_mod
    ready_at = list(model_ready) if model_ready is not None else [0.0] * n_mod
    free_at = list(device_ready) if device_ready is not None else [0.0] * n_dev
    speeds = [speed(g, p) for p in range(n_dev)]
    dev_order = sorted(range(n_dev), key=lambda p: (-speeds[p], p))
    restricted = any(len(d) < n_dev for c in on for d in c)
    idle = [True] * n_dev
    events: list[tuple[float, int, int, int]] = []  # (time, kind 0=device 1=model, id, model)
    for p in range(n_dev):
        if free_at[p] > 0:
            idle[p] = False
            heapq.heappush(events, (free_at[p], 0, p, -1))
    for i in range(n_mod):
        if ready_at[i] > 0:
            busy[i] = True
            heapq.heappush(events, (ready_at[i], 1, i, -1))
    left = sum(len(r) for r in runtimes)
    out: list[Placement] = []
    t = 0.0
    while left:
        for p in dev_order:
            if not idle[p]:
                continue
            best = _eligible_pick(p, nxt, busy, runtimes, on if restricted else None, rule,
                                  remaining, rng)
            if best < 0:
                continue
            j = nxt[best]
            end = t + on[best][j][p]
            out.append(Placement(best, j, p, t, end))
            remaining[best] -= runtimes[best][j]
            nxt[best] += 1
            busy[best] = True
            idle[p] = False
            left -= 1
            heapq.heappush(events, (end, 0, p, best))
        if not left:
            break
        if not events:
            raise RuntimeError("list scheduling stalled: a unit fits no device")
        t = events[0][0]
        while events and events[0][0] <= t:
            _, kind, ident, model = heapq.heappop(events)
            if kind == 0:
                idle[ident] = True
                if model >= 0:
                    busy[model] = False
            else:
                busy[ident] = False
    return out


def _eligible_pick(p: int, nxt: list[int], busy: list[bool], runtimes: list[list[float]],
                   on: list[list[dict[int, float]]] | None, rule: str, remaining: list[float],
                   rng: _random.Random) -> int:
    """The model whose next unit device ``p`` takes now (-1: none is eligible), in one
    linear scan: the most remaining time (``lrtf``) or a uniform draw (``random``).
    ``on``: which devices hold each unit, when some unit cannot run everywhere."""
    best, best_key, ties = -1, -math.inf, 0
    for i in range(len(nxt)):
        j = nxt[i]
        if busy[i] or j >= len(runtimes[i]):
            continue
        if on is not None and p not in on[i][j]:
            continue
        if rule == "lrtf":
            if remaining[i] > best_key:
                best, best_key = i, remaining[i]
        else:  # reservoir sampling keeps the scan single-pass
            ties += 1
            if rng.randrange(ties) == 0:
                best = i
    return best


def sharded_lrtf(problem: ShardProblem | nx.DiGraph) -> list[Placement]:
    """Hydra's Sharded-LRTF (Algorithm 2): longest remaining train time first."""
    return list_schedule(problem, "lrtf")


def random_schedule(problem: ShardProblem | nx.DiGraph, seed: int = 0) -> list[Placement]:
    """The paper's randomized baseline: a uniformly random eligible model per decision."""
    return list_schedule(problem, "random", seed)


# -- aggregation --------------------------------------------------------------------------------
def aggregate(problem: ShardProblem | nx.DiGraph, max_blocks: int
              ) -> tuple[ShardProblem, list[list[tuple[int, int]]]]:
    """Merge consecutive units of each chain into blocks of about equal work.

    Each model gets blocks in proportion to its work (at least one), at most
    ``max_blocks`` in all (or one per model if there are more models). A block's
    runtime is its units' sum and its memory their maximum, so any block schedule
    expands to a valid unit schedule. Returns the block problem and, per model,
    the unit ranges [lo, hi) of its blocks.
    """
    base = problem_from_graph(problem) if isinstance(problem, nx.DiGraph) else problem
    works = [sum(m.runtimes) for m in base.models]
    total = sum(works) or 1.0
    budget = max(max_blocks, len(base.models))
    counts = [max(1, min(len(m.runtimes), int(budget * w / total)))
              for m, w in zip(base.models, works)]
    ranges: list[list[tuple[int, int]]] = []
    models: list[ShardModel] = []
    for m, n in zip(base.models, counts):
        cuts, acc, target, k = [0], 0.0, sum(m.runtimes) / n, 1
        for j, r in enumerate(m.runtimes[:-1]):
            acc += r
            if acc >= k * target - 1e-12 and k < n and len(m.runtimes) - (j + 1) >= n - k:
                cuts.append(j + 1)
                k += 1
        cuts.append(len(m.runtimes))
        rs = [(lo, hi) for lo, hi in itertools.pairwise(cuts) if hi > lo]
        ranges.append(rs)
        models.append(ShardModel(
            m.name, tuple(sum(m.runtimes[lo:hi]) for lo, hi in rs),
            tuple(max(m.memory[lo:hi]) for lo, hi in rs) if m.memory else ()))
    return ShardProblem(base.devices, models, base.buffer_fraction, base.source), ranges


def expand(problem: ShardProblem | nx.DiGraph, ranges: list[list[tuple[int, int]]],
           block_schedule: Sequence[Placement]) -> list[Placement]:
    """A unit schedule from a block schedule: each block's units back to back on its device."""
    g = as_graph(problem)
    assignment: dict[tuple[int, int], int] = {}
    orders: list[list[tuple[int, int]]] = [[] for _ in g.graph["devices"]]
    for bl in sorted(block_schedule, key=lambda q: (q.start, q.end, q.model, q.unit)):
        lo, hi = ranges[bl.model][bl.unit]
        for j in range(lo, hi):
            assignment[bl.model, j] = bl.device
            orders[bl.device].append((bl.model, j))
    return schedule_from_orders(g, assignment, orders)


# -- exact backends ---------------------------------------------------------------------------------
def _cpsat_solve(g: nx.DiGraph, hint: list[Placement], budget_s: float, seed: int,
                 workers: int, **ready: Any) -> tuple[list[Placement] | None, Status, float | None, str]:
    """Run the CP-SAT interval model; returns (schedule, status, real-time bound, message)."""
    from apportion.formulations.shards_cpsat import build_cpsat
    from ortools.sat.python import cp_model

    built = build_cpsat(g, hint=hint, **ready)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, budget_s)
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    try:
        code = solver.solve(built.model)
    except Exception as exc:  # noqa: BLE001 - a backend fault must not take the caller down
        return None, Status.ERROR, None, f"cp-sat raised {exc!r}"
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, Status.ERROR, None, f"cp-sat: {solver.status_name(code)}"
    # Durations were rounded up by < 1 tick each, so the real optimum is at least
    # the tick bound less one tick per unit of the longest chain.
    slack = max(len(c) for c in chains(g))
    bound = (solver.best_objective_bound - slack) / built.scale
    status = Status.OPTIMAL if code == cp_model.OPTIMAL else Status.FEASIBLE
    return built.decode(solver), status, bound, f"cp-sat: {solver.status_name(code)}"


def _milp_solve(g: nx.DiGraph, hint: list[Placement], budget_s: float
                ) -> tuple[list[Placement] | None, Status, float | None, str]:
    from apportion.solvers.highs import HighsBackend

    lm = build_milp(g, hint=hint)
    res = HighsBackend().solve(lm, budget_s)
    if res.x is None or lm.decode is None:
        return None, Status.ERROR, None, f"highs: {res.message}"
    return lm.decode(res.x), res.status, res.bound, f"highs: {res.message} ({lm.summary()})"


def _rolling(g: nx.DiGraph, budget_s: float, seed: int, workers: int, window: int
             ) -> tuple[list[Placement], str]:
    """Rolling horizon: CP-SAT on the next ``window`` units per model, tails in the
    objective, commit every unit that starts before the earliest mid-window start
    of a model with units beyond the window, then slide. Once the budget is spent,
    Sharded-LRTF schedules everything left in one go."""
    problem = problem_from_graph(g)
    fastest = max(d.speed for d in problem.devices)
    n_mod, n_dev = len(problem.models), len(problem.devices)
    nxt, chain_free, dev_free = [0] * n_mod, [0.0] * n_mod, [0.0] * n_dev
    total, windows = problem.num_units, 0
    out: list[Placement] = []
    deadline = time.perf_counter() + budget_s
    while len(out) < total:
        time_left = deadline - time.perf_counter()
        width = window if time_left >= 0.05 else total  # no time left: the rest at once
        live = [i for i in range(n_mod) if nxt[i] < len(problem.models[i].runtimes)]
        sub_models, tails = [], []
        for i in live:
            m = problem.models[i]
            hi = min(len(m.runtimes), nxt[i] + width)
            sub_models.append(ShardModel(m.name, m.runtimes[nxt[i]:hi],
                                         m.memory[nxt[i]:hi] if m.memory else ()))
            tails.append(sum(m.runtimes[hi:]) / fastest)
        sub = shard_graph(ShardProblem(problem.devices, sub_models, problem.buffer_fraction,
                                       problem.source))
        ready: dict[str, Any] = {"device_ready": dev_free, "tails": tails,
                                 "model_ready": [chain_free[i] for i in live]}
        sched = list_schedule(sub, "lrtf", **ready)
        if width < total:
            share = max(0.05, time_left * sum(len(m.runtimes) for m in sub_models)
                        / (total - len(out)))
            got, _, _, _ = _cpsat_solve(sub, sched, share, seed, workers, **ready)
            if got is not None and _window_objective(got, tails) <= _window_objective(sched, tails):
                sched = got
            windows += 1
        cuts = [pl.start for pl in sched
                if tails[pl.model] > 0 and pl.unit == len(sub_models[pl.model].runtimes) // 2]
        cut = min(cuts) if cuts else math.inf
        keep = [pl for pl in sched if pl.start < cut] or [min(sched, key=lambda q: q.start)]
        for pl in keep:
            i = live[pl.model]
            out.append(Placement(i, nxt[i] + pl.unit, pl.device, pl.start, pl.end))
            dev_free[pl.device] = max(dev_free[pl.device], pl.end)
            chain_free[i] = max(chain_free[i], pl.end)
        for pl in keep:
            nxt[live[pl.model]] += 1
    assignment, orders = orders_of(out, n_dev)
    return schedule_from_orders(g, assignment, orders), f"rolling: {windows} CP-SAT windows"


def _window_objective(schedule: Sequence[Placement], tails: Sequence[float]) -> float:
    """What a rolling window minimises: the latest chain end plus its remaining work."""
    ends: dict[int, float] = {}
    for pl in schedule:
        ends[pl.model] = max(ends.get(pl.model, 0.0), pl.end)
    return max(e + tails[i] for i, e in ends.items())


# -- entry points ---------------------------------------------------------------------------------
def solve(problem: ShardProblem | nx.DiGraph, method: str = "cp-sat", time_budget_s: float = 10.0,
          seed: int = 0, workers: int = 2, scheme: str = "aggregate",
          max_blocks: int = DEFAULT_MAX_BLOCKS, window: int = 8,
          direct_max_units: int = CPSAT_DIRECT_MAX_UNITS) -> ShardSolution:
    """Schedule every unit by ``method`` under ``time_budget_s``; the result is validated.

    ``problem`` is the shard-unit graph or a :class:`ShardProblem` (encoded first).
    ``scheme`` (``aggregate`` or ``rolling``) applies when the instance is larger
    than the method's direct limit. Exact methods start from Sharded-LRTF and
    return the better of their answer and it.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    t0 = time.perf_counter()
    g = as_graph(problem)
    raw = problem_from_graph(g) if isinstance(problem, nx.DiGraph) else problem
    lb = lower_bound(g)
    if method == "random":
        sched = random_schedule(g, seed)
        sol = ShardSolution(sched, makespan(sched), lb, Status.FEASIBLE, method, 0.0,
                            message="randomized list scheduling")
    else:
        greedy = sharded_lrtf(g)
        g_ms = makespan(greedy)
        sol = ShardSolution(greedy, g_ms, lb, Status.FEASIBLE, method, 0.0, g_ms,
                            message="Sharded-LRTF")
        if method != "lrtf" and g_ms > lb * (1 + 1e-9):
            budget = max(0.01, time_budget_s - (time.perf_counter() - t0))
            sol = _exact(g, method, greedy, budget, seed, workers, scheme, max_blocks,
                         window, direct_max_units, sol)
    if sol.status is not Status.FALLBACK and sol.makespan <= lb * (1 + 1e-9):
        sol.status = Status.OPTIMAL
    sol.wall_s = time.perf_counter() - t0
    check_schedule(raw, sol.schedule)
    log.info("solve-shards %s: makespan %.6g, lower bound %.6g, %s", method, sol.makespan, lb,
             sol.status.value)
    return sol


def _exact(g: nx.DiGraph, method: str, greedy: list[Placement], budget: float, seed: int,
           workers: int, scheme: str, max_blocks: int, window: int, direct_max_units: int,
           sol: ShardSolution) -> ShardSolution:
    limit = MILP_MAX_UNITS if method == "milp" else direct_max_units
    n_units = sum(len(c) for c in chains(g))
    extra: dict[str, Any] = {"units": n_units}
    got: list[Placement] | None
    bound: float | None = None
    if n_units <= limit:
        extra["scheme"] = "direct"
        if method == "milp":
            got, status, bound, msg = _milp_solve(g, greedy, budget)
        else:
            got, status, bound, msg = _cpsat_solve(g, greedy, budget, seed, workers)
    elif method == "cp-sat" and scheme == "rolling":
        extra.update(scheme="rolling", window=window)
        got, msg = _rolling(g, budget, seed, workers, window)
        status = Status.FEASIBLE
    elif scheme in ("aggregate", "rolling"):
        blocks = min(max_blocks, limit)
        agg, ranges = aggregate(g, blocks)
        extra.update(scheme="aggregate", blocks=agg.num_units)
        ag = shard_graph(agg)
        hint = sharded_lrtf(ag)
        if method == "milp":
            got, status, _, msg = _milp_solve(ag, hint, budget)
        else:
            got, status, _, msg = _cpsat_solve(ag, hint, budget, seed, workers)
        got = expand(g, ranges, got) if got is not None else None
        if status is Status.OPTIMAL:
            status = Status.FEASIBLE  # optimal for the blocks only
    else:
        raise ValueError(f"unknown scheme {scheme!r}")
    if got is None:
        log.warning("%s found no schedule (%s); falling back to Sharded-LRTF", method, msg)
        sol.status, sol.message, sol.extra = Status.FALLBACK, f"{msg}; Sharded-LRTF answers", extra
        return sol
    solver_ms = makespan(got)
    extra["solver_makespan"] = solver_ms
    if solver_ms <= sol.makespan:
        extra["picked"] = "solver"
        return ShardSolution(got, solver_ms, sol.lower_bound, status, method, 0.0, sol.makespan,
                             bound, msg, extra)
    extra["picked"] = "lrtf-hint"
    st = status if extra["scheme"] == "direct" else Status.FEASIBLE
    return ShardSolution(sol.schedule, sol.makespan, sol.lower_bound, st, method, 0.0,
                         sol.makespan, bound, f"{msg}; its hint (Sharded-LRTF) was better", extra)


def solution_to_dict(problem: ShardProblem | nx.DiGraph, sol: ShardSolution) -> dict[str, Any]:
    """The solve-shards output contract (makespan, lower_bound, status, schedule) plus extras."""
    g = problem.graph if isinstance(problem, nx.DiGraph) else None
    models = g["models"] if g is not None else [m.name for m in problem.models]  # type: ignore[union-attr]
    devices = g["devices"] if g is not None else [d.name for d in problem.devices]  # type: ignore[union-attr]
    return {
        "makespan": sol.makespan,
        "lower_bound": sol.lower_bound,
        "status": sol.status.value,
        "method": sol.method,
        "gap": sol.gap,
        "bound": sol.bound,
        "greedy_makespan": sol.greedy_makespan,
        "wall_s": round(sol.wall_s, 6),
        "message": sol.message,
        **{k: v for k, v in sol.extra.items() if k not in ("makespan", "schedule")},
        "schedule": [
            {"model": models[pl.model], "unit": pl.unit,
             "device": devices[pl.device], "start": pl.start, "end": pl.end}
            for pl in sol.schedule
        ],
    }


def solve_shards_file(units_path: str, method: str, time_budget_s: float) -> dict[str, Any]:
    """Back end of ``apportion solve-shards``: load, validate, solve, return the output dict.

    Bad input (file, fields, method, budget) raises InputError and nothing is written.
    """
    if method not in METHODS:
        raise InputError("--method", "method", f"unknown method {method!r}; "
                         f"choose from {', '.join(METHODS)}")
    if isinstance(time_budget_s, bool) or not (isinstance(time_budget_s, (int, float))
                                               and math.isfinite(time_budget_s)
                                               and time_budget_s > 0):
        raise InputError("--time-budget", "time_budget", f"must be a positive number of seconds, "
                         f"got {time_budget_s!r}")
    problem = load_problem(units_path)
    graph = shard_graph(problem)  # the solvers read the shard-unit graph
    sol = solve(graph, method, float(time_budget_s))
    check_schedule(problem, sol.schedule)  # the raw problem, independently of the graph
    out = solution_to_dict(graph, sol)
    json.dumps(out)  # the contract is JSON: fail here, not in the CLI, if it is not
    return out
