"""Hydra's shard-unit scheduling problem (SHARP, section 5.3 of the Hydra paper).

A model too large for one device is cut into shards; a *shard unit* is the
forward or backward pass of one shard on one mini-batch. Each model is a chain
of units (forward shards in order, backward shards in reverse, mini-batch after
mini-batch, epoch after epoch) that must run one after the other, each on one
device at a time, and a device runs one unit at a time. Minimising the makespan
is a flexible job shop. This module holds the solver-free part:

* the problem types (:class:`ShardDevice`, :class:`ShardProblem`) and the
  schedule type (:class:`Placement`), loaded from the JSON contract of
  ``apportion solve-shards`` with every bad field reported as an
  :class:`~apportion.errors.InputError`;
* the unit graph as a networkx DiGraph (chains as edges, durations per device
  as node attributes), so researchers can inspect or extend it;
* lower bounds (fluid work bound and longest chain), reported with every solve;
* the paper's big-M MILP as a neutral :class:`LinearModel` with a decoder;
* :func:`schedule_from_orders`, which turns any solver's (device, order) answer
  into a left-shifted schedule in exact float time, so integer rounding in
  CP-SAT or tolerances in HiGHS can never produce an overlapping schedule.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import networkx as nx
import numpy as np
from apportion.formulations.model import LinearModel
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from apportion.config import field_path, read_text
from apportion.errors import InputError

log = logging.getLogger(__name__)

#: Hydra reserves 15% of device memory as the double-buffer loading zone (section 5.2).
DEFAULT_BUFFER_FRACTION = 0.15
#: Above this many units the big-M MILP is not built: its order binaries grow as
#: L^2/2 and its rows as L^2 * |P|; at 60 units on 4 devices that is ~1,500
#: binaries and ~12,000 rows, where HiGHS no longer closes the gap in seconds.
MILP_MAX_UNITS = 60


@dataclass(frozen=True)
class ShardDevice:
    """One device: a unit of base runtime ``r`` takes ``r / speed`` seconds on it."""

    name: str
    speed: float = 1.0
    memory: float = math.inf  # bytes; inf when the input gives none


@dataclass(frozen=True)
class ShardModel:
    """One model's chain of units: base runtimes (s) and memory needs (bytes)."""

    name: str
    runtimes: tuple[float, ...]
    memory: tuple[float, ...] = ()

    def unit_memory(self, j: int) -> float:
        return self.memory[j] if self.memory else 0.0


@dataclass(frozen=True)
class Placement:
    """One scheduled unit: model index, unit index, device index, start and end (s)."""

    model: int
    unit: int
    device: int
    start: float
    end: float


@dataclass
class ShardProblem:
    """Devices, model chains and the double-buffer reserve of one SHARP instance."""

    devices: list[ShardDevice]
    models: list[ShardModel]
    buffer_fraction: float = DEFAULT_BUFFER_FRACTION
    source: str = "<memory>"
    _eligible: dict[tuple[int, int], list[int]] = field(default_factory=dict, repr=False)

    # -- sizes and durations ------------------------------------------------------
    @property
    def num_units(self) -> int:
        return sum(len(m.runtimes) for m in self.models)

    def duration(self, i: int, j: int, p: int) -> float:
        return self.models[i].runtimes[j] / self.devices[p].speed

    def budget(self, p: int) -> float:
        """Memory a unit may use on device ``p``: all of it less the double-buffer reserve."""
        return self.devices[p].memory * (1.0 - self.buffer_fraction)

    def eligible(self, i: int, j: int) -> list[int]:
        """Devices whose budget holds unit (i, j); cached because greedy loops ask often."""
        key = (i, j)
        got = self._eligible.get(key)
        if got is None:
            need = self.models[i].unit_memory(j)
            got = [p for p in range(len(self.devices)) if need <= self.budget(p)]
            self._eligible[key] = got
        return got

    def units(self) -> list[tuple[int, int]]:
        return [(i, j) for i, m in enumerate(self.models) for j in range(len(m.runtimes))]

    # -- bounds -------------------------------------------------------------------
    def work_bound(self) -> float:
        """Fluid bound: all base work spread over the summed speed of all devices."""
        total = sum(sum(m.runtimes) for m in self.models)
        return total / sum(d.speed for d in self.devices)

    def chain_bound(self) -> float:
        """Longest chain, each unit on its fastest eligible device."""
        best = 0.0
        for i, m in enumerate(self.models):
            length = sum(
                r / max(self.devices[p].speed for p in self.eligible(i, j))
                for j, r in enumerate(m.runtimes)
            )
            best = max(best, length)
        return best

    def lower_bound(self) -> float:
        """max(work bound, chain bound): every schedule's makespan is at least this."""
        return max(self.work_bound(), self.chain_bound())

    def trivial_horizon(self) -> float:
        """Makespan of running every unit back to back on its slowest eligible device."""
        return sum(
            r / min(self.devices[p].speed for p in self.eligible(i, j))
            for i, m in enumerate(self.models)
            for j, r in enumerate(m.runtimes)
        )


# -- building chains ------------------------------------------------------------------
def chain_runtimes(
    forward: Sequence[float], backward: Sequence[float], minibatches: int = 1, epochs: int = 1
) -> list[float]:
    """Unit runtimes of one model: forward shards in order then backward shards in
    reverse, repeated per mini-batch and epoch (``backward[k]`` is shard k's pass)."""
    if len(forward) != len(backward):
        raise ValueError("forward and backward need one runtime per shard each")
    one = list(forward) + list(reversed(backward))
    return one * (minibatches * epochs)


def unit_graph(problem: ShardProblem) -> nx.DiGraph:
    """The units as a DiGraph: node (i, j) carries model name, runtime, memory and a
    ``durations`` dict per eligible device name; edges run along each chain."""
    g = nx.DiGraph(devices=[d.name for d in problem.devices], buffer_fraction=problem.buffer_fraction)
    for i, m in enumerate(problem.models):
        for j, r in enumerate(m.runtimes):
            g.add_node(
                (i, j),
                model=m.name,
                runtime=r,
                memory=m.unit_memory(j),
                durations={problem.devices[p].name: problem.duration(i, j, p)
                           for p in problem.eligible(i, j)},
            )
            if j:
                g.add_edge((i, j - 1), (i, j))
    return g


# -- loading and validation ---------------------------------------------------------------
#: Largest unit runtime and device time (s) accepted: ~31 years. Beyond it the solvers'
#: integer time scaling overflows (a speed of 1e-300 made a unit take 1e300 s).
MAX_SECONDS = 1e9
#: Speeds and memories are bounded so that runtime / speed and the budgets stay finite.
MAX_SPEED = 1e9
MIN_SPEED = 1e-9
MAX_BYTES = 1e18

Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS)]
Bytes = Annotated[float, Field(ge=0, le=MAX_BYTES)]


class _Strict(BaseModel):
    # strict: a JSON true or "fast" is not a number; extra fields are typos, not options
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class DeviceSpec(_Strict):
    name: str = Field(min_length=1, max_length=256)
    speed: float = Field(default=1.0, gt=0, ge=MIN_SPEED, le=MAX_SPEED)
    memory: float | None = Field(default=None, gt=0, le=MAX_BYTES)


class ModelSpec(_Strict):
    name: str = Field(min_length=1, max_length=256)
    units: list[Seconds] = Field(min_length=1, max_length=1_000_000)
    memory: list[Bytes] | Bytes | None = None


class UnitsFile(_Strict):
    """The ``solve-shards`` input contract (README): devices, models, buffer_fraction."""

    devices: list[DeviceSpec] = Field(min_length=1, max_length=100_000)
    models: list[ModelSpec] = Field(min_length=1, max_length=100_000)
    buffer_fraction: float = Field(default=DEFAULT_BUFFER_FRACTION, ge=0, lt=1)


def _unique(names: list[str], source: str, what: str) -> None:
    seen: set[str] = set()
    for k, n in enumerate(names):
        if n in seen:
            raise InputError(source, f"{what}[{k}].name", f"duplicate name {n!r}")
        seen.add(n)


def problem_from_dict(data: Any, source: str = "<memory>") -> ShardProblem:
    """Validate the solve-shards JSON contract (:class:`UnitsFile`, pydantic) and build a
    :class:`ShardProblem`; every problem is an :class:`InputError` naming the field.

    Required: ``devices[].name``, ``devices[].speed`` (default 1.0),
    ``models[].name``, ``models[].units`` (runtimes in seconds). Optional:
    ``devices[].memory`` (bytes), ``models[].memory`` (bytes, one per unit or a
    single number) and ``buffer_fraction`` (double-buffer reserve, default 0.15).
    Magnitudes are bounded (:data:`MAX_SECONDS`, :data:`MIN_SPEED`) so that no unit
    takes longer than :data:`MAX_SECONDS` on any device.
    """
    if not isinstance(data, dict):
        raise InputError(source, "<root>", "must be a JSON object with devices and models")
    try:
        spec = UnitsFile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise InputError(source, field_path(tuple(err["loc"])),
                         err["msg"].removeprefix("Value error, ")
                         + (f", got {err['input']!r}" if err["type"] != "missing"
                            and not isinstance(err.get("input"), (dict, list)) else "")) from None
    _unique([d.name for d in spec.devices], source, "devices")
    _unique([m.name for m in spec.models], source, "models")
    devices = [ShardDevice(d.name, d.speed, math.inf if d.memory is None else d.memory)
               for d in spec.devices]
    models = []
    for k, m in enumerate(spec.models):
        runtimes = tuple(float(u) for u in m.units)
        memory: tuple[float, ...] = ()
        if isinstance(m.memory, list):
            if len(m.memory) != len(runtimes):
                raise InputError(source, f"models[{k}].memory",
                                 f"has {len(m.memory)} entries for {len(runtimes)} units")
            memory = tuple(float(v) for v in m.memory)
        elif m.memory is not None:
            memory = (float(m.memory),) * len(runtimes)
        models.append(ShardModel(m.name, runtimes, memory))
    slowest = min(range(len(devices)), key=lambda p: devices[p].speed)
    longest = max(((i, j) for i, m in enumerate(models) for j in range(len(m.runtimes))),
                  key=lambda u: models[u[0]].runtimes[u[1]])
    worst = models[longest[0]].runtimes[longest[1]] / devices[slowest].speed
    if worst > MAX_SECONDS:
        raise InputError(source, f"devices[{slowest}].speed",
                         f"{devices[slowest].speed:g} is too slow: unit "
                         f"models[{longest[0]}].units[{longest[1]}] would take {worst:.3g} s "
                         f"on it (at most {MAX_SECONDS:g} s)")
    buffer = spec.buffer_fraction
    problem = ShardProblem(devices, models, buffer, source)
    for i, m in enumerate(models):
        for j in range(len(m.runtimes)):
            if not problem.eligible(i, j):
                where = f"models[{i}].memory[{j}]" if isinstance(spec.models[i].memory, list) \
                    else f"models[{i}].memory"
                raise InputError(source, where, f"unit {j} needs {m.unit_memory(j):g} bytes; no "
                                 f"device holds it after the {buffer:.0%} double-buffer reserve")
    return problem


def load_problem(path: str | Path) -> ShardProblem:
    """Read and validate a units JSON file; unreadable or malformed files raise InputError."""
    source = str(path)
    text = read_text(path, "JSON")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(source, "<file>", f"not valid JSON: {exc.msg} at line {exc.lineno}") from exc
    except RecursionError:
        raise InputError(source, "<file>", "nesting too deep") from None
    return problem_from_dict(data, source)


def problem_to_dict(problem: ShardProblem) -> dict[str, Any]:
    """The JSON contract form of a problem (inverse of :func:`problem_from_dict`)."""
    out: dict[str, Any] = {"devices": [], "models": [], "buffer_fraction": problem.buffer_fraction}
    for d in problem.devices:
        dev: dict[str, Any] = {"name": d.name, "speed": d.speed}
        if math.isfinite(d.memory):
            dev["memory"] = d.memory
        out["devices"].append(dev)
    for m in problem.models:
        mod: dict[str, Any] = {"name": m.name, "units": list(m.runtimes)}
        if m.memory:
            mod["memory"] = list(m.memory)
        out["models"].append(mod)
    return out


# -- schedules ------------------------------------------------------------------------------
def makespan(schedule: Sequence[Placement]) -> float:
    return max((p.end for p in schedule), default=0.0)


def schedule_from_orders(
    problem: ShardProblem, assignment: dict[tuple[int, int], int],
    device_orders: Sequence[Sequence[tuple[int, int]]],
    device_ready: Sequence[float] | None = None, model_ready: Sequence[float] | None = None,
) -> list[Placement]:
    """Left-shifted schedule from a device per unit and a unit order per device.

    Each unit starts when both its chain predecessor and its device predecessor
    have ended (and not before its device's or chain's ready time, if given),
    in exact float durations. Solvers decode through this so their
    rounding never leaks into the schedule; the makespan can only shrink versus
    the solver's own times. Raises ValueError if the orders form a cycle.
    """
    g = nx.DiGraph()
    for i, m in enumerate(problem.models):
        for j in range(len(m.runtimes)):
            g.add_node((i, j))
            if j:
                g.add_edge((i, j - 1), (i, j))
    for order in device_orders:
        for a, b in itertools.pairwise(order):
            g.add_edge(a, b)
    try:
        topo = list(nx.topological_sort(g))
    except nx.NetworkXUnfeasible as exc:
        raise ValueError("device orders contradict the chains (cycle)") from exc
    end: dict[tuple[int, int], float] = {}
    first_on: dict[tuple[int, int], int] = {o[0]: p for p, o in enumerate(device_orders) if o}
    out = []
    for u in topo:
        start = max((end[v] for v in g.predecessors(u)), default=0.0)
        if model_ready is not None and u[1] == 0:
            start = max(start, model_ready[u[0]])
        if device_ready is not None and u in first_on:
            start = max(start, device_ready[first_on[u]])
        p = assignment[u]
        end[u] = start + problem.duration(u[0], u[1], p)
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
def build_milp(problem: ShardProblem, horizon: float | None = None,
               hint: Sequence[Placement] | None = None) -> LinearModel:
    """The paper's makespan MILP with explicit device choice, as a neutral model.

    Variables: start ``s[u]``, device choice ``a[u,p]`` (binary, eligible p only),
    order ``y[u,v]`` (binary, u before v, for units of different models; one y
    per pair serves every device, since two units share at most one device) and
    the makespan ``C``. Rows: one device per unit; chain precedence (a); the
    disjunctive pair (b)/(c), switched off by big-M unless both units sit on p;
    the makespan (e). U = horizon + longest duration, where horizon is an upper
    bound on the optimal makespan (the greedy makespan when a hint is given).
    The paper's X_{t,p,j} duplicates the start per device without saying where a
    unit runs; a start per unit plus a[u,p] is the standard repair.
    """
    units = problem.units()
    if len(units) > MILP_MAX_UNITS:
        raise ValueError(f"{len(units)} units exceed the MILP limit of {MILP_MAX_UNITS}")
    if horizon is None:
        horizon = makespan(hint) if hint else problem.trivial_horizon()
    dmax = max(problem.duration(i, j, p) for (i, j) in units for p in problem.eligible(i, j))
    big = horizon + dmax + 1.0
    lm = LinearModel(name="hydra-sharp-makespan", sense="min")
    s = {u: lm.add_var(("s", u), 0.0, horizon) for u in units}
    a = {(u, p): lm.binary(("a", u, p)) for u in units for p in problem.eligible(*u)}
    c = lm.add_var(("C",), problem.lower_bound(), horizon + 1e-6 * max(1.0, horizon), obj=1.0)

    def dur(u: tuple[int, int]) -> list[tuple[int, float]]:
        return [(a[u, p], problem.duration(u[0], u[1], p)) for p in problem.eligible(*u)]

    for u in units:
        lm.add_row([(a[u, p], 1.0) for p in problem.eligible(*u)], 1.0, 1.0, f"assign{u}")
    for i, m in enumerate(problem.models):
        for j in range(1, len(m.runtimes)):
            u, v = (i, j - 1), (i, j)
            lm.add_row([(s[v], 1.0), (s[u], -1.0)] + [(k, -d) for k, d in dur(u)], 0.0,
                       name=f"chain{v}")
        last = (i, len(m.runtimes) - 1)
        lm.add_row([(c, 1.0), (s[last], -1.0)] + [(k, -d) for k, d in dur(last)], 0.0,
                   name=f"makespan{i}")
    y: dict[tuple[tuple[int, int], tuple[int, int]], int] = {}
    for x, u in enumerate(units):
        for v in units[x + 1:]:
            if u[0] == v[0]:
                continue
            common = set(problem.eligible(*u)) & set(problem.eligible(*v))
            if not common:
                continue
            y[u, v] = yv = lm.binary(("y", u, v))
            for p in sorted(common):
                du, dv = problem.duration(*u, p), problem.duration(*v, p)
                # y=1 (u first) and both on p: s_v >= s_u + du
                lm.add_row([(s[v], 1.0), (s[u], -1.0), (yv, -big), (a[u, p], -big),
                            (a[v, p], -big)], du - 3 * big, name=f"b{u}{v}{p}")
                # y=0 (v first) and both on p: s_u >= s_v + dv
                lm.add_row([(s[u], 1.0), (s[v], -1.0), (yv, big), (a[u, p], -big),
                            (a[v, p], -big)], dv - 2 * big, name=f"c{u}{v}{p}")
    lm.meta.update(kind="hydra-milp", big_m=big, horizon=horizon, units=len(units), pairs=len(y))

    def decode(xv: np.ndarray) -> list[Placement]:
        assignment = {u: max(problem.eligible(*u), key=lambda p: xv[a[u, p]]) for u in units}
        orders: list[list[tuple[int, int]]] = [[] for _ in problem.devices]
        for u in sorted(units, key=lambda q: (xv[s[q]], q)):
            orders[assignment[u]].append(u)
        return schedule_from_orders(problem, assignment, orders)

    lm.decode = decode
    if hint:
        values: dict[int, float] = {c: makespan(hint)}
        by_unit = {(pl.model, pl.unit): pl for pl in hint}
        for u in units:
            values[s[u]] = by_unit[u].start
            for p in problem.eligible(*u):
                values[a[u, p]] = 1.0 if by_unit[u].device == p else 0.0
        for (u, v), k in y.items():
            values[k] = 1.0 if (by_unit[u].start, u) < (by_unit[v].start, v) else 0.0
        lm.set_hint(values)
    return lm
