"""YMIR's joint choice of transfer-learning mode and GPUs over time, as a MILP.

Model (the table-9 model of the YMIR paper). Every task runs in one of three modes:

* **normal** – alone, ``epochs x epoch_time_1gpu`` GPU-time units of work;
* **temporal after a sibling A** – starts only when A has completed and needs
  ``(1 - g_{A->B})`` of its epochs (it starts from A's weights);
* **spatial with a sibling** – A||B is one merged job (one backbone, both heads):
  ``(1 - g_{A||B}) x max(E_A, E_B)`` epochs whose epoch time is the sum of the
  members' epoch times, running on up to ``max_gpus_A + max_gpus_B`` GPUs (the
  merged batch is the sum of both batches, so its data-parallel limit scales too).

A *unit* is what runs: a single task (normal or temporal) or a merged pair. A
unit with ``a`` GPUs does ``a`` GPU-time units of work per time unit (linear
scaling up to its GPU limit); GPUs are reassigned only when a unit completes.

Why this is exact. With reassignment only at completions a schedule is a
completion order plus one integer allocation per *phase* (the interval between
two consecutive completions). Work in a phase is ``allocation x length``; the
product is linearised exactly with a one-hot allocation ``x[u,k,g]`` and a
continuous ``y[u,k,g] = L_k x[u,k,g]``, so phase lengths stay continuous and no
time discretisation is needed. Which unit completes at which position is
``z[u,k]``; which units exist (the modes) is ``s[u]``. Every optimal schedule of
the real model is a solution of this MILP with the same objective, and every
MILP solution decodes (through :func:`simulate_plan`, in exact fractions) to a
real schedule no worse than its MILP objective; hence the MILP optimum is the
true optimum. Size: ``U x n x (G+1)`` binaries for ``U`` candidate units, ``n``
tasks and GPU limit ``G`` (see ``EXACT_MAX_TASKS`` in ``apportion.solvers.finetune``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
from apportion.formulations.model import LinearModel

from apportion.finetune_spec import SPATIAL_SEP, TEMPORAL_SEP, FinetuneProblem

log = logging.getLogger(__name__)

NORMAL, TEMPORAL, SPATIAL = "normal", "temporal", "spatial"


@dataclass(frozen=True)
class Unit:
    """A runnable job: one task (normal / temporal) or a merged pair (spatial)."""

    key: str  # "A", "A->B" (B from A's weights) or "A||B"
    members: tuple[str, ...]
    mode: str
    work: Fraction  # GPU-time units to completion
    max_gpus: int
    pred: str | None = None  # temporal: the task whose weights it starts from
    gain: Fraction = Fraction(0)

    @property
    def weight(self) -> int:
        """How many task JCTs this unit's completion time counts for."""
        return len(self.members)


def candidate_units(problem: FinetuneProblem, min_gain: Fraction = Fraction(0)) -> list[Unit]:
    """All units the scheduler may choose from; pairs with gain <= ``min_gain`` are filtered.

    Negative transfer (the paper's QQP->RTE, ImageNet25||FashionMNIST) makes a mode
    slower than normal, so such pairs never become candidates.
    """
    units = [Unit(t.id, (t.id,), NORMAL, t.work, t.max_gpus) for t in problem.tasks]
    for (a, b), g in sorted(problem.temporal.items()):
        if g <= min_gain:
            log.info("temporal %s->%s filtered: gain %s", a, b, g)
            continue
        tb = problem.task(b)
        units.append(Unit(f"{a}{TEMPORAL_SEP}{b}", (b,), TEMPORAL,
                          (1 - g) * tb.work, tb.max_gpus, pred=a, gain=g))
    for pair, g in sorted(problem.spatial.items(), key=lambda kv: sorted(kv[0])):
        a, b = sorted(pair, key=problem.ids.index)
        if g <= min_gain:
            log.info("spatial %s||%s filtered: gain %s", a, b, g)
            continue
        ta, tb = problem.task(a), problem.task(b)
        epochs = (1 - g) * max(ta.epochs, tb.epochs)
        units.append(Unit(f"{a}{SPATIAL_SEP}{b}", (a, b), SPATIAL,
                          epochs * (ta.epoch_time_1gpu + tb.epoch_time_1gpu),
                          ta.max_gpus + tb.max_gpus, gain=g))
    return units


@dataclass
class PhasePlan:
    """Selected units, their completion order and one allocation per phase."""

    units: list[Unit]
    order: list[str]  # unit keys, position k = k-th completion
    alloc: list[dict[str, int]]  # per phase: unit key -> GPUs


@dataclass
class Schedule:
    """An exact schedule: segments of constant allocation, completions, JCTs."""

    units: list[Unit]
    segments: list[tuple[Fraction, Fraction, dict[str, int]]]
    completion: dict[str, Fraction]  # unit key -> completion time
    jct: dict[str, Fraction]  # task id -> JCT (from time 0)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def total_jct(self) -> Fraction:
        return sum(self.jct.values(), Fraction(0))

    def mode_of(self, task_id: str) -> Unit:
        for u in self.units:
            if task_id in u.members:
                return u
        raise KeyError(task_id)


class PlanError(ValueError):
    """A phase plan that does not describe a runnable schedule."""


def simulate_plan(plan: PhasePlan, capacity: int) -> Schedule:
    """Run a phase plan in exact arithmetic.

    Phase k lasts until ``order[k]`` completes (zero if it already has). A unit that
    finishes inside a phase keeps its GPUs idle until the phase ends, which the model
    allows (reassignment is permitted, not required, at a completion). Raises
    :class:`PlanError` on an allocation that breaks capacity, limits or precedence.
    """
    by_key = {u.key: u for u in plan.units}
    owner = {m: u.key for u in plan.units for m in u.members}
    remaining = {u.key: u.work for u in plan.units}
    completion: dict[str, Fraction] = {}
    segments: list[tuple[Fraction, Fraction, dict[str, int]]] = []
    now = Fraction(0)
    if sorted(plan.order) != sorted(by_key):
        raise PlanError("order must list every unit once")
    for k, target in enumerate(plan.order):
        # A unit that already finished (possible after a zero-length MILP phase) keeps
        # its GPUs idle: dropping them is allowed and never delays anyone.
        alloc = {u: int(a) for u, a in plan.alloc[k].items()
                 if int(a) > 0 and u not in completion}
        if sum(alloc.values()) > capacity:
            raise PlanError(f"phase {k}: {sum(alloc.values())} GPUs > capacity {capacity}")
        for u, a in alloc.items():
            unit = by_key[u]
            if a > min(unit.max_gpus, capacity):
                raise PlanError(f"phase {k}: unit {u} gets {a} > its limit {unit.max_gpus}")
            if unit.pred is not None:
                pk = owner[unit.pred]
                if pk not in completion or completion[pk] > now:
                    raise PlanError(f"phase {k}: {u} runs before {unit.pred} completes")
        if target in completion:
            continue  # already finished earlier: zero-length phase
        rate = alloc.get(target, 0)
        if rate == 0:
            if remaining[target] == 0:
                completion[target] = now
                continue
            raise PlanError(f"phase {k}: completing unit {target} has no GPUs")
        length = remaining[target] / rate
        end = now + length
        # Split the phase at every inner completion so segments show idle GPUs exactly.
        finish = {u: now + remaining[u] / a for u, a in alloc.items()}
        cuts = sorted({t for t in finish.values() if t < end} | {end})
        start = now
        for cut in cuts:
            live = {u: a for u, a in alloc.items() if finish[u] > start}
            if cut > start:
                segments.append((start, cut, live))
            start = cut
        for u, a in alloc.items():
            done = min(remaining[u], a * length)
            remaining[u] -= done
            if remaining[u] == 0 and u not in completion:
                completion[u] = min(finish[u], end)
        now = end
    for key in by_key:
        if key not in completion:
            raise PlanError(f"unit {key} never completes")
    jct = {m: completion[u.key] for u in plan.units for m in u.members}
    return Schedule(list(plan.units), segments, completion, jct)


# --------------------------------------------------------------------------- MILP
def build_finetune_model(
    problem: FinetuneProblem, capacity: int, units: list[Unit] | None = None
) -> LinearModel:
    """The neutral MILP over candidate units; ``decode(x)`` returns a :class:`PhasePlan`.

    One helper per row family, in the model's order: the modes' rows
    (:func:`_mode_rows`), each phase's rows (:func:`_phase_rows`), the units' work and
    completion rows (:func:`_work_rows`)."""
    if capacity < 1:
        raise ValueError("capacity must be >= 1")
    units = units if units is not None else candidate_units(problem)
    n = len(problem.tasks)
    K = range(n)
    G = {u.key: min(u.max_gpus, capacity) for u in units}
    # Valid bounds: some optimum has every phase no longer than its completing unit's
    # work, and a makespan within the sum of the tasks' largest works. They are doubled
    # so no optimum sits on a bound: HiGHS 1.14's presolve was seen to cut a
    # bound-tight optimum (table 9, capacity 1, normal: 50 reported instead of 40); the
    # solver is now SCIP (``apportion.solvers.finetune.solve_exact``), the margin stays.
    wmax = 2.0 * float(max(u.work for u in units))
    tmax = 2.0 * float(sum(max(u.work for u in units if t in u.members) for t in problem.ids))
    m = LinearModel(name="finetune-modes", sense="min")
    s = {u.key: m.binary(("s", u.key)) for u in units}
    z = {(u.key, k): m.binary(("z", u.key, k)) for u in units for k in K}
    L = {k: m.add_var(("L", k), 0.0, wmax) for k in K}
    x = {(u.key, k, g): m.binary(("x", u.key, k, g)) for u in units for k in K
         for g in range(G[u.key] + 1)}
    y = {(u.key, k, g): m.add_var(("y", u.key, k, g), 0.0, wmax) for u in units for k in K
         for g in range(G[u.key] + 1)}
    c = {u.key: m.add_var(("C", u.key), 0.0, tmax, obj=float(u.weight)) for u in units}
    v = _Vars(n, K, G, wmax, tmax, s, z, L, x, y, c)
    _mode_rows(m, problem, units, v)
    for k in K:
        _phase_rows(m, units, v, k, capacity)
    _work_rows(m, units, v)
    m.decode = _finetune_decoder(units, v)
    m.meta.update(units=units, capacity=capacity, tasks=n,
                  index={"s": s, "z": z, "L": L, "x": x, "y": y, "C": c})
    return m


@dataclass
class _Vars:
    """The model's sizes, bounds and columns, as every row family reads them: ``s`` a unit
    chosen, ``z`` it completes at phase k, ``L`` phase k's length, ``x`` its GPUs in
    phase k (one-hot), ``y`` phase k's length when it holds g GPUs, ``c`` its completion."""

    n: int
    K: range
    G: dict[str, int]
    wmax: float
    tmax: float
    s: dict[str, int]
    z: dict[tuple[str, int], int]
    L: dict[int, int]
    x: dict[tuple[str, int, int], int]
    y: dict[tuple[str, int, int], int]
    c: dict[str, int]


def _mode_rows(m: LinearModel, problem: FinetuneProblem, units: list[Unit], v: _Vars) -> None:
    """Every task in exactly one unit (its mode), a temporal unit's predecessor unmerged,
    and a chosen unit completing at exactly one phase."""
    s, z = v.s, v.z
    for t in problem.ids:  # every task in exactly one unit (its mode)
        m.add_row({s[u.key]: 1 for u in units if t in u.members}, 1, 1, f"cover[{t}]")
    for u in units:  # temporal: the predecessor runs unmerged
        if u.pred is not None:
            row = {s[u.key]: 1.0}
            for w in units:
                if u.pred in w.members and w.mode != SPATIAL:
                    row[s[w.key]] = row.get(s[w.key], 0.0) - 1
            m.add_row(row, ub=0, name=f"pred-unmerged[{u.key}]")
    for u in units:
        row = {z[u.key, k]: 1.0 for k in v.K}
        row[s[u.key]] = -1
        m.add_row(row, 0, 0, f"completes-once[{u.key}]")


def _phase_rows(m: LinearModel, units: list[Unit], v: _Vars, k: int, capacity: int) -> None:
    """Phase k's rows: at most one unit completes there, an empty phase has no length,
    phases are used from the first, the GPUs within the capacity, and each unit's
    allocation there (:func:`_unit_phase_rows`)."""
    z, L, x = v.z, v.L, v.x
    m.add_row({z[u.key, k]: 1 for u in units}, ub=1, name=f"one-per-position[{k}]")
    row = {L[k]: 1.0}
    for u in units:
        row[z[u.key, k]] = -v.wmax
    m.add_row(row, ub=0, name=f"empty-phase[{k}]")
    if k + 1 < v.n:
        row = {z[u.key, k]: 1.0 for u in units}
        for u in units:
            row[z[u.key, k + 1]] = row.get(z[u.key, k + 1], 0.0) - 1
        m.add_row(row, lb=0, name=f"positions-contiguous[{k}]")
    m.add_row({x[u.key, k, g]: g for u in units for g in range(1, v.G[u.key] + 1)},
              ub=capacity, name=f"capacity[{k}]")
    for u in units:
        _unit_phase_rows(m, units, v, u, k)


def _unit_phase_rows(m: LinearModel, units: list[Unit], v: _Vars, u: Unit, k: int) -> None:
    """Unit u in phase k: one allocation, GPUs only while chosen and not yet complete (and,
    temporal, after its predecessor completed), none at the phase it completes, and
    ``y`` the phase's length at the allocation it holds."""
    s, z, L, x, y, G = v.s, v.z, v.L, v.x, v.y, v.G
    gs = range(G[u.key] + 1)
    m.add_row({x[u.key, k, g]: 1 for g in gs}, 1, 1, f"one-alloc[{u.key},{k}]")
    alloc = {x[u.key, k, g]: float(g) for g in gs if g}
    row = dict(alloc)
    row[s[u.key]] = -G[u.key]
    for j in range(k):
        row[z[u.key, j]] = G[u.key]
    m.add_row(row, ub=0, name=f"alive[{u.key},{k}]")
    if u.pred is not None:
        row = dict(alloc)
        for w in units:
            if u.pred in w.members:
                for j in range(k):
                    row[z[w.key, j]] = row.get(z[w.key, j], 0.0) - G[u.key]
        m.add_row(row, ub=0, name=f"after-pred[{u.key},{k}]")
    m.add_row({x[u.key, k, 0]: 1, z[u.key, k]: 1}, ub=1, name=f"runs-when-done[{u.key},{k}]")
    row = {y[u.key, k, g]: 1 for g in gs}
    row[L[k]] = -1
    m.add_row(row, 0, 0, f"y-sum[{u.key},{k}]")
    for g in gs:
        m.add_row({y[u.key, k, g]: 1, x[u.key, k, g]: -v.wmax}, ub=0,
                  name=f"y-on[{u.key},{k},{g}]")


def _work_rows(m: LinearModel, units: list[Unit], v: _Vars) -> None:
    """A chosen unit's GPU-time equals its work; its completion time is at least the end
    of the phase it completes at."""
    s, z, L, y, c, tmax = v.s, v.z, v.L, v.y, v.c, v.tmax
    for u in units:
        row = {y[u.key, k, g]: float(g) for k in v.K for g in range(1, v.G[u.key] + 1)}
        row[s[u.key]] = -float(u.work)
        m.add_row(row, 0, 0, f"work[{u.key}]")
        for k in v.K:  # C_u >= T_k - tmax (1 - z_uk)
            row = {c[u.key]: 1.0, z[u.key, k]: -tmax}
            for j in range(k + 1):
                row[L[j]] = -1
            m.add_row(row, lb=-tmax, name=f"completion[{u.key},{k}]")


def _finetune_decoder(units: list[Unit], v: _Vars) -> Callable[[np.ndarray], PhasePlan]:
    """The model's decode: the chosen units, the order they complete in and each phase's
    GPUs per unit."""
    by_key = {u.key: u for u in units}
    s, z, x, G, K = v.s, v.z, v.x, v.G, v.K

    def decode(sol: np.ndarray) -> PhasePlan:
        chosen = [u for u in units if sol[s[u.key]] > 0.5]
        order: list[str] = []
        allocs: list[dict[str, int]] = []
        for k in K:
            at = [u.key for u in chosen if sol[z[u.key, k]] > 0.5]
            if not at:
                break
            order.append(at[0])
            allocs.append({u.key: g for u in chosen for g in range(1, G[u.key] + 1)
                           if sol[x[u.key, k, g]] > 0.5})
        return PhasePlan([by_key[u.key] for u in chosen], order, allocs)

    return decode


def plan_hint(model: LinearModel, plan: PhasePlan, capacity: int) -> dict[int, float]:
    """A complete MILP solution for a phase plan (the greedy answer as a warm start)."""
    idx = model.meta["index"]
    sched = simulate_plan(plan, capacity)
    units: list[Unit] = model.meta["units"]
    n = model.meta["tasks"]
    hint = {i: 0.0 for i in range(model.num_vars)}
    chosen = {u.key for u in plan.units}
    now = Fraction(0)
    ends: list[Fraction] = []
    for k, key in enumerate(plan.order):
        end = max(now, sched.completion[key])
        hint[idx["L"][k]] = float(end - now)
        ends.append(end)
        now = end
    for u in units:
        hint[idx["s"][u.key]] = 1.0 if u.key in chosen else 0.0
        for k in range(n):
            g = plan.alloc[k].get(u.key, 0) if k < len(plan.order) else 0
            length = hint[idx["L"][k]]
            hint[idx["x"][u.key, k, g]] = 1.0
            hint[idx["y"][u.key, k, g]] = length
            hint[idx["z"][u.key, k]] = 1.0 if k < len(plan.order) and plan.order[k] == u.key else 0.0
        if u.key in chosen:
            hint[idx["C"][u.key]] = float(ends[plan.order.index(u.key)])
    return hint
